
/*
 * The peer view of ngx_http_upstream_affinity_module: the peers of an
 * upstream as the balancer and the status see them (ids, weights, counter
 * slots, names, and the ring), one immutable block per generation of the
 * upstream's peer list.  Built from the configuration; built again in each
 * worker when servers with "resolve" change the list (nginx 1.27.3+), and
 * then published whole: a request keeps the view it started with.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_upstream_affinity_module.h"


/*
 * Points per unit of weight on the ring.  A peer's share of the keys varies
 * by about 1/sqrt(points): 7% at nginx's 160, 3% at 1024.  Small upstreams
 * get the dense ring; large ones are capped near 64k points in all.
 */
#define NGX_HTTP_UPSTREAM_AFFINITY_RING_TOTAL       65536
#define NGX_HTTP_UPSTREAM_AFFINITY_RING_POINTS_MIN  160
#define NGX_HTTP_UPSTREAM_AFFINITY_RING_POINTS_MAX  1024


static ngx_http_upstream_affinity_view_t *ngx_http_upstream_affinity_build_view(
    ngx_http_upstream_rr_peers_t *peers, ngx_pool_t *pool, ngx_log_t *log);
static void ngx_http_upstream_affinity_view_release(void *data);


/* the view of the configured servers; their slots are claimed in init_zone */

ngx_int_t
ngx_http_upstream_affinity_init_view(ngx_conf_t *cf,
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_rr_peers_t *peers)
{
    ascf->view = ngx_http_upstream_affinity_build_view(peers, cf->pool,
                                                       cf->log);

    return ascf->view ? NGX_OK : NGX_ERROR;
}


/*
 * The current view of an upstream, rebuilt first if the peer list has
 * changed since this worker last looked.  The generation is read without
 * the peers lock, so that a request pays nothing while the list stays as
 * it is: a change that races with it is caught by get_peer, which compares
 * the generation under the lock.  A view built at run time is held for the
 * request that pool belongs to.  If a rebuild fails (no memory), the old
 * view stays, requests with it go to round robin, and the next request
 * tries again.  NULL only when no memory is left for the request.
 */

ngx_http_upstream_affinity_view_t *
ngx_http_upstream_affinity_view(ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_rr_peers_t *peers, ngx_pool_t *pool, ngx_log_t *log)
{
    ngx_uint_t                          generation;
    ngx_pool_cleanup_t                 *cln;
    ngx_http_upstream_affinity_view_t  *view, *old;

    if (ngx_http_upstream_affinity_config(peers) != ascf->view->generation) {

        ngx_http_upstream_rr_peers_rlock(peers);

        generation = ngx_http_upstream_affinity_config(peers);

        if (generation != ascf->view->generation) {
            view = ngx_http_upstream_affinity_build_view(peers, NULL, log);

            if (view) {
                ngx_http_upstream_affinity_claim_slots(
                    ascf->counter_zone->data, view, &ascf->name, log);

                old = ascf->view;
                old->current = 0;

                if (old->dynamic && old->refs == 0) {
                    ngx_free(old);
                }

                ascf->view = view;

                ngx_log_debug3(NGX_LOG_DEBUG_HTTP, log, 0,
                               "affinity upstream \"%V\": %ui peers, "
                               "generation %ui", &ascf->name, view->npeers,
                               generation);
            }
        }

        ngx_http_upstream_rr_peers_unlock(peers);
    }

    view = ascf->view;

    if (view->dynamic && pool) {
        cln = ngx_pool_cleanup_add(pool, 0);
        if (cln == NULL) {
            return NULL;
        }

        cln->handler = ngx_http_upstream_affinity_view_release;
        cln->data = view;
        view->refs++;
    }

    return view;
}


static void
ngx_http_upstream_affinity_view_release(void *data)
{
    ngx_http_upstream_affinity_view_t  *view = data;

    if (--view->refs == 0 && !view->current) {
        ngx_free(view);
    }
}


/*
 * One block: the view, the peers (primary then backup), their names, the
 * name bytes, and the ring.  Peers are known by a hash of their address,
 * not by their position: pins survive reloads and changes that reorder or
 * extend the list.  Without primary peers (servers with "resolve" may have
 * no address yet), there is no ring, and requests go to round robin.
 */

static ngx_http_upstream_affinity_view_t *
ngx_http_upstream_affinity_build_view(ngx_http_upstream_rr_peers_t *peers,
    ngx_pool_t *pool, ngx_log_t *log)
{
    u_char                             *p;
    size_t                              size, names, ring_size;
    uint32_t                            points;
    ngx_uint_t                          i, n, nbackup, weight;
    affinity_peer_t                     list[2 * AFFINITY_MAX_PEERS];
    ngx_http_upstream_rr_peer_t        *peer;
    ngx_http_upstream_rr_peers_t       *backup;
    ngx_http_upstream_affinity_view_t  *view;

    n = 0;
    nbackup = 0;
    weight = 0;
    names = 0;

    for (peer = peers->peer; peer; peer = peer->next) {
        n++;
        weight += peer->weight;
    }

    backup = peers->next;

    if (backup) {
        for (peer = backup->peer; peer; peer = peer->next) {
            nbackup++;
        }
    }

    if (n > AFFINITY_MAX_PEERS || nbackup > AFFINITY_MAX_PEERS) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "upstream \"%V\" has %ui servers, affinity balancing "
                      "supports at most %d; balancing by round robin until "
                      "it has fewer", peers->name, ngx_max(n, nbackup),
                      AFFINITY_MAX_PEERS);
        n = 0;
        nbackup = 0;
    }

    /* primary peers, then backup ones, here and below */

    for (peer = peers->peer, i = 0; i < n + nbackup; peer = peer->next, i++) {
        if (i == n) {
            peer = backup->peer;
        }

        list[i].id = affinity_peer_id((char *) peer->name.data,
                                      peer->name.len);
        list[i].weight = (uint32_t) peer->weight;
        list[i].slot = AFFINITY_NO_SLOT;
        names += peer->name.len;
    }

    points = (uint32_t) ngx_max(NGX_HTTP_UPSTREAM_AFFINITY_RING_TOTAL
                                / ngx_max(weight, 1),
                                NGX_HTTP_UPSTREAM_AFFINITY_RING_POINTS_MIN);
    points = ngx_min(points, NGX_HTTP_UPSTREAM_AFFINITY_RING_POINTS_MAX);

    ring_size = n ? affinity_ring_size(list, n, points) : 0;

    size = sizeof(ngx_http_upstream_affinity_view_t)
           + (n + nbackup) * (sizeof(affinity_peer_t) + sizeof(ngx_str_t))
           + names + 8 + ring_size;

    view = pool ? ngx_pcalloc(pool, size) : ngx_calloc(size, log);
    if (view == NULL) {
        return NULL;
    }

    view->generation = ngx_http_upstream_affinity_config(peers);
    view->npeers = n;
    view->nbackup = nbackup;
    view->dynamic = pool ? 0 : 1;
    view->current = 1;

    view->peers = (affinity_peer_t *) (view + 1);
    ngx_memcpy(view->peers, list, (n + nbackup) * sizeof(affinity_peer_t));

    view->names = (ngx_str_t *) (view->peers + n + nbackup);
    p = (u_char *) (view->names + n + nbackup);

    for (peer = peers->peer, i = 0; i < n + nbackup; peer = peer->next, i++) {
        if (i == n) {
            peer = backup->peer;
        }

        view->names[i].data = p;
        view->names[i].len = peer->name.len;
        p = ngx_cpymem(p, peer->name.data, peer->name.len);
    }

    if (n) {
        p = ngx_align_ptr(p, 8);
        view->ring = affinity_ring_build(p, ring_size, list, n, points);

        if (view->ring == NULL) {
            if (pool == NULL) {
                ngx_free(view);
            }

            return NULL;
        }
    }

    return view;
}


/*
 * Gives every peer of a view of an upstream, primary and backup, its
 * counter slot in the zone that counts the upstream's requests: in the
 * master when the zone is ready (a reload finds the counters it left, since
 * slots are keyed by peer id), and in a worker when it builds a view.  A
 * peer that gets none is balanced without its in-flight count until it
 * can claim one when routed; the status shows it.
 */

void
ngx_http_upstream_affinity_claim_slots(
    ngx_http_upstream_affinity_shctx_t *shctx,
    ngx_http_upstream_affinity_view_t *view, ngx_str_t *upstream,
    ngx_log_t *log)
{
    uint32_t    now;
    ngx_uint_t  i, missing;

    now = (uint32_t) ngx_time();
    missing = 0;

    ngx_shmtx_lock(&shctx->shpool->mutex);

    for (i = 0; i < view->npeers + view->nbackup; i++) {
        view->peers[i].slot = affinity_zone_peer_slot(shctx->zone,
                                                      view->peers[i].id, now);
        missing |= (view->peers[i].slot == AFFINITY_NO_SLOT);
    }

    ngx_shmtx_unlock(&shctx->shpool->mutex);

    if (missing) {
        ngx_log_error(NGX_LOG_WARN, log, 0,
                      "affinity zone is out of peer counter slots; "
                      "some peers of upstream \"%V\" are balanced "
                      "without their in-flight counts", upstream);
    }
}

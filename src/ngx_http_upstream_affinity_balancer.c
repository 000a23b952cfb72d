
/*
 * The balancer hooks of ngx_http_upstream_affinity_module: per-request peer
 * data, peer selection and release.  Built on round robin as the hash and
 * least_conn modules are: its peer data comes first, its usability rules
 * (down, max_fails/fail_timeout, max_conns, tried) are applied here, and it
 * takes over for backup servers.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_upstream_affinity_module.h"


typedef struct {
    /* the round robin data must be first */
    ngx_http_upstream_rr_peer_data_t        rrp;

    ngx_http_upstream_affinity_srv_conf_t  *conf;
    ngx_http_upstream_affinity_ctx_t       *ctx;
    ngx_http_upstream_affinity_shctx_t     *shctx;      /* counters */
    ngx_http_upstream_affinity_shctx_t     *prefixes;   /* or NULL */
    ngx_http_upstream_rr_peers_t           *primary;
    affinity_peer_t                        *peers;
    affinity_request_t                      request;

    /* the counter slot this try holds an in-flight request in */
    uint32_t                                slot;
} ngx_http_upstream_affinity_peer_data_t;


static ngx_int_t ngx_http_upstream_get_affinity_peer(ngx_peer_connection_t *pc,
    void *data);
static void ngx_http_upstream_free_affinity_peer(ngx_peer_connection_t *pc,
    void *data, ngx_uint_t state);
static ngx_int_t ngx_http_upstream_affinity_round_robin(
    ngx_peer_connection_t *pc, ngx_http_upstream_affinity_peer_data_t *ap);


ngx_int_t
ngx_http_upstream_init_affinity_peer(ngx_http_request_t *r,
    ngx_http_upstream_srv_conf_t *us)
{
    ngx_http_upstream_affinity_ctx_t        *ctx;
    ngx_http_upstream_affinity_srv_conf_t   *ascf;
    ngx_http_upstream_affinity_peer_data_t  *ap;

    ascf = ngx_http_conf_upstream_srv_conf(us,
                                           ngx_http_upstream_affinity_module);

    ap = ngx_palloc(r->pool, sizeof(ngx_http_upstream_affinity_peer_data_t));
    if (ap == NULL) {
        return NGX_ERROR;
    }

    r->upstream->peer.data = &ap->rrp;

    if (ngx_http_upstream_init_round_robin_peer(r, us) != NGX_OK) {
        return NGX_ERROR;
    }

    r->upstream->peer.get = ngx_http_upstream_get_affinity_peer;
    r->upstream->peer.free = ngx_http_upstream_free_affinity_peer;

    ap->conf = ascf;
    ap->shctx = ascf->counter_zone->data;
    ap->prefixes = ascf->prefix_zone ? ascf->prefix_zone->data : NULL;
    ap->primary = ap->rrp.peers;
    ap->slot = AFFINITY_NO_SLOT;

    ap->peers = ngx_palloc(r->pool, ascf->npeers * sizeof(affinity_peer_t));
    if (ap->peers == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(ap->peers, ascf->peers, ascf->npeers * sizeof(affinity_peer_t));

    /*
     * The key is looked up once per request, not per try: a retry after
     * proxy_next_upstream routes the same session.
     */

    ctx = ngx_http_get_module_ctx(r, ngx_http_upstream_affinity_module);

    if (ctx == NULL || ctx->conf != ascf) {
        ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_upstream_affinity_ctx_t));
        if (ctx == NULL) {
            return NGX_ERROR;
        }

        ctx->conf = ascf;
        ngx_http_set_ctx(r, ctx, ngx_http_upstream_affinity_module);

        if (ascf->session_zone
            && ngx_http_upstream_affinity_session_key(r, ascf, ctx) != NGX_OK)
        {
            return NGX_ERROR;
        }

        if (ascf->prefix_zone
            && ngx_http_upstream_affinity_prompt(r, ascf, ctx) != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    ap->ctx = ctx;

    ngx_memzero(&ap->request, sizeof(affinity_request_t));

    if (ctx->keyed) {
        ap->request.has_key = 1;
        ap->request.key_hash = affinity_zone_key_hash(ap->shctx->zone,
                                                      ctx->key.data,
                                                      ctx->key.len);
        ap->request.ring_hash = affinity_ring_hash(ctx->key.data,
                                                   ctx->key.len);
    }

    if (ap->prefixes && ctx->nlevels) {
        ap->request.prefixes = ap->prefixes->zone;
        ap->request.levels = ctx->levels;
        ap->request.nlevels = (uint32_t) ctx->nlevels;
        ap->request.prefix_timeout = (uint32_t) ascf->prefix_timeout;
    }

    ap->request.timeout = (uint32_t) ascf->session_timeout;
    ap->request.rotate = (uint32_t) ngx_random();

    return NGX_OK;
}


static ngx_int_t
ngx_http_upstream_get_affinity_peer(ngx_peer_connection_t *pc, void *data)
{
    ngx_http_upstream_affinity_peer_data_t  *ap = data;

    time_t                                 now;
    uintptr_t                              m;
    ngx_uint_t                             i, n, usable;
    affinity_peer_t                       *state;
    affinity_balance_t                     balance;
    affinity_decision_t                    decision;
    ngx_http_upstream_rr_peer_t           *peer;
    ngx_http_upstream_affinity_shctx_t    *prefixes;
    ngx_http_upstream_rr_peers_t          *peers;
    ngx_http_upstream_rr_peer_data_t      *rrp;
    ngx_http_upstream_affinity_srv_conf_t *ascf;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, pc->log, 0,
                   "get affinity peer, try: %ui", pc->tries);

    rrp = &ap->rrp;
    ascf = ap->conf;
    peers = rrp->peers;

    ap->slot = AFFINITY_NO_SLOT;

    /* backup servers are chosen by round robin, as least_conn does */

    if (peers != ap->primary
        || ngx_http_upstream_affinity_peers_changed(peers, ascf->npeers))
    {
        return ngx_http_upstream_affinity_round_robin(pc, ap);
    }

    pc->cached = 0;
    pc->connection = NULL;

    now = ngx_time();

    ngx_http_upstream_rr_peers_wlock(peers);

    /*
     * Classify the peers as round robin would see them.  A failed peer
     * loses its sessions for good; a peer that is only busy for this request
     * (tried already, or at max_conns) keeps them.
     */

    usable = 0;

    for (peer = peers->peer, i = 0; peer; peer = peer->next, i++) {

        n = i / (8 * sizeof(uintptr_t));
        m = (uintptr_t) 1 << i % (8 * sizeof(uintptr_t));

        state = &ap->peers[i];

        if (peer->down
            || (peer->max_fails
                && peer->fails >= peer->max_fails
                && now - peer->checked <= peer->fail_timeout))
        {
            state->state = AFFINITY_PEER_FAILED;

        } else if ((rrp->tried[n] & m)
                   || (peer->max_conns && peer->conns >= peer->max_conns))
        {
            state->state = AFFINITY_PEER_BUSY;

        } else {
            state->state = AFFINITY_PEER_USABLE;
            usable++;
        }
    }

    if (usable == 0) {
        ngx_http_upstream_rr_peers_unlock(peers);
        return ngx_http_upstream_affinity_round_robin(pc, ap);
    }

    balance.factor = (double) ascf->factor / 1000;
    balance.slack = (double) ascf->slack;

    ap->request.now = (uint32_t) now;

    /*
     * The counter zone first, then the prefix index: always in this order,
     * so that workers routing through both cannot deadlock.
     */

    prefixes = ap->request.prefixes ? ap->prefixes : NULL;

    if (prefixes == ap->shctx) {
        prefixes = NULL;
    }

    ngx_shmtx_lock(&ap->shctx->shpool->mutex);

    if (prefixes) {
        ngx_shmtx_lock(&prefixes->shpool->mutex);
    }

    (void) affinity_route(ap->shctx->zone, ascf->ring, ap->peers,
                          ascf->npeers, &balance, &ap->request, &decision);

    if (prefixes) {
        ngx_shmtx_unlock(&prefixes->shpool->mutex);
    }

    ngx_shmtx_unlock(&ap->shctx->shpool->mutex);

    if (decision.peer < 0) {
        ngx_http_upstream_rr_peers_unlock(peers);
        return ngx_http_upstream_affinity_round_robin(pc, ap);
    }

    for (peer = peers->peer, i = 0;
         i < (ngx_uint_t) decision.peer;
         peer = peer->next, i++)
    {
        /* void */
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, pc->log, 0,
                   "get affinity peer, route: %ui, peer: %ui %V",
                   (ngx_uint_t) decision.route, i, &peer->name);

    if (now - peer->checked > peer->fail_timeout) {
        peer->checked = now;
    }

    pc->sockaddr = peer->sockaddr;
    pc->socklen = peer->socklen;
    pc->name = &peer->name;
    ngx_http_upstream_affinity_set_sid(pc, peer);

    peer->conns++;

    rrp->current = peer;
    ngx_http_upstream_affinity_peer_ref(peers, peer);

    n = i / (8 * sizeof(uintptr_t));
    m = (uintptr_t) 1 << i % (8 * sizeof(uintptr_t));

    rrp->tried[n] |= m;

    ngx_http_upstream_rr_peers_unlock(peers);

    ap->slot = ap->peers[i].slot;
    ap->ctx->route = decision.route;
    ap->ctx->prefix_len = decision.prefix_len;

    return NGX_OK;
}


/*
 * Round robin picks the peer when no primary is usable (it then moves on to
 * the backup servers, or answers NGX_BUSY); the request is still counted in
 * the chosen peer's in-flight counter.
 */

static ngx_int_t
ngx_http_upstream_affinity_round_robin(ngx_peer_connection_t *pc,
    ngx_http_upstream_affinity_peer_data_t *ap)
{
    ngx_int_t                               rc;
    ngx_uint_t                              i;
    ngx_http_upstream_rr_peer_t            *peer;
    ngx_http_upstream_affinity_srv_conf_t  *ascf;

    rc = ngx_http_upstream_get_round_robin_peer(pc, &ap->rrp);

    ap->ctx->route = AFFINITY_ROUTE_FALLBACK;
    ap->ctx->prefix_len = 0;

    if (rc != NGX_OK) {
        return rc;
    }

    ascf = ap->conf;

    i = 0;

    for (peer = ap->rrp.peers->peer; peer; peer = peer->next) {
        if (peer == ap->rrp.current) {
            break;
        }

        i++;
    }

    if (peer == NULL) {
        return rc;
    }

    if (ap->rrp.peers == ap->primary) {
        if (i < ascf->npeers) {
            ap->slot = ascf->peers[i].slot;
        }

    } else if (i < ascf->nbackup) {
        ap->slot = ascf->backup_slots[i];
    }

    affinity_zone_peer_acquire(ap->shctx->zone, ap->slot);

    return rc;
}


static void
ngx_http_upstream_free_affinity_peer(ngx_peer_connection_t *pc, void *data,
    ngx_uint_t state)
{
    ngx_http_upstream_affinity_peer_data_t  *ap = data;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, pc->log, 0,
                   "free affinity peer %ui", state);

    if (ap->slot != AFFINITY_NO_SLOT) {
        if (state & NGX_PEER_FAILED) {
            affinity_zone_peer_failed(ap->shctx->zone, ap->slot);
        }

        affinity_zone_peer_release(ap->shctx->zone, ap->slot);
        ap->slot = AFFINITY_NO_SLOT;
    }

    ngx_http_upstream_free_round_robin_peer(pc, &ap->rrp, state);
}

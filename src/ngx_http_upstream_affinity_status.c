
/*
 * affinity_status: what the affinity balancers of this nginx are doing, per
 * upstream and peer, from the counters in shared memory (so the figures are
 * those of all workers).  The figures are gathered once per request, then
 * written as JSON (..._status_json.c) or, with ?format=prometheus, in the
 * Prometheus text exposition format (..._status_prometheus.c).
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_upstream_affinity_module.h"
#include "ngx_http_upstream_affinity_status.h"


const char  *ngx_http_upstream_affinity_fallback_names[AFFINITY_FALLBACKS] = {
    "not_buffered",
    "not_json",
    "no_body",
    "too_large",
    "read_error",
    "parse_error",
    "no_prompt",
    "no_memory"
};


#define ngx_http_upstream_affinity_store_event(name, help)                    \
    { #name, offsetof(ngx_http_upstream_affinity_store_counters_t, name),     \
      help }

ngx_http_upstream_affinity_store_event_t
    ngx_http_upstream_affinity_store_events[] =
{
    ngx_http_upstream_affinity_store_event(published,
        "messages the store took"),
    ngx_http_upstream_affinity_store_event(dropped,
        "messages never sent: the backlog was full"),
    ngx_http_upstream_affinity_store_event(refused,
        "writes the store refused"),
    ngx_http_upstream_affinity_store_event(outages,
        "connections lost, timed out or refused"),
    ngx_http_upstream_affinity_store_event(read,
        "entries read from the stream"),
    ngx_http_upstream_affinity_store_event(applied,
        "messages of other instances applied"),
    ngx_http_upstream_affinity_store_event(forged,
        "entries whose authenticator is wrong"),
    ngx_http_upstream_affinity_store_event(malformed,
        "entries that are not messages"),
    ngx_http_upstream_affinity_store_event(stale,
        "messages older than what the zones hold, or read again"),
    ngx_http_upstream_affinity_store_event(future,
        "messages stamped ahead of this clock"),
    ngx_http_upstream_affinity_store_event(unknown,
        "messages naming a server this instance does not have"),
    ngx_http_upstream_affinity_store_event(limited,
        "news beyond a sender's rate"),
    ngx_http_upstream_affinity_store_event(rewound,
        "times the stream's ids went back"),
    ngx_http_upstream_affinity_store_event(replayed,
        "messages a writer sent before, written again"),
    { NULL, 0, NULL }
};


static ngx_int_t ngx_http_upstream_affinity_status_handler(
    ngx_http_request_t *r);
static ngx_int_t ngx_http_upstream_affinity_collect(ngx_http_request_t *r,
    ngx_http_upstream_affinity_status_t *status);
static ngx_int_t ngx_http_upstream_affinity_collect_peers(
    ngx_http_request_t *r, ngx_http_upstream_affinity_upstream_status_t *us,
    ngx_http_upstream_affinity_view_t *view);
static ngx_int_t ngx_http_upstream_affinity_collect_upstream(
    ngx_http_request_t *r, ngx_http_upstream_affinity_status_t *status,
    ngx_http_upstream_affinity_upstream_status_t *us);
static void ngx_http_upstream_affinity_zone_info(ngx_shm_zone_t *shm_zone,
    affinity_zone_info_t *info);


char *
ngx_http_upstream_affinity_status(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_http_upstream_affinity_status_handler;

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_upstream_affinity_status_handler(ngx_http_request_t *r)
{
    ngx_int_t                             rc;
    ngx_str_t                             format;
    ngx_uint_t                            prometheus;
    ngx_chain_t                           out;
    ngx_http_upstream_affinity_status_t   status;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return NGX_HTTP_NOT_ALLOWED;
    }

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    prometheus = ngx_http_arg(r, (u_char *) "format", 6, &format) == NGX_OK
                 && format.len == 10
                 && ngx_strncmp(format.data, "prometheus", 10) == 0;

    if (ngx_http_upstream_affinity_collect(r, &status) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (prometheus) {
        ngx_str_set(&r->headers_out.content_type,
                    "text/plain; version=0.0.4; charset=utf-8");
        rc = ngx_http_upstream_affinity_status_prometheus(r, &status, &out);

    } else {
        ngx_str_set(&r->headers_out.content_type, "application/json");
        rc = ngx_http_upstream_affinity_status_json(r, &status, &out);
    }

    if (rc != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    r->headers_out.content_type_len = r->headers_out.content_type.len;
    r->headers_out.status = NGX_HTTP_OK;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    return ngx_http_output_filter(r, &out);
}


/*
 * Reads the figures of every upstream that uses this balancer: the peers
 * as the balancer sees them (its peer view, brought up to date), the
 * figures of their counter slots, its zones and its store.
 */

static ngx_int_t
ngx_http_upstream_affinity_collect(ngx_http_request_t *r,
    ngx_http_upstream_affinity_status_t *status)
{
    ngx_uint_t                                     i;
    ngx_http_upstream_srv_conf_t                  *uscf;
    ngx_http_upstream_main_conf_t                 *umcf;
    ngx_http_upstream_affinity_view_t             *view;
    ngx_http_upstream_affinity_srv_conf_t         *ascf;
    ngx_http_upstream_affinity_upstream_status_t  *us;

    status->now = ngx_time();

    if (ngx_array_init(&status->upstreams, r->pool, 4,
                       sizeof(ngx_http_upstream_affinity_upstream_status_t))
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    umcf = ngx_http_get_module_main_conf(r, ngx_http_upstream_module);

    for (i = 0; (uscf = ngx_http_upstream_affinity_next(umcf, &i, &ascf)); ) {

        if (ascf->counter_zone == NULL || ascf->view == NULL
            || uscf->peer.data == NULL)
        {
            continue;
        }

        view = ngx_http_upstream_affinity_view(ascf, uscf->peer.data,
                                               r->pool, r->connection->log);
        if (view == NULL) {
            return NGX_ERROR;
        }

        us = ngx_array_push(&status->upstreams);
        if (us == NULL) {
            return NGX_ERROR;
        }

        ngx_memzero(us, sizeof(ngx_http_upstream_affinity_upstream_status_t));

        us->name = uscf->host;
        us->conf = ascf;

        if (ngx_array_init(&us->peers, r->pool,
                           view->npeers + view->nbackup + 1,
                           sizeof(ngx_http_upstream_affinity_peer_status_t))
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        if (ngx_http_upstream_affinity_collect_peers(r, us, view) != NGX_OK
            || ngx_http_upstream_affinity_collect_upstream(r, status, us)
               != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/* the peers of an upstream's view, and what their counter slots hold */

static ngx_int_t
ngx_http_upstream_affinity_collect_peers(ngx_http_request_t *r,
    ngx_http_upstream_affinity_upstream_status_t *us,
    ngx_http_upstream_affinity_view_t *view)
{
    int64_t                                   *waits;
    uint32_t                                   slot, *slots;
    ngx_uint_t                                 j, n;
    affinity_zone_t                           *zone;
    affinity_peer_stats_t                      learned;
    ngx_http_upstream_affinity_srv_conf_t     *ascf;
    ngx_http_upstream_affinity_peer_status_t  *ps;
    ngx_http_upstream_affinity_shctx_t        *shctx, *prefixes;

    ascf = us->conf;
    shctx = ascf->counter_zone->data;
    zone = shctx->zone;

    /* requests of workers that died are not in flight any more */

    ngx_http_upstream_affinity_reap(shctx, r->connection->log);

    n = view->npeers + view->nbackup;

    slots = ngx_palloc(r->pool, n * sizeof(uint32_t));
    waits = ngx_palloc(r->pool, n * sizeof(int64_t));
    if (slots == NULL || waits == NULL) {
        return NGX_ERROR;
    }

    for (j = 0; j < n; j++) {

        ps = ngx_array_push(&us->peers);
        if (ps == NULL) {
            return NGX_ERROR;
        }

        ps->name = view->names[j];
        ps->label = NULL;
        ps->backup = (j >= view->npeers);

        /*
         * The slot the view has, or the one the peer claimed since; a
         * peer without one is reported as not counted, with zeros, never
         * with another peer's figures.
         */

        slot = view->peers[j].slot;
        affinity_zone_peer_stats(zone, slot, &ps->stats);

        if (ps->stats.id != view->peers[j].id) {
            ngx_shmtx_lock(&shctx->shpool->mutex);
            slot = affinity_zone_peer_find(zone, view->peers[j].id);
            ngx_shmtx_unlock(&shctx->shpool->mutex);

            affinity_zone_peer_stats(zone, slot, &ps->stats);
        }

        ps->counted = (ps->stats.id == view->peers[j].id);

        if (!ps->counted) {
            ngx_memzero(&ps->stats, sizeof(affinity_peer_stats_t));
            slot = AFFINITY_NO_SLOT;    /* a pace of nothing learned */
        }

        /* what its replies taught of its speed, in the same slot */

        affinity_zone_peer_pace(zone, slot, &ps->pace);
        slots[j] = slot;

        /* what its replies taught of its cache is in the prefix zone */

        if (ascf->prefix_zone && ascf->prefix_zone != ascf->counter_zone) {
            prefixes = ascf->prefix_zone->data;

            ngx_shmtx_lock(&prefixes->shpool->mutex);
            slot = affinity_zone_peer_find(prefixes->zone, view->peers[j].id);
            ngx_shmtx_unlock(&prefixes->shpool->mutex);

            affinity_zone_peer_stats(prefixes->zone, slot, &learned);

            ps->stats.learned_tokens = (learned.id == view->peers[j].id)
                                       ? learned.learned_tokens : 0;
        }
    }

    /*
     * The wait before prefill of a request sent to each peer now, by
     * routing's estimate over the primaries, the engines' figures counted
     * as routing counts them; the backups' shape is pooled apart from
     * theirs.
     */

    affinity_zone_peers_wait(zone, slots, view->npeers,
                             (uint32_t) ascf->engine_ttl, ngx_time(), waits);
    affinity_zone_peers_wait(zone, slots + view->npeers, view->nbackup,
                             (uint32_t) ascf->engine_ttl, ngx_time(),
                             waits + view->npeers);

    ps = us->peers.elts;

    for (j = 0; j < n; j++) {
        ps[j].wait_us = waits[j];
    }

    return NGX_OK;
}


/*
 * The upstream's own figures: the instances it heard from and what
 * routing presumes they send unseen, under the lock their table is
 * written under; its zones, each read once (the counter zone is one of
 * them, and holds the fallbacks); its store's counters.
 */

static ngx_int_t
ngx_http_upstream_affinity_collect_upstream(ngx_http_request_t *r,
    ngx_http_upstream_affinity_status_t *status,
    ngx_http_upstream_affinity_upstream_status_t *us)
{
    ngx_uint_t                                    k;
    ngx_http_upstream_affinity_srv_conf_t        *ascf;
    ngx_http_upstream_affinity_shctx_t           *shctx;
    ngx_http_upstream_affinity_zone_status_t     *zs;
    ngx_http_upstream_affinity_store_counters_t  *counters;

    static const char  *kinds[NGX_HTTP_UPSTREAM_AFFINITY_TABLES] = {
        "sessions", "prefixes", "responses"
    };

    ascf = us->conf;
    shctx = ascf->counter_zone->data;

    ngx_shmtx_lock(&shctx->shpool->mutex);
    us->instances = affinity_zone_instances(shctx->zone,
                                            (uint32_t) status->now);
    us->unheard_presumed = affinity_zone_unheard_presumed(shctx->zone,
                                                   (uint32_t) status->now,
                                                   &us->unheard_learned,
                                                   &us->unheard_met);
    us->unheard_beside = affinity_zone_unheard_beside(shctx->zone);
    ngx_shmtx_unlock(&shctx->shpool->mutex);

    us->zones[NGX_HTTP_UPSTREAM_AFFINITY_SESSIONS].zone = ascf->session_zone;
    us->zones[NGX_HTTP_UPSTREAM_AFFINITY_PREFIXES].zone = ascf->prefix_zone;
    us->zones[NGX_HTTP_UPSTREAM_AFFINITY_RESPONSES].zone =
                                                          ascf->response_zone;

    for (k = 0; k < NGX_HTTP_UPSTREAM_AFFINITY_TABLES; k++) {
        zs = &us->zones[k];
        zs->kind = kinds[k];

        if (zs->zone == NULL) {
            continue;
        }

        ngx_http_upstream_affinity_zone_info(zs->zone, &zs->info);

        if (zs->zone == ascf->counter_zone) {
            ngx_memcpy(us->fallbacks, zs->info.fallbacks,
                       sizeof(us->fallbacks));
        }
    }

    counters = ngx_http_upstream_affinity_store_counters(ascf);

    if (counters) {
        us->store = ngx_palloc(r->pool,
                         sizeof(ngx_http_upstream_affinity_store_counters_t));
        if (us->store == NULL) {
            return NGX_ERROR;
        }

        *us->store = *counters;
    }

    return NGX_OK;
}


static void
ngx_http_upstream_affinity_zone_info(ngx_shm_zone_t *shm_zone,
    affinity_zone_info_t *info)
{
    ngx_http_upstream_affinity_shctx_t  *shctx;

    shctx = shm_zone->data;

    ngx_shmtx_lock(&shctx->shpool->mutex);
    affinity_zone_info(shctx->zone, info);
    ngx_shmtx_unlock(&shctx->shpool->mutex);
}

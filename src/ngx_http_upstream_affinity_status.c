
/*
 * affinity_status: what the affinity balancers of this nginx are doing, per
 * upstream and peer, from the counters in shared memory (so the figures are
 * those of all workers).  JSON, built with jansson; with ?format=prometheus,
 * the Prometheus text exposition format.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>
#include <nginx.h>

#include <jansson.h>

#include "ngx_http_upstream_affinity_module.h"


/* one peer of an upstream, as reported */
typedef struct {
    ngx_str_t                               name;
    ngx_str_t                              *label;  /* name, escaped */
    ngx_uint_t                              backup;
    ngx_uint_t                              counted;  /* has its slot */
    affinity_peer_stats_t                   stats;
    affinity_peer_pace_t                    pace;
} ngx_http_upstream_affinity_peer_status_t;


/* one affinity upstream, as reported */
typedef struct {
    ngx_str_t                               name;
    ngx_str_t                              *label;  /* name, escaped */
    ngx_http_upstream_affinity_srv_conf_t  *conf;
    ngx_array_t                             peers;
} ngx_http_upstream_affinity_upstream_status_t;


/* a Prometheus family: name, type, help, and what it reports */
typedef struct {
    const char                             *name;
    const char                             *type;
    const char                             *help;
    ngx_uint_t                              value;
} ngx_http_upstream_affinity_metric_t;


/* a zone in the Prometheus response (each once, even if shared) */
typedef struct {
    ngx_shm_zone_t                         *zone;
    ngx_str_t                              *label;  /* name, escaped */
    ngx_str_t                               upstreams; /* using it, escaped,
                                                          comma-separated */
    const char                             *kind;
    affinity_zone_info_t                    info;
} ngx_http_upstream_affinity_zone_status_t;


/* affinity_fallback_e, as the status names them */
static const char  *ngx_http_upstream_affinity_fallback_names[
                                                       AFFINITY_FALLBACKS] = {
    "not_buffered",
    "not_json",
    "no_body",
    "too_large",
    "read_error",
    "parse_error",
    "no_prompt",
    "no_memory"
};


#define NGX_HTTP_UPSTREAM_AFFINITY_STATUS_ZONES  64


/* a Prometheus response under construction */
typedef struct {
    ngx_http_request_t                     *r;
    ngx_chain_t                            *out;
    ngx_chain_t                           **last;
    ngx_chain_t                            *cl;     /* the last link */
    ngx_buf_t                              *b;      /* its buffer */
    size_t                                  len;
} ngx_http_upstream_affinity_text_t;


/* the store's counters, in both formats: name, offset, help */
typedef struct {
    const char                             *name;
    size_t                                  offset;
    const char                             *help;
} ngx_http_upstream_affinity_store_event_t;

#define ngx_http_upstream_affinity_store_event(name, help)                    \
    { #name, offsetof(ngx_http_upstream_affinity_store_counters_t, name),     \
      help }

static ngx_http_upstream_affinity_store_event_t
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
        "messages a writer sent before, written again")
};

#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_EVENTS                               \
    (sizeof(ngx_http_upstream_affinity_store_events)                          \
     / sizeof(ngx_http_upstream_affinity_store_events[0]))

#define ngx_http_upstream_affinity_store_value(counters, event)               \
    (*(ngx_atomic_t *) ((u_char *) (counters) + (event)->offset))


static ngx_int_t ngx_http_upstream_affinity_status_handler(
    ngx_http_request_t *r);
static ngx_int_t ngx_http_upstream_affinity_collect(ngx_http_request_t *r,
    ngx_array_t *upstreams);
static void ngx_http_upstream_affinity_zone_info(ngx_shm_zone_t *shm_zone,
    affinity_zone_info_t *info);
static ngx_int_t ngx_http_upstream_affinity_json(ngx_http_request_t *r,
    ngx_array_t *upstreams, ngx_chain_t *out);
static json_t *ngx_http_upstream_affinity_json_pace(
    ngx_http_upstream_affinity_peer_status_t *ps);
static int64_t ngx_http_upstream_affinity_wait(
    ngx_http_upstream_affinity_peer_status_t *ps);
static json_t *ngx_http_upstream_affinity_json_figure(int64_t v,
    double unit);
static json_t *ngx_http_upstream_affinity_json_zone(ngx_shm_zone_t *shm_zone);
static json_t *ngx_http_upstream_affinity_json_store(
    ngx_http_upstream_affinity_srv_conf_t *ascf);
static ngx_int_t ngx_http_upstream_affinity_join(ngx_pool_t *pool,
    ngx_str_t *list, ngx_str_t *name);
static ngx_int_t ngx_http_upstream_affinity_prometheus(ngx_http_request_t *r,
    ngx_array_t *upstreams, ngx_chain_t *out);
static ngx_int_t ngx_http_upstream_affinity_printf(
    ngx_http_upstream_affinity_text_t *t, const char *fmt, ...);
static u_char *ngx_http_upstream_affinity_decimal(u_char *p, int64_t v);
static ngx_str_t *ngx_http_upstream_affinity_label(ngx_pool_t *pool,
    ngx_str_t *value);


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
    ngx_int_t     rc;
    ngx_str_t     format;
    ngx_uint_t    prometheus;
    ngx_chain_t   out;
    ngx_array_t   upstreams;

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

    if (ngx_array_init(&upstreams, r->pool, 4,
                       sizeof(ngx_http_upstream_affinity_upstream_status_t))
        != NGX_OK
        || ngx_http_upstream_affinity_collect(r, &upstreams) != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (prometheus) {
        ngx_str_set(&r->headers_out.content_type,
                    "text/plain; version=0.0.4; charset=utf-8");
        rc = ngx_http_upstream_affinity_prometheus(r, &upstreams, &out);

    } else {
        ngx_str_set(&r->headers_out.content_type, "application/json");
        rc = ngx_http_upstream_affinity_json(r, &upstreams, &out);
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
 * Reads the counters of every upstream that uses this balancer: the peers
 * as the balancer sees them (its peer view, brought up to date), and the
 * figures of their counter slots.
 */

static ngx_int_t
ngx_http_upstream_affinity_collect(ngx_http_request_t *r,
    ngx_array_t *upstreams)
{
    uint32_t                                       slot;
    ngx_uint_t                                     i, j;
    affinity_zone_t                               *zone;
    ngx_http_upstream_srv_conf_t                  *uscf;
    ngx_http_upstream_main_conf_t                 *umcf;
    ngx_http_upstream_affinity_view_t             *view;
    ngx_http_upstream_affinity_srv_conf_t         *ascf;
    ngx_http_upstream_affinity_peer_status_t      *ps;
    ngx_http_upstream_affinity_shctx_t            *shctx, *prefixes;
    ngx_http_upstream_affinity_upstream_status_t  *us;
    affinity_peer_stats_t                          learned;

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

        us = ngx_array_push(upstreams);
        if (us == NULL) {
            return NGX_ERROR;
        }

        us->name = uscf->host;
        us->conf = ascf;

        if (ngx_array_init(&us->peers, r->pool,
                           view->npeers + view->nbackup + 1,
                           sizeof(ngx_http_upstream_affinity_peer_status_t))
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        shctx = ascf->counter_zone->data;
        zone = shctx->zone;

        /* requests of workers that died are not in flight any more */

        ngx_http_upstream_affinity_reap(shctx, r->connection->log);

        for (j = 0; j < view->npeers + view->nbackup; j++) {

            ps = ngx_array_push(&us->peers);
            if (ps == NULL) {
                return NGX_ERROR;
            }

            ps->name = view->names[j];
            ps->backup = (j >= view->npeers);

            /*
             * The slot the view has, or the one the peer claimed since;
             * a peer without one is reported as not counted, with zeros,
             * never with another peer's figures.
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

            /* what its replies taught of its cache is in the prefix zone */

            if (ascf->prefix_zone
                && ascf->prefix_zone != ascf->counter_zone)
            {
                prefixes = ascf->prefix_zone->data;

                ngx_shmtx_lock(&prefixes->shpool->mutex);
                slot = affinity_zone_peer_find(prefixes->zone,
                                               view->peers[j].id);
                ngx_shmtx_unlock(&prefixes->shpool->mutex);

                affinity_zone_peer_stats(prefixes->zone, slot, &learned);

                ps->stats.learned_tokens = (learned.id == view->peers[j].id)
                                           ? learned.learned_tokens : 0;
            }
        }
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


static ngx_int_t
ngx_http_upstream_affinity_json(ngx_http_request_t *r, ngx_array_t *upstreams,
    ngx_chain_t *out)
{
    char                                          *text;
    size_t                                         len;
    json_int_t                                     n;
    const char                                    *name;
    json_t                                        *root, *all, *u, *list, *p;
    json_t                                        *routes, *totals, *zones;
    json_t                                        *fallbacks;
    double                                         presumed;
    uint32_t                                       instances, learned;
    uint32_t                                       met;
    ngx_buf_t                                     *b;
    affinity_zone_info_t                           info;
    ngx_uint_t                                     i, j, k;
    ngx_http_upstream_affinity_shctx_t            *shctx;
    ngx_http_upstream_affinity_peer_status_t      *ps;
    ngx_http_upstream_affinity_upstream_status_t  *us;

    root = json_object();
    all = json_object();

    if (root == NULL || all == NULL
        || json_object_set_new(root, "version",
                               json_string(AFFINITY_VERSION))
        || json_object_set_new(root, "nginx", json_string(NGINX_VERSION))
        || json_object_set_new(root, "upstreams", all))
    {
        json_decref(root);
        return NGX_ERROR;
    }

    us = upstreams->elts;

    for (i = 0; i < upstreams->nelts; i++) {
        u = json_object();
        list = json_array();
        totals = json_object();
        zones = json_object();

        /*
         * this instance and the others it heard from (affinity_store), and
         * what routing presumes they send unseen, under the lock their
         * table is written under
         */

        shctx = us[i].conf->counter_zone->data;

        ngx_shmtx_lock(&shctx->shpool->mutex);
        instances = affinity_zone_instances(shctx->zone,
                                            (uint32_t) ngx_time());
        presumed = affinity_zone_unheard_presumed(shctx->zone,
                                                  (uint32_t) ngx_time(),
                                                  &learned, &met);
        ngx_shmtx_unlock(&shctx->shpool->mutex);

        if (u == NULL || list == NULL || totals == NULL || zones == NULL
            || json_object_setn_new(all, (char *) us[i].name.data,
                                    us[i].name.len, u)
            || json_object_set_new(u, "balance",
                   json_pack("{s:f,s:i,s:i,s:f,s:i,s:i}",
                             "factor", (double) us[i].conf->factor / 1000,
                             "slack", (json_int_t) us[i].conf->slack,
                             "instances", (json_int_t) instances,
                             "unheard_presumed", presumed,
                             "unheard_learned", (json_int_t) learned,
                             "unheard_met", (json_int_t) met))
            || json_object_set_new(u, "zones", zones)
            || json_object_set_new(u, "peers", list)
            || json_object_set_new(u, "routes", totals))
        {
            json_decref(list);
            json_decref(totals);
            json_decref(zones);
            goto failed;
        }

        if (us[i].conf->store_conf
            && json_object_set_new(u, "store",
                   ngx_http_upstream_affinity_json_store(us[i].conf)))
        {
            goto failed;
        }

        if (us[i].conf->session_zone
            && json_object_set_new(zones, "sessions",
                   ngx_http_upstream_affinity_json_zone(
                                                   us[i].conf->session_zone)))
        {
            goto failed;
        }

        if (us[i].conf->prefix_zone
            && json_object_set_new(zones, "prefixes",
                   ngx_http_upstream_affinity_json_zone(
                                                   us[i].conf->prefix_zone)))
        {
            goto failed;
        }

        if (us[i].conf->response_zone
            && json_object_set_new(zones, "responses",
                   ngx_http_upstream_affinity_json_zone(
                                                 us[i].conf->response_zone)))
        {
            goto failed;
        }

        for (k = 1; k < AFFINITY_ROUTES; k++) {
            name = (const char *)
                       ngx_http_upstream_affinity_route_names[k].data;

            if (json_object_set_new(totals, name, json_integer(0))) {
                goto failed;
            }
        }

        /* requests balanced without their body, by reason */

        fallbacks = json_object();

        if (fallbacks == NULL
            || json_object_set_new(u, "fallbacks", fallbacks))
        {
            goto failed;
        }

        ngx_http_upstream_affinity_zone_info(us[i].conf->counter_zone, &info);

        for (k = 0; k < AFFINITY_FALLBACKS; k++) {
            if (json_object_set_new(fallbacks,
                    ngx_http_upstream_affinity_fallback_names[k],
                    json_integer((json_int_t) info.fallbacks[k])))
            {
                goto failed;
            }
        }

        ps = us[i].peers.elts;

        for (j = 0; j < us[i].peers.nelts; j++) {
            routes = json_object();
            p = json_pack("{s:s%,s:b,s:b,s:I,s:I,s:I,s:I}",
                          "name", (char *) ps[j].name.data, ps[j].name.len,
                          "backup", (int) ps[j].backup,
                          "counted", (int) ps[j].counted,
                          "inflight", (json_int_t)
                                      ngx_max(ps[j].stats.inflight, 0),
                          "requests", (json_int_t) ps[j].stats.requests,
                          "failures", (json_int_t) ps[j].stats.failures,
                          "pins", (json_int_t) ngx_max(ps[j].stats.pins, 0));

            if (routes == NULL || p == NULL || json_array_append_new(list, p)
                || json_object_set_new(p, "routes", routes))
            {
                json_decref(routes);
                goto failed;
            }

            /* the size its replies taught of its cache, once they did */

            if (ps[j].stats.learned_tokens
                && json_object_set_new(p, "learned_cache_tokens",
                       json_integer((json_int_t)
                                    ps[j].stats.learned_tokens)))
            {
                goto failed;
            }

            /* what its replies taught of its speed (its pace) */

            if (json_object_set_new(p, "pace",
                    ngx_http_upstream_affinity_json_pace(&ps[j])))
            {
                goto failed;
            }

            /* the engine's own figures (affinity_metrics), once it gave any */

            if (ps[j].stats.engine_load >= 0
                && json_object_set_new(p, "engine",
                       json_pack("{s:I,s:f,s:I,s:I,s:I,s:I}",
                                 "load", (json_int_t) ps[j].stats.engine_load,
                                 "cache_usage", ps[j].stats.cache_usage,
                                 "cache_tokens",
                                 (json_int_t) ps[j].stats.cache_tokens,
                                 "age", (json_int_t) (ngx_time()
                                              - ps[j].stats.engine_time),
                                 "elsewhere",
                                 (json_int_t) ps[j].stats.engine_elsewhere,
                                 "unheard",
                                 (json_int_t) ps[j].stats.unheard)))
            {
                goto failed;
            }

            for (k = 1; k < AFFINITY_ROUTES; k++) {
                n = (json_int_t) ps[j].stats.routes[k];
                name = (const char *)
                           ngx_http_upstream_affinity_route_names[k].data;

                if (json_object_set_new(routes, name, json_integer(n))
                    || json_object_set_new(totals, name,
                           json_integer(json_integer_value(
                                            json_object_get(totals, name))
                                        + n)))
                {
                    goto failed;
                }
            }
        }
    }

    /* 15 digits: 0.1 is written 0.1, not 0.10000000000000001 */

    text = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
    json_decref(root);

    if (text == NULL) {
        return NGX_ERROR;
    }

    len = ngx_strlen(text);

    b = ngx_create_temp_buf(r->pool, len + 1);
    if (b == NULL) {
        free(text);
        return NGX_ERROR;
    }

    b->last = ngx_cpymem(b->last, text, len);
    *b->last++ = '\n';
    free(text);

    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    out->buf = b;
    out->next = NULL;

    r->headers_out.content_length_n = b->last - b->pos;

    return NGX_OK;

failed:

    json_decref(root);
    return NGX_ERROR;
}


/*
 * The pace of a peer: the replies it was learned from, the prefill time of
 * a thousand prompt tokens it does not hold, the decode time of an output
 * token, the wait before prefill of a request sent now (behind its
 * requests in flight), and the prompt characters a token; null while
 * unknown.
 */

static json_t *
ngx_http_upstream_affinity_json_pace(
    ngx_http_upstream_affinity_peer_status_t *ps)
{
    affinity_peer_pace_t  *pace;

    pace = &ps->pace;

    return json_pack("{s:I,s:o,s:o,s:o,s:o}",
                     "replies", (json_int_t) pace->replies,
                     "prefill_ms_per_ktoken",
                     ngx_http_upstream_affinity_json_figure(
                         pace->prefill_ns ? (int64_t) pace->prefill_ns : -1,
                         1000),
                     "decode_ms_per_token",
                     ngx_http_upstream_affinity_json_figure(
                         pace->decode_us ? (int64_t) pace->decode_us : -1,
                         1000),
                     "wait_ms",
                     ngx_http_upstream_affinity_json_figure(
                         ngx_http_upstream_affinity_wait(ps), 1000),
                     "chars_per_token",
                     ngx_http_upstream_affinity_json_figure(
                         pace->chars_per_token
                         ? (int64_t) pace->chars_per_token : -1, 256));
}


/*
 * The wait before prefill of a request sent to the peer now, behind its
 * requests in flight, in microseconds; -1 while unknown.
 */

static int64_t
ngx_http_upstream_affinity_wait(ngx_http_upstream_affinity_peer_status_t *ps)
{
    int64_t  queued;

    queued = ngx_min(ngx_max(ps->stats.inflight, 0), AFFINITY_PACE_QUEUES - 1);

    return ps->pace.wait_us[queued];
}


/* v / unit, or null when v is negative (unknown) */

static json_t *
ngx_http_upstream_affinity_json_figure(int64_t v, double unit)
{
    return (v < 0) ? json_null() : json_real((double) v / unit);
}


static json_t *
ngx_http_upstream_affinity_json_zone(ngx_shm_zone_t *shm_zone)
{
    affinity_zone_info_t  info;

    ngx_http_upstream_affinity_zone_info(shm_zone, &info);

    return json_pack("{s:s%,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,"
                     "s:{s:I,s:I,s:I,s:I,s:I}}",
                     "name", (char *) shm_zone->shm.name.data,
                     shm_zone->shm.name.len,
                     "size", (json_int_t) shm_zone->shm.size,
                     "capacity", (json_int_t) info.capacity,
                     "entries", (json_int_t) info.used,
                     "inserts", (json_int_t) info.inserts,
                     "evictions", (json_int_t) info.evictions,
                     "expiries", (json_int_t) info.expiries,
                     "peer_slots", (json_int_t) info.peer_slots_used,
                     "peer_slots_reclaimed",
                     (json_int_t) info.peer_slots_reclaimed,
                     "peer_slots_missing",
                     (json_int_t) info.peer_slots_missing,
                     "conflicts", (json_int_t) info.conflicts,
                     "workers",
                     "rows", (json_int_t) info.rows,
                     "rows_used", (json_int_t) info.rows_used,
                     "rows_missing", (json_int_t) info.rows_missing,
                     "reaped", (json_int_t) info.rows_reaped,
                     "inflight_recovered",
                     (json_int_t) info.inflight_recovered);
}


/* the store's counters of an upstream, summed over the instance's workers */

static json_t *
ngx_http_upstream_affinity_json_store(
    ngx_http_upstream_affinity_srv_conf_t *ascf)
{
    json_t                                       *o;
    ngx_uint_t                                    k;
    ngx_http_upstream_affinity_store_event_t     *e;
    ngx_http_upstream_affinity_store_counters_t  *c;

    c = ngx_http_upstream_affinity_store_counters(ascf);
    o = json_object();

    if (o == NULL || c == NULL
        || json_object_set_new(o, "secret",
                               json_boolean(ascf->store_conf->secret)))
    {
        json_decref(o);
        return NULL;
    }

    for (k = 0; k < NGX_HTTP_UPSTREAM_AFFINITY_STORE_EVENTS; k++) {
        e = &ngx_http_upstream_affinity_store_events[k];

        if (json_object_set_new(o, e->name,
                json_integer((json_int_t)
                             ngx_http_upstream_affinity_store_value(c, e))))
        {
            json_decref(o);
            return NULL;
        }
    }

    return o;
}


/*
 * The Prometheus text format: each family once, with HELP and TYPE, then
 * its samples for every upstream and peer.
 */

typedef enum {
    NGX_HTTP_UPSTREAM_AFFINITY_INFLIGHT = 0,
    NGX_HTTP_UPSTREAM_AFFINITY_REQUESTS,
    NGX_HTTP_UPSTREAM_AFFINITY_FAILURES,
    NGX_HTTP_UPSTREAM_AFFINITY_PINS,
    NGX_HTTP_UPSTREAM_AFFINITY_ENGINE_LOAD,
    NGX_HTTP_UPSTREAM_AFFINITY_ENGINE_CACHE_TOKENS,
    NGX_HTTP_UPSTREAM_AFFINITY_LEARNED_CACHE_TOKENS,
    NGX_HTTP_UPSTREAM_AFFINITY_PACE_REPLIES,
    NGX_HTTP_UPSTREAM_AFFINITY_PACE_PREFILL,    /* from here: nanoseconds */
    NGX_HTTP_UPSTREAM_AFFINITY_PACE_DECODE,
    NGX_HTTP_UPSTREAM_AFFINITY_PACE_WAIT,
    NGX_HTTP_UPSTREAM_AFFINITY_PEER_METRICS
} ngx_http_upstream_affinity_metric_e;


static const char  *ngx_http_upstream_affinity_peer_metrics[][3] = {
    { "nginx_upstream_affinity_peer_inflight", "gauge",
      "Requests in flight to the peer, from all workers." },
    { "nginx_upstream_affinity_peer_requests_total", "counter",
      "Requests sent to the peer (each try counts)." },
    { "nginx_upstream_affinity_peer_failures_total", "counter",
      "Tries that failed on the peer." },
    { "nginx_upstream_affinity_peer_pins", "gauge",
      "Sessions pinned to the peer." },
    { "nginx_upstream_affinity_peer_engine_load", "gauge",
      "Requests running and waiting, as the peer's engine last reported "
      "them (affinity_metrics)." },
    { "nginx_upstream_affinity_peer_engine_cache_tokens", "gauge",
      "The tokens the peer's KV cache holds, as its engine reported them "
      "(affinity_metrics)." },
    { "nginx_upstream_affinity_peer_learned_cache_tokens", "gauge",
      "The prompt tokens a prefix lasts in the peer's KV cache, as its "
      "replies taught (prefix_affinity without cache=)." },
    { "nginx_upstream_affinity_peer_pace_replies_total", "counter",
      "Replies the peer's pace was learned from." },
    { "nginx_upstream_affinity_peer_prefill_seconds_per_token", "gauge",
      "The prefill time of a prompt token the peer does not hold, as its "
      "replies taught." },
    { "nginx_upstream_affinity_peer_decode_seconds_per_token", "gauge",
      "The time of an output token of the peer's streams, as its replies "
      "taught." },
    { "nginx_upstream_affinity_peer_estimated_wait_seconds", "gauge",
      "The wait before prefill of a request sent to the peer now, behind "
      "its requests in flight, as its replies taught." }
};


/* the load bound's parameters (affinity_balance): name, help */

static const char  *ngx_http_upstream_affinity_balance_metrics[][2] = {
    { "nginx_upstream_affinity_balance_factor",
      "The load bound's factor (affinity_balance)." },
    { "nginx_upstream_affinity_balance_slack",
      "The load bound's slack in requests (affinity_balance)." }
};


/* the zone families and the field of affinity_zone_info_t each reports */

typedef enum {
    NGX_HTTP_UPSTREAM_AFFINITY_ZONE_CAPACITY = 0,
    NGX_HTTP_UPSTREAM_AFFINITY_ZONE_ENTRIES,
    NGX_HTTP_UPSTREAM_AFFINITY_ZONE_INSERTS,
    NGX_HTTP_UPSTREAM_AFFINITY_ZONE_EVICTIONS,
    NGX_HTTP_UPSTREAM_AFFINITY_ZONE_EXPIRIES,
    NGX_HTTP_UPSTREAM_AFFINITY_ZONE_SLOTS,
    NGX_HTTP_UPSTREAM_AFFINITY_ZONE_SLOTS_RECLAIMED,
    NGX_HTTP_UPSTREAM_AFFINITY_ZONE_SLOTS_MISSING,
    NGX_HTTP_UPSTREAM_AFFINITY_ZONE_ROWS_USED,
    NGX_HTTP_UPSTREAM_AFFINITY_ZONE_ROWS_MISSING,
    NGX_HTTP_UPSTREAM_AFFINITY_ZONE_REAPED,
    NGX_HTTP_UPSTREAM_AFFINITY_ZONE_RECOVERED,
    NGX_HTTP_UPSTREAM_AFFINITY_ZONE_CONFLICTS
} ngx_http_upstream_affinity_zone_value_e;


static ngx_http_upstream_affinity_metric_t
    ngx_http_upstream_affinity_zone_metrics[] =
{
    { "nginx_upstream_affinity_zone_capacity", "gauge",
      "Entries the zone holds at most.",
      NGX_HTTP_UPSTREAM_AFFINITY_ZONE_CAPACITY },
    { "nginx_upstream_affinity_zone_entries", "gauge",
      "Entries in use.",
      NGX_HTTP_UPSTREAM_AFFINITY_ZONE_ENTRIES },
    { "nginx_upstream_affinity_zone_inserts_total", "counter",
      "Entries added: sessions pinned, prompt levels recorded, response "
      "ids learned.",
      NGX_HTTP_UPSTREAM_AFFINITY_ZONE_INSERTS },
    { "nginx_upstream_affinity_zone_evictions_total", "counter",
      "Entries evicted to make room (least recently used).",
      NGX_HTTP_UPSTREAM_AFFINITY_ZONE_EVICTIONS },
    { "nginx_upstream_affinity_zone_expiries_total", "counter",
      "Entries dropped after their idle timeout.",
      NGX_HTTP_UPSTREAM_AFFINITY_ZONE_EXPIRIES },
    { "nginx_upstream_affinity_zone_peer_slots", "gauge",
      "Peer counter slots in use (at most 256).",
      NGX_HTTP_UPSTREAM_AFFINITY_ZONE_SLOTS },
    { "nginx_upstream_affinity_zone_peer_slots_reclaimed_total", "counter",
      "Peer counter slots handed from an idle peer to a new one.",
      NGX_HTTP_UPSTREAM_AFFINITY_ZONE_SLOTS_RECLAIMED },
    { "nginx_upstream_affinity_zone_peer_slots_missing_total", "counter",
      "Times a peer found no counter slot (balanced without its in-flight "
      "count).",
      NGX_HTTP_UPSTREAM_AFFINITY_ZONE_SLOTS_MISSING },
    { "nginx_upstream_affinity_zone_worker_rows_used", "gauge",
      "Worker processes counting their requests in the zone.",
      NGX_HTTP_UPSTREAM_AFFINITY_ZONE_ROWS_USED },
    { "nginx_upstream_affinity_zone_worker_rows_missing_total", "counter",
      "Workers that found no free row.",
      NGX_HTTP_UPSTREAM_AFFINITY_ZONE_ROWS_MISSING },
    { "nginx_upstream_affinity_zone_workers_reaped_total", "counter",
      "Workers found dead with their row still claimed.",
      NGX_HTTP_UPSTREAM_AFFINITY_ZONE_REAPED },
    { "nginx_upstream_affinity_zone_inflight_recovered_total", "counter",
      "In-flight requests of dead workers given back.",
      NGX_HTTP_UPSTREAM_AFFINITY_ZONE_RECOVERED },
    { "nginx_upstream_affinity_zone_conflicts_total", "counter",
      "Response ids refused to a server because another one holds them.",
      NGX_HTTP_UPSTREAM_AFFINITY_ZONE_CONFLICTS }
};


static uint64_t
ngx_http_upstream_affinity_zone_value(affinity_zone_info_t *info,
    ngx_uint_t value)
{
    switch (value) {
    case NGX_HTTP_UPSTREAM_AFFINITY_ZONE_CAPACITY:
        return info->capacity;
    case NGX_HTTP_UPSTREAM_AFFINITY_ZONE_ENTRIES:
        return info->used;
    case NGX_HTTP_UPSTREAM_AFFINITY_ZONE_INSERTS:
        return info->inserts;
    case NGX_HTTP_UPSTREAM_AFFINITY_ZONE_EVICTIONS:
        return info->evictions;
    case NGX_HTTP_UPSTREAM_AFFINITY_ZONE_EXPIRIES:
        return info->expiries;
    case NGX_HTTP_UPSTREAM_AFFINITY_ZONE_SLOTS:
        return info->peer_slots_used;
    case NGX_HTTP_UPSTREAM_AFFINITY_ZONE_SLOTS_RECLAIMED:
        return info->peer_slots_reclaimed;
    case NGX_HTTP_UPSTREAM_AFFINITY_ZONE_SLOTS_MISSING:
        return info->peer_slots_missing;
    case NGX_HTTP_UPSTREAM_AFFINITY_ZONE_ROWS_USED:
        return info->rows_used;
    case NGX_HTTP_UPSTREAM_AFFINITY_ZONE_ROWS_MISSING:
        return info->rows_missing;
    case NGX_HTTP_UPSTREAM_AFFINITY_ZONE_REAPED:
        return info->rows_reaped;
    case NGX_HTTP_UPSTREAM_AFFINITY_ZONE_RECOVERED:
        return info->inflight_recovered;
    default: /* NGX_HTTP_UPSTREAM_AFFINITY_ZONE_CONFLICTS */
        return info->conflicts;
    }
}


/* appends ",name" to a comma-separated list of label values */

static ngx_int_t
ngx_http_upstream_affinity_join(ngx_pool_t *pool, ngx_str_t *list,
    ngx_str_t *name)
{
    u_char  *p;

    p = ngx_pnalloc(pool, list->len + 1 + name->len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    list->data = ngx_sprintf(ngx_cpymem(p, list->data, list->len), ",%V",
                             name);
    list->len = list->data - p;
    list->data = p;

    return NGX_OK;
}


static ngx_int_t
ngx_http_upstream_affinity_prometheus(ngx_http_request_t *r,
    ngx_array_t *upstreams, ngx_chain_t *out)
{
    u_char                                        *last;
    u_char                                         number[NGX_INT64_LEN + 2];
    int64_t                                        v;
    ngx_uint_t                                     i, j, k, m, nzones;
    ngx_shm_zone_t                                *zone;
    ngx_http_upstream_affinity_text_t              t;
    ngx_http_upstream_affinity_metric_t           *metric;
    ngx_http_upstream_affinity_zone_status_t       zones[
                                      NGX_HTTP_UPSTREAM_AFFINITY_STATUS_ZONES];
    ngx_http_upstream_affinity_peer_status_t      *ps;
    ngx_http_upstream_affinity_upstream_status_t  *us;
    ngx_http_upstream_affinity_store_event_t      *event;
    ngx_http_upstream_affinity_store_counters_t   *counters;
    ngx_uint_t                                     stores;
    affinity_zone_info_t                           info;

    ngx_memzero(&t, sizeof(ngx_http_upstream_affinity_text_t));
    stores = 0;
    t.r = r;
    t.last = &t.out;

    if (ngx_http_upstream_affinity_printf(&t,
            "# HELP nginx_upstream_affinity_info The module's version and "
            "the nginx it runs in.\n"
            "# TYPE nginx_upstream_affinity_info gauge\n"
            "nginx_upstream_affinity_info{version=\"%s\",nginx=\"%s\"} 1\n",
            AFFINITY_VERSION, NGINX_VERSION)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    us = upstreams->elts;

    /* label values, escaped once for all the families that use them */

    for (i = 0; i < upstreams->nelts; i++) {
        us[i].label = ngx_http_upstream_affinity_label(r->pool, &us[i].name);
        if (us[i].label == NULL) {
            return NGX_ERROR;
        }

        ps = us[i].peers.elts;

        for (j = 0; j < us[i].peers.nelts; j++) {
            ps[j].label = ngx_http_upstream_affinity_label(r->pool,
                                                           &ps[j].name);
            if (ps[j].label == NULL) {
                return NGX_ERROR;
            }
        }
    }

    for (m = 0; m < NGX_HTTP_UPSTREAM_AFFINITY_PEER_METRICS; m++) {
        if (ngx_http_upstream_affinity_printf(&t,
                "# HELP %s %s\n# TYPE %s %s\n",
                ngx_http_upstream_affinity_peer_metrics[m][0],
                ngx_http_upstream_affinity_peer_metrics[m][2],
                ngx_http_upstream_affinity_peer_metrics[m][0],
                ngx_http_upstream_affinity_peer_metrics[m][1])
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        for (i = 0; i < upstreams->nelts; i++) {
            ps = us[i].peers.elts;

            for (j = 0; j < us[i].peers.nelts; j++) {

                switch (m) {
                case NGX_HTTP_UPSTREAM_AFFINITY_INFLIGHT:
                    v = ngx_max(ps[j].stats.inflight, 0);
                    break;
                case NGX_HTTP_UPSTREAM_AFFINITY_REQUESTS:
                    v = (int64_t) ps[j].stats.requests;
                    break;
                case NGX_HTTP_UPSTREAM_AFFINITY_FAILURES:
                    v = (int64_t) ps[j].stats.failures;
                    break;
                case NGX_HTTP_UPSTREAM_AFFINITY_PINS:
                    v = ngx_max(ps[j].stats.pins, 0);
                    break;
                case NGX_HTTP_UPSTREAM_AFFINITY_ENGINE_LOAD:
                    v = ps[j].stats.engine_load;
                    break;
                case NGX_HTTP_UPSTREAM_AFFINITY_ENGINE_CACHE_TOKENS:
                    v = ps[j].stats.cache_tokens
                        ? (int64_t) ps[j].stats.cache_tokens : -1;
                    break;
                case NGX_HTTP_UPSTREAM_AFFINITY_LEARNED_CACHE_TOKENS:
                    v = ps[j].stats.learned_tokens
                        ? (int64_t) ps[j].stats.learned_tokens : -1;
                    break;
                case NGX_HTTP_UPSTREAM_AFFINITY_PACE_REPLIES:
                    v = ps[j].pace.replies;
                    break;
                case NGX_HTTP_UPSTREAM_AFFINITY_PACE_PREFILL:
                    v = ps[j].pace.prefill_ns
                        ? (int64_t) ps[j].pace.prefill_ns : -1;
                    break;
                case NGX_HTTP_UPSTREAM_AFFINITY_PACE_DECODE:
                    v = ps[j].pace.decode_us
                        ? (int64_t) ps[j].pace.decode_us * 1000 : -1;
                    break;
                default: /* NGX_HTTP_UPSTREAM_AFFINITY_PACE_WAIT */
                    v = ngx_http_upstream_affinity_wait(&ps[j]);
                    v = (v < 0) ? -1 : v * 1000;
                    break;
                }

                if (v < 0) {
                    continue;   /* never reported, or not learned yet */
                }

                last = (m >= NGX_HTTP_UPSTREAM_AFFINITY_PACE_PREFILL)
                       ? ngx_http_upstream_affinity_decimal(number, v)
                       : ngx_sprintf(number, "%L", v);

                if (ngx_http_upstream_affinity_printf(&t,
                        "%s{upstream=\"%V\",peer=\"%V\",backup=\"%s\"} %*s\n",
                        ngx_http_upstream_affinity_peer_metrics[m][0],
                        us[i].label, ps[j].label,
                        ps[j].backup ? "true" : "false",
                        (size_t) (last - number), number)
                    != NGX_OK)
                {
                    return NGX_ERROR;
                }
            }
        }
    }

    /* the bound's parameters, so that a dashboard can draw the bound */

    for (m = 0; m < 2; m++) {
        if (ngx_http_upstream_affinity_printf(&t,
                "# HELP %s %s\n# TYPE %s gauge\n",
                ngx_http_upstream_affinity_balance_metrics[m][0],
                ngx_http_upstream_affinity_balance_metrics[m][1],
                ngx_http_upstream_affinity_balance_metrics[m][0])
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        for (i = 0; i < upstreams->nelts; i++) {

            /* per mille: the factor as configured, the slack whole */

            k = (m == 0) ? us[i].conf->factor : us[i].conf->slack * 1000;

            if (ngx_http_upstream_affinity_printf(&t,
                    (k % 1000) ? "%s{upstream=\"%V\"} %ui.%03ui\n"
                               : "%s{upstream=\"%V\"} %ui\n",
                    ngx_http_upstream_affinity_balance_metrics[m][0],
                    us[i].label, k / 1000, k % 1000)
                != NGX_OK)
            {
                return NGX_ERROR;
            }
        }
    }

    if (ngx_http_upstream_affinity_printf(&t,
            "# HELP nginx_upstream_affinity_routes_total Requests by how "
            "they were routed.\n"
            "# TYPE nginx_upstream_affinity_routes_total counter\n")
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    for (i = 0; i < upstreams->nelts; i++) {
        ps = us[i].peers.elts;

        for (j = 0; j < us[i].peers.nelts; j++) {
            for (k = 1; k < AFFINITY_ROUTES; k++) {
                if (ngx_http_upstream_affinity_printf(&t,
                        "nginx_upstream_affinity_routes_total{upstream=\"%V\","
                        "peer=\"%V\",route=\"%V\"} %uL\n",
                        us[i].label, ps[j].label,
                        &ngx_http_upstream_affinity_route_names[k],
                        ps[j].stats.routes[k])
                    != NGX_OK)
                {
                    return NGX_ERROR;
                }
            }
        }
    }

    if (ngx_http_upstream_affinity_printf(&t,
            "# HELP nginx_upstream_affinity_fallbacks_total Requests "
            "balanced without their body, by reason.\n"
            "# TYPE nginx_upstream_affinity_fallbacks_total counter\n")
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    for (i = 0; i < upstreams->nelts; i++) {
        ngx_http_upstream_affinity_zone_info(us[i].conf->counter_zone, &info);

        for (k = 0; k < AFFINITY_FALLBACKS; k++) {
            if (ngx_http_upstream_affinity_printf(&t,
                    "nginx_upstream_affinity_fallbacks_total{upstream=\"%V\","
                    "reason=\"%s\"} %uL\n",
                    us[i].label, ngx_http_upstream_affinity_fallback_names[k],
                    info.fallbacks[k])
                != NGX_OK)
            {
                return NGX_ERROR;
            }
        }
    }

    /* the store's counters, by event, where an upstream has a store */

    for (i = 0; i < upstreams->nelts; i++) {
        counters = ngx_http_upstream_affinity_store_counters(us[i].conf);

        if (counters == NULL) {
            continue;
        }

        if (!stores++
            && ngx_http_upstream_affinity_printf(&t,
                "# HELP nginx_upstream_affinity_store_events_total What the "
                "store of the upstream took, refused and sent, by event "
                "(affinity_store).\n"
                "# TYPE nginx_upstream_affinity_store_events_total counter\n")
               != NGX_OK)
        {
            return NGX_ERROR;
        }

        for (k = 0; k < NGX_HTTP_UPSTREAM_AFFINITY_STORE_EVENTS; k++) {
            event = &ngx_http_upstream_affinity_store_events[k];

            if (ngx_http_upstream_affinity_printf(&t,
                    "nginx_upstream_affinity_store_events_total{upstream="
                    "\"%V\",event=\"%s\"} %uA\n",
                    us[i].label, event->name,
                    ngx_http_upstream_affinity_store_value(counters, event))
                != NGX_OK)
            {
                return NGX_ERROR;
            }
        }
    }

    /* zones, each once even when upstreams share it */

    nzones = 0;

    for (i = 0; i < upstreams->nelts; i++) {
        for (k = 0; k < 3; k++) {
            zone = (k == 0) ? us[i].conf->session_zone
                   : (k == 1) ? us[i].conf->prefix_zone
                   : us[i].conf->response_zone;

            if (zone == NULL) {
                continue;
            }

            for (j = 0; j < nzones; j++) {
                if (zones[j].zone == zone) {
                    break;
                }
            }

            if (j < nzones) {

                /* the upstreams sharing a zone are all named */

                if (ngx_http_upstream_affinity_join(r->pool,
                                                    &zones[j].upstreams,
                                                    us[i].label)
                    != NGX_OK)
                {
                    return NGX_ERROR;
                }

                continue;
            }

            if (nzones == NGX_HTTP_UPSTREAM_AFFINITY_STATUS_ZONES) {
                continue;
            }

            zones[nzones].zone = zone;
            zones[nzones].upstreams = *us[i].label;
            zones[nzones].kind = (k == 0) ? "sessions"
                                 : (k == 1) ? "prefixes" : "responses";
            zones[nzones].label = ngx_http_upstream_affinity_label(r->pool,
                                                            &zone->shm.name);
            if (zones[nzones].label == NULL) {
                return NGX_ERROR;
            }

            ngx_http_upstream_affinity_zone_info(zone, &zones[nzones].info);
            nzones++;
        }
    }

    /* each family once: HELP and TYPE, then its sample for every zone */

    for (m = 0; m < sizeof(ngx_http_upstream_affinity_zone_metrics)
                    / sizeof(ngx_http_upstream_affinity_zone_metrics[0]);
         m++)
    {
        metric = &ngx_http_upstream_affinity_zone_metrics[m];

        if (ngx_http_upstream_affinity_printf(&t,
                "# HELP %s %s\n# TYPE %s %s\n",
                metric->name, metric->help, metric->name, metric->type)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        for (j = 0; j < nzones; j++) {
            if (ngx_http_upstream_affinity_printf(&t,
                    "%s{zone=\"%V\",kind=\"%s\",upstream=\"%V\"} %uL\n",
                    metric->name, zones[j].label, zones[j].kind,
                    &zones[j].upstreams,
                    ngx_http_upstream_affinity_zone_value(&zones[j].info,
                                                          metric->value))
                != NGX_OK)
            {
                return NGX_ERROR;
            }
        }
    }

    if (t.b == NULL) {
        return NGX_ERROR;
    }

    t.b->last_buf = (r == r->main) ? 1 : 0;
    t.b->last_in_chain = 1;

    *out = *t.out;
    r->headers_out.content_length_n = t.len;

    return NGX_OK;
}


/* Appends formatted text, starting a new 4k buffer when one fills up. */

static ngx_int_t
ngx_http_upstream_affinity_printf(ngx_http_upstream_affinity_text_t *t,
    const char *fmt, ...)
{
    size_t        size;
    u_char       *p;
    va_list       args, copy;
    ngx_chain_t  *cl;

    /*
     * A line is written into the current buffer when a kilobyte is left
     * (names are escaped addresses and upstream names); one that fills the
     * room left may have been cut, and is written again into a buffer
     * twice that size: a zone shared by many upstreams has a long label.
     */

    size = 4096;

    va_start(args, fmt);

    for ( ;; ) {

        if (t->b == NULL || (size_t) (t->b->end - t->b->last) < size / 4) {
            cl = ngx_alloc_chain_link(t->r->pool);
            if (cl == NULL) {
                va_end(args);
                return NGX_ERROR;
            }

            t->b = ngx_create_temp_buf(t->r->pool, size);
            if (t->b == NULL) {
                va_end(args);
                return NGX_ERROR;
            }

            cl->buf = t->b;
            cl->next = NULL;
            *t->last = cl;
            t->last = &cl->next;
            t->cl = cl;
        }

        va_copy(copy, args);
        p = ngx_vslprintf(t->b->last, t->b->end, fmt, copy);
        va_end(copy);

        if (p < t->b->end) {
            break;
        }

        if (size >= 1024 * 1024) {
            va_end(args);
            return NGX_ERROR;
        }

        size = ngx_max(size, (size_t) (t->b->end - t->b->start)) * 2;

        if (t->b->last != t->b->pos) {
            t->b = NULL;        /* keep what it holds, add a larger one */
            continue;
        }

        /* nothing in it yet: a larger one takes its place in the chain */

        t->b = ngx_create_temp_buf(t->r->pool, size);
        if (t->b == NULL) {
            va_end(args);
            return NGX_ERROR;
        }

        t->cl->buf = t->b;
    }

    va_end(args);

    t->len += p - t->b->last;
    t->b->last = p;

    return NGX_OK;
}


/*
 * v billionths (v nanoseconds in seconds) in decimal, without the
 * trailing zeros of its fraction: 50000 is 0.00005.  v is not negative.
 */

static u_char *
ngx_http_upstream_affinity_decimal(u_char *p, int64_t v)
{
    int64_t  fraction, digit;

    p = ngx_sprintf(p, "%L", v / 1000000000);
    fraction = v % 1000000000;

    if (fraction) {
        *p++ = '.';
    }

    for (digit = 100000000; fraction; digit /= 10) {
        *p++ = (u_char) ('0' + fraction / digit);
        fraction %= digit;
    }

    return p;
}


/* A label value: backslash, double quote and line feed escaped. */

static ngx_str_t *
ngx_http_upstream_affinity_label(ngx_pool_t *pool, ngx_str_t *value)
{
    u_char     *p;
    ngx_str_t  *s;
    ngx_uint_t  i;

    s = ngx_palloc(pool, sizeof(ngx_str_t));
    if (s == NULL) {
        return NULL;
    }

    /* at most 200 bytes of a name: a sample line stays under 1k */

    s->data = ngx_pnalloc(pool, ngx_min(value->len, 200) * 2);
    if (s->data == NULL) {
        return NULL;
    }

    p = s->data;

    for (i = 0; i < value->len && i < 200; i++) {
        switch (value->data[i]) {
        case '\\':
            *p++ = '\\'; *p++ = '\\';
            break;
        case '"':
            *p++ = '\\'; *p++ = '"';
            break;
        case '\n':
            *p++ = '\\'; *p++ = 'n';
            break;
        default:
            *p++ = value->data[i];
        }
    }

    s->len = p - s->data;

    return s;
}

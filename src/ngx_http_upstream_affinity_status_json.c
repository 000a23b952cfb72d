
/*
 * affinity_status in JSON, built with jansson: the figures of
 * ngx_http_upstream_affinity_status.c, per upstream and peer.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>
#include <nginx.h>

#include <jansson.h>

#include "ngx_http_upstream_affinity_module.h"
#include "ngx_http_upstream_affinity_status.h"


static json_t *ngx_http_upstream_affinity_json_upstream(
    ngx_http_upstream_affinity_status_t *status,
    ngx_http_upstream_affinity_upstream_status_t *us);
static json_t *ngx_http_upstream_affinity_json_pace(
    ngx_http_upstream_affinity_peer_status_t *ps);
static json_t *ngx_http_upstream_affinity_json_figure(int64_t v,
    double unit);
static json_t *ngx_http_upstream_affinity_json_zone(
    ngx_http_upstream_affinity_zone_status_t *zs);
static json_t *ngx_http_upstream_affinity_json_store(
    ngx_http_upstream_affinity_upstream_status_t *us);


ngx_int_t
ngx_http_upstream_affinity_status_json(ngx_http_request_t *r,
    ngx_http_upstream_affinity_status_t *status, ngx_chain_t *out)
{
    char                                          *text;
    size_t                                         len;
    json_t                                        *root, *all, *u;
    ngx_buf_t                                     *b;
    ngx_uint_t                                     i;
    ngx_http_upstream_affinity_upstream_status_t  *us;

    root = json_object();
    if (root == NULL) {
        return NGX_ERROR;
    }

    /* json_object_set_new() takes its value, even when it fails */

    if (json_object_set_new(root, "version", json_string(AFFINITY_VERSION))
        || json_object_set_new(root, "nginx", json_string(NGINX_VERSION))
        || json_object_set_new(root, "upstreams", all = json_object()))
    {
        json_decref(root);
        return NGX_ERROR;
    }

    us = status->upstreams.elts;

    for (i = 0; i < status->upstreams.nelts; i++) {
        u = ngx_http_upstream_affinity_json_upstream(status, &us[i]);

        if (u == NULL
            || json_object_setn_new(all, (char *) us[i].name.data,
                                    us[i].name.len, u))
        {
            json_decref(root);
            return NGX_ERROR;
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
}


/* an upstream: its bound, zones, peers, routes, store and fallbacks */

static json_t *
ngx_http_upstream_affinity_json_upstream(
    ngx_http_upstream_affinity_status_t *status,
    ngx_http_upstream_affinity_upstream_status_t *us)
{
    json_int_t                                 n;
    const char                                *name;
    json_t                                    *u, *list, *p, *routes;
    json_t                                    *totals, *zones, *fallbacks;
    ngx_uint_t                                 j, k;
    ngx_http_upstream_affinity_zone_status_t  *zs;
    ngx_http_upstream_affinity_peer_status_t  *ps;

    u = json_object();
    if (u == NULL) {
        return NULL;
    }

    /* json_object_set_new() takes its value, even when it fails */

    if (json_object_set_new(u, "balance",
            json_pack("{s:f,s:i,s:i,s:f,s:i,s:i,s:f}",
                      "factor", (double) us->conf->factor / 1000,
                      "slack", (json_int_t) us->conf->slack,
                      "instances", (json_int_t) us->instances,
                      "unheard_presumed", us->unheard_presumed,
                      "unheard_learned", (json_int_t) us->unheard_learned,
                      "unheard_met", (json_int_t) us->unheard_met,
                      "unheard_beside", us->unheard_beside))
        || json_object_set_new(u, "zones", zones = json_object())
        || json_object_set_new(u, "peers", list = json_array())
        || json_object_set_new(u, "routes", totals = json_object()))
    {
        goto failed;
    }

    if (us->store
        && json_object_set_new(u, "store",
                               ngx_http_upstream_affinity_json_store(us)))
    {
        goto failed;
    }

    for (k = 0; k < NGX_HTTP_UPSTREAM_AFFINITY_TABLES; k++) {
        zs = &us->zones[k];

        if (zs->zone
            && json_object_set_new(zones, zs->kind,
                                   ngx_http_upstream_affinity_json_zone(zs)))
        {
            goto failed;
        }
    }

    for (k = 1; k < AFFINITY_ROUTES; k++) {
        name = (const char *) ngx_http_upstream_affinity_route_names[k].data;

        if (json_object_set_new(totals, name, json_integer(0))) {
            goto failed;
        }
    }

    /* requests balanced without their body, by reason */

    fallbacks = json_object();

    if (fallbacks == NULL || json_object_set_new(u, "fallbacks", fallbacks)) {
        goto failed;
    }

    for (k = 0; k < AFFINITY_FALLBACKS; k++) {
        if (json_object_set_new(fallbacks,
                                ngx_http_upstream_affinity_fallback_names[k],
                                json_integer((json_int_t) us->fallbacks[k])))
        {
            goto failed;
        }
    }

    ps = us->peers.elts;

    for (j = 0; j < us->peers.nelts; j++) {
        p = json_pack("{s:s%,s:b,s:b,s:I,s:I,s:I,s:I}",
                      "name", (char *) ps[j].name.data, ps[j].name.len,
                      "backup", (int) ps[j].backup,
                      "counted", (int) ps[j].counted,
                      "inflight", (json_int_t)
                                  ngx_max(ps[j].stats.inflight, 0),
                      "requests", (json_int_t) ps[j].stats.requests,
                      "failures", (json_int_t) ps[j].stats.failures,
                      "pins", (json_int_t) ngx_max(ps[j].stats.pins, 0));

        if (json_array_append_new(list, p)
            || json_object_set_new(p, "routes", routes = json_object()))
        {
            goto failed;
        }

        /* the size its replies taught of its cache, once they did */

        if (ps[j].stats.learned_tokens
            && json_object_set_new(p, "learned_cache_tokens",
                   json_integer((json_int_t) ps[j].stats.learned_tokens)))
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
                             "age", (json_int_t) (status->now
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

    return u;

failed:

    json_decref(u);
    return NULL;
}


/*
 * The pace of a peer: the replies it was learned from, the prefill time of
 * a thousand prompt tokens it does not hold, the decode time of an output
 * token, the wait before prefill of a request sent now (behind its
 * requests in flight), the prompt characters a token, null while unknown,
 * and the characters of prompts sent there whose first byte has not come.
 */

static json_t *
ngx_http_upstream_affinity_json_pace(
    ngx_http_upstream_affinity_peer_status_t *ps)
{
    affinity_peer_pace_t  *pace;

    pace = &ps->pace;

    return json_pack("{s:I,s:o,s:o,s:o,s:o,s:I}",
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
                     ngx_http_upstream_affinity_json_figure(ps->wait_us,
                                                            1000),
                     "chars_per_token",
                     ngx_http_upstream_affinity_json_figure(
                         pace->chars_per_token
                         ? (int64_t) pace->chars_per_token : -1, 256),
                     "backlog_chars", (json_int_t) pace->backlog_chars);
}


/* v / unit, or null when v is negative (unknown) */

static json_t *
ngx_http_upstream_affinity_json_figure(int64_t v, double unit)
{
    return (v < 0) ? json_null() : json_real((double) v / unit);
}


static json_t *
ngx_http_upstream_affinity_json_zone(
    ngx_http_upstream_affinity_zone_status_t *zs)
{
    ngx_shm_zone_t        *shm_zone;
    affinity_zone_info_t  *info;

    shm_zone = zs->zone;
    info = &zs->info;

    return json_pack("{s:s%,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,"
                     "s:{s:I,s:I,s:I,s:I,s:I}}",
                     "name", (char *) shm_zone->shm.name.data,
                     shm_zone->shm.name.len,
                     "size", (json_int_t) shm_zone->shm.size,
                     "capacity", (json_int_t) info->capacity,
                     "entries", (json_int_t) info->used,
                     "inserts", (json_int_t) info->inserts,
                     "evictions", (json_int_t) info->evictions,
                     "expiries", (json_int_t) info->expiries,
                     "peer_slots", (json_int_t) info->peer_slots_used,
                     "peer_slots_reclaimed",
                     (json_int_t) info->peer_slots_reclaimed,
                     "peer_slots_missing",
                     (json_int_t) info->peer_slots_missing,
                     "conflicts", (json_int_t) info->conflicts,
                     "workers",
                     "rows", (json_int_t) info->rows,
                     "rows_used", (json_int_t) info->rows_used,
                     "rows_missing", (json_int_t) info->rows_missing,
                     "reaped", (json_int_t) info->rows_reaped,
                     "inflight_recovered",
                     (json_int_t) info->inflight_recovered);
}


/* the store's counters of an upstream, summed over the instance's workers */

static json_t *
ngx_http_upstream_affinity_json_store(
    ngx_http_upstream_affinity_upstream_status_t *us)
{
    json_t                                    *o;
    ngx_http_upstream_affinity_store_event_t  *e;

    o = json_object();

    if (o == NULL
        || json_object_set_new(o, "secret",
                               json_boolean(us->conf->store_conf->secret)))
    {
        json_decref(o);
        return NULL;
    }

    for (e = ngx_http_upstream_affinity_store_events; e->name; e++) {
        if (json_object_set_new(o, e->name,
                json_integer((json_int_t)
                             ngx_http_upstream_affinity_store_value(us->store,
                                                                    e))))
        {
            json_decref(o);
            return NULL;
        }
    }

    return o;
}

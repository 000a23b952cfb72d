
/*
 * affinity_status in the Prometheus text exposition format: each family
 * once, with HELP and TYPE, then its samples for every upstream and peer,
 * from the figures of ngx_http_upstream_affinity_status.c.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>
#include <nginx.h>

#include "ngx_http_upstream_affinity_module.h"
#include "ngx_http_upstream_affinity_status.h"


/* a family: name, type, help, and what it reports */
typedef struct {
    const char                             *name;
    const char                             *type;
    const char                             *help;
    ngx_uint_t                              value;
} ngx_http_upstream_affinity_metric_t;


/* a zone in the response (each once, even if shared) */
typedef struct {
    ngx_http_upstream_affinity_zone_status_t  *status;
    ngx_str_t                              *label;  /* name, escaped */
    ngx_str_t                               upstreams; /* using it, escaped,
                                                          comma-separated */
} ngx_http_upstream_affinity_zone_series_t;


#define NGX_HTTP_UPSTREAM_AFFINITY_STATUS_ZONES  64


/* a response under construction */
typedef struct {
    ngx_http_request_t                     *r;
    ngx_chain_t                            *out;
    ngx_chain_t                           **last;
    ngx_chain_t                            *cl;     /* the last link */
    ngx_buf_t                              *b;      /* its buffer */
    size_t                                  len;
} ngx_http_upstream_affinity_text_t;


static uint64_t ngx_http_upstream_affinity_zone_value(
    affinity_zone_info_t *info, ngx_uint_t value);
static ngx_int_t ngx_http_upstream_affinity_join(ngx_pool_t *pool,
    ngx_str_t *list, ngx_str_t *name);
static ngx_int_t ngx_http_upstream_affinity_printf(
    ngx_http_upstream_affinity_text_t *t, const char *fmt, ...);
static u_char *ngx_http_upstream_affinity_decimal(u_char *p, int64_t v);
static ngx_str_t *ngx_http_upstream_affinity_label(ngx_pool_t *pool,
    ngx_str_t *value);


/* the peer families, and what each reports */

typedef enum {
    NGX_HTTP_UPSTREAM_AFFINITY_INFLIGHT = 0,
    NGX_HTTP_UPSTREAM_AFFINITY_REQUESTS,
    NGX_HTTP_UPSTREAM_AFFINITY_FAILURES,
    NGX_HTTP_UPSTREAM_AFFINITY_PINS,
    NGX_HTTP_UPSTREAM_AFFINITY_ENGINE_LOAD,
    NGX_HTTP_UPSTREAM_AFFINITY_ENGINE_CACHE_TOKENS,
    NGX_HTTP_UPSTREAM_AFFINITY_LEARNED_CACHE_TOKENS,
    NGX_HTTP_UPSTREAM_AFFINITY_PACE_REPLIES,
    NGX_HTTP_UPSTREAM_AFFINITY_PACE_BACKLOG,
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
    { "nginx_upstream_affinity_peer_backlog_chars", "gauge",
      "Characters of prompts sent the peer whose first byte has not come: "
      "the prefill a request sent now waits behind." },
    { "nginx_upstream_affinity_peer_prefill_seconds_per_token", "gauge",
      "The prefill time of a prompt token the peer does not hold, as its "
      "replies taught." },
    { "nginx_upstream_affinity_peer_decode_seconds_per_token", "gauge",
      "The time of an output token of the peer's streams, as its replies "
      "taught." },
    { "nginx_upstream_affinity_peer_estimated_wait_seconds", "gauge",
      "The wait before prefill of a request sent to the peer now, by "
      "routing's estimate: behind its requests in flight here and the "
      "prefill ahead of them." }
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


ngx_int_t
ngx_http_upstream_affinity_status_prometheus(ngx_http_request_t *r,
    ngx_http_upstream_affinity_status_t *status, ngx_chain_t *out)
{
    u_char                                        *last;
    u_char                                         number[NGX_INT64_LEN + 2];
    int64_t                                        v;
    ngx_uint_t                                     i, j, k, m, nzones;
    ngx_uint_t                                     stores;
    ngx_array_t                                   *upstreams;
    ngx_http_upstream_affinity_text_t              t;
    ngx_http_upstream_affinity_metric_t           *metric;
    ngx_http_upstream_affinity_zone_series_t       zones[
                                      NGX_HTTP_UPSTREAM_AFFINITY_STATUS_ZONES];
    ngx_http_upstream_affinity_zone_status_t      *zs;
    ngx_http_upstream_affinity_peer_status_t      *ps;
    ngx_http_upstream_affinity_upstream_status_t  *us;
    ngx_http_upstream_affinity_store_event_t      *event;

    upstreams = &status->upstreams;

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
                case NGX_HTTP_UPSTREAM_AFFINITY_PACE_BACKLOG:
                    v = (int64_t) ps[j].pace.backlog_chars;
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
                    v = ps[j].wait_us;
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
        for (k = 0; k < AFFINITY_FALLBACKS; k++) {
            if (ngx_http_upstream_affinity_printf(&t,
                    "nginx_upstream_affinity_fallbacks_total{upstream=\"%V\","
                    "reason=\"%s\"} %uL\n",
                    us[i].label, ngx_http_upstream_affinity_fallback_names[k],
                    us[i].fallbacks[k])
                != NGX_OK)
            {
                return NGX_ERROR;
            }
        }
    }

    /* the store's counters, by event, where an upstream has a store */

    for (i = 0; i < upstreams->nelts; i++) {
        if (us[i].store == NULL) {
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

        for (event = ngx_http_upstream_affinity_store_events;
             event->name;
             event++)
        {
            if (ngx_http_upstream_affinity_printf(&t,
                    "nginx_upstream_affinity_store_events_total{upstream="
                    "\"%V\",event=\"%s\"} %uA\n",
                    us[i].label, event->name,
                    ngx_http_upstream_affinity_store_value(us[i].store,
                                                           event))
                != NGX_OK)
            {
                return NGX_ERROR;
            }
        }
    }

    /* zones, each once even when upstreams share it */

    nzones = 0;

    for (i = 0; i < upstreams->nelts; i++) {
        for (k = 0; k < NGX_HTTP_UPSTREAM_AFFINITY_TABLES; k++) {
            zs = &us[i].zones[k];

            if (zs->zone == NULL) {
                continue;
            }

            for (j = 0; j < nzones; j++) {
                if (zones[j].status->zone == zs->zone) {
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

            zones[nzones].status = zs;
            zones[nzones].upstreams = *us[i].label;
            zones[nzones].label = ngx_http_upstream_affinity_label(r->pool,
                                                        &zs->zone->shm.name);
            if (zones[nzones].label == NULL) {
                return NGX_ERROR;
            }

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
                    metric->name, zones[j].label, zones[j].status->kind,
                    &zones[j].upstreams,
                    ngx_http_upstream_affinity_zone_value(
                        &zones[j].status->info, metric->value))
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

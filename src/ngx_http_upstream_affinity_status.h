
/*
 * affinity_status: the figures of one status request, gathered once from
 * the counters in shared memory (ngx_http_upstream_affinity_status.c), and
 * the two formats they are written in (..._status_json.c,
 * ..._status_prometheus.c).
 */


#ifndef _NGX_HTTP_UPSTREAM_AFFINITY_STATUS_H_INCLUDED_
#define _NGX_HTTP_UPSTREAM_AFFINITY_STATUS_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_upstream_affinity_module.h"


/* the tables of an upstream, in the order they are reported */
#define NGX_HTTP_UPSTREAM_AFFINITY_SESSIONS   0
#define NGX_HTTP_UPSTREAM_AFFINITY_PREFIXES   1
#define NGX_HTTP_UPSTREAM_AFFINITY_RESPONSES  2
#define NGX_HTTP_UPSTREAM_AFFINITY_TABLES     3


/* one peer of an upstream */
typedef struct {
    ngx_str_t                               name;
    ngx_str_t                              *label;  /* name, escaped, by
                                                       the Prometheus
                                                       format */
    ngx_uint_t                              backup;
    ngx_uint_t                              counted;  /* has its slot */
    affinity_peer_stats_t                   stats;
    affinity_peer_pace_t                    pace;
    int64_t                                 wait_us;  /* before prefill of
                                                         a request sent
                                                         now; -1: unknown */
} ngx_http_upstream_affinity_peer_status_t;


/* one table of an upstream: its zone, what the status calls it, its figures */
typedef struct {
    ngx_shm_zone_t                         *zone;   /* NULL: none */
    const char                             *kind;
    affinity_zone_info_t                    info;
} ngx_http_upstream_affinity_zone_status_t;


/* one affinity upstream */
typedef struct {
    ngx_str_t                               name;
    ngx_str_t                              *label;  /* name, escaped, by
                                                       the Prometheus
                                                       format */
    ngx_http_upstream_affinity_srv_conf_t  *conf;
    ngx_array_t                             peers;

    /* the instances it heard from (affinity_store), and what routing
       presumes they send unseen */
    uint32_t                                instances;
    double                                  unheard_presumed;
    uint32_t                                unheard_learned;
    uint32_t                                unheard_met;
    double                                  unheard_beside;

    /* requests balanced without their body, by affinity_fallback_e */
    uint64_t                                fallbacks[AFFINITY_FALLBACKS];

    ngx_http_upstream_affinity_zone_status_t
                                  zones[NGX_HTTP_UPSTREAM_AFFINITY_TABLES];

    /* its store's counters, summed over the instance's workers; NULL: it
       has no store */
    ngx_http_upstream_affinity_store_counters_t  *store;
} ngx_http_upstream_affinity_upstream_status_t;


/* the figures of a status request */
typedef struct {
    ngx_array_t                             upstreams;
    time_t                                  now;    /* when gathered */
} ngx_http_upstream_affinity_status_t;


/* a store counter, in both formats: name, offset, help */
typedef struct {
    const char                             *name;
    size_t                                  offset;
    const char                             *help;
} ngx_http_upstream_affinity_store_event_t;

#define ngx_http_upstream_affinity_store_value(counters, event)               \
    (*(ngx_atomic_t *) ((u_char *) (counters) + (event)->offset))


/* affinity_fallback_e, as the status names them */
extern const char  *ngx_http_upstream_affinity_fallback_names[
                                                       AFFINITY_FALLBACKS];

/* the store's counters, ending with a NULL name */
extern ngx_http_upstream_affinity_store_event_t
    ngx_http_upstream_affinity_store_events[];


ngx_int_t ngx_http_upstream_affinity_status_json(ngx_http_request_t *r,
    ngx_http_upstream_affinity_status_t *status, ngx_chain_t *out);
ngx_int_t ngx_http_upstream_affinity_status_prometheus(ngx_http_request_t *r,
    ngx_http_upstream_affinity_status_t *status, ngx_chain_t *out);


#endif /* _NGX_HTTP_UPSTREAM_AFFINITY_STATUS_H_INCLUDED_ */

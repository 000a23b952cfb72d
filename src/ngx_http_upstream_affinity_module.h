
/*
 * ngx_http_upstream_affinity_module: routes requests to LLM inference
 * replicas so that their KV caches are reused and none is overloaded.  The
 * nginx side (this shim) parses directives, owns the shared memory zones and
 * plugs into the upstream balancer; the decisions are made by the C++ core
 * behind affinity_core.h.
 */


#ifndef _NGX_HTTP_UPSTREAM_AFFINITY_MODULE_H_INCLUDED_
#define _NGX_HTTP_UPSTREAM_AFFINITY_MODULE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <affinity_core.h>

#include "ngx_http_upstream_affinity_compat.h"


#define NGX_HTTP_UPSTREAM_AFFINITY_HEADER  0
#define NGX_HTTP_UPSTREAM_AFFINITY_COOKIE  1
#define NGX_HTTP_UPSTREAM_AFFINITY_FIELD   2


typedef struct {
    ngx_uint_t                              type;
    ngx_str_t                               name;
} ngx_http_upstream_affinity_source_t;


#define NGX_HTTP_UPSTREAM_AFFINITY_SAMESITE_LAX     0
#define NGX_HTTP_UPSTREAM_AFFINITY_SAMESITE_STRICT  1
#define NGX_HTTP_UPSTREAM_AFFINITY_SAMESITE_NONE    2
#define NGX_HTTP_UPSTREAM_AFFINITY_SAMESITE_OFF     3


/* the cookie_* parameters of session_affinity while they are parsed */
typedef struct {
    ngx_str_t                               path;
    ngx_str_t                               domain;
    time_t                                  max_age;
    ngx_uint_t                              samesite;
    unsigned                                secure:1;
    unsigned                                set:1;  /* any was given */
} ngx_http_upstream_affinity_cookie_t;


/* shm_zone->data of an affinity zone */
typedef struct {
    ngx_slab_pool_t                        *shpool;
    affinity_zone_t                        *zone;
    affinity_zone_kind_e                    kind;
    ngx_shm_zone_t                         *shm_zone;
    ngx_array_t                             confs;  /* of srv conf pointers */
    ngx_cycle_t                            *cycle;  /* that configured it */
    uint32_t                                row;    /* this worker's row */
    unsigned                                counts:1; /* in-flight here */
} ngx_http_upstream_affinity_shctx_t;


/* reasons for balancing without the request body, each logged once */
typedef enum {
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_UNBUFFERED = 0,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_NOT_JSON,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_EMPTY,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_TOO_LARGE,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_READ,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_INVALID,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_MEMORY,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_PROMPT_NONE,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_RANDOM,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_LAST
} ngx_http_upstream_affinity_warning_e;


/* the request body while a request is analyzed: parsed once, on first use */
typedef struct {
    affinity_json_t                        *json;   /* the body loaded */
    u_char                                 *data;   /* padded for the parser */
    size_t                                  len;
    u_char                                 *map;    /* to unmap, or NULL */
    size_t                                  map_len;
    unsigned                                tried:1;
    unsigned                                loaded:1;
} ngx_http_upstream_affinity_body_t;


typedef struct {
    /* session_affinity */
    ngx_array_t                            *sources;
    ngx_str_t                               echo_header;
    ngx_str_t                               echo_cookie;
    ngx_str_t                               cookie_attributes;
    time_t                                  cookie_max_age;
    ngx_flag_t                              generate;
    ngx_shm_zone_t                         *session_zone;
    time_t                                  session_timeout;

    /* prefix_affinity */
    ngx_shm_zone_t                         *prefix_zone;
    time_t                                  prefix_timeout;
    uint32_t                               *schedule;   /* level lengths */
    ngx_uint_t                              nschedule;

    /* the zone holding the in-flight counters: sessions', else prefixes' */
    ngx_shm_zone_t                         *counter_zone;

    /* affinity_balance */
    ngx_uint_t                              factor;     /* per mille */
    ngx_uint_t                              slack;

    /* built by init_upstream from the configured peers */
    affinity_ring_t                        *ring;
    affinity_peer_t                        *peers;
    ngx_uint_t                              npeers;
    uint32_t                               *backup_slots;
    uint64_t                               *backup_ids;
    ngx_uint_t                              nbackup;

    /* the peer list generation the above were built for (nginx 1.27.3+) */
    ngx_uint_t                              config;
    unsigned                                dynamic:1;  /* built at run time */

    ngx_str_t                               name;       /* upstream name */
} ngx_http_upstream_affinity_srv_conf_t;


/* per request, shared by the balancer, the variables and the filter */
typedef struct {
    ngx_str_t                               key;
    ngx_uint_t                              route;      /* affinity_route_e */
    ngx_uint_t                              source;     /* key's source */
    ngx_uint_t                              prefix_len; /* matched level */
    affinity_level_t                       *levels;
    ngx_uint_t                              nlevels;
    unsigned                                keyed:1;
    unsigned                                generated:1;
    unsigned                                echo:1;     /* safe in a cookie */
    unsigned                                exposed:1;  /* in the variable */
    ngx_http_upstream_affinity_srv_conf_t  *conf;
} ngx_http_upstream_affinity_ctx_t;


#define NGX_HTTP_UPSTREAM_AFFINITY_GENERATED  ((ngx_uint_t) -1)


extern ngx_module_t  ngx_http_upstream_affinity_module;


ngx_int_t ngx_http_upstream_init_affinity_peer(ngx_http_request_t *r,
    ngx_http_upstream_srv_conf_t *us);
ngx_int_t ngx_http_upstream_affinity_build_peers(
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_rr_peers_t *peers, ngx_pool_t *pool, ngx_log_t *log);
void ngx_http_upstream_affinity_update_peers(
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_rr_peers_t *peers, ngx_log_t *log);
char *ngx_http_upstream_affinity_status(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
ngx_http_upstream_affinity_ctx_t *ngx_http_upstream_affinity_request(
    ngx_http_request_t *r, ngx_http_upstream_affinity_srv_conf_t *ascf);
ngx_int_t ngx_http_upstream_affinity_session_key(ngx_http_request_t *r,
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_affinity_ctx_t *ctx,
    ngx_http_upstream_affinity_body_t *body);
ngx_int_t ngx_http_upstream_affinity_prompt(ngx_http_request_t *r,
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_affinity_ctx_t *ctx,
    ngx_http_upstream_affinity_body_t *body);
ngx_int_t ngx_http_upstream_affinity_body_load(ngx_http_request_t *r,
    ngx_http_upstream_affinity_body_t *body);
void ngx_http_upstream_affinity_body_unload(
    ngx_http_upstream_affinity_body_t *body);
void ngx_http_upstream_affinity_body_exit(void);
void ngx_http_upstream_affinity_reap(ngx_http_upstream_affinity_shctx_t *shctx,
    ngx_log_t *log);
void ngx_http_upstream_affinity_warn(ngx_http_request_t *r,
    ngx_http_upstream_affinity_warning_e warning, const char *fmt,
    ngx_str_t *arg);


#endif /* _NGX_HTTP_UPSTREAM_AFFINITY_MODULE_H_INCLUDED_ */

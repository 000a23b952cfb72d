
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
#include <ngx_event.h>
#include <ngx_event_connect.h>
#include <ngx_http.h>

#include <affinity_core.h>

#include "ngx_http_upstream_affinity_compat.h"


#define NGX_HTTP_UPSTREAM_AFFINITY_HEADER  0
#define NGX_HTTP_UPSTREAM_AFFINITY_COOKIE  1
#define NGX_HTTP_UPSTREAM_AFFINITY_FIELD   2


/*
 * Milliseconds of the wall clock (the cached time, read once): what the
 * instances stamp their news of requests with, and when an engine was
 * asked for its figure, which they are weighed against.  Not
 * ngx_current_msec, whose clock is each host's own.
 */
static ngx_inline uint64_t
ngx_http_upstream_affinity_wall_msec(void)
{
    ngx_time_t  *tp;

    tp = ngx_timeofday();

    return (uint64_t) tp->sec * 1000 + tp->msec;
}


/* a session key source of session_affinity */
typedef struct {
    ngx_uint_t                              type;
    ngx_str_t                               name;
    ngx_int_t                               index;  /* $http_, $cookie_ */
} ngx_http_upstream_affinity_source_t;


/* the streams whose reading a zone's head records */
#define NGX_HTTP_UPSTREAM_AFFINITY_STREAMS  4

/*
 * What the store of an upstream did, counted by all the workers of the
 * instance (ngx_http_upstream_affinity_store.c), for the status.
 */
typedef struct {
    ngx_atomic_t                            published;  /* taken by it */
    ngx_atomic_t                            dropped;    /* never sent:
                                                           backlog full */
    ngx_atomic_t                            refused;    /* writes it
                                                           refused */
    ngx_atomic_t                            outages;    /* connections lost
                                                           or refused */
    ngx_atomic_t                            read;       /* entries read */
    ngx_atomic_t                            applied;    /* others' news and
                                                           lessons taken */
    ngx_atomic_t                            forged;     /* authenticator
                                                           wrong */
    ngx_atomic_t                            malformed;
    ngx_atomic_t                            stale;      /* older than what
                                                           the zone holds,
                                                           or expired */
    ngx_atomic_t                            future;     /* stamped ahead of
                                                           this clock */
    ngx_atomic_t                            unknown;    /* naming a server
                                                           this instance
                                                           does not have */
    ngx_atomic_t                            limited;    /* news beyond a
                                                           sender's rate */
    ngx_atomic_t                            rewound;    /* the stream's ids
                                                           went back */
    ngx_atomic_t                            replayed;   /* a writer's
                                                           message again */
} ngx_http_upstream_affinity_store_counters_t;

/* how far the instance's reader read a stream (affinity_store) */
typedef struct {
    uint32_t                                stream; /* its name's crc32;
                                                       0: free */
    ngx_atomic_t                            reading; /* its pid, 0: none */
    uint64_t                                ms;     /* last entry's id, */
    uint64_t                                seq;    /* "ms-seq" */
    ngx_http_upstream_affinity_store_counters_t  counters;
} ngx_http_upstream_affinity_stream_read_t;

/*
 * The module's own bytes at the start of a zone, before the core's table:
 * the allocation's size (first, for processes that attach on their own)
 * and, in a zone that counts requests with affinity_store, what the
 * instance's reader of the store keeps for all its workers
 * (ngx_http_upstream_affinity_store.c), under the zone lock.
 */
typedef struct {
    size_t                                  size;

    /* the instance's announcements not yet read back, watched */
    affinity_unheard_watch_t                watch;

    /* the other writers' messages taken, by count, once each */
    affinity_store_senders_t                senders;

    ngx_http_upstream_affinity_stream_read_t
                                  read[NGX_HTTP_UPSTREAM_AFFINITY_STREAMS];
} ngx_http_upstream_affinity_zone_head_t;


/* shm_zone->data of an affinity zone */
typedef struct {
    ngx_slab_pool_t                        *shpool;
    ngx_http_upstream_affinity_zone_head_t *head;
    affinity_zone_t                        *zone;
    affinity_zone_kind_e                    kind;
    ngx_shm_zone_t                         *shm_zone;
    ngx_array_t                             confs;  /* of srv conf pointers */
    ngx_cycle_t                            *cycle;  /* that configured it */
    uint32_t                                row;    /* this worker's row */
    unsigned                                counts:1; /* in-flight here */
} ngx_http_upstream_affinity_shctx_t;


/*
 * What a worker warns of once, going on without it: the request body
 * (a fallback, counted by reason), a session key, a response id, the
 * replies' usage.  The messages are ngx_http_upstream_affinity_body.c's.
 */
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
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_CONTINUED_ID,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_ENCODED,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_FILE,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_MEMORY,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_MALFORMED,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_TRUNCATED,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_ID,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_NO_EVENT,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_TAKEN,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_USAGE_NONE,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_LAST
} ngx_http_upstream_affinity_warning_e;


/*
 * The peers of an upstream as the balancer sees them, for one generation
 * of its peer list: ids, weights, counter slots and names, primary servers
 * then backups, and the ring, in one block.  Built once from the
 * configuration, and again in each worker when servers with "resolve"
 * change the list; never changed after it is published (a peer whose slot
 * changes hands gets its new one at routing), and freed, when built at run
 * time, once it is superseded and no request holds it.
 */
typedef struct {
    ngx_uint_t                              generation; /* *peers->config */
    ngx_uint_t                              refs;   /* requests holding it */
    affinity_ring_t                        *ring;   /* NULL without peers */
    affinity_peer_t                        *peers;  /* primary, then backup */
    ngx_str_t                              *names;  /* in the same order */
    ngx_uint_t                              npeers;
    ngx_uint_t                              nbackup;
    unsigned                                dynamic:1; /* ngx_alloc()'ed */
    unsigned                                current:1;
} ngx_http_upstream_affinity_view_t;


/* the request body while a request is analyzed: parsed once, on first use */
typedef struct {
    affinity_json_t                        *json;   /* the body loaded */
    u_char                                 *data;   /* padded for the parser */
    size_t                                  len;
    u_char                                 *map;    /* to unmap, or NULL */
    size_t                                  map_len;
    ngx_uint_t                              fallback;   /* why it was not
                                                           used: an
                                                           affinity_fallback_e
                                                           + 1, or 0 */
    unsigned                                tried:1;
    unsigned                                loaded:1;
} ngx_http_upstream_affinity_body_t;


/* affinity_store: where the instances share what they learn */
typedef struct {
    ngx_addr_t                              addr;
    ngx_str_t                               stream; /* NUL-terminated */
    ngx_uint_t                              maxlen;
    ngx_uint_t                              backlog;
    ngx_msec_t                              timeout;
    ngx_msec_t                              connect_timeout;
    ngx_str_t                               auth_user;  /* auth=FILE */
    ngx_str_t                               auth_pass;
    affinity_store_keys_t                  *keys;   /* of secret=FILE */
    unsigned                                secret:1;
#if (NGX_SSL)
    ngx_ssl_t                              *ssl;    /* tls */
    ngx_str_t                               tls_name;   /* NUL-terminated */
    unsigned                                tls_ip:1;   /* tls_name is an
                                                           address: no SNI */
#endif
} ngx_http_upstream_affinity_store_conf_t;

typedef struct ngx_http_upstream_affinity_store_s
    ngx_http_upstream_affinity_store_t;
typedef struct ngx_http_upstream_affinity_announcement_s
    ngx_http_upstream_affinity_announcement_t;


/* a connection to the store (ngx_http_upstream_affinity_link.c) */
typedef struct ngx_http_upstream_affinity_link_s
    ngx_http_upstream_affinity_link_t;

typedef void (*ngx_http_upstream_affinity_link_ready_pt)(
    ngx_http_upstream_affinity_link_t *link);
typedef void (*ngx_http_upstream_affinity_link_reply_pt)(
    ngx_http_upstream_affinity_link_t *link, affinity_store_reply_t *reply);
typedef void (*ngx_http_upstream_affinity_link_lost_pt)(
    ngx_http_upstream_affinity_link_t *link, const char *why);

struct ngx_http_upstream_affinity_link_s {
    ngx_peer_connection_t                   pc;
    ngx_http_upstream_affinity_store_conf_t *conf;
    affinity_store_link_t                  *proto;
    ngx_buf_t                              *out;
    u_char                                 *in;
    ngx_log_t                              *log;
    ngx_log_t                               quiet;  /* for nginx's own
                                                       lines while the
                                                       owner's outage is
                                                       said already */
    ngx_msec_t                              wait;   /* for each reply */
    size_t                                  reply_max; /* bytes of one
                                                       reply, 0: any */
    size_t                                  taken;  /* of the reply read */
    size_t                                  progress; /* since the wait
                                                       started again */
    ngx_msec_t                              started; /* the reply read */
    ngx_msec_t                              ready_at; /* greeting answered,
                                                        0: not yet */

    /* the owner's: the greeting answered; a reply (no root: none came,
       the connection went); the connection failed, and why */
    ngx_http_upstream_affinity_link_ready_pt    ready_handler;
    ngx_http_upstream_affinity_link_reply_pt    reply;
    ngx_http_upstream_affinity_link_lost_pt     lost;
    void                                   *data;

    /* what the store (or TLS) said of the failure, for the log */
    ngx_str_t                               detail;
    u_char                                  detail_buf[128];

    unsigned                                connected:1;
    unsigned                                ready:1;
    unsigned                                hush:1; /* set by the owner:
                                                       use quiet */
};


/* affinity_metrics: the engines' own load */
typedef struct {
    ngx_str_t                               path;
    ngx_msec_t                              interval;
    ngx_msec_t                              timeout;
} ngx_http_upstream_affinity_metrics_conf_t;


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
    ngx_uint_t                              turns;      /* turn levels */
    uint64_t                                prefix_cache;   /* tokens per
                                                               peer, 0 if
                                                               unknown */

    /* response_affinity */
    ngx_shm_zone_t                         *response_zone;
    time_t                                  response_timeout;

    /* affinity_metrics, and how long a figure it gave counts (seconds) */
    ngx_http_upstream_affinity_metrics_conf_t  *metrics_conf;
    ngx_uint_t                              engine_ttl;

    /* affinity_store; the store is this worker's connections to it */
    ngx_http_upstream_affinity_store_conf_t  *store_conf;
    ngx_http_upstream_affinity_store_t      *store;

    /* the zone holding the in-flight counters: sessions', else prefixes',
       else responses' */
    ngx_shm_zone_t                         *counter_zone;

    /* affinity_balance */
    ngx_uint_t                              factor;     /* per mille */
    ngx_uint_t                              slack;

    /* the peers as of the current list (ngx_http_upstream_affinity_peers.c) */
    ngx_http_upstream_affinity_view_t      *view;

    ngx_str_t                               name;       /* upstream name */
    ngx_str_t                               directive;  /* the first given:
                                                           for messages */
} ngx_http_upstream_affinity_srv_conf_t;


/* per request, shared by the balancer, the variables and the filter */
typedef struct {
    ngx_str_t                               key;
    ngx_uint_t                              route;      /* affinity_route_e */
    ngx_uint_t                              source;     /* key's source */
    ngx_uint_t                              prefix_len; /* matched level */
    affinity_level_t                       *levels;
    ngx_uint_t                              nlevels;
    size_t                                  prompt_size;    /* from above,
                                                               or 0 */
    uint64_t                                owner;      /* of the response
                                                           continued */
    affinity_response_scan_t               *scan;      /* of the response */
    affinity_usage_scan_t                  *usage;     /* of the response,
                                                           timed or with a
                                                           probe */
    uint64_t                                probe_peer; /* the peer whose
                                                           probe the request
                                                           took, or 0 */
    uint32_t                                probe_age;
    uint32_t                                probe_length;

    /* the try's decision, for its reply's times (..._usage.c) and
       $affinity_reason: the counter zone (NULL: not routed by the core),
       the peer and its slot, what routing weighed */
    ngx_http_upstream_affinity_shctx_t     *timed;
    uint64_t                                timed_peer;
    uint32_t                                timed_slot;
    uint32_t                                queued;
    uint32_t                                held_chars;
    int64_t                                 estimate_us;
    int64_t                                 alternative_us;
    size_t                                  alternative_len;
    u_char                                  alternative[NGX_SOCKADDR_STRLEN];
    ngx_msec_t                              first_byte; /* of the reply's
                                                           body, after the
                                                           try began, + 1;
                                                           0: none yet */
    uint32_t                                backlog;    /* the try's prompt
                                                           characters in its
                                                           peer's backlog */
    ngx_uint_t                              fallback;   /* why the body was
                                                           not used: an
                                                           affinity_fallback_e
                                                           + 1, or 0 */
    unsigned                                keyed:1;
    unsigned                                continues:1;
    unsigned                                generated:1;
    unsigned                                echo:1;     /* safe in a cookie */
    unsigned                                exposed:1;  /* in the variable */
    unsigned                                usage_streamed:1;
    unsigned                                backlogged:1;   /* until its
                                                               first byte */
    ngx_http_upstream_affinity_srv_conf_t  *conf;
} ngx_http_upstream_affinity_ctx_t;


#define NGX_HTTP_UPSTREAM_AFFINITY_GENERATED  ((ngx_uint_t) -1)


extern ngx_module_t  ngx_http_upstream_affinity_module;
extern ngx_str_t     ngx_http_upstream_affinity_route_names[AFFINITY_ROUTES];


typedef void (*ngx_http_upstream_affinity_upstream_pt)(ngx_cycle_t *cycle,
    ngx_http_upstream_srv_conf_t *uscf,
    ngx_http_upstream_affinity_srv_conf_t *ascf);


/* ngx_http_upstream_affinity_module.c: configuration */
ngx_http_upstream_srv_conf_t *ngx_http_upstream_affinity_next(
    ngx_http_upstream_main_conf_t *umcf, ngx_uint_t *i,
    ngx_http_upstream_affinity_srv_conf_t **ascf);
void ngx_http_upstream_affinity_each_upstream(ngx_cycle_t *cycle,
    ngx_http_upstream_affinity_upstream_pt handler);
ssize_t ngx_http_upstream_affinity_parse_size(ngx_conf_t *cf,
    const char *what, ngx_str_t *shown, ngx_str_t *value, size_t min,
    off_t max);

/* ngx_http_upstream_affinity_zone.c: shared memory zones, worker rows */
char *ngx_http_upstream_affinity_add_zone(ngx_conf_t *cf,
    ngx_http_upstream_affinity_srv_conf_t *ascf, ngx_str_t *value,
    ngx_str_t *suffix, affinity_zone_kind_e kind, ngx_shm_zone_t **zone);
void ngx_http_upstream_affinity_claim_rows(ngx_cycle_t *cycle);
void ngx_http_upstream_affinity_release_rows(ngx_cycle_t *cycle);
void ngx_http_upstream_affinity_reap(ngx_http_upstream_affinity_shctx_t *shctx,
    ngx_log_t *log);

/* ngx_http_upstream_affinity_peers.c: the peer view */
ngx_int_t ngx_http_upstream_affinity_init_view(ngx_conf_t *cf,
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_rr_peers_t *peers);
ngx_http_upstream_affinity_view_t *ngx_http_upstream_affinity_view(
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_rr_peers_t *peers, ngx_pool_t *pool, ngx_log_t *log);
void ngx_http_upstream_affinity_claim_slots(
    ngx_http_upstream_affinity_shctx_t *shctx,
    ngx_http_upstream_affinity_view_t *view, ngx_str_t *upstream,
    ngx_log_t *log);

/* ngx_http_upstream_affinity_balancer.c: the balancer */
ngx_int_t ngx_http_upstream_init_affinity(ngx_conf_t *cf,
    ngx_http_upstream_srv_conf_t *us);
ngx_http_upstream_affinity_ctx_t *ngx_http_upstream_affinity_request(
    ngx_http_request_t *r, ngx_http_upstream_affinity_srv_conf_t *ascf);

/* ngx_http_upstream_affinity_key.c: session keys in and out, variables */
ngx_int_t ngx_http_upstream_affinity_add_variables(ngx_conf_t *cf);
ngx_int_t ngx_http_upstream_affinity_init_filter(ngx_conf_t *cf);
ngx_int_t ngx_http_upstream_affinity_session_key(ngx_http_request_t *r,
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_affinity_ctx_t *ctx,
    ngx_http_upstream_affinity_body_t *body);
ngx_int_t ngx_http_upstream_affinity_field(ngx_http_request_t *r,
    ngx_http_upstream_affinity_body_t *body, ngx_str_t *path,
    ngx_str_t *value);

/* ngx_http_upstream_affinity_body.c: the request body and its prompt */
ngx_int_t ngx_http_upstream_affinity_prompt(ngx_http_request_t *r,
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_affinity_ctx_t *ctx,
    ngx_http_upstream_affinity_body_t *body);
ngx_int_t ngx_http_upstream_affinity_body_load(ngx_http_request_t *r,
    ngx_http_upstream_affinity_body_t *body);
void ngx_http_upstream_affinity_body_unload(
    ngx_http_upstream_affinity_body_t *body);
void ngx_http_upstream_affinity_body_exit(void);
void ngx_http_upstream_affinity_warn(ngx_http_request_t *r,
    ngx_http_upstream_affinity_warning_e warning, ngx_str_t *arg);
ngx_int_t ngx_http_upstream_affinity_decline(ngx_http_request_t *r,
    ngx_http_upstream_affinity_body_t *body,
    ngx_http_upstream_affinity_warning_e warning, ngx_str_t *arg);

/* ngx_http_upstream_affinity_response.c: Responses API continuations */
ngx_int_t ngx_http_upstream_affinity_continued(ngx_http_request_t *r,
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_affinity_ctx_t *ctx,
    ngx_http_upstream_affinity_body_t *body);
ngx_int_t ngx_http_upstream_affinity_init_response_filter(ngx_conf_t *cf);
affinity_response_format_e ngx_http_upstream_affinity_reply_format(
    ngx_http_request_t *r, ngx_str_t **encoding);

/* ngx_http_upstream_affinity_usage.c: the replies' usage, for the cache
   model, and their first bytes, for the peers' backlogs */
ngx_int_t ngx_http_upstream_affinity_init_usage_filter(ngx_conf_t *cf);
void ngx_http_upstream_affinity_started(
    ngx_http_upstream_affinity_ctx_t *ctx);

/* ngx_http_upstream_affinity_metrics.c: the engines' own load */
void ngx_http_upstream_affinity_metrics_init(ngx_cycle_t *cycle);

/* ngx_http_upstream_affinity_store_conf.c: the affinity_store directive */
char *ngx_http_upstream_affinity_store_conf(ngx_conf_t *cf,
    ngx_http_upstream_affinity_srv_conf_t *ascf);

/* ngx_http_upstream_affinity_link.c: a connection to the store */
ngx_int_t ngx_http_upstream_affinity_link_init(
    ngx_http_upstream_affinity_link_t *link,
    ngx_http_upstream_affinity_store_conf_t *scf,
    affinity_resp_limits_t *limits, size_t out, ngx_pool_t *pool,
    ngx_log_t *log);
void ngx_http_upstream_affinity_link_open(
    ngx_http_upstream_affinity_link_t *link);
ngx_int_t ngx_http_upstream_affinity_link_send(
    ngx_http_upstream_affinity_link_t *link, size_t argc,
    const char *const *argv, const size_t *lens, uint32_t tag, uint64_t arg);
void ngx_http_upstream_affinity_link_close(
    ngx_http_upstream_affinity_link_t *link);
void ngx_http_upstream_affinity_link_detail(
    ngx_http_upstream_affinity_link_t *link, u_char *text, size_t len);

/* ngx_http_upstream_affinity_store.c: several instances, one routing */
void ngx_http_upstream_affinity_store_init(ngx_cycle_t *cycle);
void ngx_http_upstream_affinity_store_exit(ngx_cycle_t *cycle);
void ngx_http_upstream_affinity_store_publish(
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    affinity_store_message_t *message);
ngx_http_upstream_affinity_announcement_t *
    ngx_http_upstream_affinity_store_announce(
    ngx_http_upstream_affinity_srv_conf_t *ascf, uint64_t peer,
    uint32_t slot, uint64_t watched, uint32_t watched_unheard);
void ngx_http_upstream_affinity_store_ended(
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_affinity_announcement_t *announcement);
ngx_http_upstream_affinity_store_counters_t *
    ngx_http_upstream_affinity_store_counters(
    ngx_http_upstream_affinity_srv_conf_t *ascf);
void ngx_http_upstream_affinity_store_digest(
    ngx_http_upstream_affinity_srv_conf_t *ascf, uint32_t kind,
    u_char *id, size_t len, uint8_t *digest);
uint64_t ngx_http_upstream_affinity_key_hash(
    ngx_http_upstream_affinity_srv_conf_t *ascf, affinity_zone_t *zone,
    uint32_t kind, u_char *id, size_t len);

/* ngx_http_upstream_affinity_status.c: affinity_status */
char *ngx_http_upstream_affinity_status(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);


#endif /* _NGX_HTTP_UPSTREAM_AFFINITY_MODULE_H_INCLUDED_ */

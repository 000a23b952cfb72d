
/*
 * Directives, shared memory zones, variables and the response header filter
 * of ngx_http_upstream_affinity_module.
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

#define NGX_HTTP_UPSTREAM_AFFINITY_ZONE_SIZE    (8 * 1024 * 1024)
#define NGX_HTTP_UPSTREAM_AFFINITY_ZONE_MIN     (128 * 1024)

/*
 * Default prefix levels: the lengths of the seeds, then levels every
 * max(step, 6% of the previous length) up to 128k characters, so that a
 * conversation's next turn finds its previous turn past any shared system
 * prompt (README, "Choosing levels", has the measurements).
 */
#define NGX_HTTP_UPSTREAM_AFFINITY_STEP         256
#define NGX_HTTP_UPSTREAM_AFFINITY_GROWTH       6
#define NGX_HTTP_UPSTREAM_AFFINITY_MAX_LEVEL    (32 * 1024)

/* bytes before the table in a zone's allocation: its size, a cache line */
#define NGX_HTTP_UPSTREAM_AFFINITY_ZONE_PREFIX  64


/* called for each affinity zone at worker start and exit */
typedef void (*ngx_http_upstream_affinity_zone_pt)(
    ngx_http_upstream_affinity_shctx_t *shctx, ngx_log_t *log);


static ngx_int_t ngx_http_upstream_init_affinity(ngx_conf_t *cf,
    ngx_http_upstream_srv_conf_t *us);
static void ngx_http_upstream_affinity_ring_cleanup(void *data);
static ngx_int_t ngx_http_upstream_affinity_init_zone(ngx_shm_zone_t *shm_zone,
    void *data);
static ngx_int_t ngx_http_upstream_affinity_claim_slots(
    ngx_http_upstream_affinity_shctx_t *shctx, ngx_log_t *log);
static void ngx_http_upstream_affinity_claim_conf_slots(
    ngx_http_upstream_affinity_shctx_t *shctx,
    ngx_http_upstream_affinity_srv_conf_t *ascf, ngx_log_t *log);

static ngx_int_t ngx_http_upstream_affinity_check_cpu(ngx_conf_t *cf);
static ngx_int_t ngx_http_upstream_affinity_add_variables(ngx_conf_t *cf);
static ngx_int_t ngx_http_upstream_affinity_route_variable(
    ngx_http_request_t *r, ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_upstream_affinity_session_variable(
    ngx_http_request_t *r, ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_upstream_affinity_prefix_len_variable(
    ngx_http_request_t *r, ngx_http_variable_value_t *v, uintptr_t data);
static ngx_http_upstream_affinity_srv_conf_t *
    ngx_http_upstream_affinity_upstream_of(ngx_http_request_t *r);

static ngx_int_t ngx_http_upstream_affinity_header_filter(
    ngx_http_request_t *r);
static ngx_int_t ngx_http_upstream_affinity_init(ngx_conf_t *cf);

static void *ngx_http_upstream_affinity_create_conf(ngx_conf_t *cf);
static char *ngx_http_upstream_affinity_session(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_upstream_affinity_prefix(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_upstream_affinity_balance(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_upstream_affinity_zone(ngx_conf_t *cf,
    ngx_http_upstream_affinity_srv_conf_t *ascf, ngx_str_t *value,
    ngx_str_t *suffix, affinity_zone_kind_e kind, ngx_shm_zone_t **zone);
static ngx_int_t ngx_http_upstream_affinity_timeout(ngx_conf_t *cf,
    ngx_str_t *value, time_t *timeout);
static ngx_int_t ngx_http_upstream_affinity_cookie_parameter(ngx_conf_t *cf,
    ngx_str_t *value, ngx_http_upstream_affinity_cookie_t *cookie);
static ngx_int_t ngx_http_upstream_affinity_cookie_attributes(ngx_conf_t *cf,
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_affinity_cookie_t *cookie);
static ngx_int_t ngx_http_upstream_affinity_set_method(ngx_conf_t *cf,
    ngx_http_upstream_affinity_srv_conf_t *ascf);
static ngx_int_t ngx_http_upstream_affinity_init_process(
    ngx_cycle_t *cycle);
static void ngx_http_upstream_affinity_exit_process(ngx_cycle_t *cycle);

static void ngx_http_upstream_affinity_each_zone(ngx_cycle_t *cycle,
    ngx_http_upstream_affinity_zone_pt handler);
static void ngx_http_upstream_affinity_claim_row(
    ngx_http_upstream_affinity_shctx_t *shctx, ngx_log_t *log);
static void ngx_http_upstream_affinity_release_row(
    ngx_http_upstream_affinity_shctx_t *shctx, ngx_log_t *log);


static ngx_command_t  ngx_http_upstream_affinity_commands[] = {

    { ngx_string("session_affinity"),
      NGX_HTTP_UPS_CONF|NGX_CONF_ANY,
      ngx_http_upstream_affinity_session,
      NGX_HTTP_SRV_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("prefix_affinity"),
      NGX_HTTP_UPS_CONF|NGX_CONF_ANY,
      ngx_http_upstream_affinity_prefix,
      NGX_HTTP_SRV_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("affinity_balance"),
      NGX_HTTP_UPS_CONF|NGX_CONF_1MORE,
      ngx_http_upstream_affinity_balance,
      NGX_HTTP_SRV_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("affinity_status"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_upstream_affinity_status,
      0,
      0,
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_upstream_affinity_module_ctx = {
    ngx_http_upstream_affinity_add_variables, /* preconfiguration */
    ngx_http_upstream_affinity_init,       /* postconfiguration */

    NULL,                                  /* create main configuration */
    NULL,                                  /* init main configuration */

    ngx_http_upstream_affinity_create_conf, /* create server configuration */
    NULL,                                  /* merge server configuration */

    NULL,                                  /* create location configuration */
    NULL                                   /* merge location configuration */
};


ngx_module_t  ngx_http_upstream_affinity_module = {
    NGX_MODULE_V1,
    &ngx_http_upstream_affinity_module_ctx, /* module context */
    ngx_http_upstream_affinity_commands,   /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    NULL,                                  /* init module */
    ngx_http_upstream_affinity_init_process, /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_http_upstream_affinity_exit_process, /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


static ngx_http_variable_t  ngx_http_upstream_affinity_vars[] = {

    { ngx_string("affinity_route"), NULL,
      ngx_http_upstream_affinity_route_variable, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("affinity_session"), NULL,
      ngx_http_upstream_affinity_session_variable, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("affinity_prefix_len"), NULL,
      ngx_http_upstream_affinity_prefix_len_variable, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

      ngx_http_null_variable
};


static ngx_str_t  ngx_http_upstream_affinity_routes[] = {
    ngx_null_string,                       /* AFFINITY_ROUTE_NONE */
    ngx_string("session_hit"),
    ngx_string("session_new"),
    ngx_string("session_moved"),
    ngx_string("session_moved"),           /* spilled: served off its pin */
    ngx_string("fallback"),
    ngx_string("prefix_hit"),
    ngx_string("prefix_new")
};


static ngx_str_t  ngx_http_upstream_affinity_default_header =
    ngx_string("X-Session-ID");


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;


static ngx_int_t
ngx_http_upstream_init_affinity(ngx_conf_t *cf,
    ngx_http_upstream_srv_conf_t *us)
{
    ngx_pool_cleanup_t                     *cln;
    ngx_http_upstream_affinity_shctx_t     *shctx;
    ngx_http_upstream_rr_peers_t           *peers;
    ngx_http_upstream_affinity_srv_conf_t  *ascf;

    ascf = ngx_http_conf_upstream_srv_conf(us,
                                           ngx_http_upstream_affinity_module);

    if (ascf->session_zone == NULL && ascf->prefix_zone == NULL) {
        ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                      "\"affinity_balance\" in upstream \"%V\" requires "
                      "\"session_affinity\" or \"prefix_affinity\"",
                      &us->host);
        return NGX_ERROR;
    }

    /* one zone counts the in-flight requests: the sessions' if any */

    ascf->counter_zone = ascf->session_zone ? ascf->session_zone
                                            : ascf->prefix_zone;

    shctx = ascf->counter_zone->data;
    shctx->counts = 1;

    if (ngx_http_upstream_init_round_robin(cf, us) != NGX_OK) {
        return NGX_ERROR;
    }

    peers = us->peer.data;

    if (peers->number > AFFINITY_MAX_PEERS) {
        ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                      "upstream \"%V\" has %ui servers, affinity balancing "
                      "supports at most %d", &us->host, peers->number,
                      AFFINITY_MAX_PEERS);
        return NGX_ERROR;
    }

    if (ngx_http_upstream_affinity_build_peers(ascf, peers, cf->pool, cf->log)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (ascf->ring) {
        cln = ngx_pool_cleanup_add(cf->pool, 0);
        if (cln == NULL) {
            affinity_ring_destroy(ascf->ring);
            ascf->ring = NULL;
            return NGX_ERROR;
        }

        cln->handler = ngx_http_upstream_affinity_ring_cleanup;
        cln->data = ascf->ring;
    }

    us->peer.init = ngx_http_upstream_init_affinity_peer;

    return NGX_OK;
}


/*
 * The peers as the balancer sees them, in list order: ids, weights and
 * counter slots, the backup servers' ids and slots, and the ring.  Built
 * from the configured servers (pool set; the slots are claimed when the
 * zones are ready) and again in each worker when servers with "resolve"
 * have changed the list (pool NULL; the memory is the worker's own and is
 * freed at the next change, the slots are claimed at once).  Peers are
 * known by a hash of their address, not by their position: pins survive
 * reloads and changes that reorder or extend the list.
 */

ngx_int_t
ngx_http_upstream_affinity_build_peers(
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_rr_peers_t *peers, ngx_pool_t *pool, ngx_log_t *log)
{
    size_t                               size;
    uint32_t                            *backup_slots;
    uint64_t                            *backup_ids;
    ngx_uint_t                           i, n, nbackup, points, weight;
    affinity_ring_t                     *ring;
    affinity_peer_t                     *list;
    ngx_http_upstream_rr_peer_t         *peer;
    ngx_http_upstream_rr_peers_t        *backup;
    affinity_ring_peer_t                 ring_peers[AFFINITY_MAX_PEERS];

    n = 0;
    weight = 0;

    for (peer = peers->peer; peer; peer = peer->next) {
        n++;
        weight += peer->weight;
    }

    backup = peers->next;
    nbackup = 0;

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

    /* one allocation: the peers, then the backup ids, then their slots */

    size = n * sizeof(affinity_peer_t) + nbackup * sizeof(uint64_t)
           + nbackup * sizeof(uint32_t) + 1;

    list = pool ? ngx_pcalloc(pool, size) : ngx_calloc(size, log);
    if (list == NULL) {
        return NGX_ERROR;
    }

    backup_ids = (uint64_t *) (list + n);
    backup_slots = (uint32_t *) (backup_ids + nbackup);

    peer = peers->peer;

    for (i = 0; i < n; i++, peer = peer->next) {
        list[i].id = affinity_peer_id((char *) peer->name.data,
                                      peer->name.len);
        list[i].weight = peer->weight;
        list[i].slot = AFFINITY_NO_SLOT;

        ring_peers[i].id = list[i].id;
        ring_peers[i].weight = peer->weight;
    }

    peer = nbackup ? backup->peer : NULL;

    for (i = 0; i < nbackup; i++, peer = peer->next) {
        backup_ids[i] = affinity_peer_id((char *) peer->name.data,
                                         peer->name.len);
        backup_slots[i] = AFFINITY_NO_SLOT;
    }

    /*
     * No ring without peers: servers with "resolve" may have no address
     * yet.  The balancer then leaves the request to round robin.
     */

    ring = NULL;

    if (n) {
        points = NGX_HTTP_UPSTREAM_AFFINITY_RING_TOTAL / ngx_max(weight, 1);
        points = ngx_max(points, NGX_HTTP_UPSTREAM_AFFINITY_RING_POINTS_MIN);
        points = ngx_min(points, NGX_HTTP_UPSTREAM_AFFINITY_RING_POINTS_MAX);

        ring = affinity_ring_create(ring_peers, n, (uint32_t) points);
        if (ring == NULL) {
            if (pool == NULL) {
                ngx_free(list);
            }

            return NGX_ERROR;
        }
    }

    /* the previous run-time view; the one from the configuration is the
     * pool's */

    if (pool == NULL && ascf->dynamic) {
        affinity_ring_destroy(ascf->ring);
        ngx_free(ascf->peers);
    }

    ascf->ring = ring;
    ascf->peers = list;
    ascf->npeers = n;
    ascf->backup_ids = backup_ids;
    ascf->backup_slots = backup_slots;
    ascf->nbackup = nbackup;

    if (pool == NULL) {
        ascf->dynamic = 1;
        ngx_http_upstream_affinity_claim_conf_slots(ascf->counter_zone->data,
                                                    ascf, log);
    }

    return NGX_OK;
}


static void
ngx_http_upstream_affinity_ring_cleanup(void *data)
{
    affinity_ring_destroy(data);
}


static ngx_int_t
ngx_http_upstream_affinity_init_zone(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_http_upstream_affinity_shctx_t  *oshctx = data;

    u_char                              *region;
    size_t                               size, len;
    uint32_t                             rows;
    ngx_core_conf_t                     *ccf;
    affinity_attach_e                    rc;
    ngx_slab_pool_t                     *shpool;
    ngx_http_upstream_affinity_shctx_t  *shctx;
    char                                 err[160];

    shctx = shm_zone->data;
    shctx->shm_zone = shm_zone;
    shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    if (oshctx) {
        /* a reload with the same zone name and size: keep what was learned */

        if (oshctx->kind != shctx->kind) {
            ngx_log_error(NGX_LOG_EMERG, shm_zone->shm.log, 0,
                          "affinity zone \"%V\" was used for another kind of "
                          "table; give it a new name or size, or restart",
                          &shm_zone->shm.name);
            return NGX_ERROR;
        }

        shctx->shpool = oshctx->shpool;
        shctx->zone = oshctx->zone;

        return ngx_http_upstream_affinity_claim_slots(shctx,
                                                      shm_zone->shm.log);
    }

    shctx->shpool = shpool;

    if (!shm_zone->shm.exists) {
        len = sizeof(" in affinity zone \"\"") + shm_zone->shm.name.len;

        shpool->log_ctx = ngx_slab_alloc(shpool, len);
        if (shpool->log_ctx == NULL) {
            return NGX_ERROR;
        }

        ngx_sprintf(shpool->log_ctx, " in affinity zone \"%V\"%Z",
                    &shm_zone->shm.name);

        /*
         * The table takes every free page of the zone in one allocation:
         * a fixed-capacity table needs no allocator after this.  The first
         * cache line keeps the size, for processes that attach on their own
         * (shm.exists, on Windows).
         */

        size = shpool->pfree << ngx_pagesize_shift;

        region = ngx_slab_alloc(shpool, size);
        if (region == NULL) {
            return NGX_ERROR;
        }

        *(size_t *) region = size;
        shpool->data = region;
    }

    region = shpool->data;
    size = *(size_t *) region - NGX_HTTP_UPSTREAM_AFFINITY_ZONE_PREFIX;
    region += NGX_HTTP_UPSTREAM_AFFINITY_ZONE_PREFIX;

    /*
     * A worker row for each worker that may run at once: the workers of
     * this configuration and those of the one before, finishing their
     * requests after a reload.  A zone reused by a reload keeps its rows.
     */

    ccf = (ngx_core_conf_t *) ngx_get_conf(shctx->cycle->conf_ctx,
                                           ngx_core_module);

    rows = (uint32_t) ngx_min(2 * (ngx_uint_t) ngx_max(ccf->worker_processes,
                                                       1) + 2,
                              AFFINITY_MAX_WORKER_ROWS);

    rc = affinity_zone_attach(region, size, shctx->kind, rows, &shctx->zone,
                              err, sizeof(err));

    if (shctx->zone == NULL) {
        ngx_log_error(NGX_LOG_EMERG, shm_zone->shm.log, 0,
                      "affinity zone \"%V\" cannot be used: %s%s",
                      &shm_zone->shm.name, err,
                      rc == AFFINITY_ATTACH_TOO_SMALL
                      ? "; make the zone larger" : "");
        return NGX_ERROR;
    }

    shpool->log_nomem = 0;

    return ngx_http_upstream_affinity_claim_slots(shctx, shm_zone->shm.log);
}


/*
 * Gives every peer of the upstreams using a zone its counter slot there.
 * Runs in the master at (re)configuration, before workers start; the slots
 * are keyed by peer id, so a reload finds the counters it left.
 */

static ngx_int_t
ngx_http_upstream_affinity_claim_slots(
    ngx_http_upstream_affinity_shctx_t *shctx, ngx_log_t *log)
{
    ngx_uint_t                               i;
    ngx_http_upstream_affinity_srv_conf_t  **confs;

    confs = shctx->confs.elts;

    for (i = 0; i < shctx->confs.nelts; i++) {
        if (confs[i]->counter_zone == shctx->shm_zone) {
            ngx_http_upstream_affinity_claim_conf_slots(shctx, confs[i], log);
        }
    }

    return NGX_OK;
}


/* the counter slots of one upstream's peers, primary and backup */

static void
ngx_http_upstream_affinity_claim_conf_slots(
    ngx_http_upstream_affinity_shctx_t *shctx,
    ngx_http_upstream_affinity_srv_conf_t *ascf, ngx_log_t *log)
{
    uint32_t    now;
    ngx_uint_t  i, missing;

    now = (uint32_t) ngx_time();
    missing = 0;

    ngx_shmtx_lock(&shctx->shpool->mutex);

    for (i = 0; i < ascf->npeers; i++) {
        ascf->peers[i].slot = affinity_zone_peer_slot(shctx->zone,
                                                      ascf->peers[i].id, now);
        missing |= (ascf->peers[i].slot == AFFINITY_NO_SLOT);
    }

    for (i = 0; i < ascf->nbackup; i++) {
        ascf->backup_slots[i] = affinity_zone_peer_slot(shctx->zone,
                                                        ascf->backup_ids[i],
                                                        now);
    }

    ngx_shmtx_unlock(&shctx->shpool->mutex);

    if (missing) {
        ngx_log_error(NGX_LOG_WARN, log, 0,
                      "affinity zone is out of peer counter slots; "
                      "some peers of upstream \"%V\" are balanced "
                      "without their in-flight counts", &ascf->name);
    }
}


/*
 * The core is compiled for the instruction set level of the build host
 * (auto/cpu-level).  On a CPU below that level it would die of
 * SIGILL; refuse to start instead, before any directive calls into it.
 * GCC 12 tests a whole level; older compilers test its main features.
 */

#if (defined __GNUC__ && !defined __clang__ && __GNUC__ >= 12)
#define ngx_http_upstream_affinity_cpu_has(level, features)                   \
    __builtin_cpu_supports(level)
#else
#define ngx_http_upstream_affinity_cpu_has(level, features)  (features)
#endif

static ngx_int_t
ngx_http_upstream_affinity_check_cpu(ngx_conf_t *cf)
{
#if (NGX_HTTP_UPSTREAM_AFFINITY_X86_64_V3                                    \
     || NGX_HTTP_UPSTREAM_AFFINITY_X86_64_V2)
    const char  *level;

    __builtin_cpu_init();

#if (NGX_HTTP_UPSTREAM_AFFINITY_X86_64_V3)
    level = "x86-64-v3 (AVX2, BMI1/2, F16C, FMA, LZCNT, MOVBE)";

    if (ngx_http_upstream_affinity_cpu_has("x86-64-v3",
            __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi")
            && __builtin_cpu_supports("bmi2")
            && __builtin_cpu_supports("fma")))
    {
        return NGX_OK;
    }
#else
    level = "x86-64-v2 (SSE4.2, POPCNT)";

    if (ngx_http_upstream_affinity_cpu_has("x86-64-v2",
            __builtin_cpu_supports("sse4.2")
            && __builtin_cpu_supports("popcnt")))
    {
        return NGX_OK;
    }
#endif

    ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                  "ngx_http_upstream_affinity_module was built for %s, "
                  "which this CPU lacks; rebuild it with "
                  "AFFINITY_MARCH=x86-64", level);
    return NGX_ERROR;
#else
    return NGX_OK;
#endif
}


static ngx_int_t
ngx_http_upstream_affinity_add_variables(ngx_conf_t *cf)
{
    ngx_http_variable_t  *var, *v;

    if (ngx_http_upstream_affinity_check_cpu(cf) != NGX_OK) {
        return NGX_ERROR;
    }

    for (v = ngx_http_upstream_affinity_vars; v->name.len; v++) {
        var = ngx_http_add_variable(cf, &v->name, v->flags);
        if (var == NULL) {
            return NGX_ERROR;
        }

        var->get_handler = v->get_handler;
        var->data = v->data;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_upstream_affinity_route_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_str_t                         *route;
    ngx_http_upstream_affinity_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_upstream_affinity_module);

    if (ctx == NULL || ctx->route == AFFINITY_ROUTE_NONE
        || ctx->route > AFFINITY_ROUTE_PREFIX_NEW)
    {
        v->not_found = 1;
        return NGX_OK;
    }

    route = &ngx_http_upstream_affinity_routes[ctx->route];

    v->len = route->len;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;
    v->data = route->data;

    return NGX_OK;
}


/*
 * $affinity_session: the key in use.  proxy_set_header evaluates it while
 * the request to the upstream is built, before the balancer runs: the key
 * is then read (or generated) here, for the upstream the request goes to,
 * and the balancer uses the same one.  A key with control characters is
 * used for routing but never shown.
 */

static ngx_int_t
ngx_http_upstream_affinity_session_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_http_upstream_affinity_ctx_t       *ctx;
    ngx_http_upstream_affinity_srv_conf_t  *ascf;

    ctx = ngx_http_get_module_ctx(r, ngx_http_upstream_affinity_module);

    if (ctx == NULL) {
        ascf = ngx_http_upstream_affinity_upstream_of(r);

        if (ascf) {
            ctx = ngx_http_upstream_affinity_request(r, ascf);
            if (ctx == NULL) {
                return NGX_ERROR;
            }
        }
    }

    if (ctx == NULL || !ctx->keyed || !ctx->exposed) {
        v->not_found = 1;
        return NGX_OK;
    }

    v->len = ctx->key.len;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;
    v->data = ctx->key.data;

    return NGX_OK;
}


/*
 * The affinity upstream a request is being sent to, before the balancer
 * runs: the one proxy_pass names, or, when proxy_pass takes the name from a
 * variable, the upstream{} block of that name, found as nginx will find it.
 * An upstream this balancer initialized has its counter zone set (keepalive
 * or sticky may wrap the balancer, so peer.init is not necessarily its
 * own).
 */

static ngx_http_upstream_affinity_srv_conf_t *
ngx_http_upstream_affinity_upstream_of(ngx_http_request_t *r)
{
    ngx_uint_t                              i;
    ngx_http_upstream_t                    *u;
    ngx_http_upstream_resolved_t           *rs;
    ngx_http_upstream_srv_conf_t           *uscf, **uscfp;
    ngx_http_upstream_main_conf_t          *umcf;
    ngx_http_upstream_affinity_srv_conf_t  *ascf;

    u = r->upstream;

    if (u == NULL || u->conf == NULL) {
        return NULL;
    }

    uscf = u->conf->upstream;
    rs = u->resolved;

    if (uscf == NULL && rs && rs->host.len) {
        umcf = ngx_http_get_module_main_conf(r, ngx_http_upstream_module);
        uscfp = umcf->upstreams.elts;

        for (i = 0; i < umcf->upstreams.nelts; i++) {
            if (uscfp[i]->host.len == rs->host.len
                && ((uscfp[i]->port == 0 && rs->no_port)
                    || uscfp[i]->port == rs->port)
                && ngx_strncasecmp(uscfp[i]->host.data, rs->host.data,
                                   rs->host.len)
                   == 0)
            {
                uscf = uscfp[i];
                break;
            }
        }
    }

    if (uscf == NULL || uscf->srv_conf == NULL) {
        return NULL;
    }

    ascf = ngx_http_conf_upstream_srv_conf(uscf,
                                           ngx_http_upstream_affinity_module);

    return ascf->counter_zone ? ascf : NULL;
}


static ngx_int_t
ngx_http_upstream_affinity_prefix_len_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    u_char                            *p;
    ngx_http_upstream_affinity_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_upstream_affinity_module);

    if (ctx == NULL || ctx->route == AFFINITY_ROUTE_NONE) {
        v->not_found = 1;
        return NGX_OK;
    }

    p = ngx_pnalloc(r->pool, NGX_INT_T_LEN);
    if (p == NULL) {
        return NGX_ERROR;
    }

    v->len = ngx_sprintf(p, "%ui", ctx->prefix_len) - p;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;
    v->data = p;

    return NGX_OK;
}


/*
 * Echoes the session key to the client: in the configured header (so a
 * client that did not send one learns its generated id) and, with cookie=,
 * in Set-Cookie.  A key that came from the cookie is never copied into the
 * header: an HttpOnly cookie (often an authentication token) must stay out
 * of reach of page scripts; it is only refreshed in Set-Cookie when the
 * cookie has a Max-Age.  Keys that are not safe as a cookie value are never
 * echoed.
 */

static ngx_int_t
ngx_http_upstream_affinity_header_filter(ngx_http_request_t *r)
{
    u_char                                 *p;
    ngx_uint_t                              i;
    ngx_list_part_t                        *part;
    ngx_table_elt_t                        *h;
    ngx_http_upstream_affinity_ctx_t       *ctx;
    ngx_http_upstream_affinity_srv_conf_t  *ascf;

    if (r != r->main) {
        return ngx_http_next_header_filter(r);
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_upstream_affinity_module);

    if (ctx == NULL || !ctx->echo) {
        return ngx_http_next_header_filter(r);
    }

    ascf = ctx->conf;

    if (ctx->source == NGX_HTTP_UPSTREAM_AFFINITY_COOKIE) {
        goto cookie;
    }

    /* do not repeat a header the backend already set */

    part = &r->headers_out.headers.part;
    h = part->elts;

    for (i = 0; /* void */ ; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].hash
            && h[i].key.len == ascf->echo_header.len
            && ngx_strncasecmp(h[i].key.data, ascf->echo_header.data,
                               ascf->echo_header.len) == 0)
        {
            goto cookie;
        }
    }

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    h->key = ascf->echo_header;
    h->value = ctx->key;
#if (nginx_version >= 1023000)
    h->next = NULL;
#endif

cookie:

    /*
     * Set the cookie when the client cannot have it yet: the key was
     * generated, or came from another source.  A key that came from the
     * cookie is sent back only to slide its Max-Age.
     */

    if (ascf->echo_cookie.len == 0
        || (ctx->source == NGX_HTTP_UPSTREAM_AFFINITY_COOKIE
            && ascf->cookie_max_age == NGX_CONF_UNSET))
    {
        return ngx_http_next_header_filter(r);
    }

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->value.len = ascf->echo_cookie.len + 1 + ctx->key.len
                   + ascf->cookie_attributes.len;

    h->value.data = ngx_pnalloc(r->pool, h->value.len);
    if (h->value.data == NULL) {
        return NGX_ERROR;
    }

    p = ngx_copy(h->value.data, ascf->echo_cookie.data, ascf->echo_cookie.len);
    *p++ = '=';
    p = ngx_copy(p, ctx->key.data, ctx->key.len);
    ngx_memcpy(p, ascf->cookie_attributes.data, ascf->cookie_attributes.len);

    h->hash = 1;
    ngx_str_set(&h->key, "Set-Cookie");
#if (nginx_version >= 1023000)
    h->next = NULL;
#endif

    return ngx_http_next_header_filter(r);
}


static ngx_int_t
ngx_http_upstream_affinity_init(ngx_conf_t *cf)
{
    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_upstream_affinity_header_filter;

    return NGX_OK;
}


/*
 * A worker claims a row in each affinity zone: its in-flight requests are
 * counted there too, so that whoever outlives it can give them back if it
 * dies.  Rows left by workers that died before it started are reaped now.
 */

static ngx_int_t
ngx_http_upstream_affinity_init_process(ngx_cycle_t *cycle)
{
    if (ngx_process != NGX_PROCESS_WORKER
        && ngx_process != NGX_PROCESS_SINGLE)
    {
        return NGX_OK;
    }

    ngx_http_upstream_affinity_each_zone(cycle,
        ngx_http_upstream_affinity_claim_row);

    return NGX_OK;
}


static void
ngx_http_upstream_affinity_exit_process(ngx_cycle_t *cycle)
{
    ngx_http_upstream_affinity_body_exit();

    ngx_http_upstream_affinity_each_zone(cycle,
        ngx_http_upstream_affinity_release_row);
}


static void
ngx_http_upstream_affinity_each_zone(ngx_cycle_t *cycle,
    ngx_http_upstream_affinity_zone_pt handler)
{
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_shm_zone_t   *shm_zone;

    part = &cycle->shared_memory.part;
    shm_zone = part->elts;

    for (i = 0; /* void */ ; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            shm_zone = part->elts;
            i = 0;
        }

        if (shm_zone[i].tag == &ngx_http_upstream_affinity_module) {
            handler(shm_zone[i].data, cycle->log);
        }
    }
}


static void
ngx_http_upstream_affinity_claim_row(ngx_http_upstream_affinity_shctx_t *shctx,
    ngx_log_t *log)
{
    uint64_t  start;

    if (!shctx->counts) {
        return;         /* a prefix index for upstreams that count elsewhere */
    }

    ngx_http_upstream_affinity_reap(shctx, log);

    start = affinity_process_start((uint64_t) ngx_pid);

    ngx_shmtx_lock(&shctx->shpool->mutex);
    shctx->row = affinity_zone_worker_claim(shctx->zone, (uint64_t) ngx_pid,
                                            start, (uint32_t) ngx_time());
    ngx_shmtx_unlock(&shctx->shpool->mutex);

    if (shctx->row == AFFINITY_NO_ROW) {
        ngx_log_error(NGX_LOG_WARN, log, 0,
                      "affinity zone \"%V\" has no free worker row: "
                      "requests of this worker are balanced, but not "
                      "given back if it dies; restart nginx to resize "
                      "the zone's rows", &shctx->shm_zone->shm.name);
    }
}


static void
ngx_http_upstream_affinity_release_row(
    ngx_http_upstream_affinity_shctx_t *shctx, ngx_log_t *log)
{
    if (shctx->row == AFFINITY_NO_ROW) {
        return;
    }

    ngx_shmtx_lock(&shctx->shpool->mutex);
    affinity_zone_worker_release(shctx->zone, shctx->row, (uint64_t) ngx_pid);
    ngx_shmtx_unlock(&shctx->shpool->mutex);

    shctx->row = AFFINITY_NO_ROW;
}


/*
 * Gives back the in-flight requests of workers that died without ending
 * them (a crash, the OOM killer, kill -9).  At most one process per zone
 * looks each second; the liveness checks read /proc, outside the lock.
 */

void
ngx_http_upstream_affinity_reap(ngx_http_upstream_affinity_shctx_t *shctx,
    ngx_log_t *log)
{
    int                reaped;
    size_t             i, n;
    uint64_t           recovered;
    affinity_worker_t  workers[AFFINITY_MAX_WORKER_ROWS];

    if (!shctx->counts
        || !affinity_zone_reap_due(shctx->zone, (uint32_t) ngx_time(), 1))
    {
        return;
    }

    n = affinity_zone_workers(shctx->zone, workers, AFFINITY_MAX_WORKER_ROWS);

    for (i = 0; i < n; i++) {

        if (workers[i].pid == (uint64_t) ngx_pid
            || affinity_process_alive(workers[i].pid, workers[i].start))
        {
            continue;
        }

        ngx_shmtx_lock(&shctx->shpool->mutex);
        reaped = affinity_zone_worker_reap(shctx->zone, &workers[i],
                                           &recovered);
        ngx_shmtx_unlock(&shctx->shpool->mutex);

        if (reaped) {
            ngx_log_error(NGX_LOG_NOTICE, log, 0,
                          "affinity zone \"%V\": process %uL exited with "
                          "%uL requests in flight, given back",
                          &shctx->shm_zone->shm.name, workers[i].pid,
                          recovered);
        }
    }
}


static void *
ngx_http_upstream_affinity_create_conf(ngx_conf_t *cf)
{
    ngx_http_upstream_affinity_srv_conf_t  *conf;

    conf = ngx_pcalloc(cf->pool,
                       sizeof(ngx_http_upstream_affinity_srv_conf_t));
    if (conf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     conf->sources = NULL;
     *     conf->echo_header = { 0, NULL };
     *     conf->echo_cookie = { 0, NULL };
     *     conf->cookie_attributes = { 0, NULL };
     *     conf->generate = 0;
     *     conf->session_zone = NULL;
     *     conf->prefix_zone = NULL;
     *     conf->schedule = NULL;
     *     conf->nschedule = 0;
     *     conf->counter_zone = NULL;
     *     conf->ring = NULL;
     *     conf->peers = NULL;
     *     conf->npeers = 0;
     *     conf->backup_slots = NULL;
     *     conf->backup_ids = NULL;
     *     conf->nbackup = 0;
     *     conf->config = 0;
     *     conf->dynamic = 0;
     *     conf->name = { 0, NULL };
     */

    conf->cookie_max_age = NGX_CONF_UNSET;
    conf->session_timeout = 3600;
    conf->prefix_timeout = 600;
    conf->factor = 1250;
    conf->slack = 2;

    return conf;
}


static char *
ngx_http_upstream_affinity_session(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_upstream_affinity_srv_conf_t  *ascf = conf;

    u_char                               *p;
    ngx_str_t                            *value, s, zone;
    ngx_uint_t                            i, type;
    ngx_http_upstream_affinity_cookie_t   cookie;
    ngx_http_upstream_affinity_source_t  *src;

    static ngx_str_t  suffix = ngx_string("_sessions");

    if (ascf->session_zone) {
        return "is duplicate";
    }

    ascf->sources = ngx_array_create(cf->pool, 2,
                                  sizeof(ngx_http_upstream_affinity_source_t));
    if (ascf->sources == NULL) {
        return NGX_CONF_ERROR;
    }

    value = cf->args->elts;
    ngx_str_null(&zone);

    ngx_memzero(&cookie, sizeof(ngx_http_upstream_affinity_cookie_t));
    cookie.max_age = NGX_CONF_UNSET;
    cookie.samesite = NGX_HTTP_UPSTREAM_AFFINITY_SAMESITE_LAX;
    ngx_str_set(&cookie.path, "/");

    for (i = 1; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "header=", 7) == 0) {
            type = NGX_HTTP_UPSTREAM_AFFINITY_HEADER;
            s.data = value[i].data + 7;
            s.len = value[i].len - 7;

        } else if (ngx_strncmp(value[i].data, "cookie=", 7) == 0) {
            type = NGX_HTTP_UPSTREAM_AFFINITY_COOKIE;
            s.data = value[i].data + 7;
            s.len = value[i].len - 7;

        } else if (ngx_strncmp(value[i].data, "field=", 6) == 0) {
            type = NGX_HTTP_UPSTREAM_AFFINITY_FIELD;
            s.data = value[i].data + 6;
            s.len = value[i].len - 6;

        } else if (ngx_strcmp(value[i].data, "generate") == 0) {
            ascf->generate = 1;
            continue;

        } else if (ngx_strncmp(value[i].data, "zone=", 5) == 0) {
            zone.data = value[i].data + 5;
            zone.len = value[i].len - 5;
            continue;

        } else if (ngx_strncmp(value[i].data, "timeout=", 8) == 0) {
            if (ngx_http_upstream_affinity_timeout(cf, &value[i],
                                                   &ascf->session_timeout)
                != NGX_OK)
            {
                return NGX_CONF_ERROR;
            }
            continue;

        } else if (ngx_strncmp(value[i].data, "cookie_", 7) == 0) {
            if (ngx_http_upstream_affinity_cookie_parameter(cf, &value[i],
                                                            &cookie)
                != NGX_OK)
            {
                return NGX_CONF_ERROR;
            }
            continue;

        } else {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid parameter \"%V\"", &value[i]);
            return NGX_CONF_ERROR;
        }

        /* a key source: check its name */

        if (s.len == 0) {
            goto invalid;
        }

        for (p = s.data; p < s.data + s.len; p++) {

            if (type == NGX_HTTP_UPSTREAM_AFFINITY_FIELD) {
                if (*p == '.' && (p == s.data || p == s.data + s.len - 1
                                  || p[-1] == '.'))
                {
                    goto invalid;
                }

                if (*p <= ' ' || *p >= 0x7f) {
                    goto invalid;
                }

                continue;
            }

            /* header and cookie names are HTTP tokens */

            if (*p <= ' ' || *p >= 0x7f
                || ngx_strchr("()<>@,;:\\\"/[]?={}", *p) != NULL)
            {
                goto invalid;
            }
        }

        src = ngx_array_push(ascf->sources);
        if (src == NULL) {
            return NGX_CONF_ERROR;
        }

        src->type = type;
        src->name = s;

        if (type == NGX_HTTP_UPSTREAM_AFFINITY_HEADER
            && ascf->echo_header.len == 0)
        {
            ascf->echo_header = s;
        }

        if (type == NGX_HTTP_UPSTREAM_AFFINITY_COOKIE
            && ascf->echo_cookie.len == 0)
        {
            ascf->echo_cookie = s;
        }

        continue;

    invalid:

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid key source \"%V\"", &value[i]);
        return NGX_CONF_ERROR;
    }

    if (ascf->sources->nelts == 0) {
        src = ngx_array_push(ascf->sources);
        if (src == NULL) {
            return NGX_CONF_ERROR;
        }

        src->type = NGX_HTTP_UPSTREAM_AFFINITY_HEADER;
        src->name = ngx_http_upstream_affinity_default_header;
    }

    if (ascf->echo_header.len == 0) {
        ascf->echo_header = ngx_http_upstream_affinity_default_header;
    }

    if (ngx_http_upstream_affinity_cookie_attributes(cf, ascf, &cookie)
        != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    if (cookie.set && ascf->echo_cookie.len == 0) {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "cookie_* parameters have no effect without "
                           "\"cookie=\"");
    }

    return ngx_http_upstream_affinity_zone(cf, ascf, zone.data ? &zone : NULL,
                                           &suffix, AFFINITY_ZONE_SESSIONS,
                                           &ascf->session_zone);
}


static char *
ngx_http_upstream_affinity_prefix(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_upstream_affinity_srv_conf_t  *ascf = conf;

    u_char      *p, *last, *start;
    ssize_t      size;
    ngx_int_t    n;
    ngx_str_t   *value, s, zone;
    ngx_uint_t   i, nlengths, step, growth, max;
    uint32_t     lengths[AFFINITY_MAX_LEVELS], schedule[AFFINITY_MAX_LEVELS];

    static ngx_str_t  suffix = ngx_string("_prefixes");

    if (ascf->prefix_zone) {
        return "is duplicate";
    }

    lengths[0] = 100;
    lengths[1] = 500;
    lengths[2] = 1000;
    nlengths = 3;
    step = NGX_HTTP_UPSTREAM_AFFINITY_STEP;
    growth = NGX_HTTP_UPSTREAM_AFFINITY_GROWTH;
    max = NGX_HTTP_UPSTREAM_AFFINITY_MAX_LEVEL;

    value = cf->args->elts;
    ngx_str_null(&zone);

    for (i = 1; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "lengths=", 8) == 0) {

            nlengths = 0;
            last = value[i].data + value[i].len;

            for (start = value[i].data + 8; start <= last; start = p + 1) {
                p = ngx_strlchr(start, last, ',');
                if (p == NULL) {
                    p = last;
                }

                n = ngx_atoi(start, p - start);

                if (n == NGX_ERROR || n == 0 || n > 16 * 1024 * 1024
                    || nlengths == 32)
                {
                    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                       "invalid lengths \"%V\", they must "
                                       "be up to 32 positive numbers",
                                       &value[i]);
                    return NGX_CONF_ERROR;
                }

                lengths[nlengths++] = (uint32_t) n;
            }

            continue;
        }

        if (ngx_strncmp(value[i].data, "step=", 5) == 0) {
            s.data = value[i].data + 5;
            s.len = value[i].len - 5;

            size = ngx_parse_size(&s);
            if (size == NGX_ERROR || size > 16 * 1024 * 1024) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid step \"%V\"", &value[i]);
                return NGX_CONF_ERROR;
            }

            step = (ngx_uint_t) size;
            continue;
        }

        if (ngx_strncmp(value[i].data, "growth=", 7) == 0) {
            n = ngx_atoi(value[i].data + 7, value[i].len - 7);

            if (n == NGX_ERROR || n > 100) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid growth \"%V\", it must be "
                                   "a percentage from 0 to 100", &value[i]);
                return NGX_CONF_ERROR;
            }

            growth = (ngx_uint_t) n;
            continue;
        }

        if (ngx_strncmp(value[i].data, "max=", 4) == 0) {
            s.data = value[i].data + 4;
            s.len = value[i].len - 4;

            size = ngx_parse_size(&s);
            if (size == NGX_ERROR || size == 0 || size > 16 * 1024 * 1024) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid max \"%V\"", &value[i]);
                return NGX_CONF_ERROR;
            }

            max = (ngx_uint_t) size;
            continue;
        }

        if (ngx_strncmp(value[i].data, "zone=", 5) == 0) {
            zone.data = value[i].data + 5;
            zone.len = value[i].len - 5;
            continue;
        }

        if (ngx_strncmp(value[i].data, "timeout=", 8) == 0) {
            if (ngx_http_upstream_affinity_timeout(cf, &value[i],
                                                   &ascf->prefix_timeout)
                != NGX_OK)
            {
                return NGX_CONF_ERROR;
            }
            continue;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\"", &value[i]);
        return NGX_CONF_ERROR;
    }

    /* the level lengths are fixed here, once: requests only hash them */

    ascf->nschedule = affinity_level_schedule(lengths, nlengths,
                                              (uint32_t) step,
                                              (uint32_t) growth,
                                              (uint32_t) max, schedule,
                                              AFFINITY_MAX_LEVELS);

    ascf->schedule = ngx_palloc(cf->pool, ascf->nschedule * sizeof(uint32_t));
    if (ascf->schedule == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_memcpy(ascf->schedule, schedule, ascf->nschedule * sizeof(uint32_t));

    return ngx_http_upstream_affinity_zone(cf, ascf, zone.data ? &zone : NULL,
                                           &suffix, AFFINITY_ZONE_PREFIXES,
                                           &ascf->prefix_zone);
}


static char *
ngx_http_upstream_affinity_balance(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_upstream_affinity_srv_conf_t  *ascf = conf;

    ngx_int_t    n;
    ngx_str_t   *value;
    ngx_uint_t   i;

    value = cf->args->elts;

    for (i = 1; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "factor=", 7) == 0) {

            n = ngx_atofp(value[i].data + 7, value[i].len - 7, 3);

            /* below 1 the bounds could not hold all requests */

            if (n == NGX_ERROR || n < 1000 || n > 100000) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid factor \"%V\", it must be "
                                   "a number from 1 to 100", &value[i]);
                return NGX_CONF_ERROR;
            }

            ascf->factor = n;
            continue;
        }

        if (ngx_strncmp(value[i].data, "slack=", 6) == 0) {

            n = ngx_atoi(value[i].data + 6, value[i].len - 6);

            if (n == NGX_ERROR || n > 1000000) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid slack \"%V\"", &value[i]);
                return NGX_CONF_ERROR;
            }

            ascf->slack = n;
            continue;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\"", &value[i]);
        return NGX_CONF_ERROR;
    }

    if (ngx_http_upstream_affinity_set_method(cf, ascf) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/*
 * Adds the zone of "zone=NAME:SIZE", or when value is NULL the default zone
 * named after the upstream (NAME + suffix, 8m), and makes the upstream use
 * this balancer.
 */

static char *
ngx_http_upstream_affinity_zone(ngx_conf_t *cf,
    ngx_http_upstream_affinity_srv_conf_t *ascf, ngx_str_t *value,
    ngx_str_t *suffix, affinity_zone_kind_e kind, ngx_shm_zone_t **zone)
{
    u_char                               *p;
    ssize_t                               size;
    ngx_str_t                             name, s;
    ngx_shm_zone_t                       *shm_zone;
    ngx_http_upstream_srv_conf_t         *uscf;
    ngx_http_upstream_affinity_shctx_t   *shctx;
    ngx_http_upstream_affinity_srv_conf_t **confp;

    uscf = ngx_http_conf_get_module_srv_conf(cf, ngx_http_upstream_module);

    ascf->name = uscf->host;

    if (value == NULL) {
        name.len = uscf->host.len + suffix->len;
        name.data = ngx_pnalloc(cf->pool, name.len);
        if (name.data == NULL) {
            return NGX_CONF_ERROR;
        }

        ngx_memcpy(ngx_cpymem(name.data, uscf->host.data, uscf->host.len),
                   suffix->data, suffix->len);

        size = NGX_HTTP_UPSTREAM_AFFINITY_ZONE_SIZE;

    } else {
        p = (u_char *) ngx_strchr(value->data, ':');

        if (p == NULL || p == value->data) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid zone \"%V\", it must be NAME:SIZE",
                               value);
            return NGX_CONF_ERROR;
        }

        name.data = value->data;
        name.len = p - value->data;

        s.data = p + 1;
        s.len = value->data + value->len - s.data;

        size = ngx_parse_size(&s);

        if (size == NGX_ERROR) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid zone size \"%V\"", value);
            return NGX_CONF_ERROR;
        }

        if (size < NGX_HTTP_UPSTREAM_AFFINITY_ZONE_MIN) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "zone \"%V\" is too small, the minimum is %uzk",
                               value,
                               (size_t) NGX_HTTP_UPSTREAM_AFFINITY_ZONE_MIN
                               / 1024);
            return NGX_CONF_ERROR;
        }
    }

    shm_zone = ngx_shared_memory_add(cf, &name, size,
                                     &ngx_http_upstream_affinity_module);
    if (shm_zone == NULL) {
        return NGX_CONF_ERROR;
    }

    shctx = shm_zone->data;

    if (shctx == NULL) {
        shctx = ngx_pcalloc(cf->pool,
                            sizeof(ngx_http_upstream_affinity_shctx_t));
        if (shctx == NULL) {
            return NGX_CONF_ERROR;
        }

        if (ngx_array_init(&shctx->confs, cf->pool, 2,
                           sizeof(ngx_http_upstream_affinity_srv_conf_t *))
            != NGX_OK)
        {
            return NGX_CONF_ERROR;
        }

        shctx->kind = kind;
        shctx->cycle = cf->cycle;
        shctx->row = AFFINITY_NO_ROW;

        shm_zone->init = ngx_http_upstream_affinity_init_zone;
        shm_zone->data = shctx;

    } else if (shctx->kind != kind) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "zone \"%V\" is already used for another kind "
                           "of affinity table", &name);
        return NGX_CONF_ERROR;
    }

    /* upstreams may share a zone: peers are keyed by address there */

    confp = ngx_array_push(&shctx->confs);
    if (confp == NULL) {
        return NGX_CONF_ERROR;
    }

    *confp = ascf;
    *zone = shm_zone;

    if (ngx_http_upstream_affinity_set_method(cf, ascf) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/* "timeout=TIME": idle expiry, a positive number of seconds */

static ngx_int_t
ngx_http_upstream_affinity_timeout(ngx_conf_t *cf, ngx_str_t *value,
    time_t *timeout)
{
    time_t     t;
    ngx_str_t  s;

    s.data = value->data + 8;
    s.len = value->len - 8;

    t = ngx_parse_time(&s, 1);

    if (t == (time_t) NGX_ERROR || t == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid timeout \"%V\"", value);
        return NGX_ERROR;
    }

    *timeout = t;

    return NGX_OK;
}


/*
 * "cookie_secure", "cookie_max_age=TIME", "cookie_domain=NAME",
 * "cookie_path=PATH", "cookie_samesite=strict|lax|none|off": the
 * attributes of the Set-Cookie that echoes the key.
 */

static ngx_int_t
ngx_http_upstream_affinity_cookie_parameter(ngx_conf_t *cf, ngx_str_t *value,
    ngx_http_upstream_affinity_cookie_t *cookie)
{
    u_char     *p;
    time_t      t;
    ngx_str_t   s;

    cookie->set = 1;

    if (ngx_strcmp(value->data, "cookie_secure") == 0) {
        cookie->secure = 1;
        return NGX_OK;
    }

    if (ngx_strncmp(value->data, "cookie_max_age=", 15) == 0) {
        s.data = value->data + 15;
        s.len = value->len - 15;

        t = ngx_parse_time(&s, 1);

        /* Max-Age=0 would delete the cookie with every response */

        if (t == (time_t) NGX_ERROR || t == 0) {
            goto invalid;
        }

        cookie->max_age = t;
        return NGX_OK;
    }

    if (ngx_strncmp(value->data, "cookie_domain=", 14) == 0) {
        s.data = value->data + 14;
        s.len = value->len - 14;

        for (p = s.data; p < s.data + s.len; p++) {
            if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')
                  || (*p >= '0' && *p <= '9') || *p == '.' || *p == '-'))
            {
                goto invalid;
            }
        }

        if (s.len == 0) {
            goto invalid;
        }

        cookie->domain = s;
        return NGX_OK;
    }

    if (ngx_strncmp(value->data, "cookie_path=", 12) == 0) {
        s.data = value->data + 12;
        s.len = value->len - 12;

        if (s.len == 0 || s.data[0] != '/') {
            goto invalid;
        }

        for (p = s.data; p < s.data + s.len; p++) {
            if (*p <= ' ' || *p >= 0x7f || *p == ';' || *p == ',') {
                goto invalid;
            }
        }

        cookie->path = s;
        return NGX_OK;
    }

    if (ngx_strncmp(value->data, "cookie_samesite=", 16) == 0) {
        s.data = value->data + 16;
        s.len = value->len - 16;

        if (s.len == 6 && ngx_strncasecmp(s.data, (u_char *) "strict", 6) == 0)
        {
            cookie->samesite = NGX_HTTP_UPSTREAM_AFFINITY_SAMESITE_STRICT;

        } else if (s.len == 3
                   && ngx_strncasecmp(s.data, (u_char *) "lax", 3) == 0)
        {
            cookie->samesite = NGX_HTTP_UPSTREAM_AFFINITY_SAMESITE_LAX;

        } else if (s.len == 4
                   && ngx_strncasecmp(s.data, (u_char *) "none", 4) == 0)
        {
            cookie->samesite = NGX_HTTP_UPSTREAM_AFFINITY_SAMESITE_NONE;

        } else if (s.len == 3
                   && ngx_strncasecmp(s.data, (u_char *) "off", 3) == 0)
        {
            cookie->samesite = NGX_HTTP_UPSTREAM_AFFINITY_SAMESITE_OFF;

        } else {
            goto invalid;
        }

        return NGX_OK;
    }

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "invalid parameter \"%V\"",
                       value);
    return NGX_ERROR;
}


/* the attributes after "NAME=KEY" in Set-Cookie, written once */

static ngx_int_t
ngx_http_upstream_affinity_cookie_attributes(ngx_conf_t *cf,
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_affinity_cookie_t *cookie)
{
    u_char  *p;
    size_t   len;

    static ngx_str_t  samesite[] = {
        ngx_string("; SameSite=Lax"),
        ngx_string("; SameSite=Strict"),
        ngx_string("; SameSite=None"),
        ngx_null_string
    };

    if (cookie->samesite == NGX_HTTP_UPSTREAM_AFFINITY_SAMESITE_NONE
        && !cookie->secure)
    {
        /* browsers drop such cookies */
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"cookie_samesite=none\" requires "
                           "\"cookie_secure\"");
        return NGX_ERROR;
    }

    len = sizeof("; Path=") - 1 + cookie->path.len
          + sizeof("; HttpOnly") - 1
          + samesite[cookie->samesite].len;

    if (cookie->domain.len) {
        len += sizeof("; Domain=") - 1 + cookie->domain.len;
    }

    if (cookie->max_age != NGX_CONF_UNSET) {
        len += sizeof("; Max-Age=") - 1 + NGX_TIME_T_LEN;
    }

    if (cookie->secure) {
        len += sizeof("; Secure") - 1;
    }

    p = ngx_pnalloc(cf->pool, len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    ascf->cookie_attributes.data = p;

    p = ngx_sprintf(p, "; Path=%V", &cookie->path);

    if (cookie->domain.len) {
        p = ngx_sprintf(p, "; Domain=%V", &cookie->domain);
    }

    if (cookie->max_age != NGX_CONF_UNSET) {
        p = ngx_sprintf(p, "; Max-Age=%T", cookie->max_age);
    }

    p = ngx_cpymem(p, "; HttpOnly", sizeof("; HttpOnly") - 1);

    if (cookie->secure) {
        p = ngx_cpymem(p, "; Secure", sizeof("; Secure") - 1);
    }

    p = ngx_cpymem(p, samesite[cookie->samesite].data,
                   samesite[cookie->samesite].len);

    ascf->cookie_attributes.len = p - ascf->cookie_attributes.data;
    ascf->cookie_max_age = cookie->max_age;

    return NGX_OK;
}


static ngx_int_t
ngx_http_upstream_affinity_set_method(ngx_conf_t *cf,
    ngx_http_upstream_affinity_srv_conf_t *ascf)
{
    ngx_http_upstream_srv_conf_t  *uscf;

    uscf = ngx_http_conf_get_module_srv_conf(cf, ngx_http_upstream_module);

    if (uscf->peer.init_upstream
        && uscf->peer.init_upstream != ngx_http_upstream_init_affinity)
    {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "load balancing method redefined");
    }

    uscf->peer.init_upstream = ngx_http_upstream_init_affinity;

    uscf->flags = NGX_HTTP_UPSTREAM_CREATE
                  |NGX_HTTP_UPSTREAM_WEIGHT
                  |NGX_HTTP_UPSTREAM_MAX_CONNS
                  |NGX_HTTP_UPSTREAM_MAX_FAILS
                  |NGX_HTTP_UPSTREAM_FAIL_TIMEOUT
                  |NGX_HTTP_UPSTREAM_DOWN
                  |NGX_HTTP_UPSTREAM_AFFINITY_MODIFY
                  |NGX_HTTP_UPSTREAM_BACKUP;

    return NGX_OK;
}

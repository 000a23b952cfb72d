
/*
 * The shared memory zones of ngx_http_upstream_affinity_module: declared by
 * the directives, laid out by the core when nginx maps them (and reused by
 * a reload with the same name and size), and the worker rows through which
 * the requests of a worker that dies are given back.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_upstream_affinity_module.h"


/*
 * The default zone size, and the smallest: the core's own minimum and
 * nginx's slab pool with it, rounded up to a size users write.
 */
#define NGX_HTTP_UPSTREAM_AFFINITY_ZONE_SIZE    (8 * 1024 * 1024)
#define NGX_HTTP_UPSTREAM_AFFINITY_ZONE_MIN     (128 * 1024)

#if (AFFINITY_ZONE_MIN_SIZE + 16 * 1024 > NGX_HTTP_UPSTREAM_AFFINITY_ZONE_MIN)
#error "the smallest zone must leave the core its minimum and a slab pool"
#endif

/* bytes before the table in a zone's allocation, whole cache lines */
#define NGX_HTTP_UPSTREAM_AFFINITY_ZONE_PREFIX                                \
    ngx_align(sizeof(ngx_http_upstream_affinity_zone_head_t), 64)


/* called for each affinity zone at worker start and exit */
typedef void (*ngx_http_upstream_affinity_zone_pt)(
    ngx_http_upstream_affinity_shctx_t *shctx, ngx_log_t *log);


static ngx_int_t ngx_http_upstream_affinity_init_zone(ngx_shm_zone_t *shm_zone,
    void *data);
static ngx_int_t ngx_http_upstream_affinity_claim_zone_slots(
    ngx_http_upstream_affinity_shctx_t *shctx, ngx_log_t *log);
static void ngx_http_upstream_affinity_each_zone(ngx_cycle_t *cycle,
    ngx_http_upstream_affinity_zone_pt handler);
static void ngx_http_upstream_affinity_claim_row(
    ngx_http_upstream_affinity_shctx_t *shctx, ngx_log_t *log);
static void ngx_http_upstream_affinity_release_row(
    ngx_http_upstream_affinity_shctx_t *shctx, ngx_log_t *log);


/*
 * Adds the zone of "zone=NAME:SIZE", or when value is NULL the default zone
 * named after the upstream (NAME + suffix, 8m).  Upstreams may share a
 * zone: peers are keyed by address there.
 */

char *
ngx_http_upstream_affinity_add_zone(ngx_conf_t *cf,
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

        size = ngx_http_upstream_affinity_parse_size(cf, "zone", value, &s,
                                          NGX_HTTP_UPSTREAM_AFFINITY_ZONE_MIN,
                                          NGX_MAX_OFF_T_VALUE);
        if (size == NGX_ERROR) {
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

    confp = ngx_array_push(&shctx->confs);
    if (confp == NULL) {
        return NGX_CONF_ERROR;
    }

    *confp = ascf;
    *zone = shm_zone;

    return NGX_CONF_OK;
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
        shctx->head = oshctx->head;
        shctx->zone = oshctx->zone;

        return ngx_http_upstream_affinity_claim_zone_slots(shctx,
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
         * a fixed-capacity table needs no allocator after this.  The
         * module's head comes first, with the size, for processes that
         * attach on their own (shm.exists, on Windows).
         */

        size = shpool->pfree << ngx_pagesize_shift;

        region = ngx_slab_alloc(shpool, size);
        if (region == NULL) {
            return NGX_ERROR;
        }

        ngx_memzero(region, NGX_HTTP_UPSTREAM_AFFINITY_ZONE_PREFIX);
        ((ngx_http_upstream_affinity_zone_head_t *) region)->size = size;
        shpool->data = region;
    }

    region = shpool->data;
    shctx->head = (ngx_http_upstream_affinity_zone_head_t *) region;
    size = shctx->head->size - NGX_HTTP_UPSTREAM_AFFINITY_ZONE_PREFIX;
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

    return ngx_http_upstream_affinity_claim_zone_slots(shctx,
                                                       shm_zone->shm.log);
}


/*
 * Gives every peer of the upstreams using a zone its counter slot there.
 * Runs in the master at (re)configuration, before workers start; the slots
 * are keyed by peer id, so a reload finds the counters it left.
 */

static ngx_int_t
ngx_http_upstream_affinity_claim_zone_slots(
    ngx_http_upstream_affinity_shctx_t *shctx, ngx_log_t *log)
{
    ngx_uint_t                               i;
    ngx_http_upstream_affinity_srv_conf_t  **confs;

    confs = shctx->confs.elts;

    for (i = 0; i < shctx->confs.nelts; i++) {
        if (confs[i]->counter_zone == shctx->shm_zone && confs[i]->view) {
            ngx_http_upstream_affinity_claim_slots(shctx, confs[i]->view,
                                                   &confs[i]->name, log);
        }
    }

    return NGX_OK;
}


/*
 * A worker claims a row in each affinity zone that counts requests: its
 * in-flight requests are counted there too, so that whoever outlives it can
 * give them back if it dies.  Rows left by workers that died before it
 * started are reaped now.
 */

void
ngx_http_upstream_affinity_claim_rows(ngx_cycle_t *cycle)
{
    ngx_http_upstream_affinity_each_zone(cycle,
        ngx_http_upstream_affinity_claim_row);
}


void
ngx_http_upstream_affinity_release_rows(ngx_cycle_t *cycle)
{
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

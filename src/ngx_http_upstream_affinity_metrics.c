
/*
 * The engines' own load: every interval, one worker (whichever's turn it
 * is, across all workers) fetches each primary server's metrics page
 * (vLLM's or SGLang's /metrics) on nginx's event loop, reads the requests
 * it is running and queuing, and keeps them in the zone, where the load
 * bound of every worker counts them: requests other nginx instances sent
 * are seen too.  A server that does not answer, answers late or answers
 * junk keeps its last figure until it expires, then is counted by this
 * instance's own requests only.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>
#include <ngx_event_connect.h>
#include <ngx_http.h>

#include "ngx_http_upstream_affinity_module.h"


/* the largest metrics page read (vLLM's is a few tens of KB) */
#define NGX_HTTP_UPSTREAM_AFFINITY_METRICS_MAX  (1024 * 1024)


/* a server to fetch from, copied out of the peer list */
typedef struct {
    ngx_sockaddr_t                          sockaddr;
    socklen_t                               socklen;
    ngx_str_t                               name;
    u_char                                  text[NGX_SOCKADDR_STRLEN];
} ngx_http_upstream_affinity_target_t;


typedef struct {
    ngx_http_upstream_affinity_srv_conf_t  *conf;
    ngx_http_upstream_srv_conf_t           *upstream;
    ngx_event_t                             timer;
    ngx_log_t                              *log;
    ngx_uint_t                              warned;
    ngx_http_upstream_affinity_target_t    *targets;
} ngx_http_upstream_affinity_poller_t;


/* one fetch of one server's page */
typedef struct {
    ngx_http_upstream_affinity_poller_t    *poller;
    ngx_peer_connection_t                   pc;
    ngx_pool_t                             *pool;
    ngx_str_t                               name;
    uint64_t                                peer;
    uint32_t                                slot;   /* in the counter
                                                       zone */
    affinity_engine_asked_t                 asked;
    ngx_buf_t                              *out;
    ngx_buf_t                              *in;
} ngx_http_upstream_affinity_fetch_t;


static void ngx_http_upstream_affinity_metrics_start(ngx_cycle_t *cycle,
    ngx_http_upstream_srv_conf_t *uscf,
    ngx_http_upstream_affinity_srv_conf_t *ascf);
static void ngx_http_upstream_affinity_metrics_tick(ngx_event_t *ev);
static void ngx_http_upstream_affinity_metrics_fetch(
    ngx_http_upstream_affinity_poller_t *poller,
    ngx_http_upstream_affinity_target_t *target);
static void ngx_http_upstream_affinity_metrics_send(ngx_event_t *wev);
static void ngx_http_upstream_affinity_metrics_recv(ngx_event_t *rev);
static void ngx_http_upstream_affinity_metrics_done(
    ngx_http_upstream_affinity_fetch_t *f, const char *error);
static void ngx_http_upstream_affinity_metrics_read(
    ngx_http_upstream_affinity_fetch_t *f);


void
ngx_http_upstream_affinity_metrics_init(ngx_cycle_t *cycle)
{
    ngx_http_upstream_affinity_each_upstream(cycle,
                                     ngx_http_upstream_affinity_metrics_start);
}


static void
ngx_http_upstream_affinity_metrics_start(ngx_cycle_t *cycle,
    ngx_http_upstream_srv_conf_t *uscf,
    ngx_http_upstream_affinity_srv_conf_t *ascf)
{
    ngx_http_upstream_affinity_poller_t  *poller;

    if (ascf->metrics_conf == NULL) {
        return;
    }

    poller = ngx_pcalloc(cycle->pool,
                         sizeof(ngx_http_upstream_affinity_poller_t));
    if (poller == NULL) {
        return;
    }

    poller->targets = ngx_palloc(cycle->pool, AFFINITY_MAX_PEERS
                                 * sizeof(ngx_http_upstream_affinity_target_t));
    if (poller->targets == NULL) {
        return;
    }

    poller->conf = ascf;
    poller->upstream = uscf;
    poller->log = cycle->log;

    poller->timer.handler = ngx_http_upstream_affinity_metrics_tick;
    poller->timer.data = poller;
    poller->timer.log = cycle->log;
    poller->timer.cancelable = 1;

    /* workers start at once: the zone gives one of them the turn */

    ngx_add_timer(&poller->timer, 10 + ngx_random() % 100);
}


static void
ngx_http_upstream_affinity_metrics_tick(ngx_event_t *ev)
{
    ngx_msec_t                              interval;
    ngx_uint_t                              n, i;
    ngx_http_upstream_rr_peer_t            *peer;
    ngx_http_upstream_rr_peers_t           *peers;
    ngx_http_upstream_affinity_target_t    *t;
    ngx_http_upstream_affinity_shctx_t     *shctx;
    ngx_http_upstream_affinity_poller_t    *poller = ev->data;

    if (ngx_exiting || ngx_terminate || ngx_quit) {
        return;
    }

    interval = poller->conf->metrics_conf->interval;
    ngx_add_timer(ev, interval);

    shctx = poller->conf->counter_zone->data;

    if (!affinity_engine_claim_poll(shctx->zone, (uint64_t) ngx_current_msec,
                                    (uint32_t) interval))
    {
        return;
    }

    peers = poller->upstream->peer.data;

    if (peers == NULL) {
        return;
    }

    /*
     * The list may change at run time (servers with "resolve"), and other
     * workers balance under its lock: only the addresses are copied under
     * it, and the fetches connect after it.
     */

    n = 0;

    ngx_http_upstream_rr_peers_rlock(peers);

    for (peer = peers->peer; peer && n < AFFINITY_MAX_PEERS;
         peer = peer->next)
    {
        if (peer->down || peer->socklen > sizeof(ngx_sockaddr_t)
            || peer->name.len > NGX_SOCKADDR_STRLEN)
        {
            continue;
        }

        t = &poller->targets[n++];
        ngx_memcpy(&t->sockaddr, peer->sockaddr, peer->socklen);
        t->socklen = peer->socklen;
        t->name.len = peer->name.len;
        t->name.data = t->text;
        ngx_memcpy(t->text, peer->name.data, peer->name.len);
    }

    ngx_http_upstream_rr_peers_unlock(peers);

    for (i = 0; i < n; i++) {
        ngx_http_upstream_affinity_metrics_fetch(poller, &poller->targets[i]);
    }
}


static void
ngx_http_upstream_affinity_metrics_fetch(
    ngx_http_upstream_affinity_poller_t *poller,
    ngx_http_upstream_affinity_target_t *peer)
{
    int                                         awaits;
    uint64_t                                    id;
    ngx_int_t                                   rc;
    ngx_pool_t                                 *pool;
    ngx_connection_t                           *c;
    ngx_http_upstream_affinity_fetch_t         *f;
    ngx_http_upstream_affinity_shctx_t         *shctx;
    ngx_http_upstream_affinity_metrics_conf_t  *mcf;

    mcf = poller->conf->metrics_conf;

    /* an engine that still owes an earlier poll its answer is not called */

    id = affinity_peer_id((char *) peer->name.data, peer->name.len);
    shctx = poller->conf->counter_zone->data;

    ngx_shmtx_lock(&shctx->shpool->mutex);
    awaits = affinity_engine_awaiting(shctx->zone,
                                      affinity_zone_peer_find(shctx->zone,
                                                              id),
                                      ngx_http_upstream_affinity_wall_msec(),
                                      mcf->timeout);
    ngx_shmtx_unlock(&shctx->shpool->mutex);

    if (awaits) {
        return;
    }

    pool = ngx_create_pool(1024, poller->log);
    if (pool == NULL) {
        return;
    }

    f = ngx_pcalloc(pool, sizeof(ngx_http_upstream_affinity_fetch_t));
    if (f == NULL) {
        goto failed;
    }

    f->poller = poller;
    f->pool = pool;

    f->name.data = ngx_pstrdup(pool, &peer->name);
    if (f->name.data == NULL) {
        goto failed;
    }

    f->name.len = peer->name.len;
    f->peer = id;

    f->pc.sockaddr = ngx_palloc(pool, peer->socklen);
    if (f->pc.sockaddr == NULL) {
        goto failed;
    }

    ngx_memcpy(f->pc.sockaddr, &peer->sockaddr, peer->socklen);
    f->pc.socklen = peer->socklen;
    f->pc.name = &f->name;
    f->pc.get = ngx_event_get_peer;
    f->pc.log = poller->log;
    f->pc.log_error = NGX_ERROR_INFO;
    f->pc.tries = 1;

    f->out = ngx_create_temp_buf(pool, sizeof("GET  HTTP/1.0" CRLF
                                              "Host: " CRLF
                                              "Accept: text/plain" CRLF
                                              "Connection: close" CRLF CRLF)
                                       + mcf->path.len + f->name.len);
    if (f->out == NULL) {
        goto failed;
    }

    f->out->last = ngx_sprintf(f->out->last,
                               "GET %V HTTP/1.0" CRLF
                               "Host: %V" CRLF
                               "Accept: text/plain" CRLF
                               "Connection: close" CRLF CRLF,
                               &mcf->path, &f->name);

    rc = ngx_event_connect_peer(&f->pc);

    if (rc == NGX_ERROR || rc == NGX_DECLINED || rc == NGX_BUSY) {
        ngx_http_upstream_affinity_metrics_done(f, "cannot connect");
        return;
    }

    c = f->pc.connection;
    c->data = f;
    c->pool = pool;
    c->read->handler = ngx_http_upstream_affinity_metrics_recv;
    c->write->handler = ngx_http_upstream_affinity_metrics_send;

    ngx_add_timer(c->write, mcf->timeout);

    if (rc == NGX_OK) {
        ngx_http_upstream_affinity_metrics_send(c->write);
    }

    return;

failed:

    ngx_destroy_pool(pool);
}


static void
ngx_http_upstream_affinity_metrics_send(ngx_event_t *wev)
{
    int                                  awaited;
    ssize_t                              n;
    ngx_msec_t                           timeout;
    ngx_connection_t                    *c;
    ngx_http_upstream_affinity_fetch_t  *f;
    ngx_http_upstream_affinity_shctx_t  *shctx;

    c = wev->data;
    f = c->data;

    if (wev->timedout) {
        ngx_http_upstream_affinity_metrics_done(f, "timed out");
        return;
    }

    if (f->out->pos == f->out->last) {
        return;     /* sent already: the reply is the read side's */
    }

    while (f->out->pos < f->out->last) {
        n = c->send(c, f->out->pos, f->out->last - f->out->pos);

        if (n == NGX_AGAIN) {
            if (ngx_handle_write_event(wev, 0) != NGX_OK) {
                ngx_http_upstream_affinity_metrics_done(f, "send failed");
            }

            return;
        }

        if (n == NGX_ERROR) {
            ngx_http_upstream_affinity_metrics_done(f, "send failed");
            return;
        }

        f->out->pos += n;
    }

    /*
     * all sent: the timer moves to the reply; the engine's figure will
     * count what started before this, and not what ended before.  Another
     * worker may have asked since this one looked (fetch()): its answer
     * is awaited, and this ask dropped.
     */

    timeout = f->poller->conf->metrics_conf->timeout;
    shctx = f->poller->conf->counter_zone->data;

    ngx_shmtx_lock(&shctx->shpool->mutex);
    f->slot = affinity_zone_peer_find(shctx->zone, f->peer);
    awaited = affinity_engine_ask(shctx->zone, f->slot,
                                  ngx_http_upstream_affinity_wall_msec(),
                                  timeout, &f->asked);
    ngx_shmtx_unlock(&shctx->shpool->mutex);

    if (!awaited) {
        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, f->poller->log, 0,
                       "affinity metrics of %V: an earlier ask waits",
                       &f->name);
        ngx_http_upstream_affinity_metrics_done(f, NULL);
        return;
    }

    if (wev->timer_set) {
        ngx_del_timer(wev);
    }

    ngx_add_timer(c->read, timeout);

    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        ngx_http_upstream_affinity_metrics_done(f, "recv failed");
        return;
    }

    if (c->read->ready) {
        ngx_http_upstream_affinity_metrics_recv(c->read);
    }
}


static void
ngx_http_upstream_affinity_metrics_recv(ngx_event_t *rev)
{
    size_t                               size;
    ssize_t                              n;
    ngx_buf_t                           *b;
    ngx_connection_t                    *c;
    ngx_http_upstream_affinity_fetch_t  *f;

    c = rev->data;
    f = c->data;

    if (rev->timedout) {
        ngx_http_upstream_affinity_metrics_done(f, "timed out");
        return;
    }

    if (f->out->pos < f->out->last) {
        return;     /* a reply before the request: wait for the write */
    }

    for ( ;; ) {
        b = f->in;

        if (b == NULL || b->last == b->end) {
            size = b ? 2 * (size_t) (b->end - b->start) : 64 * 1024;

            if (size > NGX_HTTP_UPSTREAM_AFFINITY_METRICS_MAX) {
                ngx_http_upstream_affinity_metrics_done(f,
                                                  "page larger than 1 MB");
                return;
            }

            b = ngx_create_temp_buf(f->pool, size);
            if (b == NULL) {
                ngx_http_upstream_affinity_metrics_done(f, "no memory");
                return;
            }

            if (f->in) {
                b->last = ngx_cpymem(b->last, f->in->pos,
                                     f->in->last - f->in->pos);
            }

            f->in = b;
        }

        n = c->recv(c, b->last, b->end - b->last);

        if (n == NGX_AGAIN) {
            if (ngx_handle_read_event(rev, 0) != NGX_OK) {
                ngx_http_upstream_affinity_metrics_done(f, "recv failed");
            }

            return;
        }

        if (n == NGX_ERROR) {
            ngx_http_upstream_affinity_metrics_done(f, "recv failed");
            return;
        }

        if (n == 0) {
            ngx_http_upstream_affinity_metrics_read(f);
            return;
        }

        b->last += n;
    }
}


/* the whole reply is here (the server closed): a 200 and its page */

static void
ngx_http_upstream_affinity_metrics_read(ngx_http_upstream_affinity_fetch_t *f)
{
    int                                     taken;
    off_t                                   size;
    u_char                                 *p, *last, *length, *digits;
    uint32_t                                slot;
    affinity_engine_load_t                  load;
    ngx_http_upstream_affinity_shctx_t     *shctx;
    ngx_http_upstream_affinity_srv_conf_t  *conf;

    if (f->in == NULL) {
        ngx_http_upstream_affinity_metrics_done(f, "empty reply");
        return;
    }

    p = f->in->pos;
    last = f->in->last;

    if (last - p < 12
        || ngx_strncmp(p, "HTTP/1.", 7) != 0
        || ngx_strncmp(p + 8, " 200", 4) != 0)
    {
        ngx_http_upstream_affinity_metrics_done(f, "not a 200 reply");
        return;
    }

    p = ngx_strlcasestrn(p, last, (u_char *) CRLF CRLF, 4 - 1);

    if (p == NULL) {
        ngx_http_upstream_affinity_metrics_done(f, "truncated reply");
        return;
    }

    /*
     * A page cut short would show counters that stepped back: with a
     * Content-Length, the whole body or nothing.
     */

    length = ngx_strlcasestrn(f->in->pos, p + 2,
                              (u_char *) CRLF "content-length:", 17 - 1);

    if (length != NULL) {
        for (length += 17; length < p && *length == ' '; length++) {
            /* void */
        }

        for (digits = length; digits < p && *digits >= '0' && *digits <= '9';
             digits++)
        {
            /* void */
        }

        size = ngx_atoof(length, digits - length);

        if (size == NGX_ERROR || last - (p + 4) < size) {
            ngx_http_upstream_affinity_metrics_done(f, "truncated reply");
            return;
        }
    }

    p += 4;

    if (affinity_engine_metrics((char *) p, last - p, &load) != 0) {
        ngx_http_upstream_affinity_metrics_done(f,
                                   "no requests running or waiting in it");
        return;
    }

    /*
     * The peer's slot, unless another peer took it since it was asked.
     * An answer the slot no longer awaits is older than the figure it
     * holds, and goes nowhere; a peer without a slot awaits none.
     */

    shctx = f->poller->conf->counter_zone->data;

    ngx_shmtx_lock(&shctx->shpool->mutex);

    slot = affinity_zone_peer_find(shctx->zone, f->peer);
    taken = 1;

    if (slot != f->slot) {
        affinity_engine_give_up(shctx->zone, f->slot, &f->asked);
        taken = 0;

    } else if (slot != AFFINITY_NO_SLOT) {
        taken = affinity_engine_answer(shctx->zone, slot, &load,
                                       (uint32_t) ngx_time(), &f->asked);
    }

    ngx_shmtx_unlock(&shctx->shpool->mutex);

    if (!taken) {
        ngx_http_upstream_affinity_metrics_done(f, NULL);
        return;
    }

    /*
     * What the engine computed, from every instance and client, moves its
     * modelled cache in the prefix index (prefix_affinity): this instance
     * alone counts only its own prompts.
     */

    conf = f->poller->conf;

    if (conf->prefix_zone != NULL
        && (load.found & AFFINITY_ENGINE_COMPUTED))
    {
        shctx = conf->prefix_zone->data;

        ngx_shmtx_lock(&shctx->shpool->mutex);
        affinity_prefixes_polled(shctx->zone, f->peer, &load,
                                 conf->prefix_cache);
        ngx_shmtx_unlock(&shctx->shpool->mutex);
    }

    ngx_log_debug5(NGX_LOG_DEBUG_HTTP, f->poller->log, 0,
                   "affinity metrics of %V: %.0f running, %.0f waiting, "
                   "cache %.3f of %.0f tokens", &f->name, load.running,
                   load.waiting, load.cache_usage, load.cache_tokens);

    ngx_http_upstream_affinity_metrics_done(f, NULL);
}


static void
ngx_http_upstream_affinity_metrics_done(ngx_http_upstream_affinity_fetch_t *f,
    const char *error)
{
    ngx_http_upstream_affinity_shctx_t   *shctx;
    ngx_http_upstream_affinity_poller_t  *poller;

    poller = f->poller;

    /* an ask that got no answer to take lets the next poll ask at once */

    if (error && f->asked.ms != 0) {
        shctx = poller->conf->counter_zone->data;

        ngx_shmtx_lock(&shctx->shpool->mutex);
        affinity_engine_give_up(shctx->zone, f->slot, &f->asked);
        ngx_shmtx_unlock(&shctx->shpool->mutex);
    }

    if (error && !poller->warned) {
        ngx_log_error(NGX_LOG_WARN, poller->log, 0,
                      "affinity: metrics of %V in upstream \"%V\": %s; "
                      "counting its requests from here only until it "
                      "answers", &f->name, &poller->conf->name, error);
        poller->warned = 1;
    }

    if (f->pc.connection) {
        ngx_close_connection(f->pc.connection);
        f->pc.connection = NULL;
    }

    ngx_destroy_pool(f->pool);
}


/*
 * Several nginx instances, one routing: what an instance learns (session
 * pins, response ids, the peers that served a prompt's levels) is appended
 * to a Redis stream, and every instance reads the stream and applies what
 * the others learned to its own zones.  A request never waits for the
 * store: publishing appends to the connection's output buffer, reading is
 * done by the event loop; when the store is away, each instance routes on
 * its own state, keeps what it learned meanwhile in a bounded backlog, and
 * sends it when the store returns.
 *
 * The connections use hiredis' asynchronous API on nginx's event loop: a
 * connection of nginx's own wraps the socket hiredis opened, and its read
 * and write handlers call hiredis (level-triggered, since hiredis reads
 * one buffer per call).  Each worker has a connection per upstream that
 * appends (XADD); the first worker has another that waits on the stream
 * (XREAD BLOCK): it applies what the other instances learned to the zones,
 * which all workers share, and reads every worker's announcements back.
 * Redis sends each entry to one reader per instance.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>
#include <ngx_http.h>

#include <hiredis/hiredis.h>
#include <hiredis/async.h>
#include <hiredis/sds.h>

#include "ngx_http_upstream_affinity_module.h"


#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_CONNECT   2000    /* ms */
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_RETRY     1000    /* ms */
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_BLOCK     5000    /* ms */
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_COUNT     1000    /* per read */

/*
 * News of a request (sent, how far it filled a cache, ended) is counted, not
 * learned: only when sent (not kept while the store is away, where it
 * would displace what was learned, but for the end of a request whose
 * start was sent), and once per instance (by its reader, and not again by
 * one that starts again: ..._store_unseen()).  That a request started or
 * ended counts on its peer's load only if it came after the peer's engine
 * was last asked for its figure, the sender's stamp to the millisecond
 * against the asking instance's clock (affinity_zone_peer_sent_elsewhere()),
 * however late it is read: a request's start and end, both read, count
 * both or neither.  How far a prompt filled a cache counts only this old:
 * read after the store was away, it would age the model late.  In whole
 * seconds of the senders' and the readers' clocks: news up to 2 s old is
 * taken.
 */
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_FRESH     1       /* s */

/* the worker that reads the stream for its instance */
#define ngx_http_upstream_affinity_store_reads()  (ngx_worker == 0)

#define ngx_http_upstream_affinity_store_news(kind)                           \
    ((kind) == AFFINITY_STORE_SENT || (kind) == AFFINITY_STORE_FILLED         \
     || (kind) == AFFINITY_STORE_DONE)

/*
 * The other instances this worker heard from, each told to the counter
 * zone at most once a second (affinity_zone_instance_seen()).
 */
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_HEARD     8

/* output not yet written to the store beyond which messages are dropped */
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_PENDING   (8 * 1024 * 1024)


/* a message kept while the store is away */
typedef struct {
    size_t                                  len;
    u_char                                  data[AFFINITY_STORE_MESSAGE_MAX];
} ngx_http_upstream_affinity_backlog_t;


/*
 * A request announced to the store (AFFINITY_STORE_SENT), until both its
 * request and the store's answer are done with it: the end of the request
 * is announced only if its start was taken, or may still be, so that the
 * others never count one without the other.
 */
struct ngx_http_upstream_affinity_announcement_s {
    uint64_t                                peer;
    uintptr_t                               ticket; /* for the answer */
    unsigned                                answered:1;
    unsigned                                taken:1;
    unsigned                                ended:1; /* its request */
};


/* another instance, and when this worker last read a message of it */
typedef struct {
    uint64_t                                instance;
    time_t                                  time;
} ngx_http_upstream_affinity_heard_t;


/* the store of one upstream, in one worker */
struct ngx_http_upstream_affinity_store_s {
    ngx_http_upstream_affinity_srv_conf_t  *conf;
    ngx_log_t                              *log;
    redisAsyncContext                      *writer;
    redisAsyncContext                      *reader;
    ngx_event_t                             retry;
    ngx_event_t                             timeout;
    uint64_t                                instance;
    uint32_t                                stream;     /* name's crc32 */

    /* the id of the last stream entry read */
    char                                    last[64];

    /* messages learned while the store was away: a ring */
    ngx_http_upstream_affinity_backlog_t   *backlog;
    ngx_uint_t                              first;
    ngx_uint_t                              queued;

    ngx_http_upstream_affinity_heard_t
                              heard[NGX_HTTP_UPSTREAM_AFFINITY_STORE_HEARD];

    ngx_uint_t                              dropped;
    unsigned                                up:1;       /* all connected */
    unsigned                                warned:1;   /* since it left */
    unsigned                                exiting:1;
};


static void ngx_http_upstream_affinity_store_open_upstream(
    ngx_cycle_t *cycle, ngx_http_upstream_srv_conf_t *uscf,
    ngx_http_upstream_affinity_srv_conf_t *ascf);
static void ngx_http_upstream_affinity_store_close_upstream(
    ngx_cycle_t *cycle, ngx_http_upstream_srv_conf_t *uscf,
    ngx_http_upstream_affinity_srv_conf_t *ascf);
static void ngx_http_upstream_affinity_store_connect(
    ngx_http_upstream_affinity_store_t *store);
static redisAsyncContext *ngx_http_upstream_affinity_store_open(
    ngx_http_upstream_affinity_store_t *store);
static void ngx_http_upstream_affinity_store_connected(
    const redisAsyncContext *ac, int status);
static void ngx_http_upstream_affinity_store_disconnected(
    const redisAsyncContext *ac, int status);
static void ngx_http_upstream_affinity_store_lost(
    ngx_http_upstream_affinity_store_t *store, const char *why);
static void ngx_http_upstream_affinity_store_retry(ngx_event_t *ev);
static void ngx_http_upstream_affinity_store_timeout(ngx_event_t *ev);
static size_t ngx_http_upstream_affinity_store_encode(
    ngx_http_upstream_affinity_store_t *store,
    affinity_store_message_t *message, u_char *buf);
static ngx_int_t ngx_http_upstream_affinity_store_send(
    ngx_http_upstream_affinity_store_t *store, u_char *data, size_t len,
    uintptr_t ticket, uint32_t number, redisCallbackFn *callback,
    void *privdata);
static void ngx_http_upstream_affinity_store_flush(
    ngx_http_upstream_affinity_store_t *store);
static void ngx_http_upstream_affinity_store_sent(redisAsyncContext *ac,
    void *reply, void *data);
static void ngx_http_upstream_affinity_store_heard(redisAsyncContext *ac,
    void *reply, void *data);
static void ngx_http_upstream_affinity_store_read(
    ngx_http_upstream_affinity_store_t *store);
static void ngx_http_upstream_affinity_store_entries(redisAsyncContext *ac,
    void *reply, void *data);
static void ngx_http_upstream_affinity_store_apply(
    ngx_http_upstream_affinity_store_t *store, redisReply *fields,
    ngx_uint_t unseen);
static ngx_uint_t ngx_http_upstream_affinity_store_unseen(
    ngx_http_upstream_affinity_store_t *store);
static ngx_http_upstream_affinity_stream_read_t *
    ngx_http_upstream_affinity_store_record(
    ngx_http_upstream_affinity_store_t *store);
static void ngx_http_upstream_affinity_store_reader_is(
    ngx_http_upstream_affinity_store_t *store, ngx_pid_t pid);
static ngx_uint_t ngx_http_upstream_affinity_store_reading(
    ngx_http_upstream_affinity_store_t *store);
static off_t ngx_http_upstream_affinity_store_number(redisReply *fields,
    u_char name);
static void ngx_http_upstream_affinity_store_heard_from(
    ngx_http_upstream_affinity_store_t *store, uint64_t instance,
    time_t now);

static ngx_int_t ngx_http_upstream_affinity_store_attach(
    redisAsyncContext *ac, ngx_log_t *log);
static void ngx_http_upstream_affinity_store_add_read(void *data);
static void ngx_http_upstream_affinity_store_del_read(void *data);
static void ngx_http_upstream_affinity_store_add_write(void *data);
static void ngx_http_upstream_affinity_store_del_write(void *data);
static void ngx_http_upstream_affinity_store_cleanup(void *data);
static void ngx_http_upstream_affinity_store_readable(ngx_event_t *ev);
static void ngx_http_upstream_affinity_store_writable(ngx_event_t *ev);


/* each worker opens the stores of the upstreams that have one */

void
ngx_http_upstream_affinity_store_init(ngx_cycle_t *cycle)
{
    ngx_http_upstream_affinity_each_upstream(cycle,
                              ngx_http_upstream_affinity_store_open_upstream);
}


void
ngx_http_upstream_affinity_store_exit(ngx_cycle_t *cycle)
{
    ngx_http_upstream_affinity_each_upstream(cycle,
                             ngx_http_upstream_affinity_store_close_upstream);
}


static void
ngx_http_upstream_affinity_store_open_upstream(ngx_cycle_t *cycle,
    ngx_http_upstream_srv_conf_t *uscf,
    ngx_http_upstream_affinity_srv_conf_t *ascf)
{
    affinity_zone_info_t                 info;
    ngx_http_upstream_affinity_store_t  *store;
    ngx_http_upstream_affinity_shctx_t  *shctx;

    if (ascf->store_conf == NULL) {
        return;
    }

    store = ngx_pcalloc(cycle->pool,
                        sizeof(ngx_http_upstream_affinity_store_t));
    if (store == NULL) {
        return;
    }

    store->backlog = ngx_alloc(ascf->store_conf->backlog
                               * sizeof(ngx_http_upstream_affinity_backlog_t),
                               cycle->log);
    if (store->backlog == NULL) {
        return;
    }

    /*
     * The instance is known by the random seed of its counter zone: every
     * worker of one nginx shares it, across reloads, and another nginx has
     * its own.
     */

    shctx = ascf->counter_zone->data;
    affinity_zone_info(shctx->zone, &info);

    store->conf = ascf;
    store->log = cycle->log;
    store->instance = info.seed;
    store->stream = ngx_crc32_short(ascf->store_conf->stream.data,
                                    ascf->store_conf->stream.len);

    /* entries still in the stream are applied if not expired */
    ngx_cpystrn((u_char *) store->last, (u_char *) "0-0",
                sizeof(store->last));

    store->retry.handler = ngx_http_upstream_affinity_store_retry;
    store->retry.data = store;
    store->retry.log = cycle->log;
    store->retry.cancelable = 1;

    store->timeout.handler = ngx_http_upstream_affinity_store_timeout;
    store->timeout.data = store;
    store->timeout.log = cycle->log;
    store->timeout.cancelable = 1;

    ascf->store = store;

    ngx_http_upstream_affinity_store_connect(store);
}


static void
ngx_http_upstream_affinity_store_close_upstream(ngx_cycle_t *cycle,
    ngx_http_upstream_srv_conf_t *uscf,
    ngx_http_upstream_affinity_srv_conf_t *ascf)
{
    ngx_http_upstream_affinity_store_t  *store;

    store = ascf->store;

    if (store == NULL) {
        return;
    }

    store->exiting = 1;
    ngx_http_upstream_affinity_store_reader_is(store, 0);

    if (store->writer) {
        redisAsyncFree(store->writer);
    }

    if (store->reader) {
        redisAsyncFree(store->reader);
    }

    ngx_free(store->backlog);
    ascf->store = NULL;
}


static void
ngx_http_upstream_affinity_store_connect(
    ngx_http_upstream_affinity_store_t *store)
{
    store->writer = ngx_http_upstream_affinity_store_open(store);
    store->reader = NULL;

    if (ngx_http_upstream_affinity_store_reads()) {
        store->reader = ngx_http_upstream_affinity_store_open(store);
    }

    if (store->writer == NULL
        || (ngx_http_upstream_affinity_store_reads() && store->reader == NULL))
    {
        ngx_http_upstream_affinity_store_lost(store, "cannot connect");
        return;
    }

    ngx_add_timer(&store->timeout, NGX_HTTP_UPSTREAM_AFFINITY_STORE_CONNECT);
}


static redisAsyncContext *
ngx_http_upstream_affinity_store_open(
    ngx_http_upstream_affinity_store_t *store)
{
    redisAsyncContext                       *ac;
    ngx_http_upstream_affinity_store_conf_t *scf;

    scf = store->conf->store_conf;

    if (scf->unix_path.len) {
        ac = redisAsyncConnectUnix((char *) scf->unix_path.data);

    } else {
        ac = redisAsyncConnect((char *) scf->host.data, (int) scf->port);
    }

    if (ac == NULL) {
        return NULL;
    }

    if (ac->err
        || ngx_http_upstream_affinity_store_attach(ac, store->log) != NGX_OK)
    {
        redisAsyncFree(ac);
        return NULL;
    }

    ac->data = store;

    redisAsyncSetConnectCallback(ac,
                                 ngx_http_upstream_affinity_store_connected);
    redisAsyncSetDisconnectCallback(ac,
                              ngx_http_upstream_affinity_store_disconnected);

    return ac;
}


static void
ngx_http_upstream_affinity_store_connected(const redisAsyncContext *ac,
    int status)
{
    ngx_http_upstream_affinity_store_t  *store = ac->data;

    if (ac != store->writer && ac != store->reader) {
        return;     /* given up on already */
    }

    if (status != REDIS_OK) {
        /* hiredis frees the context after this callback */

        if (ac == store->writer) {
            store->writer = NULL;

        } else if (ac == store->reader) {
            store->reader = NULL;
        }

        ngx_http_upstream_affinity_store_lost(store, ac->errstr);
        return;
    }

    if (!(store->writer && (store->writer->c.flags & REDIS_CONNECTED)
          && (!ngx_http_upstream_affinity_store_reads()
              || (store->reader
                  && (store->reader->c.flags & REDIS_CONNECTED)))))
    {
        return;
    }

    if (store->timeout.timer_set) {
        ngx_del_timer(&store->timeout);
    }

    store->up = 1;
    ngx_http_upstream_affinity_store_reader_is(store, ngx_pid);

    if (store->warned) {
        ngx_log_error(NGX_LOG_NOTICE, store->log, 0,
                      "affinity: store of upstream \"%V\" is back, "
                      "%ui messages to send, %ui dropped",
                      &store->conf->name, store->queued, store->dropped);
        store->warned = 0;
        store->dropped = 0;
    }

    ngx_http_upstream_affinity_store_flush(store);
    ngx_http_upstream_affinity_store_read(store);
}


static void
ngx_http_upstream_affinity_store_disconnected(const redisAsyncContext *ac,
    int status)
{
    ngx_http_upstream_affinity_store_t  *store = ac->data;

    if (store->exiting || (ac != store->writer && ac != store->reader)) {
        return;     /* closed on purpose */
    }

    if (ac == store->writer) {
        store->writer = NULL;

    } else {
        store->reader = NULL;
    }

    ngx_http_upstream_affinity_store_lost(store,
                            ac->errstr ? ac->errstr : "connection closed");
}


/*
 * A connection failed: all are closed and opened again after a
 * while.  Said once per outage, with the reason.
 */

static void
ngx_http_upstream_affinity_store_lost(
    ngx_http_upstream_affinity_store_t *store, const char *why)
{
    redisAsyncContext  *ac;

    if (store->exiting) {
        return;
    }

    if (!store->warned) {
        ngx_log_error(NGX_LOG_WARN, store->log, 0,
                      "affinity: store of upstream \"%V\" unavailable (%s), "
                      "routing on this instance's own state",
                      &store->conf->name, why ? why : "unknown");
        store->warned = 1;
    }

    store->up = 0;
    ngx_http_upstream_affinity_store_reader_is(store, 0);

    if (store->timeout.timer_set) {
        ngx_del_timer(&store->timeout);
    }

    /* the disconnect callbacks find the pointers cleared already */

    ac = store->writer;
    store->writer = NULL;

    if (ac) {
        redisAsyncFree(ac);
    }

    ac = store->reader;
    store->reader = NULL;

    if (ac) {
        redisAsyncFree(ac);
    }

    if (!store->retry.timer_set) {
        ngx_add_timer(&store->retry, NGX_HTTP_UPSTREAM_AFFINITY_STORE_RETRY);
    }
}


static void
ngx_http_upstream_affinity_store_retry(ngx_event_t *ev)
{
    ngx_http_upstream_affinity_store_t  *store = ev->data;

    if (ngx_exiting || ngx_terminate || ngx_quit) {
        return;
    }

    ngx_http_upstream_affinity_store_connect(store);
}


static void
ngx_http_upstream_affinity_store_timeout(ngx_event_t *ev)
{
    ngx_http_upstream_affinity_store_lost(ev->data, "connect timed out");
}


/*
 * What this instance learned, for the others: sent at once when the store
 * is there, else kept in the backlog (the oldest give way).  Never blocks.
 */

void
ngx_http_upstream_affinity_store_publish(
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    affinity_store_message_t *message)
{
    size_t                                 len;
    ngx_uint_t                             n;
    ngx_http_upstream_affinity_store_t    *store;
    ngx_http_upstream_affinity_backlog_t  *b;
    u_char                                 buf[AFFINITY_STORE_MESSAGE_MAX];

    store = ascf->store;

    if (store == NULL) {
        return;
    }

    len = ngx_http_upstream_affinity_store_encode(store, message, buf);

    if (len == 0) {
        return;
    }

    if (store->up && store->queued == 0) {
        (void) ngx_http_upstream_affinity_store_send(store, buf, len, 0, 0,
                                   ngx_http_upstream_affinity_store_sent,
                                   store);
        return;
    }

    /*
     * news is not kept (..._STORE_FRESH), but for the end of a request
     * the others were told of: without it they would count the request
     * until its engine reports again, and read late it still counts
     * right (affinity_zone_peer_ended_elsewhere())
     */

    if (ngx_http_upstream_affinity_store_news(message->kind)
        && message->kind != AFFINITY_STORE_DONE)
    {
        return;
    }

    n = store->conf->store_conf->backlog;

    if (store->queued == n) {
        store->first = (store->first + 1) % n;
        store->queued--;
        store->dropped++;
    }

    b = &store->backlog[(store->first + store->queued) % n];
    b->len = len;
    ngx_memcpy(b->data, buf, len);
    store->queued++;
}


/*
 * A request this instance sends a peer, with affinity_metrics: the others
 * count it on the peer's load once they read it, and NGX_OK tells that
 * they may (its end is then announced too, kept if the store goes away
 * meanwhile).  Until this instance reads it back from the stream, as they
 * do, it is announced in the counter zone, and routing here counts the
 * peer as if each other instance were sending it some unseen
 * (affinity_zone_peer_announced()).  The ticket of the announcement goes
 * with the message, for the instance's reader, and, when its decision
 * weighed a peer (watched) where requests of this instance were unheard,
 * the number the instance's watch gave it (in the zone's head): read
 * back, it tells how many of the other instances' requests those met
 * (affinity_zone_unheard_met()).  Not kept while the store is away
 * (..._STORE_FRESH).
 */

ngx_http_upstream_affinity_announcement_t *
ngx_http_upstream_affinity_store_announce(
    ngx_http_upstream_affinity_srv_conf_t *ascf, uint64_t peer, uint32_t slot,
    uint64_t watched, uint32_t watched_unheard)
{
    size_t                                      len;
    uint32_t                                    number;
    uintptr_t                                   ticket;
    affinity_store_message_t                    m;
    ngx_http_upstream_affinity_store_t         *store;
    ngx_http_upstream_affinity_shctx_t         *shctx;
    ngx_http_upstream_affinity_announcement_t  *a;
    u_char                                      buf[AFFINITY_STORE_MESSAGE_MAX];

    store = ascf->store;

    if (store == NULL || !store->up || store->queued) {
        return NULL;
    }

    ngx_memzero(&m, sizeof(affinity_store_message_t));
    m.kind = AFFINITY_STORE_SENT;
    m.peer = peer;

    len = ngx_http_upstream_affinity_store_encode(store, &m, buf);

    if (len == 0) {
        return NULL;
    }

    /* freed by whichever of the request and the answer comes last */

    a = ngx_calloc(sizeof(ngx_http_upstream_affinity_announcement_t),
                   store->log);
    if (a == NULL) {
        return NULL;
    }

    a->peer = peer;

    /*
     * announced before it is sent: the answer may not come before this
     * (a peer without a counter slot gets ticket 0, which counts nothing);
     * not while no reader would read it back
     */

    shctx = ascf->counter_zone->data;
    ticket = ngx_http_upstream_affinity_store_reading(store)
             ? affinity_zone_peer_announced(shctx->zone, slot) : 0;
    number = 0;

    if (ticket && watched && watched_unheard) {
        ngx_shmtx_lock(&shctx->shpool->mutex);
        number = affinity_watch_announced(&shctx->head->watch, watched,
                                          watched_unheard);
        ngx_shmtx_unlock(&shctx->shpool->mutex);
    }

    a->ticket = ticket;

    if (ngx_http_upstream_affinity_store_send(store, buf, len, ticket, number,
                                   ngx_http_upstream_affinity_store_heard, a)
        != NGX_OK)
    {
        affinity_zone_peer_heard(shctx->zone, ticket);
        ngx_free(a);
        return NULL;
    }

    return a;
}


/*
 * The request of an announcement ended: the others are told if they were
 * told of its start, or may yet be (the end follows the start on the same
 * connection, and goes or stays with it); kept while the store is away
 * (..._store_publish()).  Without its answer yet, the announcement is
 * left to it.
 */

void
ngx_http_upstream_affinity_store_ended(
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_affinity_announcement_t *a)
{
    affinity_store_message_t  m;

    if (!a->answered || a->taken) {
        ngx_memzero(&m, sizeof(affinity_store_message_t));
        m.kind = AFFINITY_STORE_DONE;
        m.peer = a->peer;
        ngx_http_upstream_affinity_store_publish(ascf, &m);
    }

    if (a->answered) {
        ngx_free(a);
        return;
    }

    a->ended = 1;
}


static size_t
ngx_http_upstream_affinity_store_encode(
    ngx_http_upstream_affinity_store_t *store,
    affinity_store_message_t *message, u_char *buf)
{
    ngx_time_t  *tp;

    tp = ngx_timeofday();

    message->instance = store->instance;
    message->time = (uint32_t) tp->sec;
    message->msec = (uint32_t) tp->msec;

    return affinity_store_encode(message, buf, AFFINITY_STORE_MESSAGE_MAX);
}


/*
 * A message as a stream entry's field "m", with an announcement's ticket
 * (if not 0) as its field "t" and its number in the instance's watch as
 * "w" (0: not watched), which other instances skip.  NGX_OK when the
 * command is on its way: its callback will be called.
 */

static ngx_int_t
ngx_http_upstream_affinity_store_send(
    ngx_http_upstream_affinity_store_t *store, u_char *data, size_t len,
    uintptr_t ticket, uint32_t number, redisCallbackFn *callback,
    void *privdata)
{
    int                                       rc;
    ngx_http_upstream_affinity_store_conf_t  *scf;

    scf = store->conf->store_conf;

    /* a store that takes nothing in must not fill the worker's memory */

    if (sdslen(store->writer->c.obuf)
        > NGX_HTTP_UPSTREAM_AFFINITY_STORE_PENDING)
    {
        store->dropped++;
        return NGX_DECLINED;
    }

    if (ticket) {
        rc = redisAsyncCommand(store->writer, callback, privdata,
                               "XADD %s MAXLEN ~ %lu * m %b t %lu w %u",
                               scf->stream.data, (unsigned long) scf->maxlen,
                               data, len, (unsigned long) ticket,
                               (unsigned) number);

    } else {
        rc = redisAsyncCommand(store->writer, callback, privdata,
                               "XADD %s MAXLEN ~ %lu * m %b",
                               scf->stream.data, (unsigned long) scf->maxlen,
                               data, len);
    }

    return rc == REDIS_OK ? NGX_OK : NGX_ERROR;
}


static void
ngx_http_upstream_affinity_store_flush(
    ngx_http_upstream_affinity_store_t *store)
{
    ngx_uint_t                             n;
    ngx_http_upstream_affinity_backlog_t  *b;

    n = store->conf->store_conf->backlog;

    while (store->queued && store->writer) {
        b = &store->backlog[store->first];
        (void) ngx_http_upstream_affinity_store_send(store, b->data, b->len,
                                       0, 0,
                                       ngx_http_upstream_affinity_store_sent,
                                       store);
        store->first = (store->first + 1) % n;
        store->queued--;
    }
}


static void
ngx_http_upstream_affinity_store_sent(redisAsyncContext *ac, void *reply,
    void *data)
{
    redisReply                          *r = reply;
    ngx_http_upstream_affinity_store_t  *store = data;

    static ngx_uint_t  warned;

    if (r && r->type == REDIS_REPLY_ERROR && !warned) {
        ngx_log_error(NGX_LOG_WARN, store->log, 0,
                      "affinity: store of upstream \"%V\" refused a "
                      "message: %*s", &store->conf->name,
                      (size_t) r->len, r->str);
        warned = 1;
    }
}


/*
 * The store's answer to an announced request.  Taken, the request is heard
 * when the instance's reader reads it back (..._store_apply()): the others
 * read it about then, which on a busy host may be milliseconds after this
 * answer.  Refused, it will not be read: heard now.  Without an answer
 * (the connection went, and hiredis calls back without one) it is heard
 * now too, although the store may have taken it just before: read back
 * after the store returns, it then takes off one request more, until the
 * engine's next report (which changes the ticket's epoch) clears the
 * count; and its end is not announced, which the others then count until
 * the engine reports again.
 */

static void
ngx_http_upstream_affinity_store_heard(redisAsyncContext *ac, void *reply,
    void *data)
{
    redisReply                                 *r = reply;
    ngx_http_upstream_affinity_store_t         *store = ac->data;
    ngx_http_upstream_affinity_shctx_t         *shctx;
    ngx_http_upstream_affinity_announcement_t  *a = data;

    a->answered = 1;

    if (r == NULL || r->type == REDIS_REPLY_ERROR) {

        /* the ticket affinity_zone_peer_announced() gave */

        shctx = store->conf->counter_zone->data;
        affinity_zone_peer_heard(shctx->zone, a->ticket);

    } else {
        a->taken = 1;
    }

    if (a->ended) {
        ngx_free(a);
    }

    ngx_http_upstream_affinity_store_sent(ac, reply, store);
}


/* the next entries of the stream, waiting for them on the store's side */

static void
ngx_http_upstream_affinity_store_read(
    ngx_http_upstream_affinity_store_t *store)
{
    if (store->reader == NULL) {
        return;
    }

    (void) redisAsyncCommand(store->reader,
                             ngx_http_upstream_affinity_store_entries, store,
                             "XREAD COUNT %d BLOCK %d STREAMS %s %s",
                             NGX_HTTP_UPSTREAM_AFFINITY_STORE_COUNT,
                             NGX_HTTP_UPSTREAM_AFFINITY_STORE_BLOCK,
                             store->conf->store_conf->stream.data,
                             store->last);
}


/*
 * A reply of XREAD: nil when nothing came within the block time, else
 * [[stream, [[id, [field, value, ...]], ...]]].  Anything else in it is
 * skipped: the store is written by others.
 */

static void
ngx_http_upstream_affinity_store_entries(redisAsyncContext *ac, void *reply,
    void *data)
{
    redisReply                          *r = reply;
    redisReply                          *stream, *entries, *entry;
    ngx_uint_t                           i, j;
    ngx_http_upstream_affinity_store_t  *store = data;

    if (r == NULL || store->reader != ac) {
        return;     /* the connection is going away */
    }

    /*
     * A worker finishing its requests after a reload reads no more: the
     * new first worker reads the stream.
     */

    if (ngx_exiting) {
        return;
    }

    if (r->type == REDIS_REPLY_ERROR) {
        ngx_http_upstream_affinity_store_lost(store, r->str);
        return;
    }

    if (r->type == REDIS_REPLY_ARRAY) {
        for (i = 0; i < r->elements; i++) {
            stream = r->element[i];

            if (stream->type != REDIS_REPLY_ARRAY || stream->elements != 2
                || stream->element[1]->type != REDIS_REPLY_ARRAY)
            {
                continue;
            }

            entries = stream->element[1];

            for (j = 0; j < entries->elements; j++) {
                entry = entries->element[j];

                if (entry->type != REDIS_REPLY_ARRAY || entry->elements != 2
                    || entry->element[0]->type != REDIS_REPLY_STRING
                    || entry->element[0]->len >= sizeof(store->last))
                {
                    continue;
                }

                ngx_memcpy(store->last, entry->element[0]->str,
                           entry->element[0]->len);
                store->last[entry->element[0]->len] = '\0';

                if (entry->element[1]->type == REDIS_REPLY_ARRAY) {
                    ngx_http_upstream_affinity_store_apply(store,
                        entry->element[1],
                        ngx_http_upstream_affinity_store_unseen(store));
                }
            }
        }
    }

    ngx_http_upstream_affinity_store_read(store);
}


/*
 * What another instance learned, into this instance's zones; and this
 * instance's own announcements, read back.  What is learned is applied
 * again from an entry the instance's reader read before (unseen 0: the
 * reader started again, after a reload or a worker's death, and reads the
 * stream from its beginning), since a zone may have been made afresh; what
 * is counted is counted once.
 */

static void
ngx_http_upstream_affinity_store_apply(
    ngx_http_upstream_affinity_store_t *store, redisReply *fields,
    ngx_uint_t unseen)
{
    off_t                                   ticket, number;
    time_t                                  now;
    uint32_t                                unheard, others;
    uint64_t                                hash, at;
    uint64_t                                levels[AFFINITY_MAX_LEVELS];
    ngx_uint_t                              i, heard;
    ngx_shm_zone_t                         *zone;
    affinity_store_message_t                m;
    ngx_http_upstream_affinity_shctx_t     *shctx;
    ngx_http_upstream_affinity_srv_conf_t  *ascf;

    ascf = store->conf;
    now = ngx_time();

    heard = 0;

    for (i = 0; i + 1 < fields->elements; i += 2) {

        if (fields->element[i]->type != REDIS_REPLY_STRING
            || fields->element[i]->len != 1
            || fields->element[i]->str[0] != 'm'
            || fields->element[i + 1]->type != REDIS_REPLY_STRING)
        {
            continue;
        }

        if (affinity_store_decode(fields->element[i + 1]->str,
                                  fields->element[i + 1]->len, &m, levels,
                                  AFFINITY_MAX_LEVELS)
            != 0)
        {
            continue;
        }

        if (m.instance == store->instance) {

            /*
             * This instance's own announcement, read back as the others
             * read it: they count the request from about now, so it is
             * no longer unheard here.  Once, by the instance's reader,
             * whichever worker sent it.
             */

            if (m.kind != AFFINITY_STORE_SENT || heard || !unseen) {
                continue;
            }

            heard = 1;
            shctx = ascf->counter_zone->data;

            /* the ticket affinity_zone_peer_announced() gave (..._send()) */

            ticket = ngx_http_upstream_affinity_store_number(fields, 't');

            if (ticket > 0 && (uint64_t) ticket <= UINTPTR_MAX) {
                affinity_zone_peer_heard(shctx->zone, (uintptr_t) ticket);
            }

            /* what the unheard requests beside it met (..._announce()) */

            number = ngx_http_upstream_affinity_store_number(fields, 'w');

            if (number > 0 && number <= UINT32_MAX) {
                ngx_shmtx_lock(&shctx->shpool->mutex);

                if (affinity_watch_read_back(&shctx->head->watch,
                                             (uint32_t) number, &unheard,
                                             &others))
                {
                    affinity_zone_unheard_met(shctx->zone, unheard, others);
                }

                ngx_shmtx_unlock(&shctx->shpool->mutex);
            }

            continue;
        }

        /*
         * Another instance's request, which the instance's announcements
         * not yet read back met, however late it is read.
         */

        if (m.kind == AFFINITY_STORE_SENT && ascf->engine_ttl && unseen) {
            shctx = ascf->counter_zone->data;

            ngx_shmtx_lock(&shctx->shpool->mutex);
            affinity_watch_sent_elsewhere(&shctx->head->watch, m.peer);
            ngx_shmtx_unlock(&shctx->shpool->mutex);
        }

        /*
         * With affinity_metrics, the instances that route now (their news
         * is fresh): each may be sending a peer requests this one cannot
         * count yet (affinity_zone_instance_seen()).
         */

        if (ascf->engine_ttl
            && now - m.time <= NGX_HTTP_UPSTREAM_AFFINITY_STORE_FRESH)
        {
            ngx_http_upstream_affinity_store_heard_from(store, m.instance,
                                                        now);
        }

        /* news once, a cache filled only while fresh (..._STORE_FRESH) */

        if (ngx_http_upstream_affinity_store_news(m.kind)
            && (!unseen
                || (m.kind == AFFINITY_STORE_FILLED
                    && now - m.time > NGX_HTTP_UPSTREAM_AFFINITY_STORE_FRESH)))
        {
            continue;
        }

        switch (m.kind) {

        case AFFINITY_STORE_PIN:
            zone = ascf->session_zone;

            if (zone == NULL || now - m.time > ascf->session_timeout) {
                continue;
            }

            shctx = zone->data;
            hash = affinity_zone_key_hash(shctx->zone, m.key, m.key_len);

            ngx_shmtx_lock(&shctx->shpool->mutex);
            affinity_sessions_pin(shctx->zone, hash, m.peer, (uint32_t) now,
                                  (uint32_t) ascf->session_timeout);
            ngx_shmtx_unlock(&shctx->shpool->mutex);
            break;

        case AFFINITY_STORE_RESPONSE:
            zone = ascf->response_zone;

            if (zone == NULL || now - m.time > ascf->response_timeout) {
                continue;
            }

            shctx = zone->data;
            hash = affinity_zone_key_hash(shctx->zone, m.key, m.key_len);

            ngx_shmtx_lock(&shctx->shpool->mutex);
            affinity_responses_learn(shctx->zone, hash, m.peer,
                                     (uint32_t) now,
                                     (uint32_t) ascf->response_timeout);
            ngx_shmtx_unlock(&shctx->shpool->mutex);
            break;

        case AFFINITY_STORE_LEVELS:
            zone = ascf->prefix_zone;

            if (zone == NULL || now - m.time > ascf->prefix_timeout) {
                continue;
            }

            shctx = zone->data;

            ngx_shmtx_lock(&shctx->shpool->mutex);
            affinity_prefixes_record(shctx->zone, m.levels, m.nlevels,
                                     m.peer, (uint32_t) now,
                                     (uint32_t) ascf->prefix_timeout,
                                     ascf->prefix_cache);
            ngx_shmtx_unlock(&shctx->shpool->mutex);
            break;

        case AFFINITY_STORE_SENT:
        case AFFINITY_STORE_DONE:

            /*
             * A request the other instance sent m.peer, or one that ended
             * there: with affinity_metrics it counts on the peer's load
             * here, or no longer, until the peer's engine reports again,
             * if it came after the engine was asked.
             */

            zone = ascf->counter_zone;

            if (ascf->engine_ttl == 0 || zone == NULL) {
                continue;
            }

            shctx = zone->data;

            ngx_shmtx_lock(&shctx->shpool->mutex);

            at = (uint64_t) m.time * 1000 + m.msec;

            if (m.kind == AFFINITY_STORE_SENT) {
                affinity_zone_peer_sent_elsewhere(shctx->zone, m.peer, at);

            } else {
                affinity_zone_peer_ended_elsewhere(shctx->zone, m.peer, at);
            }

            ngx_shmtx_unlock(&shctx->shpool->mutex);
            break;

        case AFFINITY_STORE_FILLED:

            /*
             * How far a prompt the other instance sent m.peer filled its
             * modelled cache: this instance's model of it ages as much.
             * The message comes before the prompt's levels, which are then
             * the most recent there.
             */

            zone = ascf->prefix_zone;

            if (zone == NULL) {
                continue;
            }

            shctx = zone->data;

            ngx_shmtx_lock(&shctx->shpool->mutex);
            affinity_prefixes_filled(shctx->zone, m.peer, m.chars,
                                     (uint32_t) now, ascf->prefix_cache);
            ngx_shmtx_unlock(&shctx->shpool->mutex);
            break;
        }
    }
}


/* the number in a stream entry's one-letter field, NGX_ERROR if none */

static off_t
ngx_http_upstream_affinity_store_number(redisReply *fields, u_char name)
{
    ngx_uint_t   i;
    redisReply  *field, *value;

    for (i = 0; i + 1 < fields->elements; i += 2) {
        field = fields->element[i];
        value = fields->element[i + 1];

        if (field->type == REDIS_REPLY_STRING && field->len == 1
            && (u_char) field->str[0] == name
            && value->type == REDIS_REPLY_STRING)
        {
            return ngx_atoof((u_char *) value->str, value->len);
        }
    }

    return NGX_ERROR;
}


/*
 * Whether the entry just read (store->last, "ms-seq": the store gives them
 * in increasing order) comes after the last one the instance's reader read
 * from the stream, which it then becomes.  A reader that starts again (a
 * reload, a worker that died) reads the stream from its beginning: what it
 * read before is not counted again.  A store restarted with a clock behind
 * its last entry gives ids below it, counted by no reader either, until
 * the clock passes it (nor read, as the reader goes on from there).
 */

static ngx_uint_t
ngx_http_upstream_affinity_store_unseen(
    ngx_http_upstream_affinity_store_t *store)
{
    u_char                                    *p, *dash;
    off_t                                      ms, seq;
    size_t                                     len;
    ngx_uint_t                                 unseen;
    ngx_http_upstream_affinity_shctx_t        *shctx;
    ngx_http_upstream_affinity_stream_read_t  *record;

    p = (u_char *) store->last;
    len = ngx_strlen(p);
    dash = ngx_strlchr(p, p + len, '-');

    if (dash == NULL) {
        return 0;
    }

    ms = ngx_atoof(p, dash - p);
    seq = ngx_atoof(dash + 1, p + len - dash - 1);

    if (ms == NGX_ERROR || seq == NGX_ERROR) {
        return 0;
    }

    shctx = store->conf->counter_zone->data;

    ngx_shmtx_lock(&shctx->shpool->mutex);

    record = ngx_http_upstream_affinity_store_record(store);

    unseen = (uint64_t) ms > record->ms
             || ((uint64_t) ms == record->ms
                 && (uint64_t) seq > record->seq);

    if (unseen) {
        record->ms = (uint64_t) ms;
        record->seq = (uint64_t) seq;
    }

    ngx_shmtx_unlock(&shctx->shpool->mutex);

    return unseen;
}


/*
 * The record of the store's stream in the counter zone's head, found by
 * the stream's name: else a free one, else the one read longest ago, taken
 * over (beyond ..._STREAMS upstreams with a store counting in one zone,
 * their readers count again what they read before when they start again).
 * The caller holds the zone lock.
 */

static ngx_http_upstream_affinity_stream_read_t *
ngx_http_upstream_affinity_store_record(
    ngx_http_upstream_affinity_store_t *store)
{
    ngx_uint_t                                 i;
    ngx_http_upstream_affinity_shctx_t        *shctx;
    ngx_http_upstream_affinity_stream_read_t  *record, *spare, *oldest;

    shctx = store->conf->counter_zone->data;
    spare = NULL;
    oldest = &shctx->head->read[0];

    for (i = 0; i < NGX_HTTP_UPSTREAM_AFFINITY_STREAMS; i++) {
        record = &shctx->head->read[i];

        if (record->stream == store->stream) {
            return record;
        }

        if (record->stream == 0 && spare == NULL) {
            spare = record;
        }

        if (record->ms < oldest->ms) {
            oldest = record;
        }
    }

    record = spare ? spare : oldest;

    ngx_memzero(record, sizeof(ngx_http_upstream_affinity_stream_read_t));
    record->stream = store->stream;

    return record;
}


/*
 * The instance's reader of the stream: this worker from when it connects
 * (pid), none from when it goes (0; a reader that went with the worker
 * is replaced when the next one connects).  The other workers announce
 * requests for reading back only while there is one (..._announce()).
 */

static void
ngx_http_upstream_affinity_store_reader_is(
    ngx_http_upstream_affinity_store_t *store, ngx_pid_t pid)
{
    ngx_http_upstream_affinity_shctx_t        *shctx;
    ngx_http_upstream_affinity_stream_read_t  *record;

    if (!ngx_http_upstream_affinity_store_reads()) {
        return;
    }

    shctx = store->conf->counter_zone->data;

    ngx_shmtx_lock(&shctx->shpool->mutex);

    record = ngx_http_upstream_affinity_store_record(store);

    if (pid || record->reading == (ngx_atomic_uint_t) ngx_pid) {
        record->reading = (ngx_atomic_uint_t) pid;
    }

    ngx_shmtx_unlock(&shctx->shpool->mutex);
}


/* whether the instance has a reader of the stream, read without the lock */

static ngx_uint_t
ngx_http_upstream_affinity_store_reading(
    ngx_http_upstream_affinity_store_t *store)
{
    ngx_uint_t                           i;
    ngx_http_upstream_affinity_shctx_t  *shctx;

    shctx = store->conf->counter_zone->data;

    for (i = 0; i < NGX_HTTP_UPSTREAM_AFFINITY_STREAMS; i++) {
        if (shctx->head->read[i].stream == store->stream) {
            return shctx->head->read[i].reading != 0;
        }
    }

    return 0;
}


static void
ngx_http_upstream_affinity_store_heard_from(
    ngx_http_upstream_affinity_store_t *store, uint64_t instance, time_t now)
{
    ngx_uint_t                           i, oldest;
    ngx_http_upstream_affinity_heard_t  *heard;
    ngx_http_upstream_affinity_shctx_t  *shctx;

    heard = store->heard;
    oldest = 0;

    for (i = 0; i < NGX_HTTP_UPSTREAM_AFFINITY_STORE_HEARD; i++) {
        if (heard[i].instance == instance) {
            break;
        }

        if (heard[i].time < heard[oldest].time) {
            oldest = i;
        }
    }

    if (i == NGX_HTTP_UPSTREAM_AFFINITY_STORE_HEARD) {
        i = oldest;
        heard[i].instance = instance;

    } else if (heard[i].time == now) {
        return;
    }

    heard[i].time = now;

    shctx = store->conf->counter_zone->data;

    ngx_shmtx_lock(&shctx->shpool->mutex);
    affinity_zone_instance_seen(shctx->zone, instance, (uint32_t) now);
    ngx_shmtx_unlock(&shctx->shpool->mutex);
}


/*
 * hiredis on nginx's event loop: the socket hiredis opened gets a
 * connection of nginx's own, whose events call hiredis back.
 */

static ngx_int_t
ngx_http_upstream_affinity_store_attach(redisAsyncContext *ac,
    ngx_log_t *log)
{
    ngx_connection_t  *c;

    c = ngx_get_connection(ac->c.fd, log);
    if (c == NULL) {
        return NGX_ERROR;
    }

    c->data = ac;
    c->log = log;
    c->read->log = log;
    c->write->log = log;
    c->read->handler = ngx_http_upstream_affinity_store_readable;
    c->write->handler = ngx_http_upstream_affinity_store_writable;

    ac->ev.data = c;
    ac->ev.addRead = ngx_http_upstream_affinity_store_add_read;
    ac->ev.delRead = ngx_http_upstream_affinity_store_del_read;
    ac->ev.addWrite = ngx_http_upstream_affinity_store_add_write;
    ac->ev.delWrite = ngx_http_upstream_affinity_store_del_write;
    ac->ev.cleanup = ngx_http_upstream_affinity_store_cleanup;

    return NGX_OK;
}


static void
ngx_http_upstream_affinity_store_add_read(void *data)
{
    ngx_connection_t  *c = data;

    if (!c->read->active) {
        (void) ngx_add_event(c->read, NGX_READ_EVENT, NGX_LEVEL_EVENT);
    }
}


static void
ngx_http_upstream_affinity_store_del_read(void *data)
{
    ngx_connection_t  *c = data;

    if (c->read->active) {
        (void) ngx_del_event(c->read, NGX_READ_EVENT, 0);
    }
}


static void
ngx_http_upstream_affinity_store_add_write(void *data)
{
    ngx_connection_t  *c = data;

    if (!c->write->active) {
        (void) ngx_add_event(c->write, NGX_WRITE_EVENT, NGX_LEVEL_EVENT);
    }
}


static void
ngx_http_upstream_affinity_store_del_write(void *data)
{
    ngx_connection_t  *c = data;

    if (c->write->active) {
        (void) ngx_del_event(c->write, NGX_WRITE_EVENT, 0);
    }
}


/*
 * hiredis closes the socket itself, after this.  The connection may be
 * freed while its events wait in the posted queue (accept_mutex on: the
 * reader's error frees the writer's connection in the same batch of
 * events); they leave the queue with it, as ngx_close_connection() has
 * them do.
 */

static void
ngx_http_upstream_affinity_store_cleanup(void *data)
{
    ngx_connection_t  *c = data;

    ngx_http_upstream_affinity_store_del_read(c);
    ngx_http_upstream_affinity_store_del_write(c);

    if (c->read->posted) {
        ngx_delete_posted_event(c->read);
    }

    if (c->write->posted) {
        ngx_delete_posted_event(c->write);
    }

    ngx_free_connection(c);
    c->fd = (ngx_socket_t) -1;
}


static void
ngx_http_upstream_affinity_store_readable(ngx_event_t *ev)
{
    ngx_connection_t  *c = ev->data;

    redisAsyncHandleRead(c->data);
}


static void
ngx_http_upstream_affinity_store_writable(ngx_event_t *ev)
{
    ngx_connection_t  *c = ev->data;

    redisAsyncHandleWrite(c->data);
}


/*
 * Several nginx instances, one routing: what an instance learns (session
 * pins, response ids, the peers that served a prompt's levels) is appended
 * to a Redis stream, and every instance reads the stream and applies what
 * the others learned to its own zones.  A request never waits for the
 * store: publishing queues a message, which nginx's event loop writes
 * after the current event; when the store is away, each instance routes on
 * its own state, keeps what it learned meanwhile in a bounded backlog,
 * and sends it when the store takes writes again.
 *
 * Each worker has a connection per upstream that appends (XADD); the
 * first worker has another that waits on the stream (XREAD BLOCK): it
 * applies what the other instances learned to the zones, which all
 * workers share, and reads every worker's announcements back.  Redis
 * sends each entry to one reader per instance.
 *
 * The store is outside the trust boundary.  Its replies are read by the
 * core's bounded reader (ngx_http_upstream_affinity_link.c); an entry
 * counts only if its authenticator, made with the instances' secret,
 * holds; session keys and response ids cross it as keyed digests; a
 * message about a server this instance does not have, stamped ahead of
 * this clock, or older than what the zone holds changes nothing.  Every
 * such case is counted in the status.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>
#include <ngx_http.h>

#include "ngx_http_upstream_affinity_module.h"


/* the owner's tags of the commands sent to the store */
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_XADD      1
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_XREAD     2
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_TIP       3

#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_RETRY     1000    /* ms, first */
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_RETRY_MAX 4000    /* ms */
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_STEADY    10000   /* ms up: retry
                                                              soon again */
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_BLOCK     5000    /* ms */
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_COUNT     128     /* per read */

/*
 * What a connection keeps of one reply: the writer's are ids and errors;
 * the reader's, ..._STORE_COUNT entries of the largest message with room
 * to spare.  An entry larger than a message can be is read past.
 */
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_STRING    2048
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_NODES     2048
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_BYTES     (384 * 1024)

/*
 * Commands awaiting their replies on the writer, the bytes queued, and
 * the bytes of one reply to XADD (an id or an error) read at most.
 */
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_PIPELINE  512
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_OUT       (256 * 1024)
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_WRITTEN   (64 * 1024)

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
 * read after the store was away, it would age the model late.
 */
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_FRESH     2000    /* ms */

/* how far ahead of this clock another instance's stamps may be */
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_SKEW      2000    /* ms */

/* news counted of one other instance in a second, at most */
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_NEWS_RATE 20000

/*
 * Bytes of one reply to XREAD read at most: it may hold entries larger
 * than any message, which are read past, but no more than a store sends
 * (Redis' largest string is 512 MB).
 */
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_READ_MAX  (512 * 1024 * 1024)

/* the stream's ids going back is said at most this often (s) */
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_REWOUND_LOG  600

/* the worker that reads the stream for its instance */
#define ngx_http_upstream_affinity_store_reads()  (ngx_worker == 0)

#define ngx_http_upstream_affinity_store_news(kind)                           \
    ((kind) == AFFINITY_STORE_SENT || (kind) == AFFINITY_STORE_FILLED         \
     || (kind) == AFFINITY_STORE_DONE)

/*
 * The other instances this worker heard from, each told to the counter
 * zone at most once a second (affinity_zone_instance_seen()), and the news
 * each sent in that second.
 */
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_HEARD     8

#define ngx_http_upstream_affinity_store_count(store, name)                   \
    (void) ngx_atomic_fetch_add(&(store)->counters->name, 1)


/* a message queued for the store, sent or not */
typedef struct {
    ngx_http_upstream_affinity_announcement_t  *announcement;  /* SENT */
    uint64_t                                ms;
    uint32_t                                kind;
    uint32_t                                len;
    u_char                                  data[AFFINITY_STORE_MESSAGE_MAX];
} ngx_http_upstream_affinity_queued_t;


/*
 * A request announced to the store (AFFINITY_STORE_SENT), until both its
 * request and the store's answer are done with it: the end of the request
 * is announced once its start was taken, so that the others never count
 * one without the other.
 */
struct ngx_http_upstream_affinity_announcement_s {
    uint64_t                                peer;
    uintptr_t                               ticket; /* for the answer */
    unsigned                                answered:1;
    unsigned                                taken:1;
    unsigned                                ended:1; /* its request, before
                                                        the answer */
};


/* another instance, and when this worker last read a message of it */
typedef struct {
    uint64_t                                instance;
    time_t                                  time;
    ngx_uint_t                              news;   /* in that second */
} ngx_http_upstream_affinity_heard_t;


/*
 * This worker's count of the messages it writes, shared by its stores:
 * from its start's millisecond times 2^20, so that a worker given a pid
 * again counts on above what its namesake sent; and how many stores it
 * opened, each of which writes as a sender of its own.
 */
static uint64_t  ngx_http_upstream_affinity_store_seq;
static uint32_t  ngx_http_upstream_affinity_store_opened;


/* the store of one upstream, in one worker */
struct ngx_http_upstream_affinity_store_s {
    ngx_http_upstream_affinity_srv_conf_t  *conf;
    ngx_log_t                              *log;
    ngx_http_upstream_affinity_store_counters_t  *counters;

    ngx_http_upstream_affinity_link_t       writer;
    ngx_http_upstream_affinity_link_t       reader;
    ngx_event_t                             write_retry;
    ngx_event_t                             read_retry;
    ngx_event_t                             read_pause; /* before the tip,
                                                           when nil came
                                                           early */
    ngx_msec_t                              read_sent;  /* XREAD, when */
    ngx_msec_t                              write_backoff;
    ngx_msec_t                              read_backoff;

    uint64_t                                instance;
    uint32_t                                stream;     /* name's crc32 */
    uint32_t                                sender;     /* in messages */
    time_t                                  rewound_logged;

    /* the id of the last stream entry read */
    uint64_t                                last_ms;
    uint64_t                                last_seq;
    u_char                                  last[48];  /* as text */

    /*
     * The messages not yet taken by the store, oldest first: the first
     * "sent" await its answer, the others wait to be sent.
     */
    ngx_http_upstream_affinity_queued_t    *queue;
    ngx_uint_t                              first;
    ngx_uint_t                              queued;
    ngx_uint_t                              sent;
    ngx_uint_t                              dropped;   /* in this outage */

    ngx_http_upstream_affinity_heard_t
                              heard[NGX_HTTP_UPSTREAM_AFFINITY_STORE_HEARD];

    unsigned                                warned:1;   /* this outage */
    unsigned                                unwritten:1; /* a write refused
                                                           or unanswered */
    unsigned                                refusing:1; /* writes refused */
    unsigned                                writing:1;  /* a write taken
                                                           since the
                                                           connection */
    unsigned                                reading:1;  /* a read answered
                                                           since it */
    unsigned                                exiting:1;
};


static void ngx_http_upstream_affinity_store_open_upstream(
    ngx_cycle_t *cycle, ngx_http_upstream_srv_conf_t *uscf,
    ngx_http_upstream_affinity_srv_conf_t *ascf);
static void ngx_http_upstream_affinity_store_close_upstream(
    ngx_cycle_t *cycle, ngx_http_upstream_srv_conf_t *uscf,
    ngx_http_upstream_affinity_srv_conf_t *ascf);
static void ngx_http_upstream_affinity_store_outage(
    ngx_http_upstream_affinity_store_t *store, const char *what,
    const char *why, ngx_str_t *detail);
static void ngx_http_upstream_affinity_store_back(
    ngx_http_upstream_affinity_store_t *store);
static void ngx_http_upstream_affinity_store_retry(ngx_event_t *ev);
static void ngx_http_upstream_affinity_store_paused(ngx_event_t *ev);
static void ngx_http_upstream_affinity_store_unsent(
    ngx_http_upstream_affinity_store_t *store, ngx_int_t rc);
static ngx_msec_t ngx_http_upstream_affinity_store_backoff(
    ngx_http_upstream_affinity_link_t *link, ngx_msec_t *backoff);
static void ngx_http_upstream_affinity_store_writer_ready(
    ngx_http_upstream_affinity_link_t *link);
static void ngx_http_upstream_affinity_store_writer_lost(
    ngx_http_upstream_affinity_link_t *link, const char *why);
static void ngx_http_upstream_affinity_store_written(
    ngx_http_upstream_affinity_link_t *link, affinity_store_reply_t *reply);
static void ngx_http_upstream_affinity_store_reader_ready(
    ngx_http_upstream_affinity_link_t *link);
static void ngx_http_upstream_affinity_store_reader_lost(
    ngx_http_upstream_affinity_link_t *link, const char *why);
static void ngx_http_upstream_affinity_store_replied(
    ngx_http_upstream_affinity_link_t *link, affinity_store_reply_t *reply);
static ngx_http_upstream_affinity_queued_t *
    ngx_http_upstream_affinity_store_enqueue(
    ngx_http_upstream_affinity_store_t *store);
static void ngx_http_upstream_affinity_store_flush(
    ngx_http_upstream_affinity_store_t *store);
static void ngx_http_upstream_affinity_store_rewind(
    ngx_http_upstream_affinity_store_t *store);
static void ngx_http_upstream_affinity_store_done(
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_affinity_announcement_t *a);
static void ngx_http_upstream_affinity_store_unanswered(
    ngx_http_upstream_affinity_store_t *store,
    ngx_http_upstream_affinity_announcement_t *a);
static size_t ngx_http_upstream_affinity_store_encode(
    ngx_http_upstream_affinity_store_t *store,
    affinity_store_message_t *message, u_char *buf);
static void ngx_http_upstream_affinity_store_readable(
    ngx_http_upstream_affinity_store_t *store);
static void ngx_http_upstream_affinity_store_tip(
    ngx_http_upstream_affinity_store_t *store);
static void ngx_http_upstream_affinity_store_read(
    ngx_http_upstream_affinity_store_t *store);
static void ngx_http_upstream_affinity_store_tipped(
    ngx_http_upstream_affinity_store_t *store,
    const affinity_resp_node_t *reply);
static void ngx_http_upstream_affinity_store_entries(
    ngx_http_upstream_affinity_store_t *store,
    const affinity_resp_node_t *reply);
static void ngx_http_upstream_affinity_store_apply(
    ngx_http_upstream_affinity_store_t *store,
    affinity_store_message_t *m, ngx_uint_t unseen);
static ngx_int_t ngx_http_upstream_affinity_store_unseen(
    ngx_http_upstream_affinity_store_t *store, uint64_t ms, uint64_t seq,
    affinity_store_message_t *m);
static ngx_http_upstream_affinity_stream_read_t *
    ngx_http_upstream_affinity_store_record(
    ngx_http_upstream_affinity_srv_conf_t *ascf, uint32_t stream);
static void ngx_http_upstream_affinity_store_reader_is(
    ngx_http_upstream_affinity_store_t *store, ngx_pid_t pid);
static ngx_uint_t ngx_http_upstream_affinity_store_reading(
    ngx_http_upstream_affinity_store_t *store);
static ngx_uint_t ngx_http_upstream_affinity_store_heard_from(
    ngx_http_upstream_affinity_store_t *store, uint64_t instance,
    time_t now, ngx_uint_t news);
static ngx_uint_t ngx_http_upstream_affinity_store_knows(
    ngx_http_upstream_affinity_store_t *store, uint64_t peer);


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
    affinity_zone_info_t                      info;
    affinity_resp_limits_t                    limits;
    ngx_http_upstream_affinity_store_t       *store;
    ngx_http_upstream_affinity_shctx_t       *shctx;
    ngx_http_upstream_affinity_store_conf_t  *scf;

    scf = ascf->store_conf;

    if (scf == NULL) {
        return;
    }

    store = ngx_pcalloc(cycle->pool,
                        sizeof(ngx_http_upstream_affinity_store_t));
    if (store == NULL) {
        return;
    }

    store->queue = ngx_alloc(scf->backlog
                             * sizeof(ngx_http_upstream_affinity_queued_t),
                             cycle->log);
    if (store->queue == NULL) {
        return;
    }

    limits.nodes = 16;
    limits.bytes = 4096;
    limits.string_max = 1024;
    limits.depth = 4;
    limits.pending = NGX_HTTP_UPSTREAM_AFFINITY_STORE_PIPELINE;

    if (ngx_http_upstream_affinity_link_init(&store->writer, scf, &limits,
                                        NGX_HTTP_UPSTREAM_AFFINITY_STORE_OUT,
                                        cycle->pool, cycle->log)
        != NGX_OK)
    {
        ngx_free(store->queue);
        return;
    }

    limits.nodes = NGX_HTTP_UPSTREAM_AFFINITY_STORE_NODES;
    limits.bytes = NGX_HTTP_UPSTREAM_AFFINITY_STORE_BYTES;
    limits.string_max = NGX_HTTP_UPSTREAM_AFFINITY_STORE_STRING;
    limits.depth = 8;
    limits.pending = 4;

    if (ngx_http_upstream_affinity_store_reads()
        && ngx_http_upstream_affinity_link_init(&store->reader, scf,
                                                &limits, 1024, cycle->pool,
                                                cycle->log)
           != NGX_OK)
    {
        ngx_free(store->queue);
        return;
    }

    /*
     * The instance is known by the id of its counter zone, which every
     * worker of one nginx shares, across reloads, and which tells nothing
     * of the zone's hash seed.
     */

    shctx = ascf->counter_zone->data;
    affinity_zone_info(shctx->zone, &info);

    store->conf = ascf;
    store->log = cycle->log;
    store->instance = info.instance;
    store->stream = ngx_crc32_short(scf->stream.data, scf->stream.len);

    /* pids have 22 bits at most on Linux: the store's number above them */
    store->sender = (uint32_t) ngx_pid
                    ^ (ngx_http_upstream_affinity_store_opened++ << 22);

    ngx_shmtx_lock(&shctx->shpool->mutex);
    store->counters = &ngx_http_upstream_affinity_store_record(ascf,
                                                  store->stream)->counters;
    ngx_shmtx_unlock(&shctx->shpool->mutex);

    /* entries still in the stream are applied if not expired */
    ngx_cpystrn(store->last, (u_char *) "0-0", sizeof(store->last));

    store->writer.data = store;
    store->writer.reply_max = NGX_HTTP_UPSTREAM_AFFINITY_STORE_WRITTEN;
    store->writer.ready_handler = ngx_http_upstream_affinity_store_writer_ready;
    store->writer.reply = ngx_http_upstream_affinity_store_written;
    store->writer.lost = ngx_http_upstream_affinity_store_writer_lost;

    store->reader.data = store;
    store->reader.ready_handler = ngx_http_upstream_affinity_store_reader_ready;
    store->reader.reply = ngx_http_upstream_affinity_store_replied;
    store->reader.lost = ngx_http_upstream_affinity_store_reader_lost;
    store->reader.wait = NGX_HTTP_UPSTREAM_AFFINITY_STORE_BLOCK + scf->timeout;
    store->reader.reply_max = NGX_HTTP_UPSTREAM_AFFINITY_STORE_READ_MAX;

    store->write_retry.handler = ngx_http_upstream_affinity_store_retry;
    store->write_retry.data = &store->writer;
    store->write_retry.log = cycle->log;
    store->write_retry.cancelable = 1;

    store->read_retry.handler = ngx_http_upstream_affinity_store_retry;
    store->read_retry.data = &store->reader;
    store->read_retry.log = cycle->log;
    store->read_retry.cancelable = 1;

    store->read_pause.handler = ngx_http_upstream_affinity_store_paused;
    store->read_pause.data = store;
    store->read_pause.log = cycle->log;
    store->read_pause.cancelable = 1;

    store->write_backoff = NGX_HTTP_UPSTREAM_AFFINITY_STORE_RETRY;
    store->read_backoff = NGX_HTTP_UPSTREAM_AFFINITY_STORE_RETRY;

    ascf->store = store;

    ngx_http_upstream_affinity_link_open(&store->writer);

    if (ngx_http_upstream_affinity_store_reads()) {
        ngx_http_upstream_affinity_link_open(&store->reader);
    }
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

    ngx_http_upstream_affinity_link_close(&store->writer);
    ngx_http_upstream_affinity_link_close(&store->reader);

    /* what is still queued has no answer to come: its records go */

    while (store->queued) {
        if (store->queue[store->first].announcement) {
            ngx_http_upstream_affinity_store_unanswered(store,
                                    store->queue[store->first].announcement);
        }

        store->first = (store->first + 1) % ascf->store_conf->backlog;
        store->queued--;
    }

    ngx_free(store->queue);
    ascf->store = NULL;
}


/*
 * The store is away, for writing or reading: said once per outage, with
 * the reason and what the store said, if anything.
 */

static void
ngx_http_upstream_affinity_store_outage(
    ngx_http_upstream_affinity_store_t *store, const char *what,
    const char *why, ngx_str_t *detail)
{
    ngx_http_upstream_affinity_store_count(store, outages);

    if (store->warned || store->exiting) {
        return;
    }

    store->warned = 1;

    ngx_log_error(NGX_LOG_WARN, store->log, 0,
                  "affinity: store of upstream \"%V\" unavailable for %s "
                  "(%s%s%V%s), routing on this instance's own state",
                  &store->conf->name, what, why,
                  detail->len ? ": \"" : "", detail,
                  detail->len ? "\"" : "");
}


/*
 * Back once a write is taken again (or the writer is connected with
 * nothing to write, unless the store refused or did not answer a write
 * since one was last taken), and, in the worker that reads, once a read
 * is answered: a store that answers the greeting and then nothing
 * sensible stays away, said once.
 */

static void
ngx_http_upstream_affinity_store_back(ngx_http_upstream_affinity_store_t *store)
{
    if (!store->warned
        || !(store->writing
             || (store->writer.ready && store->queued == 0
                 && !store->unwritten))
        || (ngx_http_upstream_affinity_store_reads() && !store->reading))
    {
        return;
    }

    ngx_log_error(NGX_LOG_NOTICE, store->log, 0,
                  "affinity: store of upstream \"%V\" is back, "
                  "%ui messages to send, %ui dropped",
                  &store->conf->name, store->queued - store->sent,
                  store->dropped);

    store->warned = 0;
    store->dropped = 0;
}


static void
ngx_http_upstream_affinity_store_retry(ngx_event_t *ev)
{
    ngx_http_upstream_affinity_link_t   *link = ev->data;
    ngx_http_upstream_affinity_store_t  *store = link->data;

    if (ngx_exiting || ngx_terminate || ngx_quit || store->exiting) {
        return;
    }

    link->hush = store->warned;
    ngx_http_upstream_affinity_link_open(link);
}


/*
 * The wait before the next try: doubled after each failure, with jitter,
 * from the shortest again after a connection that worked for a while (a
 * store that answers a read or a write and fails the next is tried less
 * and less often).
 */

static ngx_msec_t
ngx_http_upstream_affinity_store_backoff(
    ngx_http_upstream_affinity_link_t *link, ngx_msec_t *backoff)
{
    ngx_msec_t  wait;

    if (link->ready_at
        && ngx_current_msec - link->ready_at
           >= NGX_HTTP_UPSTREAM_AFFINITY_STORE_STEADY)
    {
        *backoff = NGX_HTTP_UPSTREAM_AFFINITY_STORE_RETRY;
    }

    wait = *backoff - *backoff / 4 + ngx_random() % (*backoff / 2 + 1);

    *backoff = ngx_min(*backoff * 2,
                       NGX_HTTP_UPSTREAM_AFFINITY_STORE_RETRY_MAX);

    return wait;
}


/* ---- writing -------------------------------------------------------- */

/*
 * The greeting was answered: what is queued is sent.  The waits between
 * tries start again from the shortest only once a write is taken.
 */

static void
ngx_http_upstream_affinity_store_writer_ready(
    ngx_http_upstream_affinity_link_t *link)
{
    ngx_http_upstream_affinity_store_t  *store = link->data;

    ngx_http_upstream_affinity_store_flush(store);
    ngx_http_upstream_affinity_store_back(store);
}


static void
ngx_http_upstream_affinity_store_writer_lost(
    ngx_http_upstream_affinity_link_t *link, const char *why)
{
    ngx_http_upstream_affinity_store_t  *store = link->data;

    if (store->exiting) {
        return;
    }

    store->writing = 0;
    ngx_http_upstream_affinity_store_rewind(store);
    ngx_http_upstream_affinity_store_outage(store, "writing", why,
                                            &link->detail);

    if (!store->write_retry.timer_set) {
        ngx_add_timer(&store->write_retry,
                      ngx_http_upstream_affinity_store_backoff(link,
                          &store->write_backoff));
    }
}


/*
 * The store's answer to the oldest message sent: taken (its id), or
 * refused (an error: a read-only replica, out of memory, no permission);
 * no answer (the connection went) leaves it queued, for the next
 * connection.  A refusal keeps the message and every one after it, and
 * the store is away for writing until a write is taken.
 */

static void
ngx_http_upstream_affinity_store_written(
    ngx_http_upstream_affinity_link_t *link, affinity_store_reply_t *reply)
{
    uint64_t                                    ms, seq;
    const affinity_resp_node_t                 *r;
    ngx_http_upstream_affinity_queued_t        *q;
    ngx_http_upstream_affinity_store_t         *store = link->data;
    ngx_http_upstream_affinity_announcement_t  *a;

    r = reply->root;

    if (r == NULL || store->sent == 0) {
        return;     /* lost with the connection: rewound */
    }

    q = &store->queue[store->first];

    if (r->type != AFFINITY_RESP_ERROR
        && (r->type != AFFINITY_RESP_BULK
            || affinity_store_parse_id(r->str, r->len, &ms, &seq) != 0))
    {
        /* not an answer to XADD: the connection is not with a store */

        store->unwritten = 1;
        ngx_http_upstream_affinity_link_close(link);
        ngx_http_upstream_affinity_store_writer_lost(link,
                                                     "not an answer to XADD");
        return;
    }

    if (r->type == AFFINITY_RESP_ERROR) {
        ngx_http_upstream_affinity_store_count(store, refused);
        ngx_http_upstream_affinity_link_detail(link, (u_char *) r->str,
                                               r->len);
        store->refusing = 1;
        store->unwritten = 1;

        /* the connection is dropped: what followed is rewound with it */

        ngx_http_upstream_affinity_link_close(link);
        ngx_http_upstream_affinity_store_writer_lost(link,
                                                     "writes refused");
        link->detail.len = 0;
        return;
    }

    ngx_http_upstream_affinity_store_count(store, published);

    a = q->announcement;

    store->first = (store->first + 1) % store->conf->store_conf->backlog;
    store->queued--;
    store->sent--;

    /* the start taken: the end of a request that ended meanwhile follows */

    if (a) {
        a->answered = 1;
        a->taken = 1;

        if (a->ended) {
            ngx_http_upstream_affinity_store_done(store->conf, a);
            ngx_free(a);
        }
    }

    store->refusing = 0;

    if (!store->writing) {
        store->writing = 1;
        store->unwritten = 0;
        ngx_http_upstream_affinity_store_back(store);
    }

    ngx_http_upstream_affinity_store_flush(store);
}


/*
 * What this instance learned, for the others: queued, and written after
 * the current event when the store takes writes.  Never blocks.  News is
 * not kept while the store is away (..._STORE_FRESH), but for the end of
 * a request the others were told of: without it they would count the
 * request until its engine reports again, and read late it still counts
 * right (affinity_zone_peer_ended_elsewhere()).
 */

void
ngx_http_upstream_affinity_store_publish(
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    affinity_store_message_t *message)
{
    size_t                                len;
    ngx_http_upstream_affinity_store_t   *store;
    ngx_http_upstream_affinity_queued_t  *q;
    u_char                                buf[AFFINITY_STORE_MESSAGE_MAX];

    store = ascf->store;

    if (store == NULL) {
        return;
    }

    if (ngx_http_upstream_affinity_store_news(message->kind)
        && message->kind != AFFINITY_STORE_DONE
        && (!store->writer.ready || store->refusing))
    {
        return;
    }

    len = ngx_http_upstream_affinity_store_encode(store, message, buf);

    if (len == 0) {
        return;
    }

    q = ngx_http_upstream_affinity_store_enqueue(store);

    if (q == NULL) {
        return;
    }

    q->kind = message->kind;
    q->ms = message->ms;
    q->len = len;
    ngx_memcpy(q->data, buf, len);

    ngx_http_upstream_affinity_store_flush(store);
}


/*
 * A place at the end of the queue.  When it is full, the oldest message
 * gives way, unless it awaits its answer: then the new one is dropped.
 */

static ngx_http_upstream_affinity_queued_t *
ngx_http_upstream_affinity_store_enqueue(
    ngx_http_upstream_affinity_store_t *store)
{
    ngx_uint_t                            n;
    ngx_http_upstream_affinity_queued_t  *q;

    n = store->conf->store_conf->backlog;

    if (store->queued == n) {
        ngx_http_upstream_affinity_store_count(store, dropped);
        store->dropped++;

        if (store->sent) {
            return NULL;
        }

        q = &store->queue[store->first];

        if (q->announcement) {
            ngx_http_upstream_affinity_store_unanswered(store,
                                                        q->announcement);
        }

        store->first = (store->first + 1) % n;
        store->queued--;
    }

    q = &store->queue[(store->first + store->queued) % n];
    q->announcement = NULL;
    store->queued++;

    return q;
}


/* sends what is queued and not sent, as far as the connection has room */

static void
ngx_http_upstream_affinity_store_flush(
    ngx_http_upstream_affinity_store_t *store)
{
    size_t                                    lens[8];
    ngx_int_t                                 rc;
    ngx_uint_t                                n;
    const char                               *argv[8];
    u_char                                    maxlen[NGX_INT_T_LEN];
    ngx_http_upstream_affinity_queued_t      *q;
    ngx_http_upstream_affinity_store_conf_t  *scf;

    if (!store->writer.ready || store->sent == store->queued) {
        return;
    }

    scf = store->conf->store_conf;
    n = scf->backlog;

    argv[0] = "XADD";
    lens[0] = 4;
    argv[1] = (char *) scf->stream.data;
    lens[1] = scf->stream.len;
    argv[2] = "MAXLEN";
    lens[2] = 6;
    argv[3] = "~";
    lens[3] = 1;
    argv[4] = (char *) maxlen;
    lens[4] = ngx_sprintf(maxlen, "%ui", scf->maxlen) - maxlen;
    argv[5] = "*";
    lens[5] = 1;
    argv[6] = "m";
    lens[6] = 1;

    /* after a refusal, one message at a time until one is taken */

    while (store->sent < store->queued
           && (!store->refusing || store->sent == 0))
    {
        q = &store->queue[(store->first + store->sent) % n];
        argv[7] = (char *) q->data;
        lens[7] = q->len;

        rc = ngx_http_upstream_affinity_link_send(&store->writer, 8, argv,
                                       lens,
                                       NGX_HTTP_UPSTREAM_AFFINITY_STORE_XADD,
                                       0);
        if (rc != NGX_OK) {
            return;
        }

        store->sent++;
    }
}


/*
 * The connection went: what it sent and got no answer for waits to be
 * sent again, but for news that will be stale by then, which goes (with
 * an announcement, as unanswered).  A message the store took just before
 * the connection went is sent twice: the readers take the copy for a
 * replay (the writer's count is the same) and change nothing.
 */

static void
ngx_http_upstream_affinity_store_rewind(
    ngx_http_upstream_affinity_store_t *store)
{
    ngx_uint_t                            i, j, n, kept;
    ngx_http_upstream_affinity_queued_t  *q;

    n = store->conf->store_conf->backlog;
    kept = 0;

    for (i = 0; i < store->queued; i++) {
        q = &store->queue[(store->first + i) % n];

        if (q->kind == AFFINITY_STORE_SENT
            || q->kind == AFFINITY_STORE_FILLED)
        {
            if (q->announcement) {
                ngx_http_upstream_affinity_store_unanswered(store,
                                                            q->announcement);
            }

            continue;
        }

        j = (store->first + kept) % n;

        if (j != (store->first + i) % n) {
            store->queue[j] = *q;
        }

        kept++;
    }

    store->queued = kept;
    store->sent = 0;
}


/*
 * An announcement that will have no answer: not heard by the others, it
 * is heard now (its ticket given back), and its end will not be told.
 */

static void
ngx_http_upstream_affinity_store_unanswered(
    ngx_http_upstream_affinity_store_t *store,
    ngx_http_upstream_affinity_announcement_t *a)
{
    ngx_http_upstream_affinity_shctx_t  *shctx;

    shctx = store->conf->counter_zone->data;
    affinity_zone_peer_heard(shctx->zone, a->ticket);

    a->answered = 1;
    a->taken = 0;

    if (a->ended) {
        ngx_free(a);
    }
}


/*
 * A request this instance sends a peer, with affinity_metrics: the others
 * count it on the peer's load once they read it, and a record is returned
 * when they may (its end is then announced too).  Until this instance
 * reads it back from the stream, as they do, it is announced in the
 * counter zone, and routing here counts the peer as if each other
 * instance were sending it some unseen (affinity_zone_peer_announced()).
 * The ticket of the announcement goes with the message, for the
 * instance's reader, and, when its decision weighed a peer (watched) where
 * requests of this instance were unheard, the number the instance's watch
 * gave it (in the zone's head): read back, it tells how many of the other
 * instances' requests those met (affinity_zone_unheard_met()).  Not while
 * the store is away (..._STORE_FRESH).
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
    ngx_http_upstream_affinity_queued_t        *q;
    ngx_http_upstream_affinity_store_t         *store;
    ngx_http_upstream_affinity_shctx_t         *shctx;
    ngx_http_upstream_affinity_announcement_t  *a;
    u_char                                      buf[AFFINITY_STORE_MESSAGE_MAX];

    store = ascf->store;

    if (store == NULL || !store->writer.ready || store->refusing
        || store->sent < store->queued
        || store->queued == ascf->store_conf->backlog)
    {
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

    ngx_memzero(&m, sizeof(affinity_store_message_t));
    m.kind = AFFINITY_STORE_SENT;
    m.peer = peer;
    m.ticket = ticket;
    m.watch = number;

    len = ngx_http_upstream_affinity_store_encode(store, &m, buf);
    q = len ? ngx_http_upstream_affinity_store_enqueue(store) : NULL;

    if (q == NULL) {
        affinity_zone_peer_heard(shctx->zone, ticket);
        ngx_free(a);
        return NULL;
    }

    q->kind = AFFINITY_STORE_SENT;
    q->ms = m.ms;
    q->len = len;
    q->announcement = a;
    ngx_memcpy(q->data, buf, len);

    ngx_http_upstream_affinity_store_flush(store);

    return a;
}


/*
 * The request of an announcement ended: the others are told if the store
 * took its start, and kept while the store is away
 * (..._store_publish()).  Without the store's answer yet, the end waits
 * for it (..._store_written()): a start that goes with a lost connection
 * takes its end with it, and the others never count an end without its
 * start.
 */

void
ngx_http_upstream_affinity_store_ended(
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_affinity_announcement_t *a)
{
    if (!a->answered) {
        a->ended = 1;
        return;
    }

    if (a->taken) {
        ngx_http_upstream_affinity_store_done(ascf, a);
    }

    ngx_free(a);
}


static void
ngx_http_upstream_affinity_store_done(
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_affinity_announcement_t *a)
{
    affinity_store_message_t  m;

    ngx_memzero(&m, sizeof(affinity_store_message_t));
    m.kind = AFFINITY_STORE_DONE;
    m.peer = a->peer;
    ngx_http_upstream_affinity_store_publish(ascf, &m);
}


static size_t
ngx_http_upstream_affinity_store_encode(
    ngx_http_upstream_affinity_store_t *store,
    affinity_store_message_t *message, u_char *buf)
{
    ngx_http_upstream_affinity_store_conf_t  *scf;

    scf = store->conf->store_conf;

    message->instance = store->instance;
    message->ms = ngx_http_upstream_affinity_wall_msec();

    if (ngx_http_upstream_affinity_store_seq == 0) {
        ngx_http_upstream_affinity_store_seq = message->ms << 20;
    }

    message->sender = store->sender;
    message->seq = ++ngx_http_upstream_affinity_store_seq;

    return affinity_store_encode(scf->keys, scf->stream.data, scf->stream.len,
                                 message, buf, AFFINITY_STORE_MESSAGE_MAX);
}


/*
 * A session key or response id as it crosses the store, and as the zones
 * of an upstream with a store know it: its keyed digest, which every
 * instance with the secret computes alike.
 */

void
ngx_http_upstream_affinity_store_digest(
    ngx_http_upstream_affinity_srv_conf_t *ascf, uint32_t kind, u_char *id,
    size_t len, uint8_t *digest)
{
    affinity_store_digest(ascf->store_conf->keys, kind, id, len, digest);
}


/*
 * The hash by which a zone knows a session key or response id: of the id,
 * or, with a store, of its digest, by which the other instances' messages
 * name it.
 */

uint64_t
ngx_http_upstream_affinity_key_hash(ngx_http_upstream_affinity_srv_conf_t *ascf,
    affinity_zone_t *zone, uint32_t kind, u_char *id, size_t len)
{
    uint8_t  digest[AFFINITY_STORE_DIGEST];

    if (ascf->store_conf == NULL) {
        return affinity_zone_key_hash(zone, id, len);
    }

    affinity_store_digest(ascf->store_conf->keys, kind, id, len, digest);

    return affinity_zone_key_hash(zone, digest, AFFINITY_STORE_DIGEST);
}


ngx_http_upstream_affinity_store_counters_t *
ngx_http_upstream_affinity_store_counters(
    ngx_http_upstream_affinity_srv_conf_t *ascf)
{
    uint32_t                                   stream;
    ngx_http_upstream_affinity_shctx_t        *shctx;
    ngx_http_upstream_affinity_stream_read_t  *record;

    if (ascf->store_conf == NULL) {
        return NULL;
    }

    stream = ngx_crc32_short(ascf->store_conf->stream.data,
                             ascf->store_conf->stream.len);
    shctx = ascf->counter_zone->data;

    ngx_shmtx_lock(&shctx->shpool->mutex);
    record = ngx_http_upstream_affinity_store_record(ascf, stream);
    ngx_shmtx_unlock(&shctx->shpool->mutex);

    return &record->counters;
}


/* ---- reading -------------------------------------------------------- */

/*
 * The reader first asks for the stream's last entry: a stream whose ids
 * went back below what the instance read (deleted and written again, a
 * store restored or failed over with its clock behind) is read again from
 * its start, its record starting again too, so that nothing stored keeps
 * the instance deaf, and what was written since the ids went back is not
 * lost.  What is read again changes nothing newer (versions), news that
 * old counts for nothing.  Asked again whenever the stream is quiet for
 * the block time.
 */

static void
ngx_http_upstream_affinity_store_reader_ready(
    ngx_http_upstream_affinity_link_t *link)
{
    ngx_http_upstream_affinity_store_t  *store = link->data;

    ngx_http_upstream_affinity_store_reader_is(store, ngx_pid);
    ngx_http_upstream_affinity_store_tip(store);
}


static void
ngx_http_upstream_affinity_store_reader_lost(
    ngx_http_upstream_affinity_link_t *link, const char *why)
{
    ngx_http_upstream_affinity_store_t  *store = link->data;

    if (store->exiting) {
        return;
    }

    store->reading = 0;
    ngx_http_upstream_affinity_store_reader_is(store, 0);
    ngx_http_upstream_affinity_store_outage(store, "reading", why,
                                            &link->detail);

    if (store->read_pause.timer_set) {
        ngx_del_timer(&store->read_pause);
    }

    if (!store->read_retry.timer_set) {
        ngx_add_timer(&store->read_retry,
                      ngx_http_upstream_affinity_store_backoff(link,
                          &store->read_backoff));
    }
}


/*
 * A read was answered as a stream's reads are: with entries, or with nil
 * after the block time.  The tip alone proves nothing: a store that
 * answers it and not the reads stays away, said once.
 */

static void
ngx_http_upstream_affinity_store_readable(
    ngx_http_upstream_affinity_store_t *store)
{
    if (store->reading) {
        return;
    }

    store->reading = 1;
    ngx_http_upstream_affinity_store_back(store);
}


static void
ngx_http_upstream_affinity_store_tip(ngx_http_upstream_affinity_store_t *store)
{
    size_t                                    lens[6];
    ngx_int_t                                 rc;
    const char                               *argv[6];
    ngx_http_upstream_affinity_store_conf_t  *scf;

    scf = store->conf->store_conf;

    argv[0] = "XREVRANGE";
    lens[0] = 9;
    argv[1] = (char *) scf->stream.data;
    lens[1] = scf->stream.len;
    argv[2] = "+";
    lens[2] = 1;
    argv[3] = "-";
    lens[3] = 1;
    argv[4] = "COUNT";
    lens[4] = 5;
    argv[5] = "1";
    lens[5] = 1;

    rc = ngx_http_upstream_affinity_link_send(&store->reader, 6, argv, lens,
                                        NGX_HTTP_UPSTREAM_AFFINITY_STORE_TIP,
                                        0);

    ngx_http_upstream_affinity_store_unsent(store, rc);
}


/*
 * A read that could not be sent would leave the reader waiting for
 * nothing: the connection goes, and is tried again later.
 */

static void
ngx_http_upstream_affinity_store_unsent(
    ngx_http_upstream_affinity_store_t *store, ngx_int_t rc)
{
    if (rc == NGX_OK || rc == NGX_DECLINED || ngx_exiting || store->exiting) {
        return;
    }

    ngx_http_upstream_affinity_link_close(&store->reader);
    ngx_http_upstream_affinity_store_reader_lost(&store->reader,
                                                 "cannot send a read");
}


/* the pause after a nil reply that came early is over */

static void
ngx_http_upstream_affinity_store_paused(ngx_event_t *ev)
{
    ngx_http_upstream_affinity_store_t  *store = ev->data;

    if (store->exiting || !store->reader.ready
        || affinity_store_link_pending(store->reader.proto))
    {
        return;
    }

    ngx_http_upstream_affinity_store_tip(store);
}


/* the next entries of the stream, waiting for them on the store's side */

static void
ngx_http_upstream_affinity_store_read(ngx_http_upstream_affinity_store_t *store)
{
    size_t                                    lens[8];
    ngx_int_t                                 rc;
    const char                               *argv[8];
    u_char                                    count[NGX_INT_T_LEN];
    u_char                                    block[NGX_INT_T_LEN];
    ngx_http_upstream_affinity_store_conf_t  *scf;

    /*
     * A worker finishing its requests after a reload reads no more: the
     * new first worker reads the stream.
     */

    if (ngx_exiting) {
        return;
    }

    scf = store->conf->store_conf;

    argv[0] = "XREAD";
    lens[0] = 5;
    argv[1] = "COUNT";
    lens[1] = 5;
    argv[2] = (char *) count;
    lens[2] = ngx_sprintf(count, "%d", NGX_HTTP_UPSTREAM_AFFINITY_STORE_COUNT)
              - count;
    argv[3] = "BLOCK";
    lens[3] = 5;
    argv[4] = (char *) block;
    lens[4] = ngx_sprintf(block, "%d", NGX_HTTP_UPSTREAM_AFFINITY_STORE_BLOCK)
              - block;
    argv[5] = "STREAMS";
    lens[5] = 7;
    argv[6] = (char *) scf->stream.data;
    lens[6] = scf->stream.len;
    argv[7] = (char *) store->last;
    lens[7] = ngx_strlen(store->last);

    store->read_sent = ngx_current_msec;

    rc = ngx_http_upstream_affinity_link_send(&store->reader, 8, argv, lens,
                                       NGX_HTTP_UPSTREAM_AFFINITY_STORE_XREAD,
                                       0);

    ngx_http_upstream_affinity_store_unsent(store, rc);
}


static void
ngx_http_upstream_affinity_store_replied(
    ngx_http_upstream_affinity_link_t *link, affinity_store_reply_t *reply)
{
    ngx_http_upstream_affinity_store_t  *store = link->data;


    if (reply->root == NULL || store->exiting) {
        return;     /* the connection is going away */
    }

    if (reply->root->type == AFFINITY_RESP_ERROR) {

        /* a key that is not a stream, a store that lost its data... */

        ngx_http_upstream_affinity_link_detail(link,
                                               (u_char *) reply->root->str,
                                               reply->root->len);
        ngx_http_upstream_affinity_link_close(link);
        ngx_http_upstream_affinity_store_reader_lost(link, "read refused");
        link->detail.len = 0;
        return;
    }

    if (reply->tag == NGX_HTTP_UPSTREAM_AFFINITY_STORE_TIP) {
        ngx_http_upstream_affinity_store_tipped(store, reply->root);

    } else {
        ngx_http_upstream_affinity_store_entries(store, reply->root);
    }
}


static void
ngx_http_upstream_affinity_store_tipped(
    ngx_http_upstream_affinity_store_t *store,
    const affinity_resp_node_t *reply)
{
    uint64_t                                   ms, seq, was_ms, was_seq;
    affinity_store_entry_t                     entry;
    affinity_store_entries_t                   entries;
    ngx_http_upstream_affinity_shctx_t        *shctx;
    ngx_http_upstream_affinity_stream_read_t  *record;

    if (affinity_store_entries(store->reader.proto, reply, 1, &entries) != 0)
    {
        ngx_http_upstream_affinity_link_close(&store->reader);
        ngx_http_upstream_affinity_store_reader_lost(&store->reader,
                                                     "not a stream");
        return;
    }

    ms = 0;
    seq = 0;

    if (affinity_store_entries_next(store->reader.proto, &entries, &entry)) {
        ms = entry.ms;
        seq = entry.seq;
    }

    shctx = store->conf->counter_zone->data;

    ngx_shmtx_lock(&shctx->shpool->mutex);

    record = ngx_http_upstream_affinity_store_record(store->conf,
                                                     store->stream);

    if (ms < record->ms || (ms == record->ms && seq < record->seq)
        || ms < store->last_ms
        || (ms == store->last_ms && seq < store->last_seq))
    {
        was_ms = ngx_max(record->ms, store->last_ms);
        was_seq = record->ms > store->last_ms ? record->seq : store->last_seq;

        /*
         * Read again from its start, every writer's message is new again:
         * what the zones hold since is newer, and news that old counts
         * for nothing; not a replay.
         */

        record->ms = 0;
        record->seq = 0;
        ngx_memzero(&shctx->head->senders, sizeof(affinity_store_senders_t));

        ngx_shmtx_unlock(&shctx->shpool->mutex);

        ngx_http_upstream_affinity_store_count(store, rewound);

        if (ngx_time() - store->rewound_logged
            >= NGX_HTTP_UPSTREAM_AFFINITY_STORE_REWOUND_LOG)
        {
            store->rewound_logged = ngx_time();

            ngx_log_error(NGX_LOG_WARN, store->log, 0,
                          "affinity: the stream of upstream \"%V\" went "
                          "back from %uL-%uL to %uL-%uL: reading it again "
                          "from its start", &store->conf->name,
                          was_ms, was_seq, ms, seq);
        }

        store->last_ms = 0;
        store->last_seq = 0;
        ngx_cpystrn(store->last, (u_char *) "0-0", sizeof(store->last));

    } else {
        ngx_shmtx_unlock(&shctx->shpool->mutex);
    }

    ngx_http_upstream_affinity_store_read(store);
}


/*
 * A reply of XREAD: nil when nothing came within the block time (the tip
 * is then looked at again; at once only if the store did block, so that
 * one that answers nil at once is not asked in a loop), else the entries.
 * An entry larger than any message is skipped; one that found no room
 * left in the reply is read first by the next XREAD, with room for it,
 * unless it came first.  A reply with no entry that can be read, or with
 * an entry not after the last one read, would be asked for again and
 * again: the connection goes.
 */

static void
ngx_http_upstream_affinity_store_entries(
    ngx_http_upstream_affinity_store_t *store,
    const affinity_resp_node_t *reply)
{
    int                                       rc;
    ngx_int_t                                 unseen;
    ngx_uint_t                                n;
    affinity_store_entry_t                    entry;
    affinity_store_entries_t                  entries;
    affinity_store_message_t                  m;
    ngx_http_upstream_affinity_store_conf_t  *scf;
    uint64_t                                  levels[AFFINITY_MAX_LEVELS];

    scf = store->conf->store_conf;

    if (affinity_store_entries(store->reader.proto, reply, 0, &entries) != 0)
    {
        ngx_http_upstream_affinity_link_close(&store->reader);
        ngx_http_upstream_affinity_store_reader_lost(&store->reader,
                                                     "not a stream");
        return;
    }

    if (reply->type == AFFINITY_RESP_NIL) {

        if (ngx_current_msec - store->read_sent
            < NGX_HTTP_UPSTREAM_AFFINITY_STORE_BLOCK / 2)
        {
            /* away for reading (said once) until a read is answered */
            store->reading = 0;
            ngx_http_upstream_affinity_store_outage(store, "reading",
                                                    "nil before its time",
                                                    &store->reader.detail);
            ngx_add_timer(&store->read_pause,
                          NGX_HTTP_UPSTREAM_AFFINITY_STORE_BLOCK);
            return;
        }

        ngx_http_upstream_affinity_store_readable(store);
        ngx_http_upstream_affinity_store_tip(store);
        return;
    }

    for (n = 0;
         affinity_store_entries_next(store->reader.proto, &entries, &entry);
         n++)
    {
        if (entry.full && n > 0) {
            break;
        }

        if (entry.ms < store->last_ms
            || (entry.ms == store->last_ms && entry.seq <= store->last_seq))
        {
            ngx_http_upstream_affinity_store_count(store, malformed);
            ngx_http_upstream_affinity_link_close(&store->reader);
            ngx_http_upstream_affinity_store_reader_lost(&store->reader,
                                                   "entries out of order");
            return;
        }

        store->last_ms = entry.ms;
        store->last_seq = entry.seq;
        ngx_sprintf(store->last, "%uL-%uL%Z", entry.ms, entry.seq);

        ngx_http_upstream_affinity_store_count(store, read);

        if (entry.message == NULL) {
            ngx_http_upstream_affinity_store_count(store, malformed);
            continue;
        }

        rc = affinity_store_decode(scf->keys, scf->stream.data,
                                   scf->stream.len, entry.message,
                                   entry.message_len, &m, levels,
                                   AFFINITY_MAX_LEVELS);

        if (rc == AFFINITY_STORE_FORGED) {
            ngx_http_upstream_affinity_store_count(store, forged);
            continue;
        }

        if (rc != AFFINITY_STORE_OK) {
            ngx_http_upstream_affinity_store_count(store, malformed);
            continue;
        }

        unseen = ngx_http_upstream_affinity_store_unseen(store, entry.ms,
                                                         entry.seq, &m);

        if (unseen == NGX_DECLINED) {
            ngx_http_upstream_affinity_store_count(store, replayed);
            continue;
        }

        ngx_http_upstream_affinity_store_apply(store, &m, unseen);
    }

    if (n == 0) {
        ngx_http_upstream_affinity_link_close(&store->reader);
        ngx_http_upstream_affinity_store_reader_lost(&store->reader,
                                                     "no entry to read");
        return;
    }

    ngx_http_upstream_affinity_store_readable(store);
    ngx_http_upstream_affinity_store_read(store);
}


/*
 * What another instance learned, into this instance's zones; and this
 * instance's own announcements, read back.  What is learned is applied
 * by version, so reading an entry again (unseen 0: the reader started
 * again, after a reload or a worker's death, and reads the stream from
 * its beginning) changes nothing a zone holds since; news and a prompt's
 * levels, which carry no version, are taken once.
 */

static void
ngx_http_upstream_affinity_store_apply(
    ngx_http_upstream_affinity_store_t *store, affinity_store_message_t *m,
    ngx_uint_t unseen)
{
    int                                     rc;
    time_t                                  now;
    uint32_t                                unheard, others, used;
    uint64_t                                hash, now_ms, age;
    ngx_shm_zone_t                         *zone;
    ngx_http_upstream_affinity_shctx_t     *shctx;
    ngx_http_upstream_affinity_srv_conf_t  *ascf;

    ascf = store->conf;
    now = ngx_time();
    now_ms = ngx_http_upstream_affinity_wall_msec();

    if (m->ms > now_ms + NGX_HTTP_UPSTREAM_AFFINITY_STORE_SKEW) {
        ngx_http_upstream_affinity_store_count(store, future);
        return;
    }

    age = now_ms > m->ms ? now_ms - m->ms : 0;

    if (m->instance == store->instance) {

        /*
         * This instance's own announcement, read back as the others
         * read it: they count the request from about now, so it is no
         * longer unheard here.  Once, by the instance's reader, whichever
         * worker sent it.
         */

        if (m->kind != AFFINITY_STORE_SENT || !unseen) {
            return;
        }

        shctx = ascf->counter_zone->data;

        if (m->ticket) {
            affinity_zone_peer_heard(shctx->zone, (uintptr_t) m->ticket);
        }

        /* what the unheard requests beside it met (..._announce()) */

        if (m->watch) {
            ngx_shmtx_lock(&shctx->shpool->mutex);

            if (affinity_watch_read_back(&shctx->head->watch, m->watch,
                                         &unheard, &others))
            {
                affinity_zone_unheard_met(shctx->zone, unheard, others);
            }

            ngx_shmtx_unlock(&shctx->shpool->mutex);
        }

        return;
    }

    if (!ngx_http_upstream_affinity_store_knows(store, m->peer)) {
        ngx_http_upstream_affinity_store_count(store, unknown);
        return;
    }

    /*
     * With affinity_metrics, the instances that route now (their messages
     * are fresh): each may be sending a peer requests this one cannot
     * count yet (affinity_zone_instance_seen()).  A sender's news is taken
     * up to a rate.
     */

    if (ascf->engine_ttl
        && age <= NGX_HTTP_UPSTREAM_AFFINITY_STORE_FRESH
        && !ngx_http_upstream_affinity_store_heard_from(store, m->instance,
                        now, ngx_http_upstream_affinity_store_news(m->kind)))
    {
        ngx_http_upstream_affinity_store_count(store, limited);
        return;
    }

    /* news once, a cache filled only while fresh (..._STORE_FRESH) */

    if (ngx_http_upstream_affinity_store_news(m->kind)
        && (!unseen
            || (m->kind == AFFINITY_STORE_FILLED
                && age > NGX_HTTP_UPSTREAM_AFFINITY_STORE_FRESH)))
    {
        ngx_http_upstream_affinity_store_count(store, stale);
        return;
    }

    /* the time of the other's decision, never ahead of this clock */

    used = (uint32_t) ngx_min((uint64_t) now, m->ms / 1000);

    switch (m->kind) {

    case AFFINITY_STORE_PIN:
        zone = ascf->session_zone;

        if (zone == NULL) {
            return;
        }

        shctx = zone->data;
        hash = affinity_zone_key_hash(shctx->zone, m->digest,
                                      AFFINITY_STORE_DIGEST);

        ngx_shmtx_lock(&shctx->shpool->mutex);
        rc = affinity_sessions_learn(shctx->zone, hash, m->peer, m->ms,
                                     (uint32_t) now,
                                     (uint32_t) ascf->session_timeout);
        ngx_shmtx_unlock(&shctx->shpool->mutex);
        break;

    case AFFINITY_STORE_RESPONSE:
        zone = ascf->response_zone;

        if (zone == NULL) {
            return;
        }

        shctx = zone->data;
        hash = affinity_zone_key_hash(shctx->zone, m->digest,
                                      AFFINITY_STORE_DIGEST);

        ngx_shmtx_lock(&shctx->shpool->mutex);
        rc = affinity_responses_learn(shctx->zone, hash, m->peer, m->ms,
                                      (uint32_t) now,
                                      (uint32_t) ascf->response_timeout);
        ngx_shmtx_unlock(&shctx->shpool->mutex);
        break;

    case AFFINITY_STORE_LEVELS:
        zone = ascf->prefix_zone;

        if (zone == NULL) {
            return;
        }

        if (!unseen || now - used > ascf->prefix_timeout) {
            rc = AFFINITY_LEARNED_STALE;
            break;
        }

        shctx = zone->data;

        ngx_shmtx_lock(&shctx->shpool->mutex);
        affinity_prefixes_record(shctx->zone, m->levels, m->nlevels,
                                 m->peer, used,
                                 (uint32_t) ascf->prefix_timeout,
                                 ascf->prefix_cache);
        ngx_shmtx_unlock(&shctx->shpool->mutex);
        rc = AFFINITY_LEARNED;
        break;

    case AFFINITY_STORE_SENT:
    case AFFINITY_STORE_DONE:

        /*
         * A request the other instance sent m->peer, or one that ended
         * there: with affinity_metrics it counts on the peer's load here,
         * or no longer, until the peer's engine reports again, if it came
         * after the engine was asked.
         */

        zone = ascf->counter_zone;

        if (ascf->engine_ttl == 0 || zone == NULL) {
            return;
        }

        shctx = zone->data;

        ngx_shmtx_lock(&shctx->shpool->mutex);

        if (m->kind == AFFINITY_STORE_SENT) {
            affinity_watch_sent_elsewhere(&shctx->head->watch, m->peer);
            affinity_zone_peer_sent_elsewhere(shctx->zone, m->peer, m->ms);

        } else {
            affinity_zone_peer_ended_elsewhere(shctx->zone, m->peer, m->ms);
        }

        ngx_shmtx_unlock(&shctx->shpool->mutex);
        rc = AFFINITY_LEARNED;
        break;

    case AFFINITY_STORE_FILLED:

        /*
         * How far a prompt the other instance sent m->peer filled its
         * modelled cache: this instance's model of it ages as much.
         * The message comes before the prompt's levels, which are then
         * the most recent there.
         */

        zone = ascf->prefix_zone;

        if (zone == NULL) {
            return;
        }

        shctx = zone->data;

        ngx_shmtx_lock(&shctx->shpool->mutex);
        affinity_prefixes_filled(shctx->zone, m->peer, m->chars,
                                 (uint32_t) now, ascf->prefix_cache);
        ngx_shmtx_unlock(&shctx->shpool->mutex);
        rc = AFFINITY_LEARNED;
        break;

    default:
        return;
    }

    if (rc == AFFINITY_LEARNED) {
        ngx_http_upstream_affinity_store_count(store, applied);

    } else if (rc == AFFINITY_LEARNED_STALE) {
        ngx_http_upstream_affinity_store_count(store, stale);
    }
}


/* whether a peer is one of this upstream's servers */

static ngx_uint_t
ngx_http_upstream_affinity_store_knows(
    ngx_http_upstream_affinity_store_t *store, uint64_t peer)
{
    ngx_uint_t                          i;
    ngx_http_upstream_affinity_view_t  *view;

    view = store->conf->view;

    if (view == NULL) {
        return 0;
    }

    for (i = 0; i < view->npeers; i++) {
        if (view->peers[i].id == peer) {
            return 1;
        }
    }

    return 0;
}


/*
 * Whether an entry read (ms-seq: the store gives them in increasing order)
 * comes after the last one the instance's reader read from the stream,
 * which it then becomes: 1, else 0.  A reader that starts again (a reload,
 * a worker that died) reads the stream from its beginning: what it read
 * before is not counted again.  An entry not read before whose message
 * its writer sent before (its count not above the writer's highest:
 * written into the stream again, by whoever can write there, or sent
 * again after a lost connection) is NGX_DECLINED.
 */

static ngx_int_t
ngx_http_upstream_affinity_store_unseen(
    ngx_http_upstream_affinity_store_t *store, uint64_t ms, uint64_t seq,
    affinity_store_message_t *m)
{
    ngx_int_t                                  unseen;
    ngx_http_upstream_affinity_shctx_t        *shctx;
    ngx_http_upstream_affinity_stream_read_t  *record;

    shctx = store->conf->counter_zone->data;

    ngx_shmtx_lock(&shctx->shpool->mutex);

    record = ngx_http_upstream_affinity_store_record(store->conf,
                                                     store->stream);

    unseen = ms > record->ms || (ms == record->ms && seq > record->seq);

    if (unseen) {
        record->ms = ms;
        record->seq = seq;

        if (!affinity_store_senders_admit(&shctx->head->senders,
                                          store->stream, m->instance,
                                          m->sender, m->seq,
                                          (uint32_t) ngx_time()))
        {
            unseen = NGX_DECLINED;
        }
    }

    ngx_shmtx_unlock(&shctx->shpool->mutex);

    return unseen;
}


/*
 * The record of a stream in the counter zone's head, found by the
 * stream's name: else a free one, else the one read longest ago, taken
 * over (beyond ..._STREAMS upstreams with a store counting in one zone,
 * their readers count again what they read before when they start again).
 * The caller holds the zone lock.
 */

static ngx_http_upstream_affinity_stream_read_t *
ngx_http_upstream_affinity_store_record(
    ngx_http_upstream_affinity_srv_conf_t *ascf, uint32_t stream)
{
    ngx_uint_t                                 i;
    ngx_http_upstream_affinity_shctx_t        *shctx;
    ngx_http_upstream_affinity_stream_read_t  *record, *spare, *oldest;

    shctx = ascf->counter_zone->data;
    spare = NULL;
    oldest = &shctx->head->read[0];

    for (i = 0; i < NGX_HTTP_UPSTREAM_AFFINITY_STREAMS; i++) {
        record = &shctx->head->read[i];

        if (record->stream == stream) {
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
    record->stream = stream;

    return record;
}


/*
 * The instance's reader of the stream: this worker from when it reads
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

    record = ngx_http_upstream_affinity_store_record(store->conf,
                                                     store->stream);

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


/*
 * news of another instance read now: its news this second counted, at
 * most ..._NEWS_RATE (0: beyond it); the instance told to the counter zone
 * once a second.  The least recently heard of gives way to a new one.
 */

static ngx_uint_t
ngx_http_upstream_affinity_store_heard_from(
    ngx_http_upstream_affinity_store_t *store, uint64_t instance, time_t now,
    ngx_uint_t news)
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
        heard[i].time = 0;
    }

    if (heard[i].time == now) {
        heard[i].news += news;
        return heard[i].news <= NGX_HTTP_UPSTREAM_AFFINITY_STORE_NEWS_RATE;
    }

    heard[i].time = now;
    heard[i].news = news;

    shctx = store->conf->counter_zone->data;

    ngx_shmtx_lock(&shctx->shpool->mutex);
    affinity_zone_instance_seen(shctx->zone, instance, (uint32_t) now);
    ngx_shmtx_unlock(&shctx->shpool->mutex);

    return 1;
}

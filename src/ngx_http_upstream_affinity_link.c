
/*
 * A connection to the store (affinity_store), on nginx's own machinery:
 * ngx_event_connect_peer(), nginx's timers, and ngx_ssl_* for TLS with the
 * certificate verified as proxy_ssl_verify does.  The core's link
 * (affinity_store_link_*) reads the replies, bounded whatever the store
 * sends, and pairs each with the command that asked for it.
 *
 * A connection is ready once the store answered its greeting: AUTH when
 * a password is configured, then PING, so that a store that accepts the
 * connection but does not answer (stopped, paused) is never taken for
 * one that works.  Every reply must come within the link's wait of the
 * reply before it, or of the last LINK_IN bytes of a long one, so that a
 * store that sends a byte now and then is away as one that sends nothing,
 * and all of it within LINK_SLOW waits;
 * anything that is not a reply to a command sent, a reply longer than the
 * owner's bound, an error during the greeting, a close or a reply late is
 * a failure of this connection: it is closed, the commands that got no
 * reply are handed back to the owner, and the owner is told why, once.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>
#include <ngx_event_connect.h>
#include <ngx_http.h>

#include "ngx_http_upstream_affinity_module.h"


/* the link's own commands, below the owner's tags */
#define NGX_HTTP_UPSTREAM_AFFINITY_LINK_AUTH   0xffff0001
#define NGX_HTTP_UPSTREAM_AFFINITY_LINK_PING   0xffff0002

/* read at once; written from a buffer of the owner's size */
#define NGX_HTTP_UPSTREAM_AFFINITY_LINK_IN       (16 * 1024)

/*
 * Read in one event at most, before the worker's other connections have
 * their turn: a store that floods the connection never holds the worker.
 */
#define NGX_HTTP_UPSTREAM_AFFINITY_LINK_BUDGET   (64 * 16 * 1024)

/* a reply takes at most this many times the link's wait, however long */
#define NGX_HTTP_UPSTREAM_AFFINITY_LINK_SLOW     16


static void ngx_http_upstream_affinity_link_connected(
    ngx_http_upstream_affinity_link_t *link);
#if (NGX_SSL)
static void ngx_http_upstream_affinity_link_handshaked(ngx_connection_t *c);
static ngx_int_t ngx_http_upstream_affinity_link_check_name(
    ngx_connection_t *c, ngx_http_upstream_affinity_store_conf_t *scf);
#endif
static void ngx_http_upstream_affinity_link_greet(
    ngx_http_upstream_affinity_link_t *link);
static ngx_int_t ngx_http_upstream_affinity_link_test_connect(
    ngx_connection_t *c);
static ngx_int_t ngx_http_upstream_affinity_link_queue(
    ngx_http_upstream_affinity_link_t *link, size_t argc,
    const char *const *argv, const size_t *lens, uint32_t tag,
    uint64_t arg);
static ngx_int_t ngx_http_upstream_affinity_link_dispatch(
    ngx_http_upstream_affinity_link_t *link, affinity_store_reply_t *reply);
static void ngx_http_upstream_affinity_link_read(ngx_event_t *rev);
static void ngx_http_upstream_affinity_link_write(ngx_event_t *wev);
static void ngx_http_upstream_affinity_link_fail(
    ngx_http_upstream_affinity_link_t *link, const char *why);


/* memory for the link's life, from the cycle's pool */

ngx_int_t
ngx_http_upstream_affinity_link_init(ngx_http_upstream_affinity_link_t *link,
    ngx_http_upstream_affinity_store_conf_t *scf,
    affinity_resp_limits_t *limits, size_t out, ngx_pool_t *pool,
    ngx_log_t *log)
{
    size_t   size;
    void    *mem;

    size = affinity_store_link_size(limits);

    mem = ngx_palloc(pool, size);
    if (mem == NULL) {
        return NGX_ERROR;
    }

    link->proto = affinity_store_link_init(mem, size, limits);
    if (link->proto == NULL) {
        return NGX_ERROR;
    }

    link->out = ngx_create_temp_buf(pool, out);
    if (link->out == NULL) {
        return NGX_ERROR;
    }

    link->in = ngx_palloc(pool, NGX_HTTP_UPSTREAM_AFFINITY_LINK_IN);
    if (link->in == NULL) {
        return NGX_ERROR;
    }

    link->conf = scf;
    link->log = log;
    link->wait = scf->timeout;

    /*
     * nginx logs what fails on a connection (connect(), SSL) at its own
     * levels, some at crit: once per outage, with the owner's line, not at
     * every try after it.
     */

    link->quiet = *log;
    link->quiet.log_level = NGX_LOG_EMERG;
    link->quiet.next = NULL;

    return NGX_OK;
}


/* starts connecting: the owner's ready() or lost() is called later */

void
ngx_http_upstream_affinity_link_open(ngx_http_upstream_affinity_link_t *link)
{
    ngx_int_t                                 rc;
    ngx_log_t                                *log;
    ngx_pool_t                               *pool;
    ngx_connection_t                         *c;
    ngx_http_upstream_affinity_store_conf_t  *scf;

    scf = link->conf;
    log = link->hush ? &link->quiet : link->log;

    ngx_memzero(&link->pc, sizeof(ngx_peer_connection_t));
    link->pc.sockaddr = scf->addr.sockaddr;
    link->pc.socklen = scf->addr.socklen;
    link->pc.name = &scf->addr.name;
    link->pc.get = ngx_event_get_peer;
    link->pc.log = log;
    link->pc.log_error = NGX_ERROR_INFO;
    link->pc.tries = 1;

    link->ready = 0;
    link->ready_at = 0;
    link->taken = 0;
    link->progress = 0;
    affinity_store_link_reset(link->proto);
    link->out->pos = link->out->start;
    link->out->last = link->out->start;

    rc = ngx_event_connect_peer(&link->pc);

    if (rc == NGX_ERROR || rc == NGX_BUSY || rc == NGX_DECLINED) {
        link->pc.connection = NULL;
        link->lost(link, "cannot connect");
        return;
    }

    c = link->pc.connection;

    pool = ngx_create_pool(512, log);
    if (pool == NULL) {
        ngx_close_connection(c);
        link->pc.connection = NULL;
        link->lost(link, "out of memory");
        return;
    }

    c->pool = pool;
    c->data = link;
    c->log = log;
    c->read->log = log;
    c->write->log = log;
    c->read->handler = ngx_http_upstream_affinity_link_read;
    c->write->handler = ngx_http_upstream_affinity_link_write;

    /* a worker that is shutting down does not wait for the store */
    c->read->cancelable = 1;
    c->write->cancelable = 1;

    ngx_add_timer(c->write, scf->connect_timeout);

    if (rc == NGX_OK) {
        ngx_http_upstream_affinity_link_connected(link);
    }
}


static void
ngx_http_upstream_affinity_link_connected(
    ngx_http_upstream_affinity_link_t *link)
{
    ngx_connection_t  *c;

    c = link->pc.connection;

    if (ngx_http_upstream_affinity_link_test_connect(c) != NGX_OK) {
        ngx_http_upstream_affinity_link_fail(link, "cannot connect");
        return;
    }

    link->connected = 1;

#if (NGX_SSL)

    if (link->conf->ssl) {
        ngx_int_t  rc;

        if (ngx_ssl_create_connection(link->conf->ssl, c, NGX_SSL_CLIENT)
            != NGX_OK)
        {
            ngx_http_upstream_affinity_link_fail(link, "TLS setup failed");
            return;
        }

#ifdef SSL_CTRL_SET_TLSEXT_HOSTNAME
        if (!link->conf->tls_ip
            && SSL_set_tlsext_host_name(c->ssl->connection,
                                        (char *) link->conf->tls_name.data)
               == 0)
        {
            ngx_http_upstream_affinity_link_fail(link, "TLS setup failed");
            return;
        }
#endif

        rc = ngx_ssl_handshake(c);

        if (rc == NGX_AGAIN) {
            c->ssl->handler = ngx_http_upstream_affinity_link_handshaked;
            return;
        }

        ngx_http_upstream_affinity_link_handshaked(c);
        return;
    }

#endif

    ngx_http_upstream_affinity_link_greet(link);
}


#if (NGX_SSL)

/* the store's certificate is verified as proxy_ssl_verify does */

static void
ngx_http_upstream_affinity_link_handshaked(ngx_connection_t *c)
{
    long                                rc;
    ngx_http_upstream_affinity_link_t  *link = c->data;

    if (!c->ssl->handshaked) {
        ngx_http_upstream_affinity_link_fail(link, "TLS handshake failed");
        return;
    }

    rc = SSL_get_verify_result(c->ssl->connection);

    if (rc != X509_V_OK) {
        ngx_http_upstream_affinity_link_detail(link,
                                 (u_char *) X509_verify_cert_error_string(rc),
                                 ngx_strlen(X509_verify_cert_error_string(rc)));
        ngx_http_upstream_affinity_link_fail(link,
                                    "the store's certificate is not trusted");
        return;
    }

    if (ngx_http_upstream_affinity_link_check_name(c, link->conf) != NGX_OK)
    {
        ngx_http_upstream_affinity_link_fail(link,
                     "the store's certificate does not match its tls_name");
        return;
    }

    c->read->handler = ngx_http_upstream_affinity_link_read;
    c->write->handler = ngx_http_upstream_affinity_link_write;

    ngx_http_upstream_affinity_link_greet(link);
}


/*
 * The certificate names the store: a host name as ngx_ssl_check_host()
 * checks it, an IP address (the store given by its address, tls_name
 * unset) against the certificate's IP addresses.
 */

static ngx_int_t
ngx_http_upstream_affinity_link_check_name(ngx_connection_t *c,
    ngx_http_upstream_affinity_store_conf_t *scf)
{
    int    rc;
    X509  *cert;

    if (!scf->tls_ip) {
        return ngx_ssl_check_host(c, &scf->tls_name);
    }

#if (OPENSSL_VERSION_NUMBER >= 0x30000000L)
    cert = SSL_get1_peer_certificate(c->ssl->connection);
#else
    cert = SSL_get_peer_certificate(c->ssl->connection);
#endif

    if (cert == NULL) {
        return NGX_ERROR;
    }

    rc = X509_check_ip_asc(cert, (char *) scf->tls_name.data, 0);
    X509_free(cert);

    return rc == 1 ? NGX_OK : NGX_ERROR;
}

#endif


/*
 * AUTH, when configured, then PING: a reply to both proves the store
 * works.  The password stays out of every log line: the store's error is
 * logged instead.
 */

static void
ngx_http_upstream_affinity_link_greet(ngx_http_upstream_affinity_link_t *link)
{
    size_t                                    argc, lens[3];
    const char                               *argv[3];
    ngx_connection_t                         *c;
    ngx_http_upstream_affinity_store_conf_t  *scf;

    c = link->pc.connection;
    scf = link->conf;

    if (c->write->timer_set) {
        ngx_del_timer(c->write);
    }

    if (scf->auth_pass.len) {
        argc = 0;
        argv[argc] = "AUTH";
        lens[argc++] = 4;

        if (scf->auth_user.len) {
            argv[argc] = (char *) scf->auth_user.data;
            lens[argc++] = scf->auth_user.len;
        }

        argv[argc] = (char *) scf->auth_pass.data;
        lens[argc++] = scf->auth_pass.len;

        if (ngx_http_upstream_affinity_link_queue(link, argc, argv, lens,
                                        NGX_HTTP_UPSTREAM_AFFINITY_LINK_AUTH,
                                        0)
            != NGX_OK)
        {
            ngx_http_upstream_affinity_link_fail(link, "out of room");
            return;
        }
    }

    argv[0] = "PING";
    lens[0] = 4;

    if (ngx_http_upstream_affinity_link_queue(link, 1, argv, lens,
                                        NGX_HTTP_UPSTREAM_AFFINITY_LINK_PING,
                                        0)
        != NGX_OK)
    {
        ngx_http_upstream_affinity_link_fail(link, "out of room");
        return;
    }

    ngx_http_upstream_affinity_link_write(c->write);
}


/* as ngx_http_upstream_test_connect() */

static ngx_int_t
ngx_http_upstream_affinity_link_test_connect(ngx_connection_t *c)
{
    int        err;
    socklen_t  len;

#if (NGX_HAVE_KQUEUE)

    if (ngx_event_flags & NGX_USE_KQUEUE_EVENT) {
        if (c->write->pending_eof || c->read->pending_eof) {
            return NGX_ERROR;
        }

        return NGX_OK;
    }

#endif

    err = 0;
    len = sizeof(int);

    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, (void *) &err, &len) == -1) {
        err = ngx_socket_errno;
    }

    return err ? NGX_ERROR : NGX_OK;
}


/*
 * A command for the store, once the connection is ready: NGX_OK, it is on
 * its way and its reply (or its loss) will be handed to the owner;
 * NGX_AGAIN, there is no room for it now (the output buffer is full, or
 * too many replies are awaited); NGX_DECLINED, the connection is not
 * ready.  Never blocks: what is queued is written after the current
 * event, with whatever else is queued meanwhile.
 */

ngx_int_t
ngx_http_upstream_affinity_link_send(ngx_http_upstream_affinity_link_t *link,
    size_t argc, const char *const *argv, const size_t *lens, uint32_t tag,
    uint64_t arg)
{
    ngx_int_t          rc;
    ngx_connection_t  *c;

    c = link->pc.connection;

    if (c == NULL || !link->ready) {
        return NGX_DECLINED;
    }

    rc = ngx_http_upstream_affinity_link_queue(link, argc, argv, lens, tag,
                                               arg);
    if (rc != NGX_OK) {
        return rc;
    }

    if (!c->write->posted) {
        ngx_post_event(c->write, &ngx_posted_events);
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_upstream_affinity_link_queue(ngx_http_upstream_affinity_link_t *link,
    size_t argc, const char *const *argv, const size_t *lens, uint32_t tag,
    uint64_t arg)
{
    size_t            n;
    ngx_buf_t        *b;
    ngx_connection_t *c;

    b = link->out;
    c = link->pc.connection;

    n = affinity_resp_command(b->last, b->end - b->last, argc, argv, lens);

    if (n == 0 && b->pos > b->start) {

        /* what is written already makes room */

        n = b->last - b->pos;
        ngx_memmove(b->start, b->pos, n);
        b->pos = b->start;
        b->last = b->start + n;

        n = affinity_resp_command(b->last, b->end - b->last, argc, argv,
                                  lens);
    }

    if (n == 0) {
        return NGX_AGAIN;
    }

    if (affinity_store_link_expect(link->proto, tag, arg) != 0) {
        return NGX_AGAIN;
    }

    b->last += n;

    /* the first reply awaited: its wait starts */

    if (affinity_store_link_pending(link->proto) == 1) {
        ngx_add_timer(c->read, link->wait);
        link->progress = 0;
    }

    return NGX_OK;
}


/* NGX_OK, or NGX_DONE when the connection went meanwhile */

static ngx_int_t
ngx_http_upstream_affinity_link_dispatch(
    ngx_http_upstream_affinity_link_t *link, affinity_store_reply_t *reply)
{
    ngx_connection_t     *c;
    affinity_resp_node_t *r;

    c = link->pc.connection;
    r = (affinity_resp_node_t *) reply->root;

    switch (reply->tag) {

    case NGX_HTTP_UPSTREAM_AFFINITY_LINK_AUTH:

        if (r == NULL || r->type != AFFINITY_RESP_SIMPLE) {
            if (r && r->type == AFFINITY_RESP_ERROR) {
                ngx_http_upstream_affinity_link_detail(link, (u_char *) r->str,
                                                       r->len);
            }

            ngx_http_upstream_affinity_link_fail(link,
                                                 "authentication failed");
            return NGX_DONE;
        }

        return NGX_OK;

    case NGX_HTTP_UPSTREAM_AFFINITY_LINK_PING:

        /* PONG, not any simple string: a stray +OK is not the answer */

        if (r == NULL || r->type != AFFINITY_RESP_SIMPLE || r->len != 4
            || ngx_strncmp(r->str, "PONG", 4) != 0)
        {
            if (r && r->type == AFFINITY_RESP_ERROR) {
                ngx_http_upstream_affinity_link_detail(link, (u_char *) r->str,
                                                       r->len);
                ngx_http_upstream_affinity_link_fail(link,
                                                     "the store refused");
                return NGX_DONE;
            }

            ngx_http_upstream_affinity_link_fail(link,
                                                 "not a Redis greeting");
            return NGX_DONE;
        }

        link->ready = 1;
        link->ready_at = ngx_current_msec;
        link->ready_handler(link);
        break;

    default:
        link->reply(link, reply);
        break;
    }

    return link->pc.connection == c ? NGX_OK : NGX_DONE;
}


static void
ngx_http_upstream_affinity_link_read(ngx_event_t *rev)
{
    int                                 rc;
    u_char                             *p;
    size_t                              used, budget;
    ssize_t                             n;
    ngx_connection_t                   *c;
    affinity_store_reply_t              reply;
    ngx_http_upstream_affinity_link_t  *link;

    c = rev->data;
    link = c->data;

    if (rev->timedout) {
        ngx_http_upstream_affinity_link_fail(link, "no reply in time");
        return;
    }

    budget = NGX_HTTP_UPSTREAM_AFFINITY_LINK_BUDGET;

    for ( ;; ) {

        if (budget == 0) {
            ngx_post_event(rev, &ngx_posted_next_events);
            break;
        }

        n = c->recv(c, link->in, NGX_HTTP_UPSTREAM_AFFINITY_LINK_IN);

        if (n == NGX_AGAIN) {
            break;
        }

        if (n == 0) {
            ngx_http_upstream_affinity_link_fail(link, "connection closed");
            return;
        }

        if (n == NGX_ERROR) {
            ngx_http_upstream_affinity_link_fail(link, "read failed");
            return;
        }

        budget -= ngx_min(budget, (size_t) n);

        /* a long reply that keeps coming: its wait starts again */

        link->progress += n;

        if (link->progress >= NGX_HTTP_UPSTREAM_AFFINITY_LINK_IN
            && affinity_store_link_pending(link->proto))
        {
            ngx_add_timer(rev, link->wait);
            link->progress = 0;
        }

        p = link->in;

        while (n > 0) {
            rc = affinity_store_link_feed(link->proto, p, n, &used, &reply);

            p += used;
            n -= used;

            if (link->taken == 0) {
                link->started = ngx_current_msec;
            }

            link->taken += used;

            if (rc == AFFINITY_LINK_BROKEN) {
                ngx_http_upstream_affinity_link_fail(link, reply.error);
                return;
            }

            if (link->reply_max && link->taken > link->reply_max) {
                ngx_http_upstream_affinity_link_fail(link, "reply too long");
                return;
            }

            if (rc == AFFINITY_LINK_MORE) {

                /* a long reply that keeps coming, slowly: as one late */

                if (ngx_current_msec - link->started
                    > NGX_HTTP_UPSTREAM_AFFINITY_LINK_SLOW * link->wait)
                {
                    ngx_http_upstream_affinity_link_fail(link,
                                                         "no reply in time");
                    return;
                }

                break;
            }

            link->taken = 0;

            if (ngx_http_upstream_affinity_link_dispatch(link, &reply)
                != NGX_OK)
            {
                return;
            }

            /* the next reply's wait starts */

            if (affinity_store_link_pending(link->proto)) {
                ngx_add_timer(rev, link->wait);
                link->progress = 0;
            }
        }
    }

    if (affinity_store_link_pending(link->proto) == 0 && rev->timer_set) {
        ngx_del_timer(rev);
    }

    if (ngx_handle_read_event(rev, 0) != NGX_OK) {
        ngx_http_upstream_affinity_link_fail(link, "read failed");
    }
}


static void
ngx_http_upstream_affinity_link_write(ngx_event_t *wev)
{
    ssize_t                             n;
    ngx_buf_t                          *b;
    ngx_connection_t                   *c;
    ngx_http_upstream_affinity_link_t  *link;

    c = wev->data;
    link = c->data;
    b = link->out;

    if (wev->timedout) {
        ngx_http_upstream_affinity_link_fail(link, "connect timed out");
        return;
    }

    /*
     * TLS that must read to write calls this handler on read events
     * (ngx_ssl_write_handler()): the reply's wait may have run out.
     */

    if (c->read->timedout) {
        ngx_http_upstream_affinity_link_fail(link, "no reply in time");
        return;
    }

    if (!link->connected) {
        ngx_http_upstream_affinity_link_connected(link);
        return;
    }

    while (b->pos < b->last) {
        n = c->send(c, b->pos, b->last - b->pos);

        if (n == NGX_AGAIN) {
            if (ngx_handle_write_event(wev, 0) != NGX_OK) {
                ngx_http_upstream_affinity_link_fail(link, "write failed");
            }

            return;
        }

        if (n == NGX_ERROR) {
            ngx_http_upstream_affinity_link_fail(link, "write failed");
            return;
        }

        b->pos += n;
    }

    b->pos = b->start;
    b->last = b->start;

    /* with level-triggered events, the write event is not wanted now */

    if (ngx_handle_write_event(wev, 0) != NGX_OK) {
        ngx_http_upstream_affinity_link_fail(link, "write failed");
    }
}


/*
 * Closes the connection, if any: the commands sent that got no reply are
 * handed back to the owner (a reply without root), oldest first.
 */

void
ngx_http_upstream_affinity_link_close(ngx_http_upstream_affinity_link_t *link)
{
    uint64_t                arg;
    uint32_t                tag;
    ngx_pool_t             *pool;
    ngx_connection_t       *c;
    affinity_store_reply_t  reply;

    c = link->pc.connection;

    if (c == NULL) {
        return;
    }

    link->pc.connection = NULL;
    link->ready = 0;
    link->connected = 0;

#if (NGX_SSL)
    if (c->ssl) {

        /* nothing is waited for: the SSL object is freed at once */

        c->ssl->no_wait_shutdown = 1;
        c->ssl->no_send_shutdown = 1;
        (void) ngx_ssl_shutdown(c);
    }
#endif

    pool = c->pool;
    ngx_close_connection(c);

    if (pool) {
        ngx_destroy_pool(pool);
    }

    link->out->pos = link->out->start;
    link->out->last = link->out->start;

    while (affinity_store_link_forget(link->proto, &tag, &arg)) {
        if (tag == NGX_HTTP_UPSTREAM_AFFINITY_LINK_AUTH
            || tag == NGX_HTTP_UPSTREAM_AFFINITY_LINK_PING)
        {
            continue;
        }

        ngx_memzero(&reply, sizeof(affinity_store_reply_t));
        reply.tag = tag;
        reply.arg = arg;
        link->reply(link, &reply);
    }

    affinity_store_link_reset(link->proto);
}


static void
ngx_http_upstream_affinity_link_fail(ngx_http_upstream_affinity_link_t *link,
    const char *why)
{
    ngx_http_upstream_affinity_link_close(link);
    link->lost(link, why);
    link->detail.len = 0;
}


/*
 * What the store (or TLS) said of a failure, for the log: printable bytes
 * only, at most the buffer's size.
 */

void
ngx_http_upstream_affinity_link_detail(ngx_http_upstream_affinity_link_t *link,
    u_char *text, size_t len)
{
    size_t  i, n;

    n = ngx_min(len, sizeof(link->detail_buf));

    for (i = 0; i < n; i++) {
        link->detail_buf[i] = (text[i] >= 0x20 && text[i] < 0x7f)
                              ? text[i] : '?';
    }

    link->detail.data = link->detail_buf;
    link->detail.len = n;
}

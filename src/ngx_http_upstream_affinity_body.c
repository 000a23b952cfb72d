
/*
 * The request body for ngx_http_upstream_affinity_module: the one nginx
 * buffered for the upstream (memory buffers, a temporary file, or both),
 * parsed once per request for the session key fields and the prompt
 * prefixes.  A body that cannot be used never fails the request: the
 * balancer goes on without it, and the error log says why once per worker.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <sys/mman.h>
#if (NGX_LINUX) && defined(__GLIBC__)
#include <malloc.h>
#endif

#include "ngx_http_upstream_affinity_module.h"


/* bodies larger than this are balanced without looking inside */
#define NGX_HTTP_UPSTREAM_AFFINITY_BODY_MAX     (16 * 1024 * 1024)

/*
 * Bodies up to this size are copied into the request pool, and the JSON
 * parser's buffers for them are kept for good.  A larger body is mapped (a
 * temporary file) or copied into a mapping of its own, and the buffers the
 * parser grew for it are freed once no request with a large body has ended
 * for a second: a run of large bodies reuses them, and a worker does not
 * keep their memory once the run is over.
 */
#define NGX_HTTP_UPSTREAM_AFFINITY_BODY_RETAIN  (256 * 1024)
#define NGX_HTTP_UPSTREAM_AFFINITY_RELEASE_MS   1000


static ngx_int_t ngx_http_upstream_affinity_body_map(ngx_http_request_t *r,
    ngx_http_upstream_affinity_body_t *body, ngx_buf_t *b);
static ngx_int_t ngx_http_upstream_affinity_body_copy(ngx_http_request_t *r,
    ngx_http_upstream_affinity_body_t *body, size_t len);
static void ngx_http_upstream_affinity_release_later(ngx_http_request_t *r);
static void ngx_http_upstream_affinity_release_armed(void *data);
static void ngx_http_upstream_affinity_release(ngx_event_t *ev);


/* a warning: the fallback it records, if any, and what the log says */
typedef struct {
    ngx_uint_t                              fallback;   /* an
                                                           affinity_fallback_e
                                                           + 1, or 0 */
    const char                             *text;
} ngx_http_upstream_affinity_warning_t;


/*
 * What the module goes on without, and says once per worker, by
 * ngx_http_upstream_affinity_warning_e.  A "%V" is the warning's argument.
 */
static ngx_http_upstream_affinity_warning_t
    ngx_http_upstream_affinity_warnings[NGX_HTTP_UPSTREAM_AFFINITY_WARN_LAST] =
{
    /* NGX_HTTP_UPSTREAM_AFFINITY_WARN_UNBUFFERED */
    { AFFINITY_FALLBACK_NOT_BUFFERED + 1,
      "affinity: request body is not buffered "
      "(proxy_request_buffering off), balancing without it" },

    /* NGX_HTTP_UPSTREAM_AFFINITY_WARN_NOT_JSON */
    { AFFINITY_FALLBACK_NOT_JSON + 1,
      "affinity: request body of type \"%V\" is not JSON, "
      "balancing without it" },

    /* NGX_HTTP_UPSTREAM_AFFINITY_WARN_EMPTY */
    { AFFINITY_FALLBACK_NO_BODY + 1,
      "affinity: request without a body, balancing without it" },

    /* NGX_HTTP_UPSTREAM_AFFINITY_WARN_TOO_LARGE */
    { AFFINITY_FALLBACK_TOO_LARGE + 1,
      "affinity: request body larger than 16m, balancing without it" },

    /* NGX_HTTP_UPSTREAM_AFFINITY_WARN_READ */
    { AFFINITY_FALLBACK_READ_ERROR + 1,
      "affinity: could not read the request body from its temporary file, "
      "balancing without it" },

    /* NGX_HTTP_UPSTREAM_AFFINITY_WARN_INVALID */
    { AFFINITY_FALLBACK_PARSE_ERROR + 1,
      "affinity: request body is not a valid JSON object, "
      "balancing without it" },

    /* NGX_HTTP_UPSTREAM_AFFINITY_WARN_MEMORY */
    { AFFINITY_FALLBACK_NO_MEMORY + 1,
      "affinity: no memory to read request bodies, balancing without them" },

    /* NGX_HTTP_UPSTREAM_AFFINITY_WARN_PROMPT_NONE */
    { AFFINITY_FALLBACK_NO_PROMPT + 1,
      "affinity: request body has no prompt (messages, prompt or input), "
      "balancing without it" },

    /* NGX_HTTP_UPSTREAM_AFFINITY_WARN_RANDOM */
    { 0,
      "affinity: no random bytes for a session id, "
      "balancing requests without a key" },

    /* NGX_HTTP_UPSTREAM_AFFINITY_WARN_CONTINUED_ID */
    { 0,
      "affinity: request continues a response id longer than 256 bytes, "
      "which is never learned; routing it as usual" },

    /* NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_ENCODED */
    { 0,
      "affinity: response with Content-Encoding \"%V\", its id "
      "is not learned (let nginx compress instead)" },

    /* NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_FILE */
    { 0,
      "affinity: response body went to a temporary file, its id "
      "is not learned (set proxy_max_temp_file_size 0; "
      "proxy_cache and proxy_store always write one)" },

    /* NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_MEMORY */
    { 0,
      "affinity: no memory to read a response id, not learned" },

    /* NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_MALFORMED */
    { 0,
      "affinity: malformed JSON in a response, its id is not learned" },

    /* NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_TRUNCATED */
    { 0,
      "affinity: a response ended inside its JSON object, its id is "
      "not learned" },

    /* NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_ID */
    { 0,
      "affinity: a response id is longer than 256 bytes or escaped, "
      "not learned" },

    /* NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_NO_EVENT */
    { 0,
      "affinity: an event stream sent no data in its first megabyte, "
      "its id is not learned" },

    /* NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_TAKEN */
    { 0,
      "affinity: a reply of %V reused the id of a response another "
      "server stores; it is not learned" },

    /* NGX_HTTP_UPSTREAM_AFFINITY_WARN_USAGE_NONE */
    { 0,
      "affinity: replies give no cached token count "
      "(usage.prompt_tokens_details.cached_tokens), so the size of the "
      "replicas' caches is not learned (vLLM: "
      "--enable-prompt-tokens-details; or set prefix_affinity cache=)" }
};


/* per worker: the JSON reader, and each warning logged once */
static affinity_json_t  *ngx_http_upstream_affinity_json;
static ngx_uint_t        ngx_http_upstream_affinity_warned[
                                     NGX_HTTP_UPSTREAM_AFFINITY_WARN_LAST];
static ngx_event_t       ngx_http_upstream_affinity_release_event;


/*
 * Parses the request body on first use; later calls answer from the first.
 * NGX_DECLINED: there is no usable body (the reason is logged once).
 */

ngx_int_t
ngx_http_upstream_affinity_body_load(ngx_http_request_t *r,
    ngx_http_upstream_affinity_body_t *body)
{
    off_t         total;
    ngx_int_t     rc;
    ngx_str_t    *type;
    ngx_chain_t  *cl;

    if (body->tried) {
        return body->loaded ? NGX_OK : NGX_DECLINED;
    }

    body->tried = 1;

    total = 0;

    if (r->request_body) {
        for (cl = r->request_body->bufs; cl; cl = cl->next) {
            total += ngx_buf_size(cl->buf);
        }
    }

    /* nginx's own buffers of a large body are freed with the request */

    if (total > NGX_HTTP_UPSTREAM_AFFINITY_BODY_RETAIN) {
        ngx_http_upstream_affinity_release_later(r);
    }

    /* an unbuffered body is still on its way: only part of it is here */

    if (r->request_body_no_buffering
        && (r->headers_in.content_length_n > 0 || r->headers_in.chunked))
    {
        return ngx_http_upstream_affinity_decline(r, body,
                           NGX_HTTP_UPSTREAM_AFFINITY_WARN_UNBUFFERED, NULL);
    }

    /* a missing type is accepted: many API clients omit it */

    if (r->headers_in.content_type) {
        type = &r->headers_in.content_type->value;

        if (ngx_strlcasestrn(type->data, type->data + type->len,
                             (u_char *) "json", 4 - 1)
            == NULL)
        {
            return ngx_http_upstream_affinity_decline(r, body,
                             NGX_HTTP_UPSTREAM_AFFINITY_WARN_NOT_JSON, type);
        }
    }

    /* a GET, HEAD or DELETE has no body to miss: nothing to say */

    if (total == 0) {
        if (r->method & (NGX_HTTP_POST|NGX_HTTP_PUT|NGX_HTTP_PATCH)) {
            return ngx_http_upstream_affinity_decline(r, body,
                                NGX_HTTP_UPSTREAM_AFFINITY_WARN_EMPTY, NULL);
        }

        return NGX_DECLINED;
    }

    if (total > NGX_HTTP_UPSTREAM_AFFINITY_BODY_MAX) {
        return ngx_http_upstream_affinity_decline(r, body,
                            NGX_HTTP_UPSTREAM_AFFINITY_WARN_TOO_LARGE, NULL);
    }

    if (ngx_http_upstream_affinity_json == NULL) {
        ngx_http_upstream_affinity_json =
                 affinity_json_create(NGX_HTTP_UPSTREAM_AFFINITY_BODY_RETAIN);

        if (ngx_http_upstream_affinity_json == NULL) {
            return ngx_http_upstream_affinity_decline(r, body,
                               NGX_HTTP_UPSTREAM_AFFINITY_WARN_MEMORY, NULL);
        }
    }

    /*
     * A body nginx wrote to a temporary file is mapped, not read: the
     * parser indexes it in place, and its pages are the page cache's, not
     * the worker's.  Anything else is made one buffer with the padding the
     * parser reads past the end.
     */

    cl = r->request_body->bufs;

    if (cl->next == NULL && cl->buf->in_file && !ngx_buf_in_memory(cl->buf)) {
        rc = ngx_http_upstream_affinity_body_map(r, body, cl->buf);

    } else {
        rc = NGX_DECLINED;
    }

    if (rc == NGX_DECLINED) {
        rc = ngx_http_upstream_affinity_body_copy(r, body, (size_t) total);
    }

    if (rc != NGX_OK) {
        return rc;
    }

    if (affinity_json_load(ngx_http_upstream_affinity_json,
                           (char *) body->data, body->len)
        != 0)
    {
        ngx_http_upstream_affinity_body_unload(body);

        return ngx_http_upstream_affinity_decline(r, body,
                              NGX_HTTP_UPSTREAM_AFFINITY_WARN_INVALID, NULL);
    }

    body->json = ngx_http_upstream_affinity_json;
    body->loaded = 1;

    return NGX_OK;
}


/*
 * Maps the temporary file of a body, followed by a page of zeros: the
 * parser may read AFFINITY_JSON_PADDING bytes past the end, and a page of
 * the file past its end would fault.  NGX_DECLINED: read it instead.
 */

static ngx_int_t
ngx_http_upstream_affinity_body_map(ngx_http_request_t *r,
    ngx_http_upstream_affinity_body_t *body, ngx_buf_t *b)
{
    off_t    start;
    size_t   len, delta, file_len;
    u_char  *base, *p;

    len = (size_t) (b->file_last - b->file_pos);
    start = b->file_pos & ~((off_t) ngx_pagesize - 1);
    delta = (size_t) (b->file_pos - start);
    file_len = ngx_align(delta + len, ngx_pagesize);

    base = mmap(NULL, file_len + ngx_pagesize, PROT_READ,
                MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
        return NGX_DECLINED;
    }

    p = mmap(base, file_len, PROT_READ, MAP_PRIVATE|MAP_FIXED, b->file->fd,
             start);
    if (p == MAP_FAILED) {
        /* a file system that cannot map files: read it */
        (void) munmap(base, file_len + ngx_pagesize);
        return NGX_DECLINED;
    }

    body->map = base;
    body->map_len = file_len + ngx_pagesize;
    body->data = base + delta;
    body->len = len;

    return NGX_OK;
}


/* the body's buffers, in memory or in a file, copied into one */

static ngx_int_t
ngx_http_upstream_affinity_body_copy(ngx_http_request_t *r,
    ngx_http_upstream_affinity_body_t *body, size_t len)
{
    size_t        size;
    ssize_t       n;
    u_char       *p;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    size = len + AFFINITY_JSON_PADDING;

    if (len <= NGX_HTTP_UPSTREAM_AFFINITY_BODY_RETAIN) {
        p = ngx_pnalloc(r->pool, size);
        if (p == NULL) {
            return NGX_ERROR;
        }

    } else {
        p = mmap(NULL, size, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS,
                 -1, 0);
        if (p == MAP_FAILED) {
            return ngx_http_upstream_affinity_decline(r, body,
                               NGX_HTTP_UPSTREAM_AFFINITY_WARN_MEMORY, NULL);
        }

        body->map = p;
        body->map_len = size;
    }

    body->data = p;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        b = cl->buf;

        if (ngx_buf_in_memory(b)) {
            p = ngx_cpymem(p, b->pos, b->last - b->pos);
            continue;
        }

        if (!b->in_file) {
            continue;
        }

        size = (size_t) (b->file_last - b->file_pos);

        n = ngx_read_file(b->file, p, size, b->file_pos);

        if (n != (ssize_t) size) {
            ngx_http_upstream_affinity_body_unload(body);

            return ngx_http_upstream_affinity_decline(r, body,
                                 NGX_HTTP_UPSTREAM_AFFINITY_WARN_READ, NULL);
        }

        p += size;
    }

    body->len = p - body->data;
    ngx_memzero(p, AFFINITY_JSON_PADDING);

    return NGX_OK;
}


/* the body is no longer needed: the parser forgets it, mappings go */

void
ngx_http_upstream_affinity_body_unload(ngx_http_upstream_affinity_body_t *body)
{
    if (body->loaded) {
        affinity_json_unload(body->json);
        body->loaded = 0;
    }

    if (body->map) {
        (void) munmap(body->map, body->map_len);
        body->map = NULL;
    }

    body->data = NULL;
}


/*
 * The prompt's prefixes, hashed at the configured levels.  Leaves
 * ctx->nlevels at 0 when the body has no usable prompt.
 */

ngx_int_t
ngx_http_upstream_affinity_prompt(ngx_http_request_t *r,
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_affinity_ctx_t *ctx,
    ngx_http_upstream_affinity_body_t *body)
{
    size_t             i, n, m, cap;
    uint32_t           last;
    ngx_int_t          rc;
    affinity_prompt_e  prc;

    rc = ngx_http_upstream_affinity_body_load(r, body);

    if (rc != NGX_OK) {
        return rc == NGX_ERROR ? NGX_ERROR : NGX_OK;
    }

    /* turn levels beyond the limit of a request's levels are left out */
    cap = ngx_min(ascf->nschedule + ascf->turns, AFFINITY_MAX_LEVELS);

    ctx->levels = ngx_palloc(r->pool, cap * sizeof(affinity_level_t));
    if (ctx->levels == NULL) {
        return NGX_ERROR;
    }

    prc = affinity_json_prompt(body->json, ascf->schedule, ascf->nschedule,
                               ascf->turns, ctx->levels, cap, &n);

    switch (prc) {

    case AFFINITY_PROMPT_OK:
        ctx->nlevels = n;

        /*
         * the prompt's size, from above: no more than its body's (which
         * counts inline images by their bytes), and, when it did not
         * reach the next scheduled level, shorter than that level; one
         * shorter than the first level is its one level's length
         */

        m = 0;
        last = 0;

        for (i = 0; i < n; i++) {
            if (!ctx->levels[i].turn) {
                last = ctx->levels[i].length;
                m++;
            }
        }

        if (m && last == ascf->schedule[m - 1]) {
            ctx->prompt_size = (m < ascf->nschedule)
                               ? ngx_min(body->len, ascf->schedule[m])
                               : body->len;
        }

        break;

    case AFFINITY_PROMPT_NONE:
        (void) ngx_http_upstream_affinity_decline(r, body,
                          NGX_HTTP_UPSTREAM_AFFINITY_WARN_PROMPT_NONE, NULL);
        break;

    default: /* AFFINITY_PROMPT_INVALID */
        (void) ngx_http_upstream_affinity_decline(r, body,
                              NGX_HTTP_UPSTREAM_AFFINITY_WARN_INVALID, NULL);
        break;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "affinity prompt: %ui levels, longest %ui",
                   ctx->nlevels,
                   ctx->nlevels ? (ngx_uint_t) ctx->levels[n - 1].length : 0);

    return NGX_OK;
}


/*
 * After a request with a large body, once its memory is freed (nginx's own
 * body buffers among it), the worker waits for a second without another
 * such request to end, then frees the parser's grown buffers and gives the
 * free heap back to the system: glibc keeps large freed blocks on its heap
 * once an earlier large free has raised its mapping threshold.  The pool
 * cleanup runs before the pool frees its blocks, so it only arms the timer.
 */

static void
ngx_http_upstream_affinity_release_later(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t  *cln;

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return;
    }

    cln->handler = ngx_http_upstream_affinity_release_armed;
    cln->data = NULL;
}


static void
ngx_http_upstream_affinity_release_armed(void *data)
{
    ngx_event_t  *ev;

    ev = &ngx_http_upstream_affinity_release_event;

    if (ev->handler == NULL) {
        ev->handler = ngx_http_upstream_affinity_release;
        ev->log = ngx_cycle->log;
        ev->cancelable = 1;     /* does not hold up a graceful shutdown */
    }

    ngx_add_timer(ev, NGX_HTTP_UPSTREAM_AFFINITY_RELEASE_MS);
}


static void
ngx_http_upstream_affinity_release(ngx_event_t *ev)
{
    ngx_log_debug0(NGX_LOG_DEBUG_HTTP, ev->log, 0,
                   "affinity: releasing body memory");

    if (ngx_http_upstream_affinity_json) {
        (void) affinity_json_shrink(ngx_http_upstream_affinity_json);
    }

#if (NGX_LINUX) && defined(__GLIBC__)
    (void) malloc_trim(0);
#endif
}


/* at worker exit: the reader and its buffers */

void
ngx_http_upstream_affinity_body_exit(void)
{
    if (ngx_http_upstream_affinity_release_event.timer_set) {
        ngx_del_timer(&ngx_http_upstream_affinity_release_event);
    }

    if (ngx_http_upstream_affinity_json) {
        affinity_json_destroy(ngx_http_upstream_affinity_json);
        ngx_http_upstream_affinity_json = NULL;
    }
}


/*
 * Logs a warning once per worker; its argument, if any, is its "%V".
 */

void
ngx_http_upstream_affinity_warn(ngx_http_request_t *r,
    ngx_http_upstream_affinity_warning_e warning, ngx_str_t *arg)
{
    if (ngx_http_upstream_affinity_warned[warning]) {
        return;
    }

    ngx_http_upstream_affinity_warned[warning] = 1;

    ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                  ngx_http_upstream_affinity_warnings[warning].text, arg);
}


/*
 * The request is balanced without its body: the warning's fallback is
 * recorded for the counters and the warning logged once.  NGX_DECLINED.
 */

ngx_int_t
ngx_http_upstream_affinity_decline(ngx_http_request_t *r,
    ngx_http_upstream_affinity_body_t *body,
    ngx_http_upstream_affinity_warning_e warning, ngx_str_t *arg)
{
    body->fallback = ngx_http_upstream_affinity_warnings[warning].fallback;

    ngx_http_upstream_affinity_warn(r, warning, arg);

    return NGX_DECLINED;
}

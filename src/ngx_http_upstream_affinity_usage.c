
/*
 * The replies' times and usage.  Every reply of a request the core routed
 * teaches its peer's pace (the core's peer_pace.h): when its first byte
 * came (the header of a whole body, the first byte of a stream's body),
 * when its last did, and the prompt, cached and output tokens its usage
 * gives.  When no cache size is configured and the engines report none, a
 * request whose prompt extends one its peer is watched with (a probe, see
 * the core's cache_model.h) also teaches, by the tokens the engine found
 * cached, how long a prefix lasts in the peer's cache.  The reply passes
 * unchanged and at once.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_upstream_affinity_module.h"


static ngx_int_t ngx_http_upstream_affinity_usage_header_filter(
    ngx_http_request_t *r);
static ngx_int_t ngx_http_upstream_affinity_usage_body_filter(
    ngx_http_request_t *r, ngx_chain_t *in);
static void ngx_http_upstream_affinity_timed(ngx_http_request_t *r,
    ngx_http_upstream_affinity_ctx_t *ctx);
static uint64_t ngx_http_upstream_affinity_prompt_chars(
    ngx_http_upstream_affinity_ctx_t *ctx);
static void ngx_http_upstream_affinity_replied(ngx_http_request_t *r,
    ngx_http_upstream_affinity_ctx_t *ctx);


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;


/*
 * The reply of a request the core routed, when the module may read it
 * (ngx_http_upstream_affinity_reply_format(); compressed by the upstream,
 * it teaches nothing).  The scan lives in the request's pool.
 */

static ngx_int_t
ngx_http_upstream_affinity_usage_header_filter(ngx_http_request_t *r)
{
    ngx_str_t                          *encoding;
    affinity_response_format_e          format;
    ngx_http_upstream_affinity_ctx_t   *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_upstream_affinity_module);

    if (ctx == NULL || r->upstream == NULL
        || (ctx->probe_length == 0 && ctx->timed == NULL))
    {
        return ngx_http_next_header_filter(r);
    }

    format = ngx_http_upstream_affinity_reply_format(r, &encoding);

    if (format == 0) {
        return ngx_http_next_header_filter(r);
    }

    ctx->usage_streamed = (format == AFFINITY_RESPONSE_EVENTS);

    if (ctx->probe_length == 0 && ctx->usage_streamed
        && r->upstream->buffering)
    {
        return ngx_http_next_header_filter(r);
    }

    ctx->usage = ngx_palloc(r->pool, sizeof(affinity_usage_scan_t));

    if (ctx->usage != NULL) {
        affinity_usage_scan_start(ctx->usage);
    }

    return ngx_http_next_header_filter(r);
}


/* reads the buffers as they pass, and passes them on unchanged, at once */

static ngx_int_t
ngx_http_upstream_affinity_usage_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in)
{
    ngx_buf_t                         *b;
    ngx_chain_t                       *cl;
    ngx_http_upstream_affinity_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_upstream_affinity_module);

    if (ctx == NULL || in == NULL) {
        return ngx_http_next_body_filter(r, in);
    }

    if (ctx->backlogged) {
        for (cl = in; cl; cl = cl->next) {
            if (ngx_buf_size(cl->buf)) {
                ngx_http_upstream_affinity_started(ctx);
                break;
            }
        }
    }

    if (ctx->usage == NULL) {
        return ngx_http_next_body_filter(r, in);
    }

    for (cl = in; cl; cl = cl->next) {
        b = cl->buf;

        if (ctx->first_byte == 0 && ngx_buf_size(b)) {
            ctx->first_byte = ngx_current_msec - r->upstream->start_time + 1;
        }

        if (ngx_buf_in_memory(b)) {
            if (b->last > b->pos) {
                affinity_usage_scan(ctx->usage, (char *) b->pos,
                                    b->last - b->pos);
            }

        } else if (ngx_buf_size(b)) {
            /* proxy buffering wrote it to a temporary file: not read */
            ctx->usage = NULL;
            break;
        }

        if (b->last_buf) {
            ngx_http_upstream_affinity_timed(r, ctx);
            ngx_http_upstream_affinity_replied(r, ctx);
            ctx->usage = NULL;
            break;
        }
    }

    return ngx_http_next_body_filter(r, in);
}


/* the prompt's characters: its size from above, or its longest level's */

static uint64_t
ngx_http_upstream_affinity_prompt_chars(ngx_http_upstream_affinity_ctx_t *ctx)
{
    uint64_t  chars;

    chars = ctx->prompt_size;

    if (ctx->nlevels && ctx->levels[ctx->nlevels - 1].length > chars) {
        chars = ctx->levels[ctx->nlevels - 1].length;
    }

    return chars;
}


/*
 * The try's peer answered in full: its times and usage teach its pace.
 * The try's own start is the base: a retry's reply is timed from its own
 * connect, and teaches the peer it came from.
 */

static void
ngx_http_upstream_affinity_timed(ngx_http_request_t *r,
    ngx_http_upstream_affinity_ctx_t *ctx)
{
    uint64_t                 prompt, output, cached, unused;
    ngx_msec_t               total;
    affinity_reply_times_t   t;
    ngx_http_upstream_t     *u;

    u = r->upstream;

    /*
     * A buffered stream's body passes when nginx's buffers fill or the
     * stream ends, not when its first token came: it is not timed.
     */

    if (ctx->timed == NULL || u->state == NULL
        || (ctx->usage_streamed && u->buffering))
    {
        return;
    }

    total = ngx_current_msec - u->start_time;

    affinity_usage_scan_tokens(ctx->usage, &prompt, &output);

    if (!affinity_usage_scan_result(ctx->usage, &cached, &unused)) {
        cached = 0;
    }

    ngx_memzero(&t, sizeof(affinity_reply_times_t));

    t.streamed = ctx->usage_streamed;
    t.first_ms = (uint32_t) (t.streamed && ctx->first_byte
                             ? ctx->first_byte - 1
                             : u->state->header_time);
    t.total_ms = (uint32_t) total;
    t.queued = ctx->queued;
    t.prompt_chars = (uint32_t) ngx_min(
                         ngx_http_upstream_affinity_prompt_chars(ctx),
                         UINT32_MAX);

    t.prompt_tokens = (uint32_t) ngx_min(prompt, UINT32_MAX);
    t.cached_tokens = (uint32_t) ngx_min(cached, UINT32_MAX);
    t.output_tokens = (uint32_t) ngx_min(output, UINT32_MAX);

    affinity_zone_peer_timed(ctx->timed->zone, ctx->timed_slot,
                             ctx->timed_peer, &t);

    ngx_log_debug6(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "affinity: reply in %uD/%uD ms behind %uD, tokens "
                   "%uD/%uD out %uD", t.first_ms, t.total_ms, t.queued,
                   t.cached_tokens, t.prompt_tokens, t.output_tokens);
}


/*
 * The probe's peer answered in full: what its usage says is learned.  A
 * retry that another peer answered says nothing of the probe's.
 */

static void
ngx_http_upstream_affinity_replied(ngx_http_request_t *r,
    ngx_http_upstream_affinity_ctx_t *ctx)
{
    uint64_t                             peer, cached, prompt, chars;
    ngx_str_t                           *name;
    ngx_http_upstream_affinity_shctx_t  *shctx;

    name = r->upstream->peer.name;

    if (name == NULL || name->len == 0 || ctx->conf->prefix_zone == NULL) {
        return;
    }

    peer = affinity_peer_id((char *) name->data, name->len);

    if (peer != ctx->probe_peer) {
        return;
    }

    if (!affinity_usage_scan_result(ctx->usage, &cached, &prompt)) {
        if (!ctx->usage_streamed) {
            ngx_http_upstream_affinity_warn(r,
                           NGX_HTTP_UPSTREAM_AFFINITY_WARN_USAGE_NONE, NULL);
        }

        return;
    }

    chars = ngx_http_upstream_affinity_prompt_chars(ctx);

    shctx = ctx->conf->prefix_zone->data;

    ngx_shmtx_lock(&shctx->shpool->mutex);
    affinity_prefixes_replied(shctx->zone, peer, ctx->probe_age,
                              ctx->probe_length, chars, cached, prompt);
    ngx_shmtx_unlock(&shctx->shpool->mutex);

    ngx_log_debug4(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "affinity: %V had %uL of %uL prompt tokens cached, "
                   "a probe of age %uD", name, cached, prompt,
                   ctx->probe_age);
}


ngx_int_t
ngx_http_upstream_affinity_init_usage_filter(ngx_conf_t *cf)
{
    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_upstream_affinity_usage_header_filter;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_upstream_affinity_usage_body_filter;

    return NGX_OK;
}


/*
 * The try's first byte came, or the try ended: its prompt leaves its peer's
 * backlog, the prefill that requests routed there since wait behind (the
 * core's affinity_zone_peer_started()), once per try.
 */

void
ngx_http_upstream_affinity_started(ngx_http_upstream_affinity_ctx_t *ctx)
{
    if (ctx == NULL || !ctx->backlogged) {
        return;
    }

    ctx->backlogged = 0;
    affinity_zone_peer_started(ctx->timed->zone, ctx->timed_slot,
                               ctx->backlog);
}

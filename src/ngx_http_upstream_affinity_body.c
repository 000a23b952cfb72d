
/*
 * The request body for ngx_http_upstream_affinity_module: read once per
 * request from what nginx buffered for the upstream (memory buffers, a
 * temporary file, or both), for the session key fields and the prompt
 * prefixes.  A body that cannot be used never fails the request: the
 * balancer goes on without it, and the error log says why once per worker.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_upstream_affinity_module.h"


/* bodies larger than this are balanced without looking inside */
#define NGX_HTTP_UPSTREAM_AFFINITY_BODY_MAX  (16 * 1024 * 1024)


/* per worker: each reason is logged once */
static ngx_uint_t  ngx_http_upstream_affinity_warned[
                                     NGX_HTTP_UPSTREAM_AFFINITY_WARN_LAST];


ngx_int_t
ngx_http_upstream_affinity_read_body(ngx_http_request_t *r,
    ngx_http_upstream_affinity_ctx_t *ctx)
{
    off_t                               total;
    size_t                              size;
    u_char                             *p;
    ssize_t                             n;
    ngx_buf_t                          *b;
    ngx_str_t                          *type;
    ngx_chain_t                        *cl;
    ngx_http_upstream_affinity_body_t  *body;

    body = &ctx->body;

    if (body->read) {
        return body->data ? NGX_OK : NGX_DECLINED;
    }

    body->read = 1;

    /* an unbuffered body is still on its way: only part of it is here */

    if (r->request_body_no_buffering
        && (r->headers_in.content_length_n > 0 || r->headers_in.chunked))
    {
        ngx_http_upstream_affinity_warn(r,
            NGX_HTTP_UPSTREAM_AFFINITY_WARN_UNBUFFERED,
            "affinity: request body is not buffered "
            "(proxy_request_buffering off), balancing without it", NULL);
        return NGX_DECLINED;
    }

    /* a missing type is accepted: many API clients omit it */

    if (r->headers_in.content_type) {
        type = &r->headers_in.content_type->value;

        if (ngx_strlcasestrn(type->data, type->data + type->len,
                             (u_char *) "json", 4 - 1)
            == NULL)
        {
            ngx_http_upstream_affinity_warn(r,
                NGX_HTTP_UPSTREAM_AFFINITY_WARN_NOT_JSON,
                "affinity: request body of type \"%V\" is not JSON, "
                "balancing without it", type);
            return NGX_DECLINED;
        }
    }

    total = 0;

    if (r->request_body) {
        for (cl = r->request_body->bufs; cl; cl = cl->next) {
            total += ngx_buf_size(cl->buf);
        }
    }

    if (total == 0) {
        ngx_http_upstream_affinity_warn(r,
            NGX_HTTP_UPSTREAM_AFFINITY_WARN_EMPTY,
            "affinity: request without a body, balancing without it", NULL);
        return NGX_DECLINED;
    }

    if (total > NGX_HTTP_UPSTREAM_AFFINITY_BODY_MAX) {
        ngx_http_upstream_affinity_warn(r,
            NGX_HTTP_UPSTREAM_AFFINITY_WARN_TOO_LARGE,
            "affinity: request body larger than 16m, "
            "balancing without it", NULL);
        return NGX_DECLINED;
    }

    p = ngx_pnalloc(r->pool, (size_t) total + AFFINITY_JSON_PADDING);
    if (p == NULL) {
        return NGX_ERROR;
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
            ngx_http_upstream_affinity_warn(r,
                NGX_HTTP_UPSTREAM_AFFINITY_WARN_READ,
                "affinity: could not read the request body from "
                "its temporary file, balancing without it", NULL);
            body->data = NULL;
            return NGX_DECLINED;
        }

        p += size;
    }

    body->len = p - body->data;
    ngx_memzero(p, AFFINITY_JSON_PADDING);

    return NGX_OK;
}


/*
 * The prompt's prefixes, hashed at the configured levels.  Leaves
 * ctx->nlevels at 0 when the body has no usable prompt.
 */

ngx_int_t
ngx_http_upstream_affinity_prompt(ngx_http_request_t *r,
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_affinity_ctx_t *ctx)
{
    size_t             n;
    ngx_int_t          rc;
    affinity_prompt_e  prc;

    rc = ngx_http_upstream_affinity_read_body(r, ctx);

    if (rc != NGX_OK) {
        return rc == NGX_ERROR ? NGX_ERROR : NGX_OK;
    }

    ctx->levels = ngx_palloc(r->pool,
                             ascf->nschedule * sizeof(affinity_level_t));
    if (ctx->levels == NULL) {
        return NGX_ERROR;
    }

    prc = affinity_prompt_levels((char *) ctx->body.data, ctx->body.len,
                                 ascf->schedule, ascf->nschedule,
                                 ctx->levels, ascf->nschedule, &n);

    switch (prc) {

    case AFFINITY_PROMPT_OK:
        ctx->nlevels = n;
        break;

    case AFFINITY_PROMPT_NONE:
        ngx_http_upstream_affinity_warn(r,
            NGX_HTTP_UPSTREAM_AFFINITY_WARN_PROMPT_NONE,
            "affinity: request body has no prompt (messages, prompt "
            "or input), balancing without it", NULL);
        break;

    default: /* AFFINITY_PROMPT_INVALID */
        ngx_http_upstream_affinity_warn(r,
            NGX_HTTP_UPSTREAM_AFFINITY_WARN_PROMPT_INVALID,
            "affinity: request body is not a valid JSON object, "
            "balancing without it", NULL);
        break;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "affinity prompt: %ui levels, longest %ui",
                   ctx->nlevels,
                   ctx->nlevels ? (ngx_uint_t) ctx->levels[n - 1].length : 0);

    return NGX_OK;
}


void
ngx_http_upstream_affinity_warn(ngx_http_request_t *r,
    ngx_http_upstream_affinity_warning_e warning, const char *fmt,
    ngx_str_t *arg)
{
    if (ngx_http_upstream_affinity_warned[warning]) {
        return;
    }

    ngx_http_upstream_affinity_warned[warning] = 1;

    if (arg) {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0, fmt, arg);

    } else {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0, fmt);
    }
}

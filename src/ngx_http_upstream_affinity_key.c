
/*
 * Session keys of ngx_http_upstream_affinity_module: looked up in the
 * configured sources in order (request header, cookie, JSON body field),
 * or generated.  Nothing here fails a request the balancer could route: a
 * body that cannot be read or parsed just yields no key, and the error log
 * says why once per worker.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_upstream_affinity_module.h"


/* bodies larger than this are not searched for a session field */
#define NGX_HTTP_UPSTREAM_AFFINITY_BODY_MAX  (16 * 1024 * 1024)

/* longest key taken from a body field */
#define NGX_HTTP_UPSTREAM_AFFINITY_FIELD_MAX  1024


typedef enum {
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_UNBUFFERED = 0,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_TOO_LARGE,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_READ,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_INVALID,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_RANDOM,
    NGX_HTTP_UPSTREAM_AFFINITY_WARN_LAST
} ngx_http_upstream_affinity_warning_e;


typedef struct {
    u_char                           *data;
    size_t                            len;
    unsigned                          read:1;
    unsigned                          json:1;
} ngx_http_upstream_affinity_body_t;


static ngx_int_t ngx_http_upstream_affinity_header(ngx_http_request_t *r,
    ngx_str_t *name, ngx_str_t *value);
static ngx_int_t ngx_http_upstream_affinity_field(ngx_http_request_t *r,
    ngx_http_upstream_affinity_body_t *body, ngx_str_t *path,
    ngx_str_t *value);
static void ngx_http_upstream_affinity_read_body(ngx_http_request_t *r,
    ngx_http_upstream_affinity_body_t *body);
static void ngx_http_upstream_affinity_warn(ngx_http_request_t *r,
    ngx_http_upstream_affinity_warning_e warning, const char *fmt,
    ngx_str_t *arg);


/* per worker: each reason for ignoring a body is logged once */
static ngx_uint_t  ngx_http_upstream_affinity_warned[
                                     NGX_HTTP_UPSTREAM_AFFINITY_WARN_LAST];


ngx_int_t
ngx_http_upstream_affinity_session_key(ngx_http_request_t *r,
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_affinity_ctx_t *ctx)
{
    ngx_int_t                             rc;
    ngx_str_t                             value;
    ngx_uint_t                            i;
    ngx_http_upstream_affinity_body_t     body;
    ngx_http_upstream_affinity_source_t  *src;

    ngx_memzero(&body, sizeof(ngx_http_upstream_affinity_body_t));

    src = ascf->sources->elts;

    for (i = 0; i < ascf->sources->nelts; i++) {

        ngx_str_null(&value);

        switch (src[i].type) {

        case NGX_HTTP_UPSTREAM_AFFINITY_HEADER:
            rc = ngx_http_upstream_affinity_header(r, &src[i].name, &value);
            break;

        case NGX_HTTP_UPSTREAM_AFFINITY_COOKIE:
            rc = ngx_http_upstream_affinity_cookie_found(
                     ngx_http_upstream_affinity_parse_cookie(r, &src[i].name,
                                                             &value))
                 ? NGX_OK : NGX_DECLINED;
            break;

        default: /* NGX_HTTP_UPSTREAM_AFFINITY_FIELD */
            rc = ngx_http_upstream_affinity_field(r, &body, &src[i].name,
                                                  &value);
            break;
        }

        if (rc == NGX_ERROR) {
            return NGX_ERROR;
        }

        if (rc == NGX_OK && value.len) {
            ctx->key = value;
            ctx->source = src[i].type;
            ctx->keyed = 1;
            break;
        }
    }

    if (!ctx->keyed && ascf->generate) {
        ctx->key.data = ngx_pnalloc(r->pool, AFFINITY_UUID_LEN);
        if (ctx->key.data == NULL) {
            return NGX_ERROR;
        }

        if (affinity_uuid_v4((char *) ctx->key.data) == 0) {
            ctx->key.len = AFFINITY_UUID_LEN;
            ctx->source = NGX_HTTP_UPSTREAM_AFFINITY_GENERATED;
            ctx->generated = 1;
            ctx->keyed = 1;

        } else {
            ngx_http_upstream_affinity_warn(r,
                NGX_HTTP_UPSTREAM_AFFINITY_WARN_RANDOM,
                "affinity: no random bytes for a session id, "
                "balancing requests without a key", NULL);
        }
    }

    if (ctx->keyed) {
        ctx->echo = affinity_key_echoable((char *) ctx->key.data,
                                          ctx->key.len)
                    ? 1 : 0;
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "affinity session key: \"%V\", source: %i, echo: %ui",
                   &ctx->key, (ngx_int_t) ctx->source, (ngx_uint_t) ctx->echo);

    return NGX_OK;
}


static ngx_int_t
ngx_http_upstream_affinity_header(ngx_http_request_t *r, ngx_str_t *name,
    ngx_str_t *value)
{
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    part = &r->headers_in.headers.part;
    h = part->elts;

    for (i = 0; /* void */ ; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                return NGX_DECLINED;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].key.len == name->len
            && ngx_strncasecmp(h[i].key.data, name->data, name->len) == 0)
        {
            *value = h[i].value;
            return NGX_OK;
        }
    }
}


static ngx_int_t
ngx_http_upstream_affinity_field(ngx_http_request_t *r,
    ngx_http_upstream_affinity_body_t *body, ngx_str_t *path,
    ngx_str_t *value)
{
    size_t            len;
    u_char           *out;
    affinity_field_e  rc;

    if (!body->read) {
        ngx_http_upstream_affinity_read_body(r, body);
        body->read = 1;
    }

    if (body->data == NULL) {
        return NGX_DECLINED;
    }

    out = ngx_pnalloc(r->pool, NGX_HTTP_UPSTREAM_AFFINITY_FIELD_MAX);
    if (out == NULL) {
        return NGX_ERROR;
    }

    rc = affinity_json_field((char *) body->data, body->len,
                             (char *) path->data, path->len, (char *) out,
                             NGX_HTTP_UPSTREAM_AFFINITY_FIELD_MAX, &len);

    if (rc == AFFINITY_FIELD_INVALID) {
        ngx_http_upstream_affinity_warn(r,
            NGX_HTTP_UPSTREAM_AFFINITY_WARN_INVALID,
            "affinity: request body is not a JSON object, "
            "session field \"%V\" ignored", path);

        /* do not parse the same body again for the next field */
        body->data = NULL;
        return NGX_DECLINED;
    }

    if (rc != AFFINITY_FIELD_FOUND) {
        return NGX_DECLINED;
    }

    value->data = out;
    value->len = len;

    return NGX_OK;
}


/*
 * Copies the request body that nginx buffered for the upstream into one
 * buffer with the padding the JSON parser reads past the end.  The body may
 * be in memory buffers, in a temporary file, or both.
 */

static void
ngx_http_upstream_affinity_read_body(ngx_http_request_t *r,
    ngx_http_upstream_affinity_body_t *body)
{
    off_t         total;
    size_t        size;
    u_char       *p;
    ssize_t       n;
    ngx_buf_t    *b;
    ngx_str_t    *type;
    ngx_chain_t  *cl;

    /* an unbuffered body is still on its way: only part of it is here */

    if (r->request_body_no_buffering
        && (r->headers_in.content_length_n > 0 || r->headers_in.chunked))
    {
        ngx_http_upstream_affinity_warn(r,
            NGX_HTTP_UPSTREAM_AFFINITY_WARN_UNBUFFERED,
            "affinity: request body is not buffered "
            "(proxy_request_buffering off), session fields ignored", NULL);
        return;
    }

    if (r->request_body == NULL || r->request_body->bufs == NULL) {
        return;
    }

    /* a missing type is accepted: many API clients omit it */

    if (r->headers_in.content_type) {
        type = &r->headers_in.content_type->value;

        if (ngx_strlcasestrn(type->data, type->data + type->len,
                             (u_char *) "json", 4 - 1)
            == NULL)
        {
            return;
        }
    }

    total = 0;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        total += ngx_buf_size(cl->buf);
    }

    if (total == 0) {
        return;
    }

    if (total > NGX_HTTP_UPSTREAM_AFFINITY_BODY_MAX) {
        ngx_http_upstream_affinity_warn(r,
            NGX_HTTP_UPSTREAM_AFFINITY_WARN_TOO_LARGE,
            "affinity: request body larger than 16m, "
            "session fields ignored", NULL);
        return;
    }

    p = ngx_pnalloc(r->pool, (size_t) total + AFFINITY_JSON_PADDING);
    if (p == NULL) {
        return;
    }

    body->data = p;
    body->len = (size_t) total;

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
                "its temporary file, session fields ignored", NULL);
            body->data = NULL;
            return;
        }

        p += size;
    }

    body->len = p - body->data;
    ngx_memzero(p, AFFINITY_JSON_PADDING);
}


static void
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

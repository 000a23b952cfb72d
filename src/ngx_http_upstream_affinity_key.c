
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


/* longest key taken from a body field */
#define NGX_HTTP_UPSTREAM_AFFINITY_FIELD_MAX  1024


static ngx_str_t  ngx_http_upstream_affinity_cookie_header =
    ngx_string("Cookie");


static ngx_int_t ngx_http_upstream_affinity_header(ngx_http_request_t *r,
    ngx_str_t *name, ngx_str_t *cookie, ngx_str_t *value);
static ngx_int_t ngx_http_upstream_affinity_field(ngx_http_request_t *r,
    ngx_http_upstream_affinity_body_t *body, ngx_str_t *path,
    ngx_str_t *value);


ngx_int_t
ngx_http_upstream_affinity_session_key(ngx_http_request_t *r,
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_affinity_ctx_t *ctx,
    ngx_http_upstream_affinity_body_t *body)
{
    ngx_int_t                             rc;
    ngx_str_t                             value;
    ngx_uint_t                            i;
    ngx_http_upstream_affinity_source_t  *src;

    src = ascf->sources->elts;

    for (i = 0; i < ascf->sources->nelts; i++) {

        ngx_str_null(&value);

        switch (src[i].type) {

        case NGX_HTTP_UPSTREAM_AFFINITY_HEADER:
            rc = ngx_http_upstream_affinity_header(r, &src[i].name, NULL,
                                                   &value);
            break;

        case NGX_HTTP_UPSTREAM_AFFINITY_COOKIE:
            rc = ngx_http_upstream_affinity_header(r,
                     &ngx_http_upstream_affinity_cookie_header, &src[i].name,
                     &value);
            break;

        default: /* NGX_HTTP_UPSTREAM_AFFINITY_FIELD */
            rc = ngx_http_upstream_affinity_field(r, body, &src[i].name,
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

    /*
     * Any key routes.  Only a key without control characters is shown in
     * $affinity_session (which ends up in request and response headers
     * and in logs), and only one made of cookie octets is echoed.
     */

    if (ctx->keyed) {
        ctx->exposed = affinity_key_exposable((char *) ctx->key.data,
                                              ctx->key.len)
                       ? 1 : 0;
        ctx->echo = affinity_key_echoable((char *) ctx->key.data,
                                          ctx->key.len)
                    ? 1 : 0;
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "affinity session key: %uz bytes, source: %i, echo: %ui",
                   ctx->key.len, (ngx_int_t) ctx->source,
                   (ngx_uint_t) ctx->echo);

    return NGX_OK;
}


/*
 * The value of the first request header line called name; with cookie set,
 * the value of the first cookie so called in the lines called name (the
 * Cookie lines), split by the core's RFC 6265 parser.  The request's header
 * list is the same in every nginx version, unlike its cookie parsers.
 */

static ngx_int_t
ngx_http_upstream_affinity_header(ngx_http_request_t *r, ngx_str_t *name,
    ngx_str_t *cookie, ngx_str_t *value)
{
    size_t            len;
    ngx_uint_t        i;
    const char       *p;
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

        if (h[i].key.len != name->len
            || ngx_strncasecmp(h[i].key.data, name->data, name->len) != 0)
        {
            continue;
        }

        if (cookie == NULL) {
            *value = h[i].value;
            return NGX_OK;
        }

        if (affinity_cookie_find((char *) h[i].value.data, h[i].value.len,
                                 (char *) cookie->data, cookie->len, &p, &len))
        {
            value->data = (u_char *) p;
            value->len = len;
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
    ngx_int_t         rc;
    affinity_field_e  frc;
    u_char            out[NGX_HTTP_UPSTREAM_AFFINITY_FIELD_MAX];

    rc = ngx_http_upstream_affinity_body_load(r, body);

    if (rc != NGX_OK) {
        return rc;
    }

    frc = affinity_json_field(body->json, (char *) path->data, path->len,
                              (char *) out, sizeof(out), &len);

    if (frc == AFFINITY_FIELD_INVALID) {
        ngx_http_upstream_affinity_warn(r,
            NGX_HTTP_UPSTREAM_AFFINITY_WARN_INVALID,
            "affinity: request body is not a valid JSON object, "
            "balancing without it", NULL);
        return NGX_DECLINED;
    }

    if (frc != AFFINITY_FIELD_FOUND) {
        return NGX_DECLINED;
    }

    /* only a key that was found is kept, at its own length */

    value->data = ngx_pnalloc(r->pool, len);
    if (value->data == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(value->data, out, len);
    value->len = len;

    return NGX_OK;
}

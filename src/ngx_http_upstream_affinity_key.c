
/*
 * Session keys of ngx_http_upstream_affinity_module, in and out: looked up
 * in the configured sources in order (request headers and cookies through
 * nginx's own variables, JSON body fields), or generated; echoed to the
 * client by the response header filter; shown in $affinity_session, with
 * $affinity_route and $affinity_prefix_len.  Nothing here fails a request
 * the balancer could route: a body that cannot be read or parsed just
 * yields no key, and the error log says why once per worker.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_upstream_affinity_module.h"


/* longest key taken from a body field */
#define NGX_HTTP_UPSTREAM_AFFINITY_FIELD_MAX  1024


static ngx_int_t ngx_http_upstream_affinity_route_variable(
    ngx_http_request_t *r, ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_upstream_affinity_session_variable(
    ngx_http_request_t *r, ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_upstream_affinity_prefix_len_variable(
    ngx_http_request_t *r, ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_upstream_affinity_reason_variable(
    ngx_http_request_t *r, ngx_http_variable_value_t *v, uintptr_t data);
static ngx_http_upstream_affinity_ctx_t *ngx_http_upstream_affinity_routed(
    ngx_http_request_t *r);
static ngx_http_upstream_affinity_srv_conf_t *
    ngx_http_upstream_affinity_upstream_of(ngx_http_request_t *r);
static ngx_int_t ngx_http_upstream_affinity_header_filter(
    ngx_http_request_t *r);


static ngx_http_variable_t  ngx_http_upstream_affinity_vars[] = {

    { ngx_string("affinity_route"), NULL,
      ngx_http_upstream_affinity_route_variable, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("affinity_session"), NULL,
      ngx_http_upstream_affinity_session_variable, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("affinity_prefix_len"), NULL,
      ngx_http_upstream_affinity_prefix_len_variable, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("affinity_reason"), NULL,
      ngx_http_upstream_affinity_reason_variable, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

      ngx_http_null_variable
};


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;


ngx_int_t
ngx_http_upstream_affinity_session_key(ngx_http_request_t *r,
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_affinity_ctx_t *ctx,
    ngx_http_upstream_affinity_body_t *body)
{
    ngx_int_t                             rc;
    ngx_str_t                             value;
    ngx_uint_t                            i;
    ngx_http_variable_value_t            *vv;
    ngx_http_upstream_affinity_source_t  *src;

    src = ascf->sources->elts;

    for (i = 0; i < ascf->sources->nelts; i++) {

        ngx_str_null(&value);

        if (src[i].type == NGX_HTTP_UPSTREAM_AFFINITY_FIELD) {
            rc = ngx_http_upstream_affinity_field(r, body, &src[i].name,
                                                  &value);

        } else {
            /* $http_NAME or $cookie_NAME, as nginx parses them */

            vv = ngx_http_get_indexed_variable(r, src[i].index);

            if (vv == NULL || vv->not_found) {
                rc = NGX_DECLINED;

            } else {
                value.data = vv->data;
                value.len = vv->len;
                rc = NGX_OK;
            }
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
                               NGX_HTTP_UPSTREAM_AFFINITY_WARN_RANDOM, NULL);
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


ngx_int_t
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
        return ngx_http_upstream_affinity_decline(r, body,
                              NGX_HTTP_UPSTREAM_AFFINITY_WARN_INVALID, NULL);
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


ngx_int_t
ngx_http_upstream_affinity_add_variables(ngx_conf_t *cf)
{
    ngx_http_variable_t  *var, *v;

    for (v = ngx_http_upstream_affinity_vars; v->name.len; v++) {
        var = ngx_http_add_variable(cf, &v->name, v->flags);
        if (var == NULL) {
            return NGX_ERROR;
        }

        var->get_handler = v->get_handler;
        var->data = v->data;
    }

    return NGX_OK;
}


/* the request's context once routing gave it an outcome, else NULL */

static ngx_http_upstream_affinity_ctx_t *
ngx_http_upstream_affinity_routed(ngx_http_request_t *r)
{
    ngx_http_upstream_affinity_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_upstream_affinity_module);

    if (ctx == NULL || ctx->route == AFFINITY_ROUTE_NONE
        || ctx->route >= AFFINITY_ROUTES)
    {
        return NULL;
    }

    return ctx;
}


static ngx_int_t
ngx_http_upstream_affinity_route_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_str_t                         *route;
    ngx_http_upstream_affinity_ctx_t  *ctx;

    ctx = ngx_http_upstream_affinity_routed(r);

    if (ctx == NULL) {
        v->not_found = 1;
        return NGX_OK;
    }

    /* the same name as the status gives the outcome */

    route = &ngx_http_upstream_affinity_route_names[ctx->route];

    v->len = route->len;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;
    v->data = route->data;

    return NGX_OK;
}


/*
 * $affinity_session: the key in use.  proxy_set_header evaluates it while
 * the request to the upstream is built, before the balancer runs: the key
 * is then read (or generated) here, for the upstream the request goes to,
 * and the balancer uses the same one.  A key with control characters is
 * used for routing but never shown.
 */

static ngx_int_t
ngx_http_upstream_affinity_session_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_http_upstream_affinity_ctx_t       *ctx;
    ngx_http_upstream_affinity_srv_conf_t  *ascf;

    ctx = ngx_http_get_module_ctx(r, ngx_http_upstream_affinity_module);

    if (ctx == NULL) {
        ascf = ngx_http_upstream_affinity_upstream_of(r);

        if (ascf) {
            ctx = ngx_http_upstream_affinity_request(r, ascf);
            if (ctx == NULL) {
                return NGX_ERROR;
            }
        }
    }

    if (ctx == NULL || !ctx->keyed || !ctx->exposed) {
        v->not_found = 1;
        return NGX_OK;
    }

    v->len = ctx->key.len;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;
    v->data = ctx->key.data;

    return NGX_OK;
}


/*
 * The affinity upstream a request is being sent to, before the balancer
 * runs: the one proxy_pass names, or, when proxy_pass takes the name from a
 * variable, the upstream{} block of that name, found as nginx will find it.
 * An upstream this balancer initialized has its counter zone set (keepalive
 * or sticky may wrap the balancer, so peer.init is not necessarily its
 * own).
 */

static ngx_http_upstream_affinity_srv_conf_t *
ngx_http_upstream_affinity_upstream_of(ngx_http_request_t *r)
{
    ngx_uint_t                              i;
    ngx_http_upstream_t                    *u;
    ngx_http_upstream_resolved_t           *rs;
    ngx_http_upstream_srv_conf_t           *uscf, **uscfp;
    ngx_http_upstream_main_conf_t          *umcf;
    ngx_http_upstream_affinity_srv_conf_t  *ascf;

    u = r->upstream;

    if (u == NULL || u->conf == NULL) {
        return NULL;
    }

    uscf = u->conf->upstream;
    rs = u->resolved;

    if (uscf == NULL && rs && rs->host.len) {
        umcf = ngx_http_get_module_main_conf(r, ngx_http_upstream_module);
        uscfp = umcf->upstreams.elts;

        for (i = 0; i < umcf->upstreams.nelts; i++) {
            if (uscfp[i]->host.len == rs->host.len
                && ((uscfp[i]->port == 0 && rs->no_port)
                    || uscfp[i]->port == rs->port)
                && ngx_strncasecmp(uscfp[i]->host.data, rs->host.data,
                                   rs->host.len)
                   == 0)
            {
                uscf = uscfp[i];
                break;
            }
        }
    }

    if (uscf == NULL || uscf->srv_conf == NULL) {
        return NULL;
    }

    ascf = ngx_http_conf_upstream_srv_conf(uscf,
                                           ngx_http_upstream_affinity_module);

    return ascf->counter_zone ? ascf : NULL;
}


static ngx_int_t
ngx_http_upstream_affinity_prefix_len_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    u_char                            *p;
    ngx_http_upstream_affinity_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_upstream_affinity_module);

    if (ctx == NULL || ctx->route == AFFINITY_ROUTE_NONE) {
        v->not_found = 1;
        return NGX_OK;
    }

    p = ngx_pnalloc(r->pool, NGX_INT_T_LEN);
    if (p == NULL) {
        return NGX_ERROR;
    }

    v->len = ngx_sprintf(p, "%ui", ctx->prefix_len) - p;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;
    v->data = p;

    return NGX_OK;
}


/* why the outcome, in a few words, by affinity_route_e */
static ngx_str_t  ngx_http_upstream_affinity_reasons[AFFINITY_ROUTES] = {
    ngx_null_string,
    ngx_string("pinned here"),
    ngx_string("new session"),
    ngx_string("pinned peer gone"),
    ngx_string("pinned peer busy"),
    ngx_string("round robin"),
    ngx_string("held"),
    ngx_string("held nowhere"),
    ngx_string("stores the response"),
    ngx_string("response's peer gone")
};


/*
 * $affinity_reason: why the peer was chosen, for access logs and a debug
 * header: the outcome's reason, the characters of the prompt it held, its
 * requests in flight and its estimated time to first token, and the least
 * loaded other peer with its estimate.  For example
 * "held 4096 chars, 2 in flight, ~85 ms; 10.0.0.2:8000 ~140 ms".
 */

static ngx_int_t
ngx_http_upstream_affinity_reason_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    u_char                            *p, *last;
    size_t                             len;
    ngx_str_t                         *reason;
    ngx_http_upstream_affinity_ctx_t  *ctx;

    ctx = ngx_http_upstream_affinity_routed(r);

    if (ctx == NULL) {
        v->not_found = 1;
        return NGX_OK;
    }

    reason = &ngx_http_upstream_affinity_reasons[ctx->route];

    len = reason->len + sizeof(" 4294967295 chars, 4294967295 in flight, ~")
          - 1 + 2 * (NGX_INT64_LEN + sizeof(" ms; ") - 1)
          + ctx->alternative_len;

    p = ngx_pnalloc(r->pool, len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    v->data = p;
    last = p + len;

    p = ngx_cpymem(p, reason->data, reason->len);

    if (ctx->route == AFFINITY_ROUTE_PREFIX_HIT) {
        p = ngx_slprintf(p, last, " %uD chars", ctx->held_chars);
    }

    if (ctx->timed) {
        p = ngx_slprintf(p, last, ", %uD in flight", ctx->queued);

        if (ctx->estimate_us >= 0) {
            p = ngx_slprintf(p, last, ", ~%L ms",
                             (ctx->estimate_us + 500) / 1000);
        }

        if (ctx->alternative_len) {
            p = ngx_slprintf(p, last, "; %*s", ctx->alternative_len,
                             ctx->alternative);

            if (ctx->alternative_us >= 0) {
                p = ngx_slprintf(p, last, " ~%L ms",
                                 (ctx->alternative_us + 500) / 1000);
            }
        }
    }

    v->len = p - v->data;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;

    return NGX_OK;
}


/*
 * Echoes the session key to the client: in the configured header (so a
 * client that did not send one learns its generated id) and, with cookie=,
 * in Set-Cookie.  A key that came from the cookie is never copied into the
 * header: an HttpOnly cookie (often an authentication token) must stay out
 * of reach of page scripts; it is only refreshed in Set-Cookie when the
 * cookie has a Max-Age.  Keys that are not safe as a cookie value are never
 * echoed.
 */

static ngx_int_t
ngx_http_upstream_affinity_header_filter(ngx_http_request_t *r)
{
    u_char                                 *p;
    ngx_uint_t                              i;
    ngx_list_part_t                        *part;
    ngx_table_elt_t                        *h;
    ngx_http_upstream_affinity_ctx_t       *ctx;
    ngx_http_upstream_affinity_srv_conf_t  *ascf;

    if (r != r->main) {
        return ngx_http_next_header_filter(r);
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_upstream_affinity_module);

    if (ctx == NULL || !ctx->echo) {
        return ngx_http_next_header_filter(r);
    }

    ascf = ctx->conf;

    if (ctx->source == NGX_HTTP_UPSTREAM_AFFINITY_COOKIE) {
        goto cookie;
    }

    /* do not repeat a header the backend already set */

    part = &r->headers_out.headers.part;
    h = part->elts;

    for (i = 0; /* void */ ; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].hash
            && h[i].key.len == ascf->echo_header.len
            && ngx_strncasecmp(h[i].key.data, ascf->echo_header.data,
                               ascf->echo_header.len) == 0)
        {
            goto cookie;
        }
    }

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    h->key = ascf->echo_header;
    h->value = ctx->key;
#if (nginx_version >= 1023000)
    h->next = NULL;
#endif

cookie:

    /*
     * Set the cookie when the client cannot have it yet: the key was
     * generated, or came from another source.  A key that came from the
     * cookie is sent back only to slide its Max-Age.
     */

    if (ascf->echo_cookie.len == 0
        || (ctx->source == NGX_HTTP_UPSTREAM_AFFINITY_COOKIE
            && ascf->cookie_max_age == NGX_CONF_UNSET))
    {
        return ngx_http_next_header_filter(r);
    }

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->value.len = ascf->echo_cookie.len + 1 + ctx->key.len
                   + ascf->cookie_attributes.len;

    h->value.data = ngx_pnalloc(r->pool, h->value.len);
    if (h->value.data == NULL) {
        return NGX_ERROR;
    }

    p = ngx_copy(h->value.data, ascf->echo_cookie.data, ascf->echo_cookie.len);
    *p++ = '=';
    p = ngx_copy(p, ctx->key.data, ctx->key.len);
    ngx_memcpy(p, ascf->cookie_attributes.data, ascf->cookie_attributes.len);

    h->hash = 1;
    ngx_str_set(&h->key, "Set-Cookie");
#if (nginx_version >= 1023000)
    h->next = NULL;
#endif

    return ngx_http_next_header_filter(r);
}


ngx_int_t
ngx_http_upstream_affinity_init_filter(ngx_conf_t *cf)
{
    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_upstream_affinity_header_filter;

    return NGX_OK;
}


/*
 * Responses API continuations of ngx_http_upstream_affinity_module.  An
 * inference server keeps a stored response (and a conversation) in the
 * memory of the replica that produced it, and the follow-up that names it
 * carries nothing else that says where it is.  So the module learns the id
 * of every response an upstream produces, from the response body as it
 * passes to the client, and sends the requests that name one -- by path or
 * in their body -- to the peer that produced it.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_upstream_affinity_module.h"


/*
 * A resource path: ".../NAME/{id}" followed by one of the tails (a tail
 * ending in "*" takes one more path segment), with the methods that act on
 * the stored object there.
 */
typedef struct {
    ngx_str_t                               tail;
    ngx_uint_t                              methods;
} ngx_http_upstream_affinity_tail_t;

typedef struct {
    ngx_str_t                               name;
    ngx_http_upstream_affinity_tail_t      *tails;
} ngx_http_upstream_affinity_resource_t;


static ngx_int_t ngx_http_upstream_affinity_path_id(ngx_http_request_t *r,
    ngx_str_t *id);
static ngx_int_t ngx_http_upstream_affinity_body_id(ngx_http_request_t *r,
    ngx_http_upstream_affinity_body_t *body, ngx_str_t *id);
static ngx_int_t ngx_http_upstream_affinity_response_header_filter(
    ngx_http_request_t *r);
static ngx_int_t ngx_http_upstream_affinity_response_body_filter(
    ngx_http_request_t *r, ngx_chain_t *in);
static void ngx_http_upstream_affinity_learn(ngx_http_request_t *r,
    ngx_http_upstream_affinity_ctx_t *ctx);
static void ngx_http_upstream_affinity_unlearned(ngx_http_request_t *r,
    affinity_scan_reason_e reason);


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;


/*
 * GET and DELETE /v1/responses/{id}, POST .../{id}/cancel, GET
 * .../{id}/input_items; GET, POST (its metadata) and DELETE
 * /v1/conversations/{id}, GET and POST its items, GET and DELETE one item.
 * Matched at any depth, so that a location prefix in front of "/v1" does
 * not matter.  Only these methods: POST /v1/responses/compact or
 * /v1/responses/input_tokens name no stored response (their body may).
 */

#define NGX_HTTP_UPSTREAM_AFFINITY_READ  (NGX_HTTP_GET|NGX_HTTP_HEAD)

static ngx_http_upstream_affinity_tail_t
    ngx_http_upstream_affinity_response_tails[] = {
    { ngx_string(""), NGX_HTTP_UPSTREAM_AFFINITY_READ|NGX_HTTP_DELETE },
    { ngx_string("/cancel"), NGX_HTTP_POST },
    { ngx_string("/input_items"), NGX_HTTP_UPSTREAM_AFFINITY_READ },
    { ngx_null_string, 0 }
};

static ngx_http_upstream_affinity_tail_t
    ngx_http_upstream_affinity_conversation_tails[] = {
    { ngx_string(""),
      NGX_HTTP_UPSTREAM_AFFINITY_READ|NGX_HTTP_POST|NGX_HTTP_DELETE },
    { ngx_string("/items"), NGX_HTTP_UPSTREAM_AFFINITY_READ|NGX_HTTP_POST },
    { ngx_string("/items/*"),
      NGX_HTTP_UPSTREAM_AFFINITY_READ|NGX_HTTP_DELETE },
    { ngx_null_string, 0 }
};

/* the requests whose body may name what they continue */

static ngx_str_t  ngx_http_upstream_affinity_body_paths[] = {
    ngx_string("/responses"),
    ngx_string("/responses/compact"),
    ngx_string("/responses/input_tokens"),
    ngx_null_string
};

static ngx_http_upstream_affinity_resource_t
    ngx_http_upstream_affinity_resources[] = {
    { ngx_string("/responses/"), ngx_http_upstream_affinity_response_tails },
    { ngx_string("/conversations/"),
      ngx_http_upstream_affinity_conversation_tails },
    { ngx_null_string, NULL }
};


/*
 * Whether a request continues a stored response or conversation, and where
 * it is: its owner, looked up once per request (a retry keeps it).  An id
 * that cannot have been learned (too long) is still a continuation: it is
 * routed as one whose owner is unknown.
 */

ngx_int_t
ngx_http_upstream_affinity_continued(ngx_http_request_t *r,
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_affinity_ctx_t *ctx,
    ngx_http_upstream_affinity_body_t *body)
{
    uint64_t                             hash;
    ngx_int_t                            rc;
    ngx_str_t                            id;
    ngx_http_upstream_affinity_shctx_t  *shctx;

    rc = ngx_http_upstream_affinity_path_id(r, &id);

    if (rc == NGX_DECLINED) {
        rc = ngx_http_upstream_affinity_body_id(r, body, &id);
    }

    if (rc != NGX_OK) {
        return rc == NGX_ERROR ? NGX_ERROR : NGX_OK;
    }

    ctx->continues = 1;

    if (id.len > AFFINITY_RESPONSE_ID_MAX) {
        ngx_http_upstream_affinity_warn(r,
                         NGX_HTTP_UPSTREAM_AFFINITY_WARN_CONTINUED_ID, NULL);
        return NGX_OK;
    }

    shctx = ascf->response_zone->data;

    hash = ngx_http_upstream_affinity_key_hash(ascf, shctx->zone,
                                               AFFINITY_STORE_RESPONSE,
                                               id.data, id.len);

    ngx_shmtx_lock(&shctx->shpool->mutex);
    ctx->owner = affinity_responses_owner(shctx->zone, hash,
                                          (uint32_t) ngx_time(),
                                          (uint32_t) ascf->response_timeout);
    ngx_shmtx_unlock(&shctx->shpool->mutex);

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "affinity continues \"%V\", owner: %s%uL", &id,
                   ctx->owner ? "" : "unknown ", ctx->owner);

    return NGX_OK;
}


static ngx_int_t
ngx_http_upstream_affinity_path_id(ngx_http_request_t *r, ngx_str_t *id)
{
    u_char                                 *p, *start, *end, *last;
    size_t                                  rest;
    ngx_str_t                              *tail;
    ngx_http_upstream_affinity_tail_t      *t;
    ngx_http_upstream_affinity_resource_t  *res;

    last = r->uri.data + r->uri.len;

    for (res = ngx_http_upstream_affinity_resources; res->name.len; res++) {

        p = r->uri.data;

        for ( ;; ) {
            p = ngx_strlcasestrn(p, last, res->name.data, res->name.len - 1);

            if (p == NULL) {
                break;
            }

            start = p + res->name.len;
            p++;

            for (end = start; end < last && *end != '/'; end++) {
                /* void */
            }

            if (end == start) {
                continue;
            }

            rest = last - end;

            for (t = res->tails; t->tail.data; t++) {

                if (!(r->method & t->methods)) {
                    continue;
                }

                tail = &t->tail;

                if (tail->len && tail->data[tail->len - 1] == '*') {
                    /* a sub-resource with an id of its own */

                    if (rest > tail->len - 1
                        && ngx_strncmp(end, tail->data, tail->len - 1) == 0
                        && ngx_strlchr(end + tail->len - 1, last, '/')
                           == NULL)
                    {
                        goto found;
                    }

                } else if (rest == tail->len
                           && ngx_strncmp(end, tail->data, rest) == 0)
                {
                    goto found;
                }
            }
        }
    }

    return NGX_DECLINED;

found:

    id->data = start;
    id->len = end - start;

    return NGX_OK;
}


/*
 * "previous_response_id", else "conversation" (an id, or an object with
 * one), of a request body that has one: a POST with content.
 */

static ngx_int_t
ngx_http_upstream_affinity_body_id(ngx_http_request_t *r,
    ngx_http_upstream_affinity_body_t *body, ngx_str_t *id)
{
    ngx_int_t   rc;
    ngx_str_t  *field;

    static ngx_str_t  fields[] = {
        ngx_string("previous_response_id"),
        ngx_string("conversation"),
        ngx_string("conversation.id"),
        ngx_null_string
    };

    if (r->method != NGX_HTTP_POST
        || (r->headers_in.content_length_n <= 0 && !r->headers_in.chunked))
    {
        return NGX_DECLINED;
    }

    for (field = ngx_http_upstream_affinity_body_paths; field->len; field++) {
        if (r->uri.len >= field->len
            && ngx_strncasecmp(r->uri.data + r->uri.len - field->len,
                               field->data, field->len)
               == 0)
        {
            break;
        }
    }

    if (field->len == 0) {
        return NGX_DECLINED;
    }

    for (field = fields; field->len; field++) {
        rc = ngx_http_upstream_affinity_field(r, body, field, id);

        if (rc == NGX_OK && id->len) {
            return NGX_OK;
        }

        if (rc == NGX_ERROR) {
            return NGX_ERROR;
        }

        if (!body->loaded) {
            break;
        }
    }

    return NGX_DECLINED;
}


/*
 * The format of a reply body the module may read: a 2xx JSON or event
 * stream, of the request the module routed (not a subrequest's), as the
 * upstream sent it.  0 for any other; *encoding is the upstream's
 * Content-Encoding when that is what kept it from being read, else NULL.
 */

affinity_response_format_e
ngx_http_upstream_affinity_reply_format(ngx_http_request_t *r,
    ngx_str_t **encoding)
{
    ngx_str_t                   *type, *value;
    affinity_response_format_e   format;

    *encoding = NULL;

    if (r != r->main || r->upstream == NULL || r->header_only
        || r->headers_out.status < NGX_HTTP_OK
        || r->headers_out.status >= NGX_HTTP_SPECIAL_RESPONSE)
    {
        return 0;
    }

    type = &r->headers_out.content_type;

    if (type->len >= sizeof("text/event-stream") - 1
        && ngx_strncasecmp(type->data, (u_char *) "text/event-stream",
                           sizeof("text/event-stream") - 1)
           == 0)
    {
        format = AFFINITY_RESPONSE_EVENTS;

    } else if (type->len
               && ngx_strlcasestrn(type->data, type->data + type->len,
                                   (u_char *) "json", 4 - 1)
                  != NULL)
    {
        format = AFFINITY_RESPONSE_JSON;

    } else {
        return 0;
    }

    if (r->headers_out.content_encoding
        && r->headers_out.content_encoding->hash)
    {
        value = &r->headers_out.content_encoding->value;

        if (value->len
            && !(value->len == 8
                 && ngx_strncasecmp(value->data, (u_char *) "identity", 8)
                    == 0))
        {
            *encoding = value;
            return 0;
        }
    }

    return format;
}


/*
 * The response of an upstream with response_affinity is read for its id
 * when it may hold one (ngx_http_upstream_affinity_reply_format()).  The
 * scan lives in the request's pool.
 */

static ngx_int_t
ngx_http_upstream_affinity_response_header_filter(ngx_http_request_t *r)
{
    ngx_str_t                          *encoding;
    affinity_response_format_e          format;
    ngx_http_upstream_affinity_ctx_t   *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_upstream_affinity_module);

    if (ctx == NULL || ctx->conf->response_zone == NULL) {
        return ngx_http_next_header_filter(r);
    }

    format = ngx_http_upstream_affinity_reply_format(r, &encoding);

    if (format == 0) {
        if (encoding) {
            ngx_http_upstream_affinity_warn(r,
                    NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_ENCODED, encoding);
        }

        return ngx_http_next_header_filter(r);
    }

    ctx->scan = ngx_palloc(r->pool, sizeof(affinity_response_scan_t));

    if (ctx->scan == NULL) {
        ngx_http_upstream_affinity_warn(r,
                      NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_MEMORY, NULL);
        return ngx_http_next_header_filter(r);
    }

    affinity_response_scan_start(ctx->scan, format);

    return ngx_http_next_header_filter(r);
}


/*
 * Reads the buffers as they pass, and passes them on unchanged, at once:
 * nothing is held back, so a stream goes out as fast as without the
 * module.  The scan stops as soon as the id is known, or known to be
 * missing.
 */

static ngx_int_t
ngx_http_upstream_affinity_response_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in)
{
    ngx_buf_t                         *b;
    ngx_chain_t                       *cl;
    affinity_scan_e                    rc;
    ngx_http_upstream_affinity_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_upstream_affinity_module);

    if (ctx == NULL || ctx->scan == NULL || in == NULL) {
        return ngx_http_next_body_filter(r, in);
    }

    rc = AFFINITY_SCAN_MORE;

    for (cl = in; cl && rc == AFFINITY_SCAN_MORE; cl = cl->next) {
        b = cl->buf;

        if (ngx_buf_in_memory(b)) {
            if (b->last > b->pos) {
                rc = affinity_response_scan(ctx->scan, (char *) b->pos,
                                            b->last - b->pos);
            }

        } else if (ngx_buf_size(b)) {
            /* proxy buffering wrote it to a temporary file */

            ngx_http_upstream_affinity_warn(r,
                        NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_FILE, NULL);
            ctx->scan = NULL;
            return ngx_http_next_body_filter(r, in);
        }

        if (rc == AFFINITY_SCAN_MORE && b->last_buf) {
            rc = affinity_response_scan_end(ctx->scan);
        }
    }

    if (rc == AFFINITY_SCAN_FOUND) {
        ngx_http_upstream_affinity_learn(r, ctx);

    } else if (rc == AFFINITY_SCAN_NONE) {
        ngx_http_upstream_affinity_unlearned(r,
                                affinity_response_scan_reason(ctx->scan));
    }

    if (rc != AFFINITY_SCAN_MORE) {
        ctx->scan = NULL;
    }

    return ngx_http_next_body_filter(r, in);
}


/* the id is remembered for the peer that served the response */

static void
ngx_http_upstream_affinity_learn(ngx_http_request_t *r,
    ngx_http_upstream_affinity_ctx_t *ctx)
{
    int                                     rc;
    size_t                                  len;
    uint8_t                                 digest[AFFINITY_STORE_DIGEST];
    uint64_t                                hash, peer;
    ngx_str_t                              *name;
    const char                             *id;
    affinity_object_e                       object;
    affinity_store_message_t                m;
    ngx_http_upstream_affinity_shctx_t     *shctx;
    ngx_http_upstream_affinity_srv_conf_t  *ascf;

    name = r->upstream->peer.name;

    if (name == NULL || name->len == 0) {
        return;
    }

    id = affinity_response_scan_id(ctx->scan, &len, &object);

    if (id == NULL) {
        return;
    }

    ascf = ctx->conf;
    shctx = ascf->response_zone->data;
    peer = affinity_peer_id((char *) name->data, name->len);
    hash = ngx_http_upstream_affinity_key_hash(ascf, shctx->zone,
                                               AFFINITY_STORE_RESPONSE,
                                               (u_char *) id, len);

    /* the first server to produce an id keeps it while it lives */

    ngx_shmtx_lock(&shctx->shpool->mutex);
    rc = affinity_responses_learn(shctx->zone, hash, peer,
                                  ngx_http_upstream_affinity_wall_msec(),
                                  (uint32_t) ngx_time(),
                                  (uint32_t) ascf->response_timeout);
    ngx_shmtx_unlock(&shctx->shpool->mutex);

    if (rc == AFFINITY_LEARNED_TAKEN) {
        ngx_http_upstream_affinity_warn(r,
                       NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_TAKEN, name);
        return;
    }

    if (ascf->store) {
        ngx_memzero(&m, sizeof(affinity_store_message_t));
        ngx_http_upstream_affinity_store_digest(ascf, AFFINITY_STORE_RESPONSE,
                                                (u_char *) id, len, digest);
        m.kind = AFFINITY_STORE_RESPONSE;
        m.peer = peer;
        m.digest = digest;
        ngx_http_upstream_affinity_store_publish(ascf, &m);
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "affinity learned %s \"%*s\"",
                   object == AFFINITY_OBJECT_CONVERSATION
                   ? "conversation" : "response", len, id);
    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "affinity learned it from %V", name);
}


/*
 * Bodies without an id are common (chat completions, lists, errors) and
 * say nothing; an id that could not be read, or a body that broke off, is
 * logged once per worker.
 */

static void
ngx_http_upstream_affinity_unlearned(ngx_http_request_t *r,
    affinity_scan_reason_e reason)
{
    switch (reason) {

    case AFFINITY_SCAN_MALFORMED:
        ngx_http_upstream_affinity_warn(r,
                   NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_MALFORMED, NULL);
        break;

    case AFFINITY_SCAN_TRUNCATED:
        ngx_http_upstream_affinity_warn(r,
                   NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_TRUNCATED, NULL);
        break;

    case AFFINITY_SCAN_ID_TOO_LONG:
    case AFFINITY_SCAN_ID_ESCAPED:
        ngx_http_upstream_affinity_warn(r,
                          NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_ID, NULL);
        break;

    case AFFINITY_SCAN_NO_EVENT:
        ngx_http_upstream_affinity_warn(r,
                    NGX_HTTP_UPSTREAM_AFFINITY_WARN_RESPONSE_NO_EVENT, NULL);
        break;

    default:
        ngx_log_debug0(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "affinity: response without an id to learn");
        break;
    }
}


ngx_int_t
ngx_http_upstream_affinity_init_response_filter(ngx_conf_t *cf)
{
    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter =
                             ngx_http_upstream_affinity_response_header_filter;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_upstream_affinity_response_body_filter;

    return NGX_OK;
}

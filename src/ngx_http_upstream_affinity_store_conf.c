
/*
 * The affinity_store directive: where the store is, how to reach it
 * (a password or ACL user, TLS with the certificate verified), and the
 * secret the instances share, each read from a file so that no secret
 * is written in nginx.conf.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_upstream_affinity_module.h"


#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_PORT     6379
#define NGX_HTTP_UPSTREAM_AFFINITY_STORE_TIMEOUT  2000  /* ms */

/* the shortest secret= accepted, and the longest file read for one */
#define NGX_HTTP_UPSTREAM_AFFINITY_SECRET_MIN     16
#define NGX_HTTP_UPSTREAM_AFFINITY_SECRET_FILE    4096


static ngx_int_t ngx_http_upstream_affinity_store_address(ngx_conf_t *cf,
    ngx_http_upstream_affinity_store_conf_t *scf, ngx_str_t *value,
    ngx_str_t *host);
static ngx_int_t ngx_http_upstream_affinity_store_file(ngx_conf_t *cf,
    ngx_str_t *param, ngx_str_t *name, ngx_str_t *text);
static ngx_int_t ngx_http_upstream_affinity_store_auth(ngx_conf_t *cf,
    ngx_http_upstream_affinity_store_conf_t *scf, ngx_str_t *param,
    ngx_str_t *name);
static ngx_int_t ngx_http_upstream_affinity_store_secret(ngx_conf_t *cf,
    ngx_http_upstream_affinity_store_conf_t *scf, ngx_str_t *param,
    ngx_str_t *name);
static void ngx_http_upstream_affinity_store_free_keys(void *data);
#if (NGX_SSL)
static ngx_int_t ngx_http_upstream_affinity_store_tls(ngx_conf_t *cf,
    ngx_http_upstream_affinity_store_conf_t *scf, ngx_str_t *ca,
    ngx_str_t *cert, ngx_str_t *key);
#endif


/*
 * affinity_store ADDRESS[:PORT] | unix:PATH [stream=KEY] [maxlen=NUMBER]
 *     [backlog=NUMBER] [timeout=TIME] [auth=FILE] [secret=FILE] [tls]
 *     [tls_name=NAME] [tls_ca=FILE] [tls_cert=FILE tls_key=FILE]
 */

char *
ngx_http_upstream_affinity_store_conf(ngx_conf_t *cf,
    ngx_http_upstream_affinity_srv_conf_t *ascf)
{
    u_char                                   *p;
    ngx_int_t                                 n;
    ngx_str_t                                *value, s, t, host, name;
    ngx_str_t                                 ca, cert, key, auth, secret;
    ngx_str_t                                *auth_param, *secret_param;
    ngx_uint_t                                i, tls;
    ngx_msec_t                                ms;
    ngx_pool_cleanup_t                       *cln;
    ngx_http_upstream_srv_conf_t             *uscf;
    ngx_http_upstream_affinity_store_conf_t  *scf;
#if (NGX_SSL && NGX_HAVE_INET6)
    u_char                                    inet6[16];
#endif

    scf = ngx_pcalloc(cf->pool,
                      sizeof(ngx_http_upstream_affinity_store_conf_t));
    if (scf == NULL) {
        return NGX_CONF_ERROR;
    }

    value = cf->args->elts;

    if (ngx_http_upstream_affinity_store_address(cf, scf, &value[1], &host)
        != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    scf->maxlen = 100000;
    scf->backlog = 4096;
    scf->timeout = NGX_HTTP_UPSTREAM_AFFINITY_STORE_TIMEOUT;

    ngx_str_null(&s);
    ngx_str_null(&name);
    ngx_str_null(&ca);
    ngx_str_null(&cert);
    ngx_str_null(&key);
    ngx_str_null(&auth);
    ngx_str_null(&secret);
    auth_param = NULL;
    secret_param = NULL;
    tls = 0;

    for (i = 2; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "stream=", 7) == 0) {
            s.data = value[i].data + 7;
            s.len = value[i].len - 7;

            if (s.len == 0 || s.len > 512) {
                goto invalid;
            }

            continue;
        }

        if (ngx_strncmp(value[i].data, "maxlen=", 7) == 0) {
            n = ngx_atoi(value[i].data + 7, value[i].len - 7);

            if (n < 1000) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid \"%V\", it must be a number of "
                                   "1000 or more", &value[i]);
                return NGX_CONF_ERROR;
            }

            scf->maxlen = n;
            continue;
        }

        if (ngx_strncmp(value[i].data, "backlog=", 8) == 0) {
            n = ngx_atoi(value[i].data + 8, value[i].len - 8);

            if (n < 1 || n > 1000000) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid \"%V\", it must be a number "
                                   "from 1 to 1000000", &value[i]);
                return NGX_CONF_ERROR;
            }

            scf->backlog = n;
            continue;
        }

        if (ngx_strncmp(value[i].data, "timeout=", 8) == 0) {
            t.data = value[i].data + 8;
            t.len = value[i].len - 8;
            ms = ngx_parse_time(&t, 0);

            if (ms == (ngx_msec_t) NGX_ERROR || ms < 100 || ms > 60000) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid \"%V\", it must be a time "
                                   "from 100ms to 60s", &value[i]);
                return NGX_CONF_ERROR;
            }

            scf->timeout = ms;
            continue;
        }

        if (ngx_strncmp(value[i].data, "auth=", 5) == 0) {
            auth.data = value[i].data + 5;
            auth.len = value[i].len - 5;
            auth_param = &value[i];
            continue;
        }

        if (ngx_strncmp(value[i].data, "secret=", 7) == 0) {
            secret.data = value[i].data + 7;
            secret.len = value[i].len - 7;
            secret_param = &value[i];
            continue;
        }

        if (ngx_strcmp(value[i].data, "tls") == 0) {
            tls = 1;
            continue;
        }

        if (ngx_strncmp(value[i].data, "tls_name=", 9) == 0) {
            name.data = value[i].data + 9;
            name.len = value[i].len - 9;
            continue;
        }

        if (ngx_strncmp(value[i].data, "tls_ca=", 7) == 0) {
            ca.data = value[i].data + 7;
            ca.len = value[i].len - 7;
            continue;
        }

        if (ngx_strncmp(value[i].data, "tls_cert=", 9) == 0) {
            cert.data = value[i].data + 9;
            cert.len = value[i].len - 9;
            continue;
        }

        if (ngx_strncmp(value[i].data, "tls_key=", 8) == 0) {
            key.data = value[i].data + 8;
            key.len = value[i].len - 8;
            continue;
        }

        goto invalid;
    }

    scf->connect_timeout = scf->timeout;

    /* the stream, by default named after the upstream */

    if (s.data == NULL) {
        uscf = ngx_http_conf_get_module_srv_conf(cf,
                                                 ngx_http_upstream_module);

        s.len = sizeof("nginx:affinity:") - 1 + uscf->host.len;
        s.data = ngx_pnalloc(cf->pool, s.len + 1);
        if (s.data == NULL) {
            return NGX_CONF_ERROR;
        }

        p = ngx_sprintf(s.data, "nginx:affinity:%V", &uscf->host);
        *p = '\0';

    } else {
        p = ngx_pnalloc(cf->pool, s.len + 1);
        if (p == NULL) {
            return NGX_CONF_ERROR;
        }

        (void) ngx_cpystrn(p, s.data, s.len + 1);
        s.data = p;
    }

    scf->stream = s;

    if (auth.data
        && ngx_http_upstream_affinity_store_auth(cf, scf, auth_param, &auth)
           != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    if (ngx_http_upstream_affinity_store_secret(cf, scf, secret_param,
                                                &secret)
        != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    cln = ngx_pool_cleanup_add(cf->pool, 0);
    if (cln == NULL) {
        return NGX_CONF_ERROR;
    }

    cln->handler = ngx_http_upstream_affinity_store_free_keys;
    cln->data = scf;

    if (!tls) {
        if (name.data || ca.data || cert.data || key.data) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"tls_name\", \"tls_ca\", \"tls_cert\" and "
                               "\"tls_key\" of \"affinity_store\" need "
                               "\"tls\"");
            return NGX_CONF_ERROR;
        }

        ascf->store_conf = scf;
        return NGX_CONF_OK;
    }

#if (NGX_SSL)

    if ((cert.data == NULL) != (key.data == NULL)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"tls_cert\" and \"tls_key\" of "
                           "\"affinity_store\" go together");
        return NGX_CONF_ERROR;
    }

    /* the name the certificate must carry: tls_name, else the host */

    if (name.data == NULL) {
        name = host;
    }

    if (name.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"affinity_store\" with \"tls\" on a unix socket "
                           "needs \"tls_name\"");
        return NGX_CONF_ERROR;
    }

    /* an IPv6 address as given, [::1], is checked without its brackets */

    if (name.len > 2 && name.data[0] == '[' && name.data[name.len - 1] == ']')
    {
        name.data++;
        name.len -= 2;
    }

    if (name.len > 255) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"tls_name\" of \"affinity_store\" is too long");
        return NGX_CONF_ERROR;
    }

    /* a host name is sent (SNI), an address is not (RFC 6066) */

    scf->tls_ip = ngx_inet_addr(name.data, name.len) != INADDR_NONE;
#if (NGX_HAVE_INET6)
    scf->tls_ip |= ngx_inet6_addr(name.data, name.len, inet6) == NGX_OK;
#endif

    scf->tls_name.data = ngx_pnalloc(cf->pool, name.len + 1);
    if (scf->tls_name.data == NULL) {
        return NGX_CONF_ERROR;
    }

    (void) ngx_cpystrn(scf->tls_name.data, name.data, name.len + 1);
    scf->tls_name.len = name.len;

    if (ngx_http_upstream_affinity_store_tls(cf, scf, &ca, &cert, &key)
        != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    ascf->store_conf = scf;
    return NGX_CONF_OK;

#else

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "\"affinity_store\" with \"tls\" needs nginx built "
                       "with OpenSSL");
    return NGX_CONF_ERROR;

#endif

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid parameter \"%V\"", &value[i]);
    return NGX_CONF_ERROR;
}


/*
 * The address, as nginx parses a server's: a name is resolved now, at
 * start and reload, never by a worker; its first address is used.
 */

static ngx_int_t
ngx_http_upstream_affinity_store_address(ngx_conf_t *cf,
    ngx_http_upstream_affinity_store_conf_t *scf, ngx_str_t *value,
    ngx_str_t *host)
{
    ngx_url_t  u;

    ngx_memzero(&u, sizeof(ngx_url_t));

    u.url = *value;
    u.default_port = NGX_HTTP_UPSTREAM_AFFINITY_STORE_PORT;
    u.no_resolve = 0;

    if (ngx_parse_url(cf->pool, &u) != NGX_OK) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "%s in \"affinity_store\" address \"%V\"",
                           u.err ? u.err : "invalid address", value);
        return NGX_ERROR;
    }

    if (u.naddrs == 0 || u.uri.len) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid \"affinity_store\" address \"%V\"",
                           value);
        return NGX_ERROR;
    }

    scf->addr = u.addrs[0];

    /* a unix socket has no host name to check a certificate against */

    *host = u.family == AF_UNIX ? (ngx_str_t) ngx_null_string : u.host;

    return NGX_OK;
}


/*
 * A file of a secret, read whole at configuration: at most
 * ..._SECRET_FILE bytes, its trailing line breaks and spaces dropped.  A
 * file that every user may read is said to be so.
 */

static ngx_int_t
ngx_http_upstream_affinity_store_file(ngx_conf_t *cf, ngx_str_t *param,
    ngx_str_t *name, ngx_str_t *text)
{
    u_char           *buf;
    ssize_t           n;
    ngx_fd_t          fd;
    ngx_str_t         path;
    ngx_file_info_t   fi;

    path = *name;

    if (path.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\"", param);
        return NGX_ERROR;
    }

    if (ngx_conf_full_name(cf->cycle, &path, 1) != NGX_OK) {
        return NGX_ERROR;
    }

    fd = ngx_open_file(path.data, NGX_FILE_RDONLY, NGX_FILE_OPEN, 0);

    if (fd == NGX_INVALID_FILE) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           ngx_open_file_n " \"%s\" failed", path.data);
        return NGX_ERROR;
    }

    if (ngx_fd_info(fd, &fi) == NGX_FILE_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           ngx_fd_info_n " \"%s\" failed", path.data);
        (void) ngx_close_file(fd);
        return NGX_ERROR;
    }

    if (fi.st_mode & S_IROTH) {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "\"%s\" of \"affinity_store\" is readable by "
                           "every user", path.data);
    }

    buf = ngx_pnalloc(cf->pool, NGX_HTTP_UPSTREAM_AFFINITY_SECRET_FILE + 1);
    if (buf == NULL) {
        (void) ngx_close_file(fd);
        return NGX_ERROR;
    }

    n = ngx_read_fd(fd, buf, NGX_HTTP_UPSTREAM_AFFINITY_SECRET_FILE + 1);

    (void) ngx_close_file(fd);

    if (n == -1) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           ngx_read_fd_n " \"%s\" failed", path.data);
        return NGX_ERROR;
    }

    if (n > NGX_HTTP_UPSTREAM_AFFINITY_SECRET_FILE) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%s\" of \"affinity_store\" is longer than "
                           "%d bytes", path.data,
                           NGX_HTTP_UPSTREAM_AFFINITY_SECRET_FILE);
        return NGX_ERROR;
    }

    while (n > 0 && (buf[n - 1] == LF || buf[n - 1] == CR
                     || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
    {
        n--;
    }

    buf[n] = '\0';
    text->data = buf;
    text->len = n;

    return NGX_OK;
}


/*
 * auth=FILE: its first line is PASSWORD (Redis AUTH) or USERNAME PASSWORD
 * (an ACL user); a password with spaces needs the second form ("default"
 * is Redis' own user).
 */

static ngx_int_t
ngx_http_upstream_affinity_store_auth(ngx_conf_t *cf,
    ngx_http_upstream_affinity_store_conf_t *scf, ngx_str_t *param,
    ngx_str_t *name)
{
    u_char     *nl, *sp;
    ngx_str_t   text;

    if (ngx_http_upstream_affinity_store_file(cf, param, name, &text)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    nl = ngx_strlchr(text.data, text.data + text.len, LF);

    if (nl) {
        text.len = nl - text.data;

        if (text.len && text.data[text.len - 1] == CR) {
            text.len--;
        }
    }

    sp = ngx_strlchr(text.data, text.data + text.len, ' ');

    if (sp) {
        scf->auth_user.data = text.data;
        scf->auth_user.len = sp - text.data;
        scf->auth_pass.data = sp + 1;
        scf->auth_pass.len = text.data + text.len - sp - 1;

    } else {
        scf->auth_pass = text;
    }

    if (scf->auth_pass.len == 0
        || (sp && scf->auth_user.len == 0))
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "the file of \"auth=\" of \"affinity_store\" "
                           "holds no password");
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * secret=FILE: the secret the instances share, at least
 * ..._SECRET_MIN bytes, from which the keys that authenticate messages
 * and digest ids are derived.  Without it, anyone who can write to the
 * store can steer this instance's traffic: said at every start.
 */

static ngx_int_t
ngx_http_upstream_affinity_store_secret(ngx_conf_t *cf,
    ngx_http_upstream_affinity_store_conf_t *scf, ngx_str_t *param,
    ngx_str_t *name)
{
    ngx_str_t  text;

    ngx_str_null(&text);

    if (name->data) {
        if (ngx_http_upstream_affinity_store_file(cf, param, name, &text)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        if (text.len < NGX_HTTP_UPSTREAM_AFFINITY_SECRET_MIN) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "the secret of \"affinity_store\" must be at "
                               "least %d bytes",
                               NGX_HTTP_UPSTREAM_AFFINITY_SECRET_MIN);
            return NGX_ERROR;
        }

        scf->secret = 1;

    } else {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "\"affinity_store\" without \"secret=\": whoever "
                           "can write to the store can steer this "
                           "upstream's traffic");
    }

    scf->keys = affinity_store_keys_create(text.data, text.len);

    if (text.len) {
        ngx_explicit_memzero(text.data, text.len);
    }

    if (scf->keys == NULL) {
        return NGX_ERROR;
    }

    return NGX_OK;
}


static void
ngx_http_upstream_affinity_store_free_keys(void *data)
{
    ngx_http_upstream_affinity_store_conf_t  *scf = data;

    affinity_store_keys_free(scf->keys);
    scf->keys = NULL;
}


#if (NGX_SSL)

/*
 * TLS to the store: TLS 1.2 and 1.3, the certificate checked against
 * tls_ca= (else the system's trusted certificates) and tls_name; a client
 * certificate for stores that ask for one.
 */

static ngx_int_t
ngx_http_upstream_affinity_store_tls(ngx_conf_t *cf,
    ngx_http_upstream_affinity_store_conf_t *scf, ngx_str_t *ca,
    ngx_str_t *cert, ngx_str_t *key)
{
    ngx_pool_cleanup_t  *cln;

    scf->ssl = ngx_pcalloc(cf->pool, sizeof(ngx_ssl_t));
    if (scf->ssl == NULL) {
        return NGX_ERROR;
    }

    scf->ssl->log = cf->log;

    if (ngx_ssl_create(scf->ssl, NGX_SSL_TLSv1_2|NGX_SSL_TLSv1_3, NULL)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

#ifdef SSL_OP_NO_RENEGOTIATION
    /* a store that asks to renegotiate is refused */
    SSL_CTX_set_options(scf->ssl->ctx, SSL_OP_NO_RENEGOTIATION);
#endif

    cln = ngx_pool_cleanup_add(cf->pool, 0);
    if (cln == NULL) {
        ngx_ssl_cleanup_ctx(scf->ssl);
        return NGX_ERROR;
    }

    cln->handler = ngx_ssl_cleanup_ctx;
    cln->data = scf->ssl;

    if (cert->data
        && ngx_ssl_certificate(cf, scf->ssl, cert, key, NULL) != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (ca->data) {
        if (ngx_ssl_trusted_certificate(cf, scf->ssl, ca, 4) != NGX_OK) {
            return NGX_ERROR;
        }

    } else if (SSL_CTX_set_default_verify_paths(scf->ssl->ctx) != 1) {
        ngx_ssl_error(NGX_LOG_EMERG, cf->log, 0,
                      "SSL_CTX_set_default_verify_paths() failed");
        return NGX_ERROR;

    } else {
        /* as deep as with tls_ca= */
        SSL_CTX_set_verify_depth(scf->ssl->ctx, 4);
    }

    return NGX_OK;
}

#endif

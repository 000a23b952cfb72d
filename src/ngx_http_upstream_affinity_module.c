
/*
 * ngx_http_upstream_affinity_module: the module's tables, its configuration
 * and the parsers of its directives.  The rest is split by the role it has
 * in nginx: zones (..._zone.c), the peer view (..._peers.c), the balancer
 * (..._balancer.c), session keys in and out and the variables (..._key.c),
 * the request body (..._body.c), Responses API continuations
 * (..._response.c), the engines' own load (..._metrics.c), what several
 * instances share (..._store.c) and the status page (..._status.c).
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_upstream_affinity_module.h"


/*
 * Default prefix levels: the lengths of the seeds, then levels every
 * max(step, 6% of the previous length) up to 32k characters, so that a
 * conversation's next turn finds its previous turn past any shared system
 * prompt (README, "Choosing levels", has the measurements).
 */
#define NGX_HTTP_UPSTREAM_AFFINITY_STEP         256
#define NGX_HTTP_UPSTREAM_AFFINITY_GROWTH       6
#define NGX_HTTP_UPSTREAM_AFFINITY_MAX_LEVEL    (32 * 1024)

/*
 * Default turn levels: a level at the end of each of a prompt's last 8
 * messages (README, "Choosing levels")
 */
#define NGX_HTTP_UPSTREAM_AFFINITY_TURNS        8

/* the largest level length, step and max level */
#define NGX_HTTP_UPSTREAM_AFFINITY_LEVEL_LIMIT  (16 * 1024 * 1024)

/* the largest cache= a server may have, in tokens */
#define NGX_HTTP_UPSTREAM_AFFINITY_CACHE_LIMIT  ((off_t) 1 << 40)


#define NGX_HTTP_UPSTREAM_AFFINITY_SAMESITE_LAX     0
#define NGX_HTTP_UPSTREAM_AFFINITY_SAMESITE_STRICT  1
#define NGX_HTTP_UPSTREAM_AFFINITY_SAMESITE_NONE    2
#define NGX_HTTP_UPSTREAM_AFFINITY_SAMESITE_OFF     3

/* the cookie_* parameters of session_affinity while they are parsed */
typedef struct {
    ngx_str_t                               path;
    ngx_str_t                               domain;
    time_t                                  max_age;
    ngx_uint_t                              samesite;
    unsigned                                secure:1;
    unsigned                                set:1;  /* any was given */
} ngx_http_upstream_affinity_cookie_t;


static ngx_int_t ngx_http_upstream_affinity_check_cpu(ngx_conf_t *cf);
static ngx_int_t ngx_http_upstream_affinity_preconfiguration(ngx_conf_t *cf);
static ngx_int_t ngx_http_upstream_affinity_postconfiguration(
    ngx_conf_t *cf);
static ngx_int_t ngx_http_upstream_affinity_check_method(ngx_conf_t *cf);
static ngx_int_t ngx_http_upstream_affinity_init_module(ngx_cycle_t *cycle);
static ngx_int_t ngx_http_upstream_affinity_init_process(
    ngx_cycle_t *cycle);
static void ngx_http_upstream_affinity_exit_process(ngx_cycle_t *cycle);

static void *ngx_http_upstream_affinity_create_conf(ngx_conf_t *cf);
static char *ngx_http_upstream_affinity_session(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_upstream_affinity_prefix(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_upstream_affinity_response(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_upstream_affinity_balance(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_upstream_affinity_store(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_upstream_affinity_metrics(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static ngx_int_t ngx_http_upstream_affinity_key_source(ngx_conf_t *cf,
    ngx_http_upstream_affinity_srv_conf_t *ascf, ngx_uint_t type,
    ngx_str_t *param, ngx_str_t *name);
static ngx_int_t ngx_http_upstream_affinity_once(ngx_conf_t *cf,
    ngx_str_t *once);
static ngx_int_t ngx_http_upstream_affinity_timeout(ngx_conf_t *cf,
    ngx_str_t *param, ngx_str_t *value, time_t *timeout);
static ssize_t ngx_http_upstream_affinity_param_size(ngx_conf_t *cf,
    ngx_str_t *param, const char *name, size_t min, off_t max);
static ngx_int_t ngx_http_upstream_affinity_cookie_parameter(ngx_conf_t *cf,
    ngx_str_t *value, ngx_http_upstream_affinity_cookie_t *cookie);
static ngx_int_t ngx_http_upstream_affinity_cookie_attributes(ngx_conf_t *cf,
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_affinity_cookie_t *cookie);
static ngx_int_t ngx_http_upstream_affinity_set_method(ngx_conf_t *cf,
    ngx_http_upstream_affinity_srv_conf_t *ascf);
static ngx_int_t ngx_http_upstream_affinity_table_param(ngx_conf_t *cf,
    ngx_str_t *param, ngx_str_t *zone, time_t *timeout);
static char *ngx_http_upstream_affinity_table(ngx_conf_t *cf,
    ngx_http_upstream_affinity_srv_conf_t *ascf, ngx_str_t *zone,
    ngx_str_t *suffix, affinity_zone_kind_e kind, ngx_shm_zone_t **shm_zone);


static ngx_command_t  ngx_http_upstream_affinity_commands[] = {

    { ngx_string("session_affinity"),
      NGX_HTTP_UPS_CONF|NGX_CONF_ANY,
      ngx_http_upstream_affinity_session,
      NGX_HTTP_SRV_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("prefix_affinity"),
      NGX_HTTP_UPS_CONF|NGX_CONF_ANY,
      ngx_http_upstream_affinity_prefix,
      NGX_HTTP_SRV_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("response_affinity"),
      NGX_HTTP_UPS_CONF|NGX_CONF_ANY,
      ngx_http_upstream_affinity_response,
      NGX_HTTP_SRV_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("affinity_balance"),
      NGX_HTTP_UPS_CONF|NGX_CONF_ANY,
      ngx_http_upstream_affinity_balance,
      NGX_HTTP_SRV_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("affinity_store"),
      NGX_HTTP_UPS_CONF|NGX_CONF_1MORE,
      ngx_http_upstream_affinity_store,
      NGX_HTTP_SRV_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("affinity_metrics"),
      NGX_HTTP_UPS_CONF|NGX_CONF_ANY,
      ngx_http_upstream_affinity_metrics,
      NGX_HTTP_SRV_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("affinity_status"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_upstream_affinity_status,
      0,
      0,
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_upstream_affinity_module_ctx = {
    ngx_http_upstream_affinity_preconfiguration, /* preconfiguration */
    ngx_http_upstream_affinity_postconfiguration, /* postconfiguration */

    NULL,                                  /* create main configuration */
    NULL,                                  /* init main configuration */

    ngx_http_upstream_affinity_create_conf, /* create server configuration */
    NULL,                                  /* merge server configuration */

    NULL,                                  /* create location configuration */
    NULL                                   /* merge location configuration */
};


ngx_module_t  ngx_http_upstream_affinity_module = {
    NGX_MODULE_V1,
    &ngx_http_upstream_affinity_module_ctx, /* module context */
    ngx_http_upstream_affinity_commands,   /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    ngx_http_upstream_affinity_init_module, /* init module */
    ngx_http_upstream_affinity_init_process, /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_http_upstream_affinity_exit_process, /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


/* the routing outcomes (affinity_route_e), as the status names them */
ngx_str_t  ngx_http_upstream_affinity_route_names[AFFINITY_ROUTES] = {
    ngx_null_string,                       /* AFFINITY_ROUTE_NONE */
    ngx_string("session_hit"),
    ngx_string("session_new"),
    ngx_string("session_moved"),
    ngx_string("session_spill"),
    ngx_string("fallback"),
    ngx_string("prefix_hit"),
    ngx_string("prefix_new"),
    ngx_string("response_hit"),
    ngx_string("response_lost")
};


static ngx_str_t  ngx_http_upstream_affinity_default_header =
    ngx_string("X-Session-ID");


/*
 * The core is compiled for the instruction set level of the build host
 * (auto/cpu-level).  On a CPU below that level it would die of
 * SIGILL; refuse to start instead, before any directive calls into it.
 * GCC 12 tests a whole level; older compilers test its main features.
 */

#if (defined __GNUC__ && !defined __clang__ && __GNUC__ >= 12)
#define ngx_http_upstream_affinity_cpu_has(level, features)                   \
    __builtin_cpu_supports(level)
#else
#define ngx_http_upstream_affinity_cpu_has(level, features)  (features)
#endif

static ngx_int_t
ngx_http_upstream_affinity_check_cpu(ngx_conf_t *cf)
{
#if (NGX_HTTP_UPSTREAM_AFFINITY_X86_64_V3                                    \
     || NGX_HTTP_UPSTREAM_AFFINITY_X86_64_V2)
    const char  *level;

    __builtin_cpu_init();

#if (NGX_HTTP_UPSTREAM_AFFINITY_X86_64_V3)
    level = "x86-64-v3 (AVX2, BMI1/2, F16C, FMA, LZCNT, MOVBE)";

    if (ngx_http_upstream_affinity_cpu_has("x86-64-v3",
            __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi")
            && __builtin_cpu_supports("bmi2")
            && __builtin_cpu_supports("fma")))
    {
        return NGX_OK;
    }
#else
    level = "x86-64-v2 (SSE4.2, POPCNT)";

    if (ngx_http_upstream_affinity_cpu_has("x86-64-v2",
            __builtin_cpu_supports("sse4.2")
            && __builtin_cpu_supports("popcnt")))
    {
        return NGX_OK;
    }
#endif

    ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                  "ngx_http_upstream_affinity_module was built for %s, "
                  "which this CPU lacks; rebuild it with "
                  "AFFINITY_MARCH=x86-64", level);
    return NGX_ERROR;
#else
    return NGX_OK;
#endif
}
















static ngx_int_t
ngx_http_upstream_affinity_preconfiguration(ngx_conf_t *cf)
{
    if (ngx_http_upstream_affinity_check_cpu(cf) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_upstream_affinity_add_variables(cf);
}


static ngx_int_t
ngx_http_upstream_affinity_postconfiguration(ngx_conf_t *cf)
{
    if (ngx_http_upstream_affinity_check_method(cf) != NGX_OK
        || ngx_http_upstream_affinity_init_filter(cf) != NGX_OK
        || ngx_http_upstream_affinity_init_usage_filter(cf) != NGX_OK)
    {
        return NGX_ERROR;
    }

    return ngx_http_upstream_affinity_init_response_filter(cf);
}


/*
 * A balancing directive given after the affinity directives ("hash",
 * "least_conn", ...) replaces the affinity balancer, and nginx only warns
 * "load balancing method redefined": the zones would be created and never
 * used.  The upstreams have been initialized by now, so an affinity
 * upstream whose balancer never ran (it sets counter_zone) was replaced.
 */

static ngx_int_t
ngx_http_upstream_affinity_check_method(ngx_conf_t *cf)
{
    ngx_uint_t                              i;
    ngx_http_upstream_srv_conf_t           *uscf;
    ngx_http_upstream_main_conf_t          *umcf;
    ngx_http_upstream_affinity_srv_conf_t  *ascf;

    umcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_upstream_module);

    for (i = 0; (uscf = ngx_http_upstream_affinity_next(umcf, &i, &ascf)); ) {
        if (ascf->counter_zone != NULL) {
            continue;
        }

        ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                      "a load balancing directive after \"%V\" in "
                      "upstream \"%V\" in %s:%ui replaces it: \"hash\", "
                      "\"ip_hash\", \"least_conn\" and \"random\" cannot "
                      "be combined with the affinity directives",
                      &ascf->directive, &uscf->host,
                      uscf->file_name, uscf->line);

        return NGX_ERROR;
    }

    return NGX_OK;
}


/* which build runs, in the log of every start and reload */

static ngx_int_t
ngx_http_upstream_affinity_init_module(ngx_cycle_t *cycle)
{
    ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                  "ngx_http_upstream_affinity_module/%s", AFFINITY_VERSION);

    return NGX_OK;
}


static ngx_int_t
ngx_http_upstream_affinity_init_process(ngx_cycle_t *cycle)
{
    if (ngx_process == NGX_PROCESS_WORKER
        || ngx_process == NGX_PROCESS_SINGLE)
    {
        ngx_http_upstream_affinity_claim_rows(cycle);
        ngx_http_upstream_affinity_store_init(cycle);
        ngx_http_upstream_affinity_metrics_init(cycle);
    }

    return NGX_OK;
}


static void
ngx_http_upstream_affinity_exit_process(ngx_cycle_t *cycle)
{
    ngx_http_upstream_affinity_store_exit(cycle);
    ngx_http_upstream_affinity_body_exit();
    ngx_http_upstream_affinity_release_rows(cycle);
}


/*
 * The upstreams given this module's directives, one by one: the next after
 * *i, its configuration in *ascf; NULL after the last.  Those the module
 * balances have a counter zone (ngx_http_upstream_init_affinity() sets
 * it); once the configuration is checked, all of them do.
 */

ngx_http_upstream_srv_conf_t *
ngx_http_upstream_affinity_next(ngx_http_upstream_main_conf_t *umcf,
    ngx_uint_t *i, ngx_http_upstream_affinity_srv_conf_t **ascf)
{
    ngx_http_upstream_srv_conf_t           *uscf, **uscfp;
    ngx_http_upstream_affinity_srv_conf_t  *conf;

    uscfp = umcf->upstreams.elts;

    while (*i < umcf->upstreams.nelts) {
        uscf = uscfp[(*i)++];

        if (uscf->srv_conf == NULL) {
            continue;           /* an implicit upstream of proxy_pass */
        }

        conf = uscf->srv_conf[ngx_http_upstream_affinity_module.ctx_index];

        if (conf && conf->directive.len) {
            *ascf = conf;
            return uscf;
        }
    }

    return NULL;
}


/*
 * Calls handler with each upstream of the cycle that this module balances:
 * what a worker starts and stops per upstream (stores, pollers).
 */

void
ngx_http_upstream_affinity_each_upstream(ngx_cycle_t *cycle,
    ngx_http_upstream_affinity_upstream_pt handler)
{
    ngx_uint_t                              i;
    ngx_http_upstream_srv_conf_t           *uscf;
    ngx_http_upstream_main_conf_t          *umcf;
    ngx_http_upstream_affinity_srv_conf_t  *ascf;

    umcf = ngx_http_cycle_get_module_main_conf(cycle,
                                               ngx_http_upstream_module);
    if (umcf == NULL) {
        return;
    }

    for (i = 0; (uscf = ngx_http_upstream_affinity_next(umcf, &i, &ascf)); ) {
        if (ascf->counter_zone) {
            handler(cycle, uscf, ascf);
        }
    }
}


static void *
ngx_http_upstream_affinity_create_conf(ngx_conf_t *cf)
{
    ngx_http_upstream_affinity_srv_conf_t  *conf;

    conf = ngx_pcalloc(cf->pool,
                       sizeof(ngx_http_upstream_affinity_srv_conf_t));
    if (conf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     conf->sources = NULL;
     *     conf->echo_header = { 0, NULL };
     *     conf->echo_cookie = { 0, NULL };
     *     conf->cookie_attributes = { 0, NULL };
     *     conf->generate = 0;
     *     conf->session_zone = NULL;
     *     conf->prefix_zone = NULL;
     *     conf->response_zone = NULL;
     *     conf->schedule = NULL;
     *     conf->nschedule = 0;
     *     conf->counter_zone = NULL;
     *     conf->view = NULL;
     *     conf->name = { 0, NULL };
     */

    conf->cookie_max_age = NGX_CONF_UNSET;
    conf->session_timeout = 3600;
    conf->prefix_timeout = 600;
    conf->response_timeout = 3600;
    conf->factor = 1250;
    conf->slack = 2;

    return conf;
}


static char *
ngx_http_upstream_affinity_session(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_upstream_affinity_srv_conf_t  *ascf = conf;

    ngx_int_t                             rc;
    ngx_str_t                            *value, s, zone;
    ngx_uint_t                            i;
    ngx_http_upstream_affinity_cookie_t   cookie;

    static ngx_str_t  suffix = ngx_string("_sessions");
    static ngx_str_t  once[] = {
        ngx_string("generate"),
        ngx_string("zone="),
        ngx_string("timeout="),
        ngx_string("cookie_secure"),
        ngx_string("cookie_max_age="),
        ngx_string("cookie_domain="),
        ngx_string("cookie_path="),
        ngx_string("cookie_samesite="),
        ngx_null_string
    };

    if (ascf->session_zone) {
        return "is duplicate";
    }

    if (ngx_http_upstream_affinity_once(cf, once) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    ascf->sources = ngx_array_create(cf->pool, 2,
                                  sizeof(ngx_http_upstream_affinity_source_t));
    if (ascf->sources == NULL) {
        return NGX_CONF_ERROR;
    }

    value = cf->args->elts;
    ngx_str_null(&zone);

    ngx_memzero(&cookie, sizeof(ngx_http_upstream_affinity_cookie_t));
    cookie.max_age = NGX_CONF_UNSET;
    cookie.samesite = NGX_HTTP_UPSTREAM_AFFINITY_SAMESITE_LAX;
    ngx_str_set(&cookie.path, "/");

    for (i = 1; i < cf->args->nelts; i++) {

        /* key sources: repeatable, tried in the order written */

        if (ngx_strncmp(value[i].data, "header=", 7) == 0
            || ngx_strncmp(value[i].data, "cookie=", 7) == 0
            || ngx_strncmp(value[i].data, "field=", 6) == 0)
        {
            s.data = (u_char *) ngx_strchr(value[i].data, '=') + 1;
            s.len = value[i].data + value[i].len - s.data;

            rc = ngx_http_upstream_affinity_key_source(cf, ascf,
                     value[i].data[0] == 'h' ? NGX_HTTP_UPSTREAM_AFFINITY_HEADER
                     : value[i].data[0] == 'c'
                       ? NGX_HTTP_UPSTREAM_AFFINITY_COOKIE
                       : NGX_HTTP_UPSTREAM_AFFINITY_FIELD,
                     &value[i], &s);

            if (rc != NGX_OK) {
                return NGX_CONF_ERROR;
            }

            continue;
        }

        if (ngx_strcmp(value[i].data, "generate") == 0) {
            ascf->generate = 1;
            continue;
        }

        rc = ngx_http_upstream_affinity_table_param(cf, &value[i], &zone,
                                                    &ascf->session_timeout);
        if (rc == NGX_ERROR) {
            return NGX_CONF_ERROR;
        }

        if (rc == NGX_OK) {
            continue;
        }

        if (ngx_strncmp(value[i].data, "cookie_", 7) == 0) {
            if (ngx_http_upstream_affinity_cookie_parameter(cf, &value[i],
                                                            &cookie)
                != NGX_OK)
            {
                return NGX_CONF_ERROR;
            }

            continue;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\"", &value[i]);
        return NGX_CONF_ERROR;
    }

    if (ascf->sources->nelts == 0
        && ngx_http_upstream_affinity_key_source(cf, ascf,
               NGX_HTTP_UPSTREAM_AFFINITY_HEADER,
               &ngx_http_upstream_affinity_default_header,
               &ngx_http_upstream_affinity_default_header)
           != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    if (ascf->echo_header.len == 0) {
        ascf->echo_header = ngx_http_upstream_affinity_default_header;
    }

    if (ngx_http_upstream_affinity_cookie_attributes(cf, ascf, &cookie)
        != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    if (cookie.set && ascf->echo_cookie.len == 0) {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "cookie_* parameters have no effect without "
                           "\"cookie=\"");
    }

    return ngx_http_upstream_affinity_table(cf, ascf, &zone, &suffix,
                                            AFFINITY_ZONE_SESSIONS,
                                            &ascf->session_zone);
}


/*
 * A key source: a request header or cookie, read through nginx's own
 * $http_NAME and $cookie_NAME variables (which parse them as every nginx
 * version does), or a field of the JSON body.  The first header and the
 * first cookie named are where the key is echoed.
 */

static ngx_int_t
ngx_http_upstream_affinity_key_source(ngx_conf_t *cf,
    ngx_http_upstream_affinity_srv_conf_t *ascf, ngx_uint_t type,
    ngx_str_t *param, ngx_str_t *name)
{
    u_char                               *p, *v;
    ngx_str_t                             var;
    ngx_uint_t                            i;
    ngx_http_upstream_affinity_source_t  *src;

    if (name->len == 0) {
        goto invalid;
    }

    for (p = name->data; p < name->data + name->len; p++) {

        if (type == NGX_HTTP_UPSTREAM_AFFINITY_FIELD) {
            if (*p == '.' && (p == name->data
                              || p == name->data + name->len - 1
                              || p[-1] == '.'))
            {
                goto invalid;
            }

            if (*p <= ' ' || *p >= 0x7f) {
                goto invalid;
            }

            continue;
        }

        /* header and cookie names are HTTP tokens */

        if (*p <= ' ' || *p >= 0x7f
            || ngx_strchr("()<>@,;:\\\"/[]?={}", *p) != NULL)
        {
            goto invalid;
        }
    }

    src = ngx_array_push(ascf->sources);
    if (src == NULL) {
        return NGX_ERROR;
    }

    src->type = type;
    src->name = *name;
    src->index = NGX_ERROR;

    if (type != NGX_HTTP_UPSTREAM_AFFINITY_FIELD) {

        /* $http_x_session_id: lower case, '-' as '_'; $cookie_NAME */

        var.len = (type == NGX_HTTP_UPSTREAM_AFFINITY_HEADER
                   ? sizeof("http_") : sizeof("cookie_")) - 1 + name->len;
        var.data = ngx_pnalloc(cf->pool, var.len);
        if (var.data == NULL) {
            return NGX_ERROR;
        }

        v = ngx_cpymem(var.data,
                       type == NGX_HTTP_UPSTREAM_AFFINITY_HEADER
                       ? "http_" : "cookie_",
                       var.len - name->len);

        for (i = 0; i < name->len; i++) {
            v[i] = (type == NGX_HTTP_UPSTREAM_AFFINITY_HEADER
                    && name->data[i] == '-')
                   ? '_' : ngx_tolower(name->data[i]);
        }

        src->index = ngx_http_get_variable_index(cf, &var);
        if (src->index == NGX_ERROR) {
            return NGX_ERROR;
        }
    }

    if (type == NGX_HTTP_UPSTREAM_AFFINITY_HEADER
        && ascf->echo_header.len == 0)
    {
        ascf->echo_header = *name;
    }

    if (type == NGX_HTTP_UPSTREAM_AFFINITY_COOKIE
        && ascf->echo_cookie.len == 0)
    {
        ascf->echo_cookie = *name;
    }

    return NGX_OK;

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "invalid key source \"%V\"",
                       param);
    return NGX_ERROR;
}


static char *
ngx_http_upstream_affinity_prefix(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_upstream_affinity_srv_conf_t  *ascf = conf;

    u_char      *p, *last, *start;
    ssize_t      size;
    ngx_int_t    n, rc;
    ngx_str_t   *value, zone;
    ngx_uint_t   i, nlengths, step, growth, max, longest;
    ngx_str_t   *max_arg, *growth_arg;
    uint32_t     lengths[AFFINITY_MAX_LEVELS], schedule[AFFINITY_MAX_LEVELS];

    static ngx_str_t  suffix = ngx_string("_prefixes");
    static ngx_str_t  once[] = {
        ngx_string("lengths="),
        ngx_string("step="),
        ngx_string("growth="),
        ngx_string("max="),
        ngx_string("turns="),
        ngx_string("cache="),
        ngx_string("zone="),
        ngx_string("timeout="),
        ngx_null_string
    };

    if (ascf->prefix_zone) {
        return "is duplicate";
    }

    if (ngx_http_upstream_affinity_once(cf, once) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    lengths[0] = 100;
    lengths[1] = 500;
    lengths[2] = 1000;
    nlengths = 3;
    step = NGX_HTTP_UPSTREAM_AFFINITY_STEP;
    growth = NGX_HTTP_UPSTREAM_AFFINITY_GROWTH;
    max = NGX_HTTP_UPSTREAM_AFFINITY_MAX_LEVEL;
    ascf->turns = NGX_HTTP_UPSTREAM_AFFINITY_TURNS;

    max_arg = NULL;
    growth_arg = NULL;

    value = cf->args->elts;
    ngx_str_null(&zone);

    for (i = 1; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "lengths=", 8) == 0) {
            nlengths = 0;
            last = value[i].data + value[i].len;

            for (start = value[i].data + 8; start <= last; start = p + 1) {
                p = ngx_strlchr(start, last, ',');
                if (p == NULL) {
                    p = last;
                }

                n = ngx_atoi(start, p - start);

                if (n == NGX_ERROR || n == 0
                    || n > NGX_HTTP_UPSTREAM_AFFINITY_LEVEL_LIMIT
                    || nlengths == 32)
                {
                    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                       "invalid lengths \"%V\", they must "
                                       "be up to 32 positive numbers",
                                       &value[i]);
                    return NGX_CONF_ERROR;
                }

                lengths[nlengths++] = (uint32_t) n;
            }

            continue;
        }

        if (ngx_strncmp(value[i].data, "step=", 5) == 0) {
            size = ngx_http_upstream_affinity_param_size(cf, &value[i],
                       "step", 0, NGX_HTTP_UPSTREAM_AFFINITY_LEVEL_LIMIT);
            if (size == NGX_ERROR) {
                return NGX_CONF_ERROR;
            }

            step = (ngx_uint_t) size;
            continue;
        }

        if (ngx_strncmp(value[i].data, "growth=", 7) == 0) {
            n = ngx_atoi(value[i].data + 7, value[i].len - 7);

            if (n == NGX_ERROR || n > 100) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid growth \"%V\", it must be "
                                   "a percentage from 0 to 100", &value[i]);
                return NGX_CONF_ERROR;
            }

            growth = (ngx_uint_t) n;
            growth_arg = &value[i];
            continue;
        }

        if (ngx_strncmp(value[i].data, "max=", 4) == 0) {
            size = ngx_http_upstream_affinity_param_size(cf, &value[i],
                       "max", 1, NGX_HTTP_UPSTREAM_AFFINITY_LEVEL_LIMIT);
            if (size == NGX_ERROR) {
                return NGX_CONF_ERROR;
            }

            max = (ngx_uint_t) size;
            max_arg = &value[i];
            continue;
        }

        if (ngx_strncmp(value[i].data, "turns=", 6) == 0) {
            /* message ends hashed too: a next turn finds the one before */
            n = ngx_atoi(value[i].data + 6, value[i].len - 6);

            if (n == NGX_ERROR || n > AFFINITY_TURNS_MAX) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid turns \"%V\", it must be "
                                   "a number from 0 to %d", &value[i],
                                   AFFINITY_TURNS_MAX);
                return NGX_CONF_ERROR;
            }

            ascf->turns = (ngx_uint_t) n;
            continue;
        }

        if (value[i].len == 9
            && ngx_strncmp(value[i].data, "cache=off", 9) == 0)
        {
            /* no cache model, whatever the engines report */
            ascf->prefix_cache = AFFINITY_CAPACITY_OFF;
            continue;
        }

        if (ngx_strncmp(value[i].data, "cache=", 6) == 0) {
            /* tokens each server's KV cache holds, as the engine says */
            size = ngx_http_upstream_affinity_param_size(cf, &value[i],
                       "cache", 1, NGX_HTTP_UPSTREAM_AFFINITY_CACHE_LIMIT);
            if (size == NGX_ERROR) {
                return NGX_CONF_ERROR;
            }

            ascf->prefix_cache = (uint64_t) size;
            continue;
        }

        rc = ngx_http_upstream_affinity_table_param(cf, &value[i], &zone,
                                                    &ascf->prefix_timeout);
        if (rc == NGX_ERROR) {
            return NGX_CONF_ERROR;
        }

        if (rc == NGX_OK) {
            continue;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\"", &value[i]);
        return NGX_CONF_ERROR;
    }

    /* the level lengths are fixed here, once: requests only hash them */

    ascf->nschedule = affinity_level_schedule(lengths, nlengths,
                                              (uint32_t) step,
                                              (uint32_t) growth,
                                              (uint32_t) max, schedule,
                                              AFFINITY_MAX_LEVELS);

    ascf->schedule = ngx_palloc(cf->pool, ascf->nschedule * sizeof(uint32_t));
    if (ascf->schedule == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_memcpy(ascf->schedule, schedule, ascf->nschedule * sizeof(uint32_t));

    /* parameters that change nothing are a mistake worth a word */

    longest = 0;

    for (i = 0; i < nlengths; i++) {
        longest = ngx_max(longest, lengths[i]);
    }

    if (step == 0 && (max_arg || growth_arg)) {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "\"%V\" is ignored: with step=0 no level is "
                           "added after lengths=",
                           max_arg ? max_arg : growth_arg);

    } else if (step && max_arg && max <= longest) {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "\"%V\" adds no level: it is not above the "
                           "longest of lengths= (%ui)", max_arg, longest);

    } else if (step && ascf->nschedule == AFFINITY_MAX_LEVELS
               && schedule[AFFINITY_MAX_LEVELS - 1]
                  + ngx_max(step, schedule[AFFINITY_MAX_LEVELS - 1]
                                  * growth / 100)
                  <= max)
    {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "prompts are hashed at %d levels at most: the "
                           "longest is %uD characters, not max=%ui (raise "
                           "step= or growth=)", AFFINITY_MAX_LEVELS,
                           schedule[AFFINITY_MAX_LEVELS - 1], max);
    }

    return ngx_http_upstream_affinity_table(cf, ascf, &zone, &suffix,
                                            AFFINITY_ZONE_PREFIXES,
                                            &ascf->prefix_zone);
}


/*
 * response_affinity [zone=NAME:SIZE] [timeout=TIME]: the peer of each
 * response id the upstream produces, for the requests that continue it.
 */

static char *
ngx_http_upstream_affinity_response(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_upstream_affinity_srv_conf_t  *ascf = conf;

    ngx_int_t    rc;
    ngx_str_t   *value, zone;
    ngx_uint_t   i;

    static ngx_str_t  suffix = ngx_string("_responses");
    static ngx_str_t  once[] = {
        ngx_string("zone="),
        ngx_string("timeout="),
        ngx_null_string
    };

    if (ascf->response_zone) {
        return "is duplicate";
    }

    if (ngx_http_upstream_affinity_once(cf, once) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    value = cf->args->elts;
    ngx_str_null(&zone);

    for (i = 1; i < cf->args->nelts; i++) {

        rc = ngx_http_upstream_affinity_table_param(cf, &value[i], &zone,
                                                    &ascf->response_timeout);
        if (rc == NGX_ERROR) {
            return NGX_CONF_ERROR;
        }

        if (rc == NGX_OK) {
            continue;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\"", &value[i]);
        return NGX_CONF_ERROR;
    }

    return ngx_http_upstream_affinity_table(cf, ascf, &zone, &suffix,
                                            AFFINITY_ZONE_RESPONSES,
                                            &ascf->response_zone);
}


/*
 * affinity_store ...: the Redis (or Valkey) server through which the
 * nginx instances in front of the same servers share what they learn
 * (ngx_http_upstream_affinity_store_conf.c).
 */

static char *
ngx_http_upstream_affinity_store(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_upstream_affinity_srv_conf_t  *ascf = conf;

    static ngx_str_t  once[] = {
        ngx_string("stream="),
        ngx_string("maxlen="),
        ngx_string("backlog="),
        ngx_string("timeout="),
        ngx_string("auth="),
        ngx_string("secret="),
        ngx_string("tls"),
        ngx_string("tls_name="),
        ngx_string("tls_ca="),
        ngx_string("tls_cert="),
        ngx_string("tls_key="),
        ngx_null_string
    };

    if (ascf->store_conf) {
        return "is duplicate";
    }

    if (ngx_http_upstream_affinity_once(cf, once) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    if (ngx_http_upstream_affinity_store_conf(cf, ascf) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    /* alone, it would do nothing: the balancer then says what it needs */

    return ngx_http_upstream_affinity_set_method(cf, ascf) == NGX_OK
           ? NGX_CONF_OK : NGX_CONF_ERROR;
}


/*
 * affinity_metrics [path=URI] [interval=TIME] [timeout=TIME]: poll each
 * server's own metrics page for its requests running and waiting.
 */

static char *
ngx_http_upstream_affinity_metrics(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_upstream_affinity_srv_conf_t  *ascf = conf;

    ngx_str_t                                  *value, s;
    ngx_msec_t                                  ms;
    ngx_uint_t                                  i;
    ngx_http_upstream_affinity_metrics_conf_t  *mcf;

    static ngx_str_t  once[] = {
        ngx_string("path="),
        ngx_string("interval="),
        ngx_string("timeout="),
        ngx_null_string
    };

    if (ascf->metrics_conf) {
        return "is duplicate";
    }

    if (ngx_http_upstream_affinity_once(cf, once) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    mcf = ngx_pcalloc(cf->pool,
                      sizeof(ngx_http_upstream_affinity_metrics_conf_t));
    if (mcf == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_str_set(&mcf->path, "/metrics");
    mcf->interval = 1000;
    mcf->timeout = 1000;

    value = cf->args->elts;

    for (i = 1; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "path=", 5) == 0) {
            mcf->path.data = value[i].data + 5;
            mcf->path.len = value[i].len - 5;

            if (mcf->path.len == 0 || mcf->path.data[0] != '/') {
                goto invalid;
            }

            for (s.data = mcf->path.data;
                 s.data < mcf->path.data + mcf->path.len;
                 s.data++)
            {
                if (*s.data <= ' ' || *s.data >= 0x7f) {
                    goto invalid;
                }
            }

            continue;
        }

        if (ngx_strncmp(value[i].data, "interval=", 9) == 0
            || ngx_strncmp(value[i].data, "timeout=", 8) == 0)
        {
            s.data = (u_char *) ngx_strchr(value[i].data, '=') + 1;
            s.len = value[i].data + value[i].len - s.data;

            ms = ngx_parse_time(&s, 0);

            if (ms == (ngx_msec_t) NGX_ERROR || ms < 100 || ms > 3600000) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid \"%V\", it must be a time from "
                                   "100ms to 1h", &value[i]);
                return NGX_CONF_ERROR;
            }

            if (value[i].data[0] == 'i') {
                mcf->interval = ms;

            } else {
                mcf->timeout = ms;
            }

            continue;
        }

        goto invalid;
    }

    ascf->metrics_conf = mcf;

    /* a figure counts for three intervals: a late poll does not drop it */

    ascf->engine_ttl = ngx_max(2, (3 * mcf->interval + 999) / 1000);

    return ngx_http_upstream_affinity_set_method(cf, ascf) == NGX_OK
           ? NGX_CONF_OK : NGX_CONF_ERROR;

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid parameter \"%V\"", &value[i]);
    return NGX_CONF_ERROR;
}


static char *
ngx_http_upstream_affinity_balance(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_upstream_affinity_srv_conf_t  *ascf = conf;

    ngx_int_t    n;
    ngx_str_t   *value;
    ngx_uint_t   i;

    static ngx_str_t  once[] = {
        ngx_string("factor="),
        ngx_string("slack="),
        ngx_null_string
    };

    if (ngx_http_upstream_affinity_once(cf, once) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    value = cf->args->elts;

    for (i = 1; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "factor=", 7) == 0) {
            n = ngx_atofp(value[i].data + 7, value[i].len - 7, 3);

            /* below 1 the bounds could not hold all requests */

            if (n == NGX_ERROR || n < 1000 || n > 100000) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid factor \"%V\", it must be "
                                   "a number from 1 to 100", &value[i]);
                return NGX_CONF_ERROR;
            }

            ascf->factor = n;
            continue;
        }

        if (ngx_strncmp(value[i].data, "slack=", 6) == 0) {
            n = ngx_atoi(value[i].data + 6, value[i].len - 6);

            if (n == NGX_ERROR || n > 1000000) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid slack \"%V\"", &value[i]);
                return NGX_CONF_ERROR;
            }

            ascf->slack = n;
            continue;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\"", &value[i]);
        return NGX_CONF_ERROR;
    }

    if (ngx_http_upstream_affinity_set_method(cf, ascf) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/*
 * nginx refuses a parameter given twice rather than keep one silently;
 * so do these directives, for the parameters in "once" (a word, or a
 * prefix ending in '='), before any value is read.
 */

static ngx_int_t
ngx_http_upstream_affinity_once(ngx_conf_t *cf, ngx_str_t *once)
{
    ngx_str_t   *value, *name;
    ngx_uint_t   i, found;

    value = cf->args->elts;

    for (name = once; name->len; name++) {
        found = 0;

        for (i = 1; i < cf->args->nelts; i++) {

            if (name->data[name->len - 1] == '='
                ? ngx_strncmp(value[i].data, name->data, name->len) != 0
                : ngx_strcmp(value[i].data, name->data) != 0)
            {
                continue;
            }

            if (found++) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "duplicate parameter \"%V\"", &value[i]);
                return NGX_ERROR;
            }
        }
    }

    return NGX_OK;
}


/*
 * A size ("16k", "32m") from min to max, of the parameter "what" shown as
 * "shown": the value, or NGX_ERROR, logged.
 */

ssize_t
ngx_http_upstream_affinity_parse_size(ngx_conf_t *cf, const char *what,
    ngx_str_t *shown, ngx_str_t *value, size_t min, off_t max)
{
    ssize_t  size;

    size = ngx_parse_size(value);

    if (size == NGX_ERROR || (off_t) size > max) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "invalid %s size \"%V\"",
                           what, shown);
        return NGX_ERROR;
    }

    if ((size_t) size < min) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "%s \"%V\" is too small, the minimum is %uz",
                           what, shown, min);
        return NGX_ERROR;
    }

    return size;
}


/* the size of a "NAME=SIZE" parameter, as above */

static ssize_t
ngx_http_upstream_affinity_param_size(ngx_conf_t *cf, ngx_str_t *param,
    const char *name, size_t min, off_t max)
{
    size_t     skip;
    ngx_str_t  s;

    skip = ngx_strlen(name) + 1;

    s.data = param->data + skip;
    s.len = param->len - skip;

    return ngx_http_upstream_affinity_parse_size(cf, name, param, &s, min,
                                                 max);
}


/* "timeout=TIME": idle expiry, a positive number of seconds */

static ngx_int_t
ngx_http_upstream_affinity_timeout(ngx_conf_t *cf, ngx_str_t *param,
    ngx_str_t *value, time_t *timeout)
{
    time_t  t;

    t = ngx_parse_time(value, 1);

    if (t == (time_t) NGX_ERROR || t == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid timeout \"%V\"", param);
        return NGX_ERROR;
    }

    *timeout = t;

    return NGX_OK;
}


/*
 * "cookie_secure", "cookie_max_age=TIME", "cookie_domain=NAME",
 * "cookie_path=PATH", "cookie_samesite=strict|lax|none|off": the
 * attributes of the Set-Cookie that echoes the key.
 */

static ngx_int_t
ngx_http_upstream_affinity_cookie_parameter(ngx_conf_t *cf, ngx_str_t *value,
    ngx_http_upstream_affinity_cookie_t *cookie)
{
    u_char     *p;
    time_t      t;
    ngx_str_t   s;

    cookie->set = 1;

    if (ngx_strcmp(value->data, "cookie_secure") == 0) {
        cookie->secure = 1;
        return NGX_OK;
    }

    if (ngx_strncmp(value->data, "cookie_max_age=", 15) == 0) {
        s.data = value->data + 15;
        s.len = value->len - 15;

        t = ngx_parse_time(&s, 1);

        /* Max-Age=0 would delete the cookie with every response */

        if (t == (time_t) NGX_ERROR || t == 0) {
            goto invalid;
        }

        cookie->max_age = t;
        return NGX_OK;
    }

    if (ngx_strncmp(value->data, "cookie_domain=", 14) == 0) {
        s.data = value->data + 14;
        s.len = value->len - 14;

        for (p = s.data; p < s.data + s.len; p++) {
            if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')
                  || (*p >= '0' && *p <= '9') || *p == '.' || *p == '-'))
            {
                goto invalid;
            }
        }

        if (s.len == 0) {
            goto invalid;
        }

        cookie->domain = s;
        return NGX_OK;
    }

    if (ngx_strncmp(value->data, "cookie_path=", 12) == 0) {
        s.data = value->data + 12;
        s.len = value->len - 12;

        if (s.len == 0 || s.data[0] != '/') {
            goto invalid;
        }

        for (p = s.data; p < s.data + s.len; p++) {
            if (*p <= ' ' || *p >= 0x7f || *p == ';' || *p == ',') {
                goto invalid;
            }
        }

        cookie->path = s;
        return NGX_OK;
    }

    if (ngx_strncmp(value->data, "cookie_samesite=", 16) == 0) {
        s.data = value->data + 16;
        s.len = value->len - 16;

        if (s.len == 6 && ngx_strncasecmp(s.data, (u_char *) "strict", 6) == 0)
        {
            cookie->samesite = NGX_HTTP_UPSTREAM_AFFINITY_SAMESITE_STRICT;

        } else if (s.len == 3
                   && ngx_strncasecmp(s.data, (u_char *) "lax", 3) == 0)
        {
            cookie->samesite = NGX_HTTP_UPSTREAM_AFFINITY_SAMESITE_LAX;

        } else if (s.len == 4
                   && ngx_strncasecmp(s.data, (u_char *) "none", 4) == 0)
        {
            cookie->samesite = NGX_HTTP_UPSTREAM_AFFINITY_SAMESITE_NONE;

        } else if (s.len == 3
                   && ngx_strncasecmp(s.data, (u_char *) "off", 3) == 0)
        {
            cookie->samesite = NGX_HTTP_UPSTREAM_AFFINITY_SAMESITE_OFF;

        } else {
            goto invalid;
        }

        return NGX_OK;
    }

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "invalid parameter \"%V\"",
                       value);
    return NGX_ERROR;
}


/* the attributes after "NAME=KEY" in Set-Cookie, written once */

static ngx_int_t
ngx_http_upstream_affinity_cookie_attributes(ngx_conf_t *cf,
    ngx_http_upstream_affinity_srv_conf_t *ascf,
    ngx_http_upstream_affinity_cookie_t *cookie)
{
    u_char  *p;
    size_t   len;

    static ngx_str_t  samesite[] = {
        ngx_string("; SameSite=Lax"),
        ngx_string("; SameSite=Strict"),
        ngx_string("; SameSite=None"),
        ngx_null_string
    };

    if (cookie->samesite == NGX_HTTP_UPSTREAM_AFFINITY_SAMESITE_NONE
        && !cookie->secure)
    {
        /* browsers drop such cookies */
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"cookie_samesite=none\" requires "
                           "\"cookie_secure\"");
        return NGX_ERROR;
    }

    len = sizeof("; Path=") - 1 + cookie->path.len
          + sizeof("; HttpOnly") - 1
          + samesite[cookie->samesite].len;

    if (cookie->domain.len) {
        len += sizeof("; Domain=") - 1 + cookie->domain.len;
    }

    if (cookie->max_age != NGX_CONF_UNSET) {
        len += sizeof("; Max-Age=") - 1 + NGX_TIME_T_LEN;
    }

    if (cookie->secure) {
        len += sizeof("; Secure") - 1;
    }

    p = ngx_pnalloc(cf->pool, len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    ascf->cookie_attributes.data = p;

    p = ngx_sprintf(p, "; Path=%V", &cookie->path);

    if (cookie->domain.len) {
        p = ngx_sprintf(p, "; Domain=%V", &cookie->domain);
    }

    if (cookie->max_age != NGX_CONF_UNSET) {
        p = ngx_sprintf(p, "; Max-Age=%T", cookie->max_age);
    }

    p = ngx_cpymem(p, "; HttpOnly", sizeof("; HttpOnly") - 1);

    if (cookie->secure) {
        p = ngx_cpymem(p, "; Secure", sizeof("; Secure") - 1);
    }

    p = ngx_cpymem(p, samesite[cookie->samesite].data,
                   samesite[cookie->samesite].len);

    ascf->cookie_attributes.len = p - ascf->cookie_attributes.data;
    ascf->cookie_max_age = cookie->max_age;

    return NGX_OK;
}


/*
 * The parameters every table directive has: "zone=NAME:SIZE", kept for
 * ngx_http_upstream_affinity_table(), and "timeout=TIME".  NGX_DECLINED
 * when param is neither.
 */

static ngx_int_t
ngx_http_upstream_affinity_table_param(ngx_conf_t *cf, ngx_str_t *param,
    ngx_str_t *zone, time_t *timeout)
{
    ngx_str_t  s;

    if (ngx_strncmp(param->data, "zone=", 5) == 0) {
        zone->data = param->data + 5;
        zone->len = param->len - 5;
        return NGX_OK;
    }

    if (ngx_strncmp(param->data, "timeout=", 8) == 0) {
        s.data = param->data + 8;
        s.len = param->len - 8;

        return ngx_http_upstream_affinity_timeout(cf, param, &s, timeout);
    }

    return NGX_DECLINED;
}


/*
 * The zone of a directive's table ("zone=", else the upstream's default
 * one), and the balancer set for the upstream.
 */

static char *
ngx_http_upstream_affinity_table(ngx_conf_t *cf,
    ngx_http_upstream_affinity_srv_conf_t *ascf, ngx_str_t *zone,
    ngx_str_t *suffix, affinity_zone_kind_e kind, ngx_shm_zone_t **shm_zone)
{
    char  *rv;

    rv = ngx_http_upstream_affinity_add_zone(cf, ascf,
                                             zone->data ? zone : NULL,
                                             suffix, kind, shm_zone);
    if (rv != NGX_CONF_OK) {
        return rv;
    }

    return ngx_http_upstream_affinity_set_method(cf, ascf) == NGX_OK
           ? NGX_CONF_OK : NGX_CONF_ERROR;
}


static ngx_int_t
ngx_http_upstream_affinity_set_method(ngx_conf_t *cf,
    ngx_http_upstream_affinity_srv_conf_t *ascf)
{
    ngx_str_t                     *value;
    ngx_http_upstream_srv_conf_t  *uscf;

    uscf = ngx_http_conf_get_module_srv_conf(cf, ngx_http_upstream_module);
    value = cf->args->elts;

    /*
     * What was set before is another balancer ("hash", "least_conn", ...)
     * or "keepalive", which keeps connections for the balancer given
     * before it: either way it is replaced.  Named, not just "redefined".
     */

    if (uscf->peer.init_upstream
        && uscf->peer.init_upstream != ngx_http_upstream_init_affinity)
    {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "\"%V\" replaces the load balancing directive "
                           "given before it in upstream \"%V\": \"hash\", "
                           "\"ip_hash\", \"least_conn\" and \"random\" "
                           "cannot be combined with it, and \"keepalive\" "
                           "and \"sticky\" must come after it",
                           &value[0], &uscf->host);
    }

    if (ascf->directive.len == 0) {
        ascf->directive = value[0];
    }

    uscf->peer.init_upstream = ngx_http_upstream_init_affinity;

    uscf->flags = NGX_HTTP_UPSTREAM_CREATE
                  |NGX_HTTP_UPSTREAM_WEIGHT
                  |NGX_HTTP_UPSTREAM_MAX_CONNS
                  |NGX_HTTP_UPSTREAM_MAX_FAILS
                  |NGX_HTTP_UPSTREAM_FAIL_TIMEOUT
                  |NGX_HTTP_UPSTREAM_DOWN
                  |NGX_HTTP_UPSTREAM_AFFINITY_MODIFY
                  |NGX_HTTP_UPSTREAM_BACKUP;

    return NGX_OK;
}

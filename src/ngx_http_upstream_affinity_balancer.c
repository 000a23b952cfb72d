
/*
 * The balancer hooks of ngx_http_upstream_affinity_module: per-request peer
 * data, peer selection and release.  Built on round robin as the hash and
 * least_conn modules are: its peer data comes first, its usability rules
 * (down, max_fails/fail_timeout, max_conns, tried) are applied here, and it
 * takes over for backup servers.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_upstream_affinity_module.h"


typedef struct {
    /* the round robin data must be first */
    ngx_http_upstream_rr_peer_data_t        rrp;

    ngx_http_upstream_affinity_srv_conf_t  *conf;
    ngx_http_upstream_affinity_ctx_t       *ctx;
    ngx_http_upstream_affinity_shctx_t     *shctx;      /* counters */
    ngx_http_upstream_affinity_shctx_t     *prefixes;   /* or NULL */
    ngx_http_upstream_rr_peers_t           *primary;

    /* the peers as they were when the request started */
    ngx_http_upstream_affinity_view_t      *view;

    affinity_request_t                      request;

    /* this try's announcement (AFFINITY_STORE_SENT), or NULL */
    ngx_http_upstream_affinity_announcement_t
                                           *announced;

    /* the counter slot this try holds an in-flight request in */
    uint32_t                                slot;
} ngx_http_upstream_affinity_peer_data_t;


static ngx_int_t ngx_http_upstream_init_affinity_peer(ngx_http_request_t *r,
    ngx_http_upstream_srv_conf_t *us);
static ngx_int_t ngx_http_upstream_get_affinity_peer(ngx_peer_connection_t *pc,
    void *data);
static void ngx_http_upstream_free_affinity_peer(ngx_peer_connection_t *pc,
    void *data, ngx_uint_t state);
static void ngx_http_upstream_affinity_decided(
    ngx_http_upstream_affinity_peer_data_t *ap, affinity_decision_t *decision,
    ngx_http_upstream_rr_peers_t *peers);
static ngx_int_t ngx_http_upstream_affinity_round_robin(
    ngx_peer_connection_t *pc, ngx_http_upstream_affinity_peer_data_t *ap);
static void ngx_http_upstream_affinity_count(
    ngx_http_upstream_affinity_peer_data_t *ap, affinity_peer_t *peer);
static void ngx_http_upstream_affinity_share(
    ngx_http_upstream_affinity_peer_data_t *ap,
    affinity_decision_t *decision);


ngx_int_t
ngx_http_upstream_init_affinity(ngx_conf_t *cf,
    ngx_http_upstream_srv_conf_t *us)
{
    ngx_http_upstream_affinity_shctx_t     *shctx;
    ngx_http_upstream_rr_peers_t           *peers;
    ngx_http_upstream_affinity_srv_conf_t  *ascf;

    ascf = ngx_http_conf_upstream_srv_conf(us,
                                           ngx_http_upstream_affinity_module);

    if (ascf->session_zone == NULL && ascf->prefix_zone == NULL
        && ascf->response_zone == NULL)
    {
        ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                      "\"affinity_balance\" in upstream \"%V\" requires "
                      "\"session_affinity\", \"prefix_affinity\" or "
                      "\"response_affinity\"", &us->host);
        return NGX_ERROR;
    }

    /* one zone counts the in-flight requests: the sessions' if any */

    ascf->counter_zone = ascf->session_zone ? ascf->session_zone
                         : ascf->prefix_zone ? ascf->prefix_zone
                         : ascf->response_zone;

    shctx = ascf->counter_zone->data;
    shctx->counts = 1;

    if (ngx_http_upstream_init_round_robin(cf, us) != NGX_OK) {
        return NGX_ERROR;
    }

    peers = us->peer.data;

    if (peers->number > AFFINITY_MAX_PEERS) {
        ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                      "upstream \"%V\" has %ui servers, affinity balancing "
                      "supports at most %d", &us->host, peers->number,
                      AFFINITY_MAX_PEERS);
        return NGX_ERROR;
    }

    /* the peers' counter slots are claimed when the zone is ready */

    if (ngx_http_upstream_affinity_init_view(cf, ascf, peers) != NGX_OK) {
        return NGX_ERROR;
    }

    us->peer.init = ngx_http_upstream_init_affinity_peer;

    return NGX_OK;
}


static ngx_int_t
ngx_http_upstream_init_affinity_peer(ngx_http_request_t *r,
    ngx_http_upstream_srv_conf_t *us)
{
    ngx_http_upstream_affinity_ctx_t        *ctx;
    ngx_http_upstream_affinity_srv_conf_t   *ascf;
    ngx_http_upstream_affinity_peer_data_t  *ap;

    ascf = ngx_http_conf_upstream_srv_conf(us,
                                           ngx_http_upstream_affinity_module);

    ap = ngx_palloc(r->pool, sizeof(ngx_http_upstream_affinity_peer_data_t));
    if (ap == NULL) {
        return NGX_ERROR;
    }

    r->upstream->peer.data = &ap->rrp;

    if (ngx_http_upstream_init_round_robin_peer(r, us) != NGX_OK) {
        return NGX_ERROR;
    }

    r->upstream->peer.get = ngx_http_upstream_get_affinity_peer;
    r->upstream->peer.free = ngx_http_upstream_free_affinity_peer;

    ap->conf = ascf;
    ap->shctx = ascf->counter_zone->data;
    ap->prefixes = ascf->prefix_zone ? ascf->prefix_zone->data : NULL;
    ap->primary = ap->rrp.peers;
    ap->announced = NULL;
    ap->slot = AFFINITY_NO_SLOT;

    /*
     * Servers with "resolve" may have changed the peer list since this
     * worker last looked (nginx 1.27.3+): the view is brought up to date
     * first, and the request keeps the one it was given.
     */

    ap->view = ngx_http_upstream_affinity_view(ascf, ap->primary, r->pool,
                                               r->connection->log);
    if (ap->view == NULL) {
        return NGX_ERROR;
    }

    /*
     * The key and the prompt are read once per request, not per try: a
     * retry after proxy_next_upstream routes the same session.
     */

    ctx = ngx_http_upstream_affinity_request(r, ascf);
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    ap->ctx = ctx;

    /*
     * Counted here, when the request is balanced, and not where the body
     * is read: $affinity_session may read it for a request that is never
     * balanced (in the log phase of a request that failed before).
     */

    if (ctx->fallback && ap->shctx->zone) {
        affinity_zone_count_fallback(ap->shctx->zone,
                                     (uint32_t) ctx->fallback - 1);
    }

    ngx_memzero(&ap->request, sizeof(affinity_request_t));

    if (ctx->keyed) {
        ap->request.has_key = ctx->generated ? AFFINITY_KEY_GENERATED
                                             : AFFINITY_KEY_CLIENT;
        ap->request.key_hash = ngx_http_upstream_affinity_key_hash(ascf,
                                                  ap->shctx->zone,
                                                  AFFINITY_STORE_PIN,
                                                  ctx->key.data, ctx->key.len);
        ap->request.ring_hash = affinity_ring_hash(ctx->key.data,
                                                   ctx->key.len);
    }

    if (ap->prefixes && ctx->nlevels) {
        ap->request.prefixes = ap->prefixes->zone;
        ap->request.levels = ctx->levels;
        ap->request.nlevels = (uint32_t) ctx->nlevels;
        ap->request.prefix_timeout = (uint32_t) ascf->prefix_timeout;
        ap->request.prefix_capacity = ascf->prefix_cache;
        ap->request.prompt_size = ctx->prompt_size;
    }

    if (ctx->continues) {
        ap->request.continues = 1;
        ap->request.owner = ctx->owner;
    }

    ap->request.timeout = (uint32_t) ascf->session_timeout;
    ap->request.rotate = (uint32_t) ngx_random();
    ap->request.row = ap->shctx->row;

    /* dead workers' requests given back, before any lock is taken */

    ngx_http_upstream_affinity_reap(ap->shctx, r->connection->log);

    return NGX_OK;
}


/*
 * What the balancer needs of a request: its session key, the stored
 * response it continues and its prompt levels, read from the headers, the
 * path and the body (parsed once for all).
 * Done once per request and upstream, by whoever asks first: the balancer,
 * or $affinity_session when proxy_set_header evaluates it, before the
 * balancer runs.  NULL on allocation failure only: a request without a
 * usable key or body is still routed.
 */

ngx_http_upstream_affinity_ctx_t *
ngx_http_upstream_affinity_request(ngx_http_request_t *r,
    ngx_http_upstream_affinity_srv_conf_t *ascf)
{
    ngx_int_t                           rc;
    ngx_http_upstream_affinity_ctx_t   *ctx;
    ngx_http_upstream_affinity_body_t   body;

    ctx = ngx_http_get_module_ctx(r, ngx_http_upstream_affinity_module);

    if (ctx && ctx->conf == ascf) {
        return ctx;
    }

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_upstream_affinity_ctx_t));
    if (ctx == NULL) {
        return NULL;
    }

    ctx->conf = ascf;

    ngx_memzero(&body, sizeof(ngx_http_upstream_affinity_body_t));

    rc = NGX_OK;

    if (ascf->session_zone) {
        rc = ngx_http_upstream_affinity_session_key(r, ascf, ctx, &body);
    }

    if (rc == NGX_OK && ascf->response_zone) {
        rc = ngx_http_upstream_affinity_continued(r, ascf, ctx, &body);
    }

    if (rc == NGX_OK && ascf->prefix_zone) {
        rc = ngx_http_upstream_affinity_prompt(r, ascf, ctx, &body);
    }

    ngx_http_upstream_affinity_body_unload(&body);

    if (rc != NGX_OK) {
        return NULL;
    }

    ctx->fallback = body.fallback;

    ngx_http_set_ctx(r, ctx, ngx_http_upstream_affinity_module);

    return ctx;
}


static ngx_int_t
ngx_http_upstream_get_affinity_peer(ngx_peer_connection_t *pc, void *data)
{
    ngx_http_upstream_affinity_peer_data_t  *ap = data;

    time_t                                 now;
    uint8_t                                state[AFFINITY_MAX_PEERS];
    uintptr_t                              m;
    ngx_uint_t                             i, n, usable, draining;
    affinity_balance_t                     balance;
    affinity_decision_t                    decision;
    ngx_http_upstream_rr_peer_t           *peer;
    ngx_http_upstream_affinity_shctx_t    *prefixes;
    ngx_http_upstream_rr_peers_t          *peers;
    ngx_http_upstream_rr_peer_data_t      *rrp;
    ngx_http_upstream_affinity_srv_conf_t *ascf;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, pc->log, 0,
                   "get affinity peer, try: %ui", pc->tries);

    rrp = &ap->rrp;
    ascf = ap->conf;
    peers = rrp->peers;

    ap->slot = AFFINITY_NO_SLOT;
    ap->ctx->timed = NULL;

    /* backup servers are chosen by round robin, as least_conn does */

    if (peers != ap->primary) {
        return ngx_http_upstream_affinity_round_robin(pc, ap);
    }

    pc->cached = 0;
    pc->connection = NULL;

    now = ngx_time();

    ngx_http_upstream_rr_peers_wlock(peers);

    /*
     * A peer list changed at run time since the request started, or one
     * without peers yet (all "resolve" servers unresolved), is round robin's.
     */

    if (ap->view->npeers == 0
        || ap->view->generation != ngx_http_upstream_affinity_config(peers))
    {
        ngx_http_upstream_rr_peers_unlock(peers);
        return ngx_http_upstream_affinity_round_robin(pc, ap);
    }

    /* a request the sticky module binds to a peer goes there */

    peer = ngx_http_upstream_affinity_hinted_peer(rrp, pc, &i);

    if (peer) {
        if (i < ap->view->npeers) {
            ngx_http_upstream_affinity_count(ap, &ap->view->peers[i]);
        }

        ap->ctx->route = AFFINITY_ROUTE_FALLBACK;
        ap->ctx->prefix_len = 0;

        goto found;
    }

    /*
     * Classify the peers as round robin would see them.  A failed peer
     * loses its sessions for good; a peer that is only busy for this request
     * (tried already, or at max_conns) keeps them, and so does a draining
     * one, which serves nothing else.
     */

    usable = 0;
    draining = 0;

    for (peer = peers->peer, i = 0;
         peer && i < ap->view->npeers;
         peer = peer->next, i++)
    {
        n = i / (8 * sizeof(uintptr_t));
        m = (uintptr_t) 1 << i % (8 * sizeof(uintptr_t));

        if ((peer->down && !ngx_http_upstream_affinity_draining(peer))
            || (peer->max_fails
                && peer->fails >= peer->max_fails
                && now - peer->checked <= peer->fail_timeout))
        {
            state[i] = AFFINITY_PEER_FAILED;

        } else if ((rrp->tried[n] & m)
                   || (peer->max_conns && peer->conns >= peer->max_conns))
        {
            state[i] = AFFINITY_PEER_BUSY;

        } else if (ngx_http_upstream_affinity_draining(peer)) {
            state[i] = AFFINITY_PEER_DRAINING;
            draining++;

        } else {
            state[i] = AFFINITY_PEER_USABLE;
            usable++;
        }
    }

    if (usable + draining == 0) {
        ngx_http_upstream_rr_peers_unlock(peers);
        return ngx_http_upstream_affinity_round_robin(pc, ap);
    }

    balance.factor = (double) ascf->factor / 1000;
    balance.slack = (double) ascf->slack;
    balance.engine_ttl = (uint32_t) ascf->engine_ttl;
    balance.reserved = 0;

    ap->request.now = (uint32_t) now;
    ap->request.now_ms = ngx_http_upstream_affinity_wall_msec();

    /*
     * The counter zone first, then the prefix index: always in this order,
     * so that workers routing through both cannot deadlock.
     */

    prefixes = ap->request.prefixes ? ap->prefixes : NULL;

    if (prefixes == ap->shctx) {
        prefixes = NULL;
    }

    ngx_shmtx_lock(&ap->shctx->shpool->mutex);

    if (prefixes) {
        ngx_shmtx_lock(&prefixes->shpool->mutex);
    }

    (void) affinity_route(ap->shctx->zone, ap->view->ring, ap->view->peers,
                          state, ap->view->npeers, &balance, &ap->request,
                          &decision);

    if (prefixes) {
        ngx_shmtx_unlock(&prefixes->shpool->mutex);
    }

    ngx_shmtx_unlock(&ap->shctx->shpool->mutex);

    if (decision.peer < 0) {
        ngx_http_upstream_rr_peers_unlock(peers);
        return ngx_http_upstream_affinity_round_robin(pc, ap);
    }

    for (peer = peers->peer, i = 0;
         i < (ngx_uint_t) decision.peer;
         peer = peer->next, i++)
    {
        /* void */
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, pc->log, 0,
                   "get affinity peer, route: %ui, peer: %ui %V",
                   (ngx_uint_t) decision.route, i, &peer->name);

    ap->slot = decision.slot;
    ap->ctx->route = decision.route;
    ap->ctx->prefix_len = decision.prefix_len;

    /*
     * The reply will tell whether the peer still held the probe's prefix;
     * a retry's reply is another peer's, and teaches nothing of an earlier
     * try's probe.
     */
    ap->ctx->probe_peer = decision.probe_length
                          ? ap->view->peers[decision.peer].id : 0;
    ap->ctx->probe_age = decision.probe_age;
    ap->ctx->probe_length = decision.probe_length;

    ngx_http_upstream_affinity_decided(ap, &decision, peers);

    if (ascf->store) {
        ngx_http_upstream_affinity_share(ap, &decision);
    }

found:

    if (now - peer->checked > peer->fail_timeout) {
        peer->checked = now;
    }

    pc->sockaddr = peer->sockaddr;
    pc->socklen = peer->socklen;
    pc->name = &peer->name;
    ngx_http_upstream_affinity_set_sid(pc, peer);

    peer->conns++;

    rrp->current = peer;
    ngx_http_upstream_affinity_peer_ref(peers, peer);

    n = i / (8 * sizeof(uintptr_t));
    m = (uintptr_t) 1 << i % (8 * sizeof(uintptr_t));

    rrp->tried[n] |= m;

    ngx_http_upstream_rr_peers_unlock(peers);

    return NGX_OK;
}


/*
 * What the decision weighed, kept for the reply's times (the peer's pace,
 * ..._usage.c) and $affinity_reason.  The other peer's name is copied:
 * a peer a resolver removes takes its name with it.
 */

static void
ngx_http_upstream_affinity_decided(ngx_http_upstream_affinity_peer_data_t *ap,
    affinity_decision_t *decision, ngx_http_upstream_rr_peers_t *peers)
{
    ngx_int_t                          i;
    ngx_http_upstream_rr_peer_t       *peer;
    ngx_http_upstream_affinity_ctx_t  *ctx;

    ctx = ap->ctx;

    ctx->timed = decision->slot != AFFINITY_NO_SLOT ? ap->shctx : NULL;
    ctx->timed_peer = ap->view->peers[decision->peer].id;
    ctx->timed_slot = decision->slot;
    ctx->queued = decision->queued;
    ctx->held_chars = decision->held_chars;
    ctx->estimate_us = decision->estimate_us;
    ctx->alternative_us = decision->alternative_us;
    ctx->alternative_len = 0;
    ctx->first_byte = 0;
    ctx->backlog = decision->backlog_chars;
    ctx->backlogged = (ctx->timed != NULL);

    if (decision->alternative < 0) {
        return;
    }

    for (peer = peers->peer, i = 0;
         peer && i < decision->alternative;
         peer = peer->next, i++)
    {
        /* void */
    }

    if (peer) {
        ctx->alternative_len = ngx_min(peer->name.len, NGX_SOCKADDR_STRLEN);
        ngx_memcpy(ctx->alternative, peer->name.data, ctx->alternative_len);
    }
}


/*
 * Round robin picks the peer when no primary is usable (it then moves on to
 * the backup servers, or answers NGX_BUSY); the request is still counted in
 * the chosen peer's in-flight counter.
 */

static ngx_int_t
ngx_http_upstream_affinity_round_robin(ngx_peer_connection_t *pc,
    ngx_http_upstream_affinity_peer_data_t *ap)
{
    ngx_int_t                     rc;
    ngx_uint_t                    i;
    ngx_http_upstream_rr_peer_t  *peer;

    rc = ngx_http_upstream_get_round_robin_peer(pc, &ap->rrp);

    ap->ctx->route = AFFINITY_ROUTE_FALLBACK;
    ap->ctx->prefix_len = 0;

    if (rc != NGX_OK) {
        return rc;
    }

    i = 0;

    for (peer = ap->rrp.peers->peer; peer; peer = peer->next) {
        if (peer == ap->rrp.current) {
            break;
        }

        i++;
    }

    if (peer == NULL) {
        return rc;
    }

    /*
     * Round robin answers only from the generation of the peer list the
     * request started with, so the indexes match the view it was given.
     */

    if (ap->rrp.peers == ap->primary) {
        if (i < ap->view->npeers) {
            ngx_http_upstream_affinity_count(ap, &ap->view->peers[i]);
        }

    } else if (i < ap->view->nbackup) {
        ngx_http_upstream_affinity_count(ap,
                                    &ap->view->peers[ap->view->npeers + i]);
    }

    return rc;
}


/*
 * Counts a request placed outside affinity_route() in the peer's slot.  A
 * slot that went to another peer meanwhile (peers that come and go share
 * the zone's 256 slots) is not counted on: the peer claims a slot anew.
 */

static void
ngx_http_upstream_affinity_count(ngx_http_upstream_affinity_peer_data_t *ap,
    affinity_peer_t *peer)
{
    uint32_t                             now, slot;
    ngx_http_upstream_affinity_shctx_t  *shctx;

    shctx = ap->shctx;
    now = (uint32_t) ngx_time();
    slot = peer->slot;

    if (affinity_zone_peer_acquire(shctx->zone, shctx->row, peer->id, slot,
                                   now)
        != 0)
    {
        ngx_shmtx_lock(&shctx->shpool->mutex);
        slot = affinity_zone_peer_slot(shctx->zone, peer->id, now);
        ngx_shmtx_unlock(&shctx->shpool->mutex);

        if (affinity_zone_peer_acquire(shctx->zone, shctx->row, peer->id,
                                       slot, now)
            != 0)
        {
            return;
        }
    }

    ap->slot = slot;
}


/*
 * What this decision taught, for the other instances (affinity_store): a
 * session pinned or moved, the peer that now holds the prompt's levels and
 * how far the prompt filled its modelled cache.  A session that stays
 * where it was pinned teaches nothing new.  And the request itself, as
 * load, with affinity_metrics.
 */

static void
ngx_http_upstream_affinity_share(ngx_http_upstream_affinity_peer_data_t *ap,
    affinity_decision_t *decision)
{
    ngx_uint_t                         i;
    uint64_t                           watched;
    uint8_t                            digest[AFFINITY_STORE_DIGEST];
    uint64_t                           hashes[AFFINITY_MAX_LEVELS];
    affinity_store_message_t           m;
    ngx_http_upstream_affinity_ctx_t  *ctx;

    ctx = ap->ctx;

    ngx_memzero(&m, sizeof(affinity_store_message_t));
    m.peer = ap->view->peers[decision->peer].id;

    /*
     * With affinity_metrics, the request itself: the other instances count
     * it on the peer's load until its engine reports again (..._store.c),
     * or until it ends (ngx_http_upstream_free_affinity_peer()).
     */

    if (ap->conf->engine_ttl) {
        watched = decision->watched >= 0
                  ? ap->view->peers[decision->watched].id : 0;

        ap->announced = ngx_http_upstream_affinity_store_announce(ap->conf,
                                   m.peer, ap->slot, watched,
                                   decision->watched_unheard);
    }

    /*
     * How far the prompt filled the peer's modelled cache, before its
     * levels: the others' models of that cache age as much, and then hold
     * the prompt as the most recent there (affinity_prefixes_filled()).
     */

    if (decision->cache_chars) {
        m.kind = AFFINITY_STORE_FILLED;
        m.chars = decision->cache_chars;
        ngx_http_upstream_affinity_store_publish(ap->conf, &m);
    }

    /*
     * A keyed request is pinned, or pinned anew, by every outcome but a hit
     * of its pin (a generated key's first request is reported by its
     * prompt's outcome, and pinned all the same).
     */

    if (ap->request.has_key
        && ap->conf->session_zone
        && decision->route != AFFINITY_ROUTE_SESSION_HIT)
    {
        ngx_http_upstream_affinity_store_digest(ap->conf, AFFINITY_STORE_PIN,
                                                ctx->key.data, ctx->key.len,
                                                digest);
        m.kind = AFFINITY_STORE_PIN;
        m.digest = digest;
        ngx_http_upstream_affinity_store_publish(ap->conf, &m);
    }

    if (ap->request.nlevels) {
        for (i = 0; i < ap->request.nlevels && i < AFFINITY_MAX_LEVELS; i++) {
            hashes[i] = ap->request.levels[i].hash;
        }

        m.kind = AFFINITY_STORE_LEVELS;
        m.digest = NULL;
        m.levels = hashes;
        m.nlevels = i;
        ngx_http_upstream_affinity_store_publish(ap->conf, &m);
    }
}


static void
ngx_http_upstream_free_affinity_peer(ngx_peer_connection_t *pc, void *data,
    ngx_uint_t state)
{
    ngx_http_upstream_affinity_peer_data_t  *ap = data;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, pc->log, 0,
                   "free affinity peer %ui", state);

    if (ap->slot != AFFINITY_NO_SLOT) {
        if (state & NGX_PEER_FAILED) {
            affinity_zone_peer_failed(ap->shctx->zone, ap->slot);
        }

        /* a try that ends without its first byte leaves the backlog too */
        ngx_http_upstream_affinity_started(ap->ctx);

        affinity_zone_peer_release(ap->shctx->zone, ap->shctx->row,
                                   ap->slot);
        ap->slot = AFFINITY_NO_SLOT;
    }

    /*
     * The end of a try the other instances were told of: without it they
     * would count it on the peer's load until its engine reports again,
     * and every peer would look busier there than here.
     */

    if (ap->announced) {
        ngx_http_upstream_affinity_store_ended(ap->conf, ap->announced);
        ap->announced = NULL;
    }

    ngx_http_upstream_free_round_robin_peer(pc, &ap->rrp, state);
}



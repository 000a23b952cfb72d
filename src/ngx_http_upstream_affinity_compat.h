
/*
 * Differences between the nginx versions the module builds against, kept in
 * one place.  Each macro says which nginx release changed what.
 */


#ifndef _NGX_HTTP_UPSTREAM_AFFINITY_COMPAT_H_INCLUDED_
#define _NGX_HTTP_UPSTREAM_AFFINITY_COMPAT_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/*
 * 1.27.3 made upstream peers in a shared zone reference-counted (servers
 * with "resolve" may be removed while requests use them): a balancer takes
 * a reference on the peer it returns.  Before that there is nothing to do.
 */
#if (nginx_version >= 1027003)
#define ngx_http_upstream_affinity_peer_ref(peers, peer)                      \
    ngx_http_upstream_rr_peer_ref(peers, peer)
#else
#define ngx_http_upstream_affinity_peer_ref(peers, peer)
#endif


/*
 * 1.27.3 lets servers with "resolve" in a shared zone change the peer list
 * at run time, for the balancers whose upstream flags include
 * NGX_HTTP_UPSTREAM_MODIFY.  The list then has a generation,
 * *peers->config, that every change increments; a request whose
 * generation is not the current one is left to round robin (which answers
 * NGX_BUSY, as for the stock balancers), and each worker rebuilds its view
 * of the peers when it sees a new generation.
 */
#if (NGX_HTTP_UPSTREAM_MODIFY)
#define NGX_HTTP_UPSTREAM_AFFINITY_MODIFY  NGX_HTTP_UPSTREAM_MODIFY
#else
#define NGX_HTTP_UPSTREAM_AFFINITY_MODIFY  0
#endif

#if (NGX_HTTP_UPSTREAM_ZONE && nginx_version >= 1027003)
#define ngx_http_upstream_affinity_config(peers)                              \
    ((peers)->config ? *(peers)->config : 0)
#else
#define ngx_http_upstream_affinity_config(peers)  0
#endif


/*
 * 1.29.6 gave peers a session id ("sid", a server's "route=") that the
 * balancer passes on with the chosen address, and added the sticky module:
 * it hands the balancer the route a request is bound to (pc->hint), and
 * every balancer sends the request there while that peer is usable.
 */
#if (NGX_HTTP_UPSTREAM_SID)
#define ngx_http_upstream_affinity_set_sid(pc, peer)  (pc)->sid = &(peer)->sid
#define ngx_http_upstream_affinity_hinted_peer(rrp, pc, p)                    \
    ngx_http_upstream_get_rr_peer_by_sid(rrp, (pc)->hint, p, 0)
#else
#define ngx_http_upstream_affinity_set_sid(pc, peer)
#define ngx_http_upstream_affinity_hinted_peer(rrp, pc, p)  NULL
#endif


/*
 * 1.29.6 also added the "drain" server state (with the sticky module):
 * peer->down is NGX_HTTP_UPSTREAM_DRAINING, round robin skips the peer and
 * only requests bound to it reach it.  Here it keeps the sessions pinned to
 * it and takes nothing new.
 */
#if (NGX_HTTP_UPSTREAM_STICKY)
#define ngx_http_upstream_affinity_draining(peer)                             \
    ((peer)->down == NGX_HTTP_UPSTREAM_DRAINING)
#else
#define ngx_http_upstream_affinity_draining(peer)  0
#endif


/*
 * 1.29.6 also calls pc->notify when the response header arrives
 * (NGX_HTTP_UPSTREAM_NOTIFY_HEADER); the sticky module chains it for its
 * "learn" mode.  This balancer leaves it unset: it records pins and prompt
 * levels when it routes, since the load bound must see them at once, and
 * needs no macro for it.
 */


#endif /* _NGX_HTTP_UPSTREAM_AFFINITY_COMPAT_H_INCLUDED_ */

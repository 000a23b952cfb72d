
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
 * 1.23.0 replaced the arrays of multi-valued request headers (cookies) with
 * linked lists and changed ngx_http_parse_multi_header_lines() to take the
 * request and the list.
 */
#if (nginx_version >= 1023000)
#define ngx_http_upstream_affinity_parse_cookie(r, name, value)               \
    ngx_http_parse_multi_header_lines(r, (r)->headers_in.cookie, name, value)
#define ngx_http_upstream_affinity_cookie_found(rc)  ((rc) != NULL)
#else
#define ngx_http_upstream_affinity_parse_cookie(r, name, value)               \
    ngx_http_parse_multi_header_lines(&(r)->headers_in.cookies, name, value)
#define ngx_http_upstream_affinity_cookie_found(rc)  ((rc) != NGX_DECLINED)
#endif


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
 * With NGX_HTTP_UPSTREAM_MODIFY (1.27.3+, zone + "resolve") the peer list can
 * change at run time; the balancer then notices a different peer count and
 * hands the request to round robin until the next reload rebuilds its ring.
 */
#if (NGX_HTTP_UPSTREAM_MODIFY)
#define ngx_http_upstream_affinity_peers_changed(peers, n)                    \
    ((peers)->number != (n))
#else
#define ngx_http_upstream_affinity_peers_changed(peers, n)  0
#endif


/*
 * 1.29.6 gave peers a session id ("sid") that the balancer passes on with
 * the chosen address.
 */
#if (NGX_HTTP_UPSTREAM_SID)
#define ngx_http_upstream_affinity_set_sid(pc, peer)  (pc)->sid = &(peer)->sid
#else
#define ngx_http_upstream_affinity_set_sid(pc, peer)
#endif


#endif /* _NGX_HTTP_UPSTREAM_AFFINITY_COMPAT_H_INCLUDED_ */

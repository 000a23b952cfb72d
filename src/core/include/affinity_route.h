/*
 * affinity_route.h - routing one request: the balance, the request as the core
 * sees it, the decision.
 * Included by affinity_core.h.
 */

#ifndef AFFINITY_ROUTE_H
#define AFFINITY_ROUTE_H

#include "affinity_api.h"
#include "affinity_zone.h"
#include "affinity_prefixes.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    AFFINITY_PEER_USABLE = 0,   /* may take the request */
    AFFINITY_PEER_BUSY,         /* tried for this request or at max_conns:
                                   skip it now, keep pins to it */
    AFFINITY_PEER_FAILED,       /* down or failed (max_fails): pins move */
    AFFINITY_PEER_DRAINING      /* being taken out (nginx "drain"): serves
                                   the sessions pinned to it, nothing new */
} affinity_peer_state_e;

typedef struct {
    double      factor;     /* bound = max(factor * mean, mean + slack) */
    double      slack;
    uint32_t    engine_ttl; /* seconds an engine's own load figure counts
                               (affinity_engine_answer()), 0: never */
    uint32_t    reserved;
} affinity_balance_t;

typedef enum {
    AFFINITY_ROUTE_NONE = 0,
    AFFINITY_ROUTE_SESSION_HIT,     /* served by its pinned peer */
    AFFINITY_ROUTE_SESSION_NEW,     /* first request of a key: pinned now */
    AFFINITY_ROUTE_SESSION_MOVED,   /* pinned peer failed, gone or presumed
                                       empty (cache model): pinned anew */
    AFFINITY_ROUTE_SESSION_SPILL,   /* pinned peer over the bound or busy:
                                       served elsewhere, the pin follows */
    AFFINITY_ROUTE_FALLBACK,        /* no key and no prompt levels:
                                       weighted least in-flight */
    AFFINITY_ROUTE_PREFIX_HIT,      /* to a peer that served the longest
                                       known prefix of the prompt */
    AFFINITY_ROUTE_PREFIX_NEW,      /* no level held by a peer that may take
                                       it, or a short shared one copied to
                                       a sooner peer: least loaded, ring
                                       order ties */
    AFFINITY_ROUTE_RESPONSE_HIT,    /* to the peer that stored the response
                                       or conversation it continues */
    AFFINITY_ROUTE_RESPONSE_LOST    /* continues one whose peer is unknown,
                                       failed or gone: routed as usual */
} affinity_route_e;

/*
 * A generated key is new by construction: its first request is placed by
 * its prompt (or its ring position), and that is the outcome reported, not
 * AFFINITY_ROUTE_SESSION_NEW, so that the counters show how generated-id
 * traffic really found its cache.  The pin is made all the same.
 */
typedef enum {
    AFFINITY_KEY_NONE = 0,
    AFFINITY_KEY_CLIENT,            /* sent by the client */
    AFFINITY_KEY_GENERATED          /* made up for this request */
} affinity_key_e;


/* affinity_request_t.prefix_capacity: no cache model, whatever the engines
 * report. */
#define AFFINITY_CAPACITY_OFF  UINT64_MAX

typedef struct {
    uint64_t    key_hash;   /* affinity_zone_key_hash() of the key */
    uint64_t    ring_hash;  /* affinity_ring_hash() of the key */
    uint32_t    has_key;    /* affinity_key_e: a session key (the zone
                               holds sessions), and where it came from */
    uint32_t    now;        /* seconds, monotonic enough for idle expiry */
    uint32_t    timeout;    /* idle expiry of pins, seconds */
    uint64_t    now_ms;     /* the wall clock in milliseconds: when a pin
                               is made (0: now's seconds) */
    uint32_t    rotate;     /* varies per request: breaks fallback ties */
    uint32_t    row;        /* the worker's row, or AFFINITY_NO_ROW */
    uint32_t    continues;  /* continues a stored response or
                               conversation (response_affinity) */

    /* prompt prefixes (affinity_json_prompt()), or none */
    affinity_zone_t         *prefixes;      /* the prefix index zone */
    const affinity_level_t  *levels;        /* shortest first */
    uint32_t                 nlevels;
    uint32_t                 prefix_timeout;

    /* with continues: the id of the peer that stored what the request
       continues (affinity_responses_owner()), 0 if unknown */
    uint64_t                 owner;

    /* with prefixes: the tokens each peer's KV cache holds, 0 if unknown,
       AFFINITY_CAPACITY_OFF for no cache model at all.
       A holder that has since been sent prompts of about that size (at
       AFFINITY_CHARS_PER_TOKEN) that it did not hold is presumed to have
       evicted a prefix, and is not followed for it.  0: each peer's size
       as its engine last reported it (affinity_engine_answer()), if
       it did, else as its replies taught it (affinity_prefixes_replied()),
       if they did */
    uint64_t                 prefix_capacity;
    /* with prefix_capacity: the prompt's length in characters, or an
       estimate from above (the body's size, or the length of the next
       scheduled level when smaller); 0: its longest level's */
    uint64_t                 prompt_size;
} affinity_request_t;

typedef struct {
    int32_t     peer;       /* index into the peers array, -1 if none */
    uint32_t    route;      /* affinity_route_e */
    uint32_t    prefix_len; /* code points of the level matched, or 0 */
    uint32_t    slot;       /* the counter slot the request is counted in
                               (to release), or AFFINITY_NO_SLOT */
    /* with prefixes and no capacity known for the peer: the prompt
       extends one the peer is watched with (a probe), and its reply's
       cached tokens tell whether the peer held it still, probe_age
       characters of its modelled cache later: pass them on to
       affinity_prefixes_replied().  probe_length 0: none */
    uint32_t    probe_age;
    uint32_t    probe_length;
    /* with prefixes and a modelled cache for the peer: the characters of
       the prompt it was not presumed to hold, by which its modelled cache
       advanced (for other instances to count: AFFINITY_STORE_FILLED,
       affinity_prefixes_filled()); 0: none */
    uint32_t    cache_chars;
    /* with affinity_store and affinity_metrics, other instances routing:
       the first peer this decision weighed while this instance had
       requests there not yet heard (index into the peers array, -1 if
       none), and how many it counted: to watch
       (affinity_watch_announced()) */
    int32_t     watched;
    uint32_t    watched_unheard;
    /* the requests in flight on the chosen peer before this one, as
       routing counted them: for affinity_reply_times_t.queued */
    uint32_t    queued;
    /* the characters of the prompt the chosen peer was presumed to hold
       (0: none known), and its estimated time to first token there in
       microseconds (-1: its pace is not learned yet, affinity_peer_pace) */
    uint32_t    held_chars;
    int64_t     estimate_us;
    /* the best other peer weighed (index, -1 if none) and its estimate
       (-1: not learned): for $affinity_reason */
    int32_t     alternative;
    /* the characters of the prompt the chosen peer must prefill, counted in
       its backlog until affinity_zone_peer_started() */
    uint32_t    backlog_chars;
    int64_t     alternative_us;
} affinity_decision_t;

/*
 * Chooses a peer for a request among peers[0..npeers), whose states for
 * this request are states[0..npeers) (affinity_peer_state_e), and counts it
 * in the chosen peer's in-flight counter in zone (the zone holding the
 * counters, and the session table when it is a session zone).
 *
 * A request that continues a stored response goes to its owner whatever
 * its load, while the owner serves pins (usable or draining), and a session
 * key is pinned there too; when the owner is unknown or cannot serve, it is
 * routed as below and the route is AFFINITY_ROUTE_RESPONSE_LOST.
 *
 * With a session key: the pinned peer while it is usable and under the load
 * bound; when it is merely busy or overloaded, a spill (with prompt levels
 * routed by the prompt as below, else to the previous pin or the next peer
 * on the ring) that the pin follows; with prompt levels, also a spill to
 * the soonest other peer when the pinned one would queue the request and
 * that one has a running slot free and is sooner even with the history
 * the pin holds counted eight times; a new pin, placed by
 * the prompt (below) or on the ring with bounded load, when the key is new
 * or its peer failed, left or is presumed to hold none of the prompt.
 * Else, with prompt levels: the longest level held by a usable peer under
 * the bound wins; among its recent peers the least loaded one, ties to the
 * least loaded peer of all (ties in ring order from the longest level),
 * but at the prompt's longest scheduled level and the turn levels past it
 * the most recent one.  When the level has as many recent peers as an
 * entry remembers (widely held), a level shorter than 4,096 characters
 * goes to the least loaded peer of all, held or not, and a longer one to
 * the prompt's ring peer (from its longest scheduled level) unless the
 * chosen holder has fewer in flight.  If no level is held, the least
 * loaded usable peer, ties in ring order from the longest level.  In a
 * burst through several instances (affinity_store: requests presumed
 * placed beside this one, affinity_zone_unheard_beside()), such a prompt,
 * and a short widely held level's, goes instead to a peer drawn by its
 * room below the level they fill the peers to (docs/routing.md, "Several
 * instances").
 * Else: the usable peer with the least in-flight per weight.
 * Every level of the prompt is then recorded for the chosen peer.  The
 * bound is soft: when every usable peer is over it, the least loaded one is
 * chosen, so a request is never refused for load.
 *
 * A peer whose slot (peers[i].slot) is not its own, or unset, is looked up
 * or gets one claimed here; decision->slot is the slot the request was
 * counted in (to release it).
 *
 * Caller holds the lock of zone and of request->prefixes.  No allocation;
 * at most 256 peers are considered.  Returns 0, or -1 when no peer is
 * usable (decision->peer is then -1 and nothing is counted).
 */
AFFINITY_API int affinity_route(affinity_zone_t *zone,
    const affinity_ring_t *ring, const affinity_peer_t *peers,
    const uint8_t *states, size_t npeers, const affinity_balance_t *balance,
    const affinity_request_t *request, affinity_decision_t *decision)
    AFFINITY_NOEXCEPT;


#ifdef __cplusplus
}
#endif

#endif /* AFFINITY_ROUTE_H */

/*
 * affinity_core.h - the C API of the affinity balancer's C++17 core.
 *
 * This is the only header the nginx shim includes.  It exposes opaque
 * handles and plain-old-data structs; no C++ type and no exception crosses
 * it (every function is noexcept on the C++ side and catches internally).
 *
 * Concurrency contract: the zone functions operate on memory shared by all
 * nginx workers.  Functions marked "caller holds the zone lock" must be
 * called with the mutex the caller associates with the zone held (the shim
 * uses the slab pool's mutex, which nginx's master force-unlocks when a
 * worker dies holding it).  The in-flight counters are updated atomically
 * and may be changed without the lock.
 */

#ifndef AFFINITY_CORE_H
#define AFFINITY_CORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define AFFINITY_NOEXCEPT noexcept
extern "C" {
#else
#define AFFINITY_NOEXCEPT
#endif

#define AFFINITY_API __attribute__((visibility("default")))


/*
 * The release of the module and its core, one string for both: the status
 * page, the Prometheus info metric, the module's startup notice, the Debian
 * package and the container image all read it from here.
 */
#define AFFINITY_VERSION  "0.9.0"


/* ---- hashing ---------------------------------------------------------- */

/* XXH3 64-bit of data with the given seed. */
AFFINITY_API uint64_t affinity_hash(const void *data, size_t len,
    uint64_t seed) AFFINITY_NOEXCEPT;

/*
 * The stable identity of an upstream peer, derived from its address text
 * (nginx's peer->name, e.g. "10.0.0.1:8000").  Independent of the peer's
 * position in the list and of any zone, so pins survive reloads and peer
 * list reordering.  Never 0.
 */
AFFINITY_API uint64_t affinity_peer_id(const char *name, size_t len)
    AFFINITY_NOEXCEPT;

/*
 * The hash that places a key on the consistent-hash ring.  Fixed seed, so
 * several nginx instances with the same peer list place a key alike.
 */
AFFINITY_API uint64_t affinity_ring_hash(const void *key, size_t len)
    AFFINITY_NOEXCEPT;


/* ---- peers ----------------------------------------------------------- */

/* The most peers an upstream may have for the balancer. */
#define AFFINITY_MAX_PEERS  256

/* A peer as the balancer knows it, in the order of the upstream's list. */
typedef struct {
    uint64_t    id;         /* affinity_peer_id() */
    uint32_t    weight;     /* nginx "weight=", >= 1 */
    uint32_t    slot;       /* its counter slot in the zone when the list
                               was built, or AFFINITY_NO_SLOT; routing
                               checks it and claims another if it went to
                               another peer since */
} affinity_peer_t;


/* ---- consistent-hash ring --------------------------------------------- */

typedef struct affinity_ring_s  affinity_ring_t;

/*
 * A weighted ring: each peer gets points_per_weight * weight points, laid
 * out in memory the caller provides.  affinity_ring_size() tells how many
 * bytes (0 on bad arguments: no peers, more than AFFINITY_MAX_PEERS, no
 * points); affinity_ring_build() fills mem (8-byte aligned, at least that
 * size) and returns it as the ring, or NULL on bad arguments.  Peer indexes
 * returned by the ring are positions in the array given here.  No
 * allocation; not for the hot path.
 */
AFFINITY_API size_t affinity_ring_size(const affinity_peer_t *peers,
    size_t npeers, uint32_t points_per_weight) AFFINITY_NOEXCEPT;
AFFINITY_API affinity_ring_t *affinity_ring_build(void *mem, size_t size,
    const affinity_peer_t *peers, size_t npeers, uint32_t points_per_weight)
    AFFINITY_NOEXCEPT;
AFFINITY_API size_t affinity_ring_points(const affinity_ring_t *ring)
    AFFINITY_NOEXCEPT;

/*
 * Writes up to max distinct peer indexes in ring order, starting at the
 * first point at or after hash.  Returns how many were written.
 */
AFFINITY_API size_t affinity_ring_walk(const affinity_ring_t *ring,
    uint64_t hash, uint32_t *out, size_t max) AFFINITY_NOEXCEPT;


/* ---- shared-memory zone ----------------------------------------------- */

typedef struct affinity_zone_s  affinity_zone_t;

typedef enum {
    AFFINITY_ZONE_SESSIONS = 1,     /* session key -> pinned peer */
    AFFINITY_ZONE_PREFIXES,         /* prompt level -> recent peers */
    AFFINITY_ZONE_RESPONSES         /* response id -> the peer storing it */
} affinity_zone_kind_e;

typedef enum {
    AFFINITY_ATTACH_CREATED = 0,    /* fresh region, initialized */
    AFFINITY_ATTACH_REUSED,         /* valid region from an earlier cycle */
    AFFINITY_ATTACH_INCOMPATIBLE,   /* valid region of another layout/kind */
    AFFINITY_ATTACH_TOO_SMALL       /* region cannot hold a table */
} affinity_attach_e;

/* Smallest region a zone can be built in. */
#define AFFINITY_ZONE_MIN_SIZE  (96 * 1024)

/* Peer counter slots of a zone, and the most worker rows it may have. */
#define AFFINITY_PEER_SLOTS        256
#define AFFINITY_MAX_WORKER_ROWS   256

/*
 * Attaches to a region of shared memory: initializes it when it does not
 * hold a zone yet (seed drawn from OpenSSL's RAND_bytes), or validates the
 * header left by an earlier cycle.  rows: the worker rows a new zone gets
 * (one per worker process that may run at once, old workers finishing
 * after a reload included; at least 4, at most 256, and at most a quarter
 * of the region).  On failure *zone is NULL and, if err is given, a
 * NUL-terminated reason is written to it.  The region must be 64-byte
 * aligned; the zone keeps only offsets inside it.
 */
AFFINITY_API affinity_attach_e affinity_zone_attach(void *region, size_t size,
    affinity_zone_kind_e kind, uint32_t rows, affinity_zone_t **zone,
    char *err, size_t err_len) AFFINITY_NOEXCEPT;

/*
 * Why a request was balanced without its body (logged once per worker,
 * counted for every request in the zone that counts its upstream's load).
 */
typedef enum {
    AFFINITY_FALLBACK_NOT_BUFFERED = 0, /* proxy_request_buffering off */
    AFFINITY_FALLBACK_NOT_JSON,         /* Content-Type is not JSON */
    AFFINITY_FALLBACK_NO_BODY,          /* POST, PUT or PATCH without one */
    AFFINITY_FALLBACK_TOO_LARGE,        /* over 16m */
    AFFINITY_FALLBACK_READ_ERROR,       /* its temporary file unreadable */
    AFFINITY_FALLBACK_PARSE_ERROR,      /* not a valid JSON object */
    AFFINITY_FALLBACK_NO_PROMPT,        /* no messages, prompt or input */
    AFFINITY_FALLBACK_NO_MEMORY,        /* the worker could not read it */
    AFFINITY_FALLBACKS
} affinity_fallback_e;

typedef struct {
    uint32_t    kind;
    uint32_t    layout_version;
    uint64_t    seed;           /* per-zone seed of key hashes */
    uint64_t    capacity;       /* entries the table holds */
    uint64_t    used;           /* live entries */
    uint64_t    inserts;        /* entries added (sessions pinned, ids
                                   learned) */
    uint64_t    evictions;      /* entries dropped to make room (LRU) */
    uint64_t    expiries;       /* entries dropped after the idle timeout */
    uint32_t    peer_slots;     /* capacity of the per-peer counter table */
    uint32_t    peer_slots_used;
    uint32_t    peer_slots_reclaimed;   /* slots handed to another peer */
    uint32_t    rows;           /* worker rows */
    uint64_t    peer_slots_missing;     /* peers that found no slot */
    uint32_t    rows_used;
    uint32_t    reserved;
    uint64_t    rows_missing;   /* workers that found no row */
    uint64_t    rows_reaped;    /* rows of dead workers freed */
    uint64_t    inflight_recovered;     /* their requests given back */
    uint64_t    fallbacks[AFFINITY_FALLBACKS];  /* by affinity_fallback_e */
    uint64_t    instance;       /* the instance's id in the store's
                                   messages: random, not the seed */
    uint64_t    conflicts;      /* response ids refused to another peer */
} affinity_zone_info_t;

/* Caller holds the zone lock for exact figures. */
AFFINITY_API void affinity_zone_info(const affinity_zone_t *zone,
    affinity_zone_info_t *info) AFFINITY_NOEXCEPT;

/* Hash of a request key with the zone's seed. */
AFFINITY_API uint64_t affinity_zone_key_hash(const affinity_zone_t *zone,
    const void *key, size_t len) AFFINITY_NOEXCEPT;

#define AFFINITY_NO_SLOT  UINT32_MAX

/*
 * Finds or claims the counter slot of a peer id; now is the time in
 * seconds.  When every slot is taken, the slot of a peer with nothing in
 * flight and no request for a minute (one that left the configuration) is
 * handed over (its counters restart).  Caller holds the zone lock.  Returns
 * AFFINITY_NO_SLOT when no slot can be had (counted in peer_slots_missing).
 */
AFFINITY_API uint32_t affinity_zone_peer_slot(affinity_zone_t *zone,
    uint64_t peer_id, uint32_t now) AFFINITY_NOEXCEPT;

/* The counter slot of a peer id, or AFFINITY_NO_SLOT if it has none.
 * Caller holds the zone lock. */
AFFINITY_API uint32_t affinity_zone_peer_find(const affinity_zone_t *zone,
    uint64_t peer_id) AFFINITY_NOEXCEPT;

/* affinity_route_e values, for per-outcome counters */
#define AFFINITY_ROUTES  10

typedef struct {
    uint64_t    id;
    int64_t     inflight;
    uint64_t    requests;
    uint64_t    failures;   /* tries reported failed */
    int64_t     pins;       /* sessions pinned to the peer */
    uint64_t    routes[AFFINITY_ROUTES];    /* requests by affinity_route_e */
    int64_t     engine_load;    /* running + waiting as the engine last
                                   reported it, -1 if it never did */
    double      cache_usage;    /* its KV cache usage, 0..1, -1 unknown */
    uint32_t    engine_time;    /* when it reported them, seconds */
    uint32_t    reserved;
    int64_t     engine_elsewhere;   /* requests other instances said they
                                       sent it since, less those they said
                                       ended: below 0 when more ended
                                       (affinity_store) */
    uint64_t    cache_tokens;   /* its KV cache's size as the engine
                                   reported it, 0 if it never did */
    uint64_t    learned_tokens; /* in a prefix zone: the prompt tokens a
                                   prefix lasts in its cache, as its replies
                                   taught (affinity_prefixes_replied()), 0
                                   if they taught none */
    int64_t     unheard;        /* requests announced to the store that
                                   this instance has not yet read back
                                   (affinity_zone_peer_announced()) */
} affinity_peer_stats_t;

/*
 * What a peer's replies teach of its speed (its pace), per peer in its
 * counter slot: the prefill time of a prompt token it does not hold, the
 * decode time of an output token, and the wait before prefill by how many
 * requests it had in flight when the request was sent.
 */
#define AFFINITY_PACE_QUEUES  12

/* One reply, as nginx observed it. */
typedef struct {
    uint32_t    first_ms;       /* to the response header, or, streamed,
                                   to the first byte of its body */
    uint32_t    total_ms;       /* to its last byte */
    uint32_t    queued;         /* affinity_decision_t.queued of the try */
    uint32_t    streamed;       /* 1: first_ms is the first body byte of
                                   a stream, 0: the header of a whole
                                   body, which comes with the last token */
    uint32_t    prompt_chars;   /* characters of the prompt, 0 unknown */
    uint32_t    prompt_tokens;  /* the reply's usage; 0 unknown */
    uint32_t    cached_tokens;
    uint32_t    output_tokens;  /* 0 unknown */
} affinity_reply_times_t;

/* Lock-free: learns from a reply of the peer in slot (whose id is
 * peer_id, so that a slot handed to another peer since is left alone).
 * Figures move by at most an eighth at a time and ignore replies far off
 * the rest; a reply without usage teaches what its times alone can. */
AFFINITY_API void affinity_zone_peer_timed(affinity_zone_t *zone,
    uint32_t slot, uint64_t peer_id, const affinity_reply_times_t *times)
    AFFINITY_NOEXCEPT;

typedef struct {
    uint32_t    replies;        /* learned from */
    uint32_t    prefill_ns;     /* per prompt token not held; 0 unknown */
    uint32_t    decode_us;      /* per output token; 0 unknown */
    uint32_t    chars_per_token;    /* x 256; 0 unknown */
    int64_t     wait_us[AFFINITY_PACE_QUEUES];  /* by requests in flight
                                                   when sent; -1 unknown */
} affinity_peer_pace_t;

/* Lock-free: the pace of the peer in slot. */
AFFINITY_API void affinity_zone_peer_pace(const affinity_zone_t *zone,
    uint32_t slot, affinity_peer_pace_t *pace) AFFINITY_NOEXCEPT;

/* Lock-free; counters are read atomically one by one. */
AFFINITY_API void affinity_zone_peer_stats(const affinity_zone_t *zone,
    uint32_t slot, affinity_peer_stats_t *stats) AFFINITY_NOEXCEPT;

/* Lock-free: the end of a request on a peer (the start is counted by
 * affinity_route() or affinity_zone_peer_acquire()), in the slot and in the
 * row of the worker that counted it (AFFINITY_NO_ROW if it has none). */
AFFINITY_API void affinity_zone_peer_release(affinity_zone_t *zone,
    uint32_t row, uint32_t slot) AFFINITY_NOEXCEPT;

/* Lock-free: counts a request placed outside affinity_route() (by round
 * robin on a backup peer, or by an nginx sticky hint), as a fallback; now
 * is the time in seconds.  Returns 0, or -1 when slot is not the counter
 * slot of peer_id (any more): nothing is counted, and the caller may claim
 * the peer's slot (affinity_zone_peer_slot()) and try again. */
AFFINITY_API int affinity_zone_peer_acquire(affinity_zone_t *zone,
    uint32_t row, uint64_t peer_id, uint32_t slot, uint32_t now)
    AFFINITY_NOEXCEPT;

/* Lock-free: counts a request balanced without its body, by reason. */
AFFINITY_API void affinity_zone_count_fallback(affinity_zone_t *zone,
    uint32_t reason) AFFINITY_NOEXCEPT;

/* Lock-free: counts a try that failed on the peer. */
AFFINITY_API void affinity_zone_peer_failed(affinity_zone_t *zone,
    uint32_t slot) AFFINITY_NOEXCEPT;


/* ---- worker rows ------------------------------------------------------ */

/*
 * In-flight counts that survive the death of a worker.  Each worker claims
 * a row when it starts and counts its requests there as well as in the
 * peers' slots.  When a worker dies without giving its requests back
 * (crash, OOM, kill -9), a surviving worker that finds its row's owner gone
 * gives them back for it.
 */

#define AFFINITY_NO_ROW  UINT32_MAX

typedef struct {
    uint32_t    row;
    uint32_t    reserved;
    uint64_t    pid;
    uint64_t    start;      /* affinity_process_start() of pid */
} affinity_worker_t;

/* The row of a process (the one it has, else a free one), or
 * AFFINITY_NO_ROW when all are taken.  Caller holds the zone lock. */
AFFINITY_API uint32_t affinity_zone_worker_claim(affinity_zone_t *zone,
    uint64_t pid, uint64_t start, uint32_t now) AFFINITY_NOEXCEPT;

/* A worker that exits frees its row.  Caller holds the zone lock. */
AFFINITY_API void affinity_zone_worker_release(affinity_zone_t *zone,
    uint32_t row, uint64_t pid) AFFINITY_NOEXCEPT;

/* Lock-free: whether it is the caller's turn to look for dead workers;
 * true for at most one caller per interval seconds. */
AFFINITY_API int affinity_zone_reap_due(affinity_zone_t *zone, uint32_t now,
    uint32_t interval) AFFINITY_NOEXCEPT;

/* Lock-free: the rows in use, for a liveness check made outside the lock.
 * Returns how many were written to out. */
AFFINITY_API size_t affinity_zone_workers(const affinity_zone_t *zone,
    affinity_worker_t *out, size_t cap) AFFINITY_NOEXCEPT;

/* Frees the row of a worker found dead, if it still has it, and gives its
 * requests back, setting *recovered to how many; returns 1, or 0 when the
 * row changed hands since the snapshot.  Caller holds the zone lock. */
AFFINITY_API int affinity_zone_worker_reap(affinity_zone_t *zone,
    const affinity_worker_t *worker, uint64_t *recovered) AFFINITY_NOEXCEPT;

/* The start time of a process, 0 if the system does not tell (Linux:
 * /proc/PID/stat). */
AFFINITY_API uint64_t affinity_process_start(uint64_t pid) AFFINITY_NOEXCEPT;

/* Whether the process with pid and start time (0: unknown) still runs. */
AFFINITY_API int affinity_process_alive(uint64_t pid, uint64_t start)
    AFFINITY_NOEXCEPT;


/* ---- selection -------------------------------------------------------- */

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
                               (affinity_zone_peer_polled()), 0: never */
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
                                       it: least loaded, ring order ties */
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

typedef struct affinity_level_s  affinity_level_t;

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

    /* prompt prefixes (affinity_prompt_levels()), or none */
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
       as its engine last reported it (affinity_zone_peer_polled()), if
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
    uint32_t    reserved;
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
 * on the ring) that the pin follows; a new pin, placed by
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
 * loaded usable peer, ties in ring order from the longest level.
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


/* ---- session keys ----------------------------------------------------- */

#define AFFINITY_KEY_MAX_ECHO  256
#define AFFINITY_UUID_LEN      36

/*
 * Whether a key may be echoed to the client in a header or a cookie: at most
 * 256 cookie octets (RFC 6265: printable ASCII but space, '"', ',', ';' and
 * backslash).
 */
AFFINITY_API int affinity_key_echoable(const char *key, size_t len)
    AFFINITY_NOEXCEPT;

/*
 * Whether a key may be shown in $affinity_session, which ends up in
 * request and response headers and in logs: not empty and without control
 * characters (bytes below 0x20, and 0x7f).
 */
AFFINITY_API int affinity_key_exposable(const char *key, size_t len)
    AFFINITY_NOEXCEPT;

/* Writes a random UUID v4 (36 characters, no NUL) from OpenSSL RAND_bytes.
 * Returns 0, or -1 if the random generator failed. */
AFFINITY_API int affinity_uuid_v4(char out[AFFINITY_UUID_LEN])
    AFFINITY_NOEXCEPT;


/* ---- JSON request bodies --------------------------------------------- */

/* Bytes a body buffer must have readable past its end for the parser. */
#define AFFINITY_JSON_PADDING  64

typedef struct affinity_json_s  affinity_json_t;

/*
 * A reader of JSON request bodies for one thread (an nginx worker).  It
 * owns the JSON parser and its buffers, which grow with the largest body
 * read and are kept for the next; affinity_json_shrink() frees what grew
 * past retain bytes of body.  NULL when out of memory.  Not for the hot
 * path.
 */
AFFINITY_API affinity_json_t *affinity_json_create(size_t retain)
    AFFINITY_NOEXCEPT;
AFFINITY_API void affinity_json_destroy(affinity_json_t *json)
    AFFINITY_NOEXCEPT;

/*
 * Indexes a body, body[0..len) with AFFINITY_JSON_PADDING readable bytes
 * after it, for the reads below; the body must stay in place until
 * affinity_json_unload().  The whole body is validated, once, whatever is
 * read from it.  Returns 0, or -1 when it is not a JSON object (malformed,
 * truncated, not UTF-8, nested too deep, a number out of range): nothing
 * is then read from it.
 */
AFFINITY_API int affinity_json_load(affinity_json_t *json, const char *body,
    size_t len) AFFINITY_NOEXCEPT;

/* Forgets the body loaded. */
AFFINITY_API void affinity_json_unload(affinity_json_t *json)
    AFFINITY_NOEXCEPT;

/* Frees the buffers grown past the retain size; returns 1 if it freed any
 * (the caller may then give the memory back to the system). */
AFFINITY_API int affinity_json_shrink(affinity_json_t *json)
    AFFINITY_NOEXCEPT;

typedef enum {
    AFFINITY_FIELD_FOUND = 0,
    AFFINITY_FIELD_MISSING,     /* valid JSON, no string/number at path */
    AFFINITY_FIELD_INVALID      /* no body loaded */
} affinity_field_e;

/*
 * Looks up a top-level or dotted field ("user", "metadata.session_id") in
 * the body loaded.  A string value is returned unescaped (it may hold any
 * byte, control characters included), a number in its shortest form (42,
 * 42.0 and 4.2e1 all give "42").  The value is copied to out (at most
 * out_cap bytes; a longer value is MISSING).
 */
AFFINITY_API affinity_field_e affinity_json_field(affinity_json_t *json,
    const char *path, size_t path_len, char *out, size_t out_cap,
    size_t *out_len) AFFINITY_NOEXCEPT;


/* ---- prompt prefixes -------------------------------------------------- */

/* Most levels a prompt is hashed at. */
#define AFFINITY_MAX_LEVELS  128

/* Characters of prompt text per token, where a size in tokens is turned
 * into characters (affinity_request_t.prefix_capacity). */
#define AFFINITY_CHARS_PER_TOKEN  4

struct affinity_level_s {
    uint32_t    length;     /* code points of canonical text hashed */
    uint32_t    turn;       /* 1: at a message's end, 0: scheduled */
    uint64_t    hash;       /* XXH3, fixed seed (same in every instance) */
};

typedef enum {
    AFFINITY_PROMPT_OK = 0,
    AFFINITY_PROMPT_NONE,       /* valid JSON object without a prompt */
    AFFINITY_PROMPT_INVALID     /* not a JSON object, malformed, or not
                                   UTF-8 */
} affinity_prompt_e;

/*
 * The lengths (code points) a prompt is hashed at: the given lengths
 * (sorted, duplicates dropped), then, after the last one, lengths growing
 * by max(step, previous * growth_percent / 100) up to max.  step 0 adds
 * nothing after the given lengths.  Returns how many were written to out.
 */
AFFINITY_API size_t affinity_level_schedule(const uint32_t *lengths,
    size_t nlengths, uint32_t step, uint32_t growth_percent, uint32_t max,
    uint32_t *out, size_t out_cap) AFFINITY_NOEXCEPT;

/* Most turn levels a prompt may have (affinity_json_prompt()). */
#define AFFINITY_TURNS_MAX  16

/*
 * Builds the canonical prompt text of the chat completions, completions or
 * Responses API body loaded, and hashes its first L code points for each
 * scheduled L it reaches; a text shorter than schedule[0] gives one level
 * of its own length.  Reading stops at the last scheduled length.  Also
 * hashes it at the ends of its last turns messages (or Responses input
 * items) that end between the first and the last scheduled lengths, at
 * most AFFINITY_TURNS_MAX: turn levels, which let a conversation's next turn
 * find this whole prompt (when it adds fewer than turns messages).  The
 * instructions of a Responses API body end a turn too.  schedule is
 * strictly increasing.  Levels are written shortest first, as many as
 * out_cap allows (nschedule + min(turns, AFFINITY_TURNS_MAX): all of
 * them), the scheduled ones first, then the most recent turn levels.
 * Allocates only when a body's tools or items are larger than any
 * compacted before.
 */
AFFINITY_API affinity_prompt_e affinity_json_prompt(affinity_json_t *json,
    const uint32_t *schedule, size_t nschedule, size_t turns,
    affinity_level_t *out, size_t out_cap, size_t *nout) AFFINITY_NOEXCEPT;


/* ---- Responses API continuations ------------------------------------ */

/*
 * A responses zone (AFFINITY_ZONE_RESPONSES) remembers which peer produced
 * each response or conversation id, keyed by affinity_zone_key_hash() of
 * the id: set-associative, LRU with idle expiry, as sessions.  Both
 * functions: caller holds the zone lock; now and timeout in seconds.
 */

/* The peer id that produced the id, made most recently used; 0 if the
 * zone does not know it (never seen, evicted or expired). */
AFFINITY_API uint64_t affinity_responses_owner(affinity_zone_t *zone,
    uint64_t key_hash, uint32_t now, uint32_t timeout) AFFINITY_NOEXCEPT;

typedef enum {
    AFFINITY_LEARNED = 0,           /* the zone holds it now */
    AFFINITY_LEARNED_STALE,         /* it holds a newer one, or it expired */
    AFFINITY_LEARNED_TAKEN          /* the id belongs to another peer */
} affinity_learned_e;

/* Remembers that peer_id (non-zero) produced the id at version_ms (the
 * wall clock in milliseconds, here or at the instance that learned it):
 * the first peer to produce an id keeps it while its entry lives, so that
 * a reply reusing a live id (an engine lets clients choose them) cannot
 * take another's follow-ups; each such refusal is counted (conflicts). */
AFFINITY_API int affinity_responses_learn(affinity_zone_t *zone,
    uint64_t key_hash, uint64_t peer_id, uint64_t version_ms, uint32_t now,
    uint32_t timeout) AFFINITY_NOEXCEPT;

/* Longest id learned; a longer one is not (nor looked up). */
#define AFFINITY_RESPONSE_ID_MAX  256

typedef enum {
    AFFINITY_RESPONSE_JSON = 1,     /* application/json */
    AFFINITY_RESPONSE_EVENTS        /* text/event-stream */
} affinity_response_format_e;

typedef enum {
    AFFINITY_SCAN_MORE = 0,         /* feed more of the body */
    AFFINITY_SCAN_FOUND,            /* an id was read: stop feeding */
    AFFINITY_SCAN_NONE              /* nothing to learn: stop feeding */
} affinity_scan_e;

typedef enum {
    AFFINITY_SCAN_OK = 0,
    AFFINITY_SCAN_MALFORMED,        /* not a JSON object */
    AFFINITY_SCAN_TRUNCATED,        /* ended inside the object */
    AFFINITY_SCAN_NO_ID,            /* no id of a response or conversation */
    AFFINITY_SCAN_ID_TOO_LONG,      /* over AFFINITY_RESPONSE_ID_MAX */
    AFFINITY_SCAN_ID_ESCAPED,       /* an escape other than \" \\ \/ */
    AFFINITY_SCAN_NO_EVENT,         /* an event stream without data (in its
                                       first MiB, or at all) */
    AFFINITY_SCAN_NOT_STORED        /* a response with "store": false */
} affinity_scan_reason_e;

typedef enum {
    AFFINITY_OBJECT_NONE = 0,
    AFFINITY_OBJECT_RESPONSE,
    AFFINITY_OBJECT_CONVERSATION
} affinity_object_e;

/*
 * The state of reading one response body, in memory the caller owns (the
 * request's pool): no allocation, and nothing of the body is kept but the
 * id.  The body is fed as it passes, in pieces split anywhere; the id is
 * known when a JSON body's top-level object (with "object": "response" or
 * "conversation") closes, or when the first event of a stream (the
 * "response" member of response.created) does.
 */
#define AFFINITY_RESPONSE_SCAN_SIZE  512

typedef struct {
    uint64_t    opaque[AFFINITY_RESPONSE_SCAN_SIZE / 8];
} affinity_response_scan_t;

AFFINITY_API void affinity_response_scan_start(affinity_response_scan_t *scan,
    affinity_response_format_e format) AFFINITY_NOEXCEPT;

/* Reads the next len bytes. */
AFFINITY_API affinity_scan_e affinity_response_scan(
    affinity_response_scan_t *scan, const char *data, size_t len)
    AFFINITY_NOEXCEPT;

/* The body ended (MORE becomes NONE). */
AFFINITY_API affinity_scan_e affinity_response_scan_end(
    affinity_response_scan_t *scan) AFFINITY_NOEXCEPT;

/* Why a scan ended without an id. */
AFFINITY_API affinity_scan_reason_e affinity_response_scan_reason(
    const affinity_response_scan_t *scan) AFFINITY_NOEXCEPT;

/* The id read (not NUL-terminated), or NULL before FOUND. */
AFFINITY_API const char *affinity_response_scan_id(
    const affinity_response_scan_t *scan, size_t *len,
    affinity_object_e *object) AFFINITY_NOEXCEPT;


/*
 * The usage a reply gives (usage.prompt_tokens or usage.input_tokens, and
 * their details' cached_tokens), read from its body as it passes, JSON or
 * event stream, in pieces split anywhere; the last figures win.  In memory
 * the caller owns; nothing of the body is kept.
 */
#define AFFINITY_USAGE_SCAN_SIZE  64

typedef struct {
    uint64_t    opaque[AFFINITY_USAGE_SCAN_SIZE / 8];
} affinity_usage_scan_t;

AFFINITY_API void affinity_usage_scan_start(affinity_usage_scan_t *scan)
    AFFINITY_NOEXCEPT;

/* Reads the next len bytes. */
AFFINITY_API void affinity_usage_scan(affinity_usage_scan_t *scan,
    const char *data, size_t len) AFFINITY_NOEXCEPT;

/* The body ended: 1 and the figures (prompt_tokens 0 if none was read)
 * if a count of cached tokens was read, else 0. */
AFFINITY_API int affinity_usage_scan_result(affinity_usage_scan_t *scan,
    uint64_t *cached_tokens, uint64_t *prompt_tokens) AFFINITY_NOEXCEPT;

/* The body ended: its prompt's tokens and its own (usage.completion_tokens
 * or usage.output_tokens), 0 for a figure not read, whether or not a count
 * of cached tokens was. */
AFFINITY_API void affinity_usage_scan_tokens(affinity_usage_scan_t *scan,
    uint64_t *prompt_tokens, uint64_t *output_tokens) AFFINITY_NOEXCEPT;


/* ---- the engines' own load ------------------------------------------- */

/*
 * Another nginx instance's requests are not in this one's counters, but
 * the engine that serves them counts them all.  Its metrics (vLLM's and
 * SGLang's Prometheus names) give its requests running and waiting, and
 * how full its KV cache is.
 */
#define AFFINITY_ENGINE_RUNNING   1
#define AFFINITY_ENGINE_WAITING   2
#define AFFINITY_ENGINE_CACHE     4
#define AFFINITY_ENGINE_CAPACITY  8
#define AFFINITY_ENGINE_COMPUTED  16

typedef struct {
    double      running;        /* summed over label sets */
    double      waiting;
    double      cache_usage;    /* 0..1, the largest */
    double      cache_tokens;   /* the tokens its KV cache holds, summed */
    double      queried_tokens; /* prompt tokens looked up in its prefix
                                   cache since it started, summed */
    double      hit_tokens;     /* of them, found there */
    uint32_t    found;          /* AFFINITY_ENGINE_* read; COMPUTED: both
                                   of the above */
    uint32_t    reserved;
} affinity_engine_load_t;

/* Reads a Prometheus text exposition: 0 when it gives running or waiting
 * requests, else -1. */
AFFINITY_API int affinity_engine_metrics(const char *text, size_t len,
    affinity_engine_load_t *load) AFFINITY_NOEXCEPT;

/* When a peer's engine was asked for its figure, which counts what
 * started before and not what ended before. */
typedef struct {
    uint64_t    ms;             /* milliseconds of the wall clock, the one
                                   the instances stamp their news with;
                                   not 0 */
    int64_t     inflight;       /* this instance's requests on the peer */
} affinity_engine_asked_t;

/*
 * The engine of the peer of slot is asked for its figure at ms (asked),
 * and reported load at now (seconds, polled), with what asked set; both
 * with the zone lock held, which news from the others is counted under
 * (affinity_zone_peer_sent_elsewhere()): the news read while the engine
 * answers is kept for its figure when stamped after the ask.  One ask of
 * a peer's engine waits for its answer at a time, whichever worker made
 * it: asked returns 0 (and sets asked->ms to 0) while another, made less
 * than answer_within milliseconds before or after by the clock, waits,
 * and the caller drops its own (awaits says so before the engine is even
 * called); polled takes only the answer to the ask that waits, and
 * returns 1 if it took it; an ask that gets no answer to take (failed,
 * junk) is given up with unanswered, so that the next need not wait for
 * answer_within to pass.  Routing then counts the peer as max(in-flight
 * here, engine's running + waiting + the requests that started less those
 * that ended since it was asked, here and, as the others said,
 * elsewhere), while the figure is younger than the balance's engine_ttl.
 * A KV cache size it reported is kept until it reports another: with no
 * prefix_capacity, the prefix index models the peer's cache with it.
 */
AFFINITY_API int affinity_zone_peer_awaits(const affinity_zone_t *zone,
    uint32_t slot, uint64_t ms, uint64_t answer_within) AFFINITY_NOEXCEPT;
AFFINITY_API int affinity_zone_peer_asked(affinity_zone_t *zone,
    uint32_t slot, uint64_t ms, uint64_t answer_within,
    affinity_engine_asked_t *asked) AFFINITY_NOEXCEPT;
AFFINITY_API int affinity_zone_peer_polled(affinity_zone_t *zone,
    uint32_t slot, const affinity_engine_load_t *load, uint32_t now,
    const affinity_engine_asked_t *asked) AFFINITY_NOEXCEPT;
AFFINITY_API void affinity_zone_peer_unanswered(affinity_zone_t *zone,
    uint32_t slot, const affinity_engine_asked_t *asked) AFFINITY_NOEXCEPT;

/*
 * Another nginx instance sent peer_id a request (an AFFINITY_STORE_SENT
 * message), or one it had sent ended there (AFFINITY_STORE_DONE), at at_ms
 * (milliseconds of the wall clock, the message's time and msec).  Counted
 * with the engine's figure, or taken off it, until the engine reports
 * again, and only when it came after the figure was asked for: before,
 * the figure has it (started) or never had it (ended), however late the
 * news is read.  So a request's two messages count both or neither, or
 * correct a figure that counted it.  Nothing without a figure (caller
 * holds the zone lock).
 */
AFFINITY_API void affinity_zone_peer_sent_elsewhere(affinity_zone_t *zone,
    uint64_t peer_id, uint64_t at_ms) AFFINITY_NOEXCEPT;
AFFINITY_API void affinity_zone_peer_ended_elsewhere(affinity_zone_t *zone,
    uint64_t peer_id, uint64_t at_ms) AFFINITY_NOEXCEPT;

/*
 * Lock-free: this instance told the store it sent the peer of slot a
 * request (an AFFINITY_STORE_SENT message on its way), and has not yet
 * read it back from the store (announced) or now has (heard).  Until then
 * the other instances may not have read it either, and cannot count it,
 * nor this one the requests they send the peer meanwhile: routing counts
 * the peer with as many of those as it presumes beside each
 * (affinity_zone_unheard_presumed()), while its engine's figure counts
 * (affinity_balance_t.engine_ttl).  announced returns a ticket (0:
 * nothing counted, slot out of range) to pass to heard once: when this
 * instance reads the message back, or when the store refuses it or the
 * connection goes.  An engine's report clears what is left
 * (affinity_zone_peer_polled()), and the tickets of the requests counted
 * before it then take nothing off.
 */
AFFINITY_API uintptr_t affinity_zone_peer_announced(affinity_zone_t *zone,
    uint32_t slot) AFFINITY_NOEXCEPT;
AFFINITY_API void affinity_zone_peer_heard(affinity_zone_t *zone,
    uintptr_t ticket) AFFINITY_NOEXCEPT;

/*
 * How many requests the other instances send a peer, unseen, beside each
 * of this instance's unheard requests there.  Each other instance as many
 * when they reach the instances at random; none when a front sends all of
 * a session's requests (an agent's parallel calls) to one instance.  So it
 * is learned: a decision that weighed a peer while unheard of this
 * instance's requests were there (affinity_decision_t.watched), placed
 * there or not, tells once its own announcement is read back how many of
 * the other instances' requests on that peer were read first: others,
 * which it could not count, beside unheard (caller holds the zone lock).
 * Only while other instances route: alone, nothing is watched.  The
 * lessons are pooled over the peers, the oldest forgotten by halves.
 *
 * unheard_presumed returns what routing presumes (exact with the zone
 * lock held, which the instances' table is written under): one per other
 * instance routing (affinity_zone_instances()), or, once enough unheard
 * requests were learned from, the others' they met per unheard one when
 * that is next to nothing (the front keeps sessions on instances; spread,
 * the mean would understate the bursts).  *unheard and *met, if not NULL,
 * are set to the unheard requests learned from and the others' they met.
 */
AFFINITY_API void affinity_zone_unheard_met(affinity_zone_t *zone,
    uint32_t unheard, uint32_t others) AFFINITY_NOEXCEPT;
AFFINITY_API double affinity_zone_unheard_presumed(
    const affinity_zone_t *zone, uint32_t now, uint32_t *unheard,
    uint32_t *met) AFFINITY_NOEXCEPT;

/*
 * An instance's watch over its announcements, for those lessons: its
 * reader reads every message of the stream, the others' and the
 * instance's, in the store's order.  Caller-owned (nginx keeps it in
 * shared memory for all the workers, under a lock), zeroed before first
 * use; its fields are the core's.
 *
 * watch_announced: a request is announced whose decision weighed peer_id
 * with unheard requests of this instance there (the decision's watched
 * and watched_unheard); returns a number to send with the message and to
 * pass to watch_read_back when it is read back (0: nothing to learn, as
 * without unheard ones).  watch_sent_elsewhere: another instance's request
 * on peer_id was read.  watch_read_back: returns 1 and the lesson
 * (unheard, others) for affinity_zone_unheard_met(), or 0 when there is
 * none (a number unknown, or forgotten after AFFINITY_WATCHED later
 * announcements: an instance with more than that many waiting to be read
 * back, as while the store stalls, loses the oldest, which waited longest
 * and met the most).
 */
#define AFFINITY_WATCHED  64

typedef struct {
    uint64_t    peer[AFFINITY_WATCHED];     /* 0: none watched */
    uint32_t    number[AFFINITY_WATCHED];
    uint32_t    unheard[AFFINITY_WATCHED];
    uint32_t    others[AFFINITY_WATCHED];
    uint32_t    last;
} affinity_unheard_watch_t;

AFFINITY_API uint32_t affinity_watch_announced(
    affinity_unheard_watch_t *watch, uint64_t peer_id, int64_t unheard)
    AFFINITY_NOEXCEPT;
AFFINITY_API void affinity_watch_sent_elsewhere(
    affinity_unheard_watch_t *watch, uint64_t peer_id) AFFINITY_NOEXCEPT;
AFFINITY_API int affinity_watch_read_back(affinity_unheard_watch_t *watch,
    uint32_t number, uint32_t *unheard, uint32_t *others) AFFINITY_NOEXCEPT;

/*
 * A message of another nginx instance was read from the store at now
 * (seconds): the instances heard from in the last ten seconds are those
 * routing to the same peers (caller holds the zone lock; instance is the
 * other's zone seed, affinity_zone_info()).
 */
AFFINITY_API void affinity_zone_instance_seen(affinity_zone_t *zone,
    uint64_t instance, uint32_t now) AFFINITY_NOEXCEPT;

/* The instances routing as of now: this one and those heard from in the
 * last ten seconds (exact with the zone lock held). */
AFFINITY_API uint32_t affinity_zone_instances(const affinity_zone_t *zone,
    uint32_t now) AFFINITY_NOEXCEPT;

/* Lock-free: whether it is the caller's turn to poll the engines; true for
 * at most one caller per interval (milliseconds, now too). */
AFFINITY_API int affinity_zone_poll_due(affinity_zone_t *zone,
    uint64_t now_ms, uint32_t interval_ms) AFFINITY_NOEXCEPT;


/* ---- several instances: applying what the others learned ----------- */

/* Applying what another instance learned, to this instance's zones (caller
 * holds the zone lock; now and timeout in seconds). */

/* Another instance pinned the session of key_hash
 * (affinity_zone_key_hash()) to peer_id at version_ms (its wall clock):
 * applied only over an older pin (on a tie, the higher peer id wins), so
 * that reading the stream again or late never puts back a pin since
 * moved; not applied, the entry is not even made more recent.  Returns an
 * affinity_learned_e. */
AFFINITY_API int affinity_sessions_learn(affinity_zone_t *zone,
    uint64_t key_hash, uint64_t peer_id, uint64_t version_ms, uint32_t now,
    uint32_t timeout) AFFINITY_NOEXCEPT;

/* Records that peer_id served the prompt levels of these hashes.  With a
 * capacity in tokens (affinity_request_t.prefix_capacity), the peer is
 * taken to have them cached as of now: as of its modelled cache's clock,
 * which counts the prompts this instance sends it and those the others
 * announce (affinity_prefixes_filled()). */
AFFINITY_API void affinity_prefixes_record(affinity_zone_t *zone,
    const uint64_t *level_hashes, size_t nlevels, uint64_t peer_id,
    uint32_t now, uint32_t timeout, uint64_t capacity) AFFINITY_NOEXCEPT;

/* Another instance sent peer_id a prompt of which its model of the peer's
 * cache took in chars characters (affinity_decision_t.cache_chars there):
 * this instance's model of that cache advances by as much, so that the
 * prefixes it presumes held age with every instance's prompts, not only
 * its own.  Applied before the prompt's levels are recorded, they are then
 * the most recent in the cache, as where it was routed.  capacity: as in
 * affinity_prefixes_record().  Caller holds the zone lock. */
AFFINITY_API void affinity_prefixes_filled(affinity_zone_t *zone,
    uint64_t peer_id, uint32_t chars, uint32_t now, uint64_t capacity)
    AFFINITY_NOEXCEPT;

/*
 * peer_id replied to a request whose decision took a probe (probe_age,
 * probe_length != 0), with the usage its body gave: cached_tokens of
 * prompt_tokens were in its cache (affinity_usage_scan()).  prompt_chars:
 * the prompt's size as affinity_request_t.prompt_size gives it (or its
 * longest level's), to weigh tokens in characters, at most twice
 * AFFINITY_CHARS_PER_TOKEN a token; 0 or no prompt_tokens:
 * AFFINITY_CHARS_PER_TOKEN.  The probe's prefix counts as held when at
 * least half of it was cached; the peer's capacity is learned from it
 * (affinity_request_t.prefix_capacity 0).  A prefix lost before probe_age
 * reached probe_length teaches nothing.  Caller holds the zone lock.
 */
AFFINITY_API void affinity_prefixes_replied(affinity_zone_t *zone,
    uint64_t peer_id, uint32_t probe_age, uint32_t probe_length,
    uint64_t prompt_chars, uint64_t cached_tokens, uint64_t prompt_tokens)
    AFFINITY_NOEXCEPT;

/*
 * peer_id's engine reported how many prompt tokens it has computed since it
 * started (queried_tokens - hit_tokens of an AFFINITY_ENGINE_COMPUTED
 * load): what its KV cache really took in, whoever sent it.  Its modelled
 * cache (prefix_capacity) advances by what this instance did not count
 * itself since the last report: the prompts of other nginx instances and
 * of clients that bypass nginx.  A count that went back is an engine that
 * restarted, its cache empty: every prefix it held is presumed evicted.
 * capacity: as in affinity_prefixes_record().  Caller holds the zone lock.
 */
AFFINITY_API void affinity_prefixes_polled(affinity_zone_t *zone,
    uint64_t peer_id, const affinity_engine_load_t *load, uint64_t capacity)
    AFFINITY_NOEXCEPT;


#ifdef __cplusplus
}
#endif

#include "affinity_store.h"

#endif /* AFFINITY_CORE_H */

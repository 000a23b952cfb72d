/*
 * affinity_zone.h - the shared-memory zone: its layout, each peer's counter
 * slot (in-flight requests, routes, learned pace) and each worker's row.
 * Included by affinity_core.h.
 */

#ifndef AFFINITY_ZONE_H
#define AFFINITY_ZONE_H

#include "affinity_api.h"
#include "affinity_peers.h"

#ifdef __cplusplus
extern "C" {
#endif

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
    uint64_t    backlog_chars;  /* prompt characters sent, not presumed
                                   held, whose first byte has not come */
} affinity_peer_pace_t;

/* Lock-free: the pace of the peer in slot. */
AFFINITY_API void affinity_zone_peer_pace(const affinity_zone_t *zone,
    uint32_t slot, affinity_peer_pace_t *pace) AFFINITY_NOEXCEPT;

/* Lock-free: the wait before prefill (wait_us, microseconds) of a request
 * sent at now (seconds) to each peer of slots[0..n) (one upstream's
 * primaries, or its backups), by routing's estimate: the shape pooled over
 * those peers, behind each one's requests in flight as routing counts them
 * (the engine's figure while it is within engine_ttl seconds,
 * affinity_balance_t) and the prefill ahead of them; -1 where a peer's
 * pace is not learned, it has no slot (AFFINITY_NO_SLOT), or it is past
 * the first AFFINITY_MAX_PEERS. */
AFFINITY_API void affinity_zone_peers_wait(const affinity_zone_t *zone,
    const uint32_t *slots, size_t n, uint32_t engine_ttl, uint64_t now,
    int64_t *wait_us) AFFINITY_NOEXCEPT;

/* Lock-free; counters are read atomically one by one. */
AFFINITY_API void affinity_zone_peer_stats(const affinity_zone_t *zone,
    uint32_t slot, affinity_peer_stats_t *stats) AFFINITY_NOEXCEPT;

/* Lock-free: the end of a request on a peer (the start is counted by
 * affinity_route() or affinity_zone_peer_acquire()), in the slot and in the
 * row of the worker that counted it (AFFINITY_NO_ROW if it has none). */
AFFINITY_API void affinity_zone_peer_release(affinity_zone_t *zone,
    uint32_t row, uint32_t slot) AFFINITY_NOEXCEPT;

/* Lock-free: the request counted in slot with decision->backlog_chars got
 * its first byte, or its try ended without one: its prompt leaves the
 * peer's backlog (affinity_peer_pace_t.backlog_chars).  Once per try. */
AFFINITY_API void affinity_zone_peer_started(affinity_zone_t *zone,
    uint32_t slot, uint32_t backlog_chars) AFFINITY_NOEXCEPT;

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


#ifdef __cplusplus
}
#endif

#endif /* AFFINITY_ZONE_H */

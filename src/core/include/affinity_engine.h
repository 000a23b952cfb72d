/*
 * affinity_engine.h - the engines' own load: their metrics, and polling them
 * from one worker at a time.
 * Included by affinity_core.h.
 */

#ifndef AFFINITY_ENGINE_H
#define AFFINITY_ENGINE_H

#include "affinity_api.h"
#include "affinity_zone.h"

#ifdef __cplusplus
extern "C" {
#endif

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
 * Polling the engine of the peer of slot, one ask at a time whichever
 * worker makes it; each call with the zone lock held, under which the
 * others' news is counted too (affinity_zone_peer_sent_elsewhere()).
 *
 * ask: the engine is about to be asked at ms.  Returns 0 (asked->ms 0)
 * while another ask, made less than answer_within milliseconds before or
 * after, waits for its answer: the caller then drops its own.  awaiting
 * tells the same before the engine is even called.
 * answer: the engine reported load at now (seconds) for the ask in asked.
 * Only the answer to the ask that waits is taken: returns 1 if it was.
 * give_up: the ask got no answer to take (failed, junk), so the next need
 * not wait for answer_within to pass.
 *
 * Routing then counts the peer as max(in-flight here, the engine's running
 * + waiting + the requests that started less those that ended since the
 * ask, here and, as the others said, elsewhere), while the figure is
 * younger than the balance's engine_ttl.  News read while the engine
 * answers is kept for its figure when stamped after the ask.  A KV cache
 * size it reported is kept until it reports another: with no
 * prefix_capacity, the prefix index models the peer's cache with it.
 */
AFFINITY_API int affinity_engine_awaiting(const affinity_zone_t *zone,
    uint32_t slot, uint64_t ms, uint64_t answer_within) AFFINITY_NOEXCEPT;
AFFINITY_API int affinity_engine_ask(affinity_zone_t *zone,
    uint32_t slot, uint64_t ms, uint64_t answer_within,
    affinity_engine_asked_t *asked) AFFINITY_NOEXCEPT;
AFFINITY_API int affinity_engine_answer(affinity_zone_t *zone,
    uint32_t slot, const affinity_engine_load_t *load, uint32_t now,
    const affinity_engine_asked_t *asked) AFFINITY_NOEXCEPT;
AFFINITY_API void affinity_engine_give_up(affinity_zone_t *zone,
    uint32_t slot, const affinity_engine_asked_t *asked) AFFINITY_NOEXCEPT;

/* Lock-free: whether it is the caller's turn to poll the engines; true for
 * at most one caller per interval (milliseconds, now too). */
AFFINITY_API int affinity_engine_claim_poll(affinity_zone_t *zone,
    uint64_t now_ms, uint32_t interval_ms) AFFINITY_NOEXCEPT;


#ifdef __cplusplus
}
#endif

#endif /* AFFINITY_ENGINE_H */

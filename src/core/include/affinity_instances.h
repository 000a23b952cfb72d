/*
 * affinity_instances.h - several nginx instances: what the others sent and
 * ended, this instance's unheard requests, and applying what the others
 * learned.
 * Included by affinity_core.h.
 */

#ifndef AFFINITY_INSTANCES_H
#define AFFINITY_INSTANCES_H

#include "affinity_api.h"
#include "affinity_zone.h"
#include "affinity_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

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
 * (affinity_engine_answer()), and the tickets of the requests counted
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
 * How many of this instance's requests were unheard as it routed one, in
 * the recent mean (each decision while other instances route weighs 1/32
 * of it).  Twice that, per other instance, are presumed placed unseen
 * beside each request: they count in the load bound's share, and new
 * prompts are dealt over the peers' room (docs/routing.md, "Several
 * instances").  Exact with the zone lock held.
 */
AFFINITY_API double affinity_zone_unheard_beside(const affinity_zone_t *zone)
    AFFINITY_NOEXCEPT;

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

#endif /* AFFINITY_INSTANCES_H */

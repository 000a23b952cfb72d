#include "engine_poll.h"

#include <algorithm>

#include "engine_metrics.h"
#include "trace.h"

namespace affinity {

namespace {

// One ask at a time: the news since an ask is kept for its answer, and a
// second ask would start that count again, from later.  An ask older than
// its answer could be is abandoned (its worker is gone), as is one the
// clock went back from by as much; a little earlier is another worker's
// clock, read a moment before this one's.
bool awaits_answer(const PeerSlot &s, uint64_t ms,
                   uint64_t answer_within) noexcept
{
    uint64_t waiting = s.engine_asking;

    return waiting != 0
           && (ms >= waiting ? ms - waiting : waiting - ms) < answer_within;
}

}  // namespace

bool engine_awaiting(Zone zone, uint32_t slot, uint64_t ms,
                     uint64_t answer_within) noexcept
{
    return slot < kPeerSlots
           && awaits_answer(zone.peer_slots()[slot], ms, answer_within);
}

bool engine_ask(Zone zone, uint32_t slot, uint64_t ms,
                uint64_t answer_within,
                affinity_engine_asked_t &asked) noexcept
{
    asked.ms = ms;
    asked.inflight = 0;

    if (slot >= kPeerSlots) {
        return true;
    }

    PeerSlot &s = zone.peer_slots()[slot];

    if (awaits_answer(s, ms, answer_within)) {
        asked.ms = 0;
        return false;
    }

    asked.inflight = std::max<int64_t>(atomic_load(&s.inflight), 0);

    // The others' news from now on is what its answer will not show.
    s.engine_asking = ms;
    s.others_since_asking = 0;
    return true;
}

void engine_give_up(Zone zone, uint32_t slot,
                    const affinity_engine_asked_t &asked) noexcept
{
    if (slot >= kPeerSlots || asked.ms == 0) {
        return;
    }

    PeerSlot &s = zone.peer_slots()[slot];

    if (s.engine_asking == asked.ms) {
        s.engine_asking = 0;
        s.others_since_asking = 0;
    }
}

bool engine_answer(Zone zone, uint32_t slot,
                   const affinity_engine_load_t &load, uint32_t now,
                   const affinity_engine_asked_t &asked) noexcept
{
    if (slot >= kPeerSlots || now == 0) {
        return false;
    }

    PeerSlot &s = zone.peer_slots()[slot];

    // Only the answer the slot waits for: not one to an ask refused or
    // abandoned, nor one to the slot's previous peer.
    if (asked.ms == 0 || s.engine_asking != asked.ms) {
        return false;
    }

    double total = load.running + load.waiting;

    atomic_store<int64_t>(&s.engine_load,
                          total < kMaxRequests ? int64_t(total + 0.5)
                                               : int64_t(kMaxRequests));

    // What it counts of this instance's requests, and of the others': a
    // request that ended while it answered is not counted again.
    atomic_store<int64_t>(&s.engine_base, asked.inflight);
    atomic_store<uint64_t>(&s.cache_usage,
                           (load.found & AFFINITY_ENGINE_CACHE)
                               ? uint64_t(load.cache_usage * 1e6)
                               : UINT64_MAX);
    // What the others said since it was asked, read while it answered,
    // is not in it.
    int64_t others = s.others_since_asking;
    s.engine_asking = 0;
    s.others_since_asking = 0;

    atomic_store<uint64_t>(&s.engine_asked, asked.ms);
    atomic_store<int64_t>(&s.engine_others, others);
    clear_unheard(&s.unheard);
    if ((load.found & AFFINITY_ENGINE_CAPACITY)
        && load.cache_tokens >= 1 && load.cache_tokens <= kMaxCacheTokens)
    {
        atomic_store<uint64_t>(&s.cache_tokens, uint64_t(load.cache_tokens));
    }
    atomic_store<uint64_t>(&s.engine_time, now);
    AFFINITY_TRACE_EVENT("AFP", slot, int64_t(total + 0.5));
    return true;
}

void count_elsewhere(Zone zone, uint64_t peer_id, int64_t requests,
                     uint64_t at_ms) noexcept
{
    uint32_t slot = zone.find_slot(peer_id);

    if (slot == kNoSlot) {
        return;
    }

    PeerSlot &s = zone.peer_slots()[slot];

    // Only a figure to add to: without one, this instance cannot know when
    // those requests end, nor count the ends of those it holds.  And only
    // what came after the figure was asked for: a request that started
    // before is in it, one that ended before is not; the news of either,
    // read late, would count it twice or take off another.
    if (atomic_load(&s.engine_time) != 0
        && at_ms >= atomic_load(&s.engine_asked))
    {
        atomic_add<int64_t>(&s.engine_others, requests);
    }

    // And what the answer to an ask under way will not show.
    if (s.engine_asking != 0 && at_ms >= s.engine_asking) {
        s.others_since_asking += requests;
    }

    AFFINITY_TRACE_EVENT("AFE", slot, requests);
}

bool engine_claim_poll(Zone zone, uint64_t now_ms,
                       uint32_t interval_ms) noexcept
{
    uint64_t *last = &zone.header().last_poll;
    uint64_t seen = atomic_load(last);

    if (now_ms < seen + interval_ms) {
        return false;
    }

    return __atomic_compare_exchange_n(last, &seen, now_ms, false,
                                       __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

}  // namespace affinity

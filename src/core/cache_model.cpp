#include "cache_model.h"

#include <algorithm>

namespace affinity {

namespace {

// Tokens beyond which the product below could overflow: far above any
// engine's cache.
constexpr uint64_t kMaxCapacity = uint64_t{1} << 48;

// Characters of other prompts per stamp, for a cache of this many tokens.
uint64_t stamp_unit(uint64_t tokens) noexcept
{
    return std::max<uint64_t>(std::min(tokens, kMaxCapacity)
                                  * AFFINITY_CHARS_PER_TOKEN
                                  * kCapacityMarginPercent / 100
                                  / kStampsPerCapacity,
                              1);
}

}  // namespace

CacheModel::CacheModel(Zone prefixes, const affinity_peer_t *peers,
                       size_t npeers, uint64_t capacity,
                       const uint64_t *reported, uint64_t now) noexcept
    : enabled_(false)
{
    // No prefixes (the zone may be none), or no model wanted.
    if (npeers == 0 || capacity == kCapacityOff) {
        return;
    }

    PeerSlot *slots = prefixes.peer_slots();

    for (size_t i = 0; i < std::min(npeers, kMaxPeers); i++) {
        uint64_t tokens = capacity ? capacity : reported ? reported[i] : 0;
        // When the prefix zone also counts the upstream's requests, the
        // peer's slot there is the one it already has.
        uint32_t slot = peers[i].slot;

        slots_[i] = nullptr;
        fill_[i] = 0;
        unit_[i] = 0;

        if (!prefixes.owns(slot, peers[i].id)) {
            slot = tokens != 0 ? prefixes.claim_slot(peers[i].id, now)
                               : prefixes.find_slot(peers[i].id);
        }

        if (slot == kNoSlot) {
            continue;
        }

        PeerSlot &s = slots[slot];

        // The engine's figure is kept here too: for records that come with
        // none (affinity_prefixes_record()), and while the counters have
        // none (their slot handed over, their zone new), so that the
        // peer's stamps keep their meaning.
        if (capacity == 0) {
            if (tokens == 0) {
                tokens = atomic_load(&s.cache_tokens);
            } else if (atomic_load(&s.cache_tokens) != tokens) {
                atomic_store(&s.cache_tokens, tokens);
            }
        }

        if (tokens == 0) {
            continue;
        }

        // In use: not to be reclaimed for another peer.
        atomic_store(&s.last_used, now);

        slots_[i] = &s;
        fill_[i] = atomic_load(&s.cache_fill);
        unit_[i] = stamp_unit(tokens);
        enabled_ = true;
    }
}

void CacheModel::add(size_t i, uint64_t chars) noexcept
{
    if (enabled_ && unit_[i] != 0) {
        fill_[i] += chars;
        atomic_store(&slots_[i]->cache_fill, fill_[i]);
    }
}

void CacheModel::engine_computed(Zone prefixes, uint64_t peer_id,
                                 double tokens, uint64_t capacity) noexcept
{
    // Counts beyond any engine's lifetime are junk.
    if (!(tokens >= 0 && tokens < 1e18) || capacity == kCapacityOff) {
        return;
    }

    uint32_t n = prefixes.find_slot(peer_id);

    // A peer never modelled here has no clock to move.
    if (n == kNoSlot) {
        return;
    }

    PeerSlot &slot = prefixes.peer_slots()[n];
    uint64_t size = std::min(capacity ? capacity
                                      : atomic_load(&slot.cache_tokens),
                             kMaxCapacity);
    uint64_t was = slot.engine_mark;
    uint32_t count = static_cast<uint32_t>(static_cast<uint64_t>(tokens));
    uint64_t fill = atomic_load(&slot.cache_fill);
    uint32_t mark = static_cast<uint32_t>(was >> 32);

    if (size == 0) {
        slot.engine_mark = 0;
        return;
    }

    // Both counts modulo 2^32: reports come seconds apart.
    uint32_t computed = count - static_cast<uint32_t>(was);
    uint32_t back = static_cast<uint32_t>(was) - count;
    bool went_back = back != 0 && back < (1u << 31);

    if (was == 0) {
        // The first report: a mark to count from.
        mark = static_cast<uint32_t>(fill);

    } else if (went_back && back < size) {
        // A little back: counters read a moment apart (several processes,
        // several ranks).  The old count stays.
        return;

    } else if (went_back
               || uint64_t{computed} > static_cast<uint64_t>(tokens))
    {
        // Back by a capacity or more, or more computed since the last
        // report than in the engine's whole life: the count restarted
        // from zero, and so did the engine, its cache empty.
        fill += stamp_unit(size) * kStampsPerCapacity;
        mark = static_cast<uint32_t>(fill);
        atomic_store(&slot.cache_fill, fill);

    } else if (uint64_t{computed} * AFFINITY_CHARS_PER_TOKEN
               >= (uint64_t{1} << 31))
    {
        // Too far from the last report to compare modulo 2^32 characters
        // (reports missed for long): a new mark.
        mark = static_cast<uint32_t>(fill);

    } else {
        uint32_t chars = static_cast<uint32_t>(uint64_t{computed}
                                               * AFFINITY_CHARS_PER_TOKEN);

        mark += chars;

        // The engine's clock ahead of this one's: caught up, by no more
        // than it moved.  Behind by more than a capacity: held there.  A
        // mark left for hours (reports missed while this instance sent
        // 2^31 characters) may compare wrongly modulo 2^32: the catch-up
        // is still no more than the engine computed.
        int64_t ahead = static_cast<int32_t>(
            mark - static_cast<uint32_t>(fill));
        int64_t limit = static_cast<int64_t>(
            std::min<uint64_t>(size * AFFINITY_CHARS_PER_TOKEN,
                               uint64_t{1} << 30));

        if (ahead > 0) {
            fill += std::min<uint64_t>(uint64_t(ahead), chars);
            mark = static_cast<uint32_t>(fill);
            atomic_store(&slot.cache_fill, fill);
        } else if (ahead < -limit) {
            mark = static_cast<uint32_t>(fill - uint64_t(limit));
        }
    }

    // The mark's high half may be 0, its count too: 0 means no mark.
    uint64_t next = (uint64_t{mark} << 32) | count;
    slot.engine_mark = next != 0 ? next : uint64_t{1} << 32;
}

}  // namespace affinity

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
    // No prefixes: the zone may be none.
    if (npeers == 0) {
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
            if (tokens != 0) {
                slot = prefixes.claim_slot(peers[i].id, now);
            } else if (capacity == 0 && reported == nullptr) {
                slot = prefixes.find_slot(peers[i].id);
            } else {
                continue;
            }
        }

        if (slot == kNoSlot) {
            continue;
        }

        PeerSlot &s = slots[slot];

        // The engine's figure is kept here too, for records that come
        // with none (affinity_prefixes_record()).
        if (capacity == 0 && reported != nullptr) {
            if (tokens != 0 && atomic_load(&s.cache_tokens) != tokens) {
                atomic_store(&s.cache_tokens, tokens);
            }
        } else if (capacity == 0) {
            tokens = atomic_load(&s.cache_tokens);
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
    if (unit_[i] != 0) {
        fill_[i] += chars;
        atomic_store(&slots_[i]->cache_fill, fill_[i]);
    }
}

}  // namespace affinity

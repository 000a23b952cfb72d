#include "cache_model.h"

#include <algorithm>

namespace affinity {

namespace {

// Tokens beyond which the product below could overflow: far above any
// engine's cache.
constexpr uint64_t kMaxCapacity = uint64_t{1} << 48;

}  // namespace

CacheModel::CacheModel(Zone prefixes, const affinity_peer_t *peers,
                       size_t npeers, uint64_t capacity, uint64_t now)
    noexcept
    : unit_(0)
{
    if (capacity == 0) {
        return;
    }

    unit_ = std::max<uint64_t>(std::min(capacity, kMaxCapacity)
                                   * AFFINITY_CHARS_PER_TOKEN
                                   * kCapacityMarginPercent / 100
                                   / kStampsPerCapacity,
                               1);

    PeerSlot *slots = prefixes.peer_slots();

    for (size_t i = 0; i < std::min(npeers, kMaxPeers); i++) {
        // When the prefix zone also counts the upstream's requests, the
        // peer's slot there is the one it already has.
        uint32_t slot = peers[i].slot;

        if (prefixes.owns(slot, peers[i].id)) {
            // In use: not to be reclaimed for another peer.
            atomic_store(&slots[slot].last_used, now);
        } else {
            slot = prefixes.claim_slot(peers[i].id, now);
        }

        slots_[i] = slot != kNoSlot ? &slots[slot] : nullptr;
        fill_[i] = slots_[i] ? atomic_load(&slots_[i]->cache_fill) : 0;
    }
}

void CacheModel::add(size_t i, uint64_t chars) noexcept
{
    if (unit_ != 0 && slots_[i] != nullptr) {
        fill_[i] += chars;
        atomic_store(&slots_[i]->cache_fill, fill_[i]);
    }
}

}  // namespace affinity

#include "zone.h"

#include "hashing.h"

namespace affinity {

uint32_t Zone::claim_slot(uint64_t peer_id) noexcept
{
    PeerSlot *slots = peer_slots();
    uint32_t start = static_cast<uint32_t>(peer_id % kPeerSlots);

    for (uint32_t i = 0; i < kPeerSlots; i++) {
        PeerSlot &slot = slots[(start + i) % kPeerSlots];

        if (slot.id == peer_id) {
            return (start + i) % kPeerSlots;
        }

        if (slot.id == 0) {
            slot.id = peer_id;
            header_->peer_slots_used++;
            return (start + i) % kPeerSlots;
        }
    }

    return kNoSlot;
}

uint32_t Zone::find_slot(uint64_t peer_id) const noexcept
{
    const PeerSlot *slots = peer_slots();
    uint32_t start = static_cast<uint32_t>(peer_id % kPeerSlots);

    for (uint32_t i = 0; i < kPeerSlots; i++) {
        const PeerSlot &slot = slots[(start + i) % kPeerSlots];

        if (slot.id == peer_id) {
            return (start + i) % kPeerSlots;
        }

        if (slot.id == 0) {
            break;
        }
    }

    return kNoSlot;
}

void Zone::add_pins(uint64_t peer_id, int64_t delta) noexcept
{
    uint32_t slot = find_slot(peer_id);

    if (slot != kNoSlot) {
        peer_slots()[slot].pins += delta;
    }
}

uint64_t Zone::key_hash(const void *key, size_t len) const noexcept
{
    uint64_t h = hash64(key, len, header_->seed);
    // 0 marks an empty table entry.
    return h != 0 ? h : 1;
}

}  // namespace affinity

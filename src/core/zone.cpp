#include "zone.h"

#include "hashing.h"

namespace affinity {

uint32_t Zone::claim_slot(uint64_t peer_id, uint64_t now) noexcept
{
    PeerSlot *slots = peer_slots();
    uint32_t start = static_cast<uint32_t>(peer_id % kPeerSlots);
    uint32_t idlest = kNoSlot;

    // Slots are never emptied (a reclaimed one changes hands), so a probe
    // for a peer may stop at the first empty slot, as find_slot() does.
    for (uint32_t i = 0; i < kPeerSlots; i++) {
        uint32_t n = (start + i) % kPeerSlots;
        PeerSlot &slot = slots[n];

        if (slot.id == peer_id) {
            __atomic_store_n(&slot.last_used, now, __ATOMIC_RELAXED);
            return n;
        }

        if (slot.id == 0) {
            slot = PeerSlot{};
            slot.id = peer_id;
            slot.last_used = now;
            header_->peer_slots_used++;
            return n;
        }

        uint64_t used = atomic_load(&slot.last_used);

        if (atomic_load(&slot.inflight) <= 0 && used + kSlotReclaimIdle <= now
            && (idlest == kNoSlot || used < slots[idlest].last_used))
        {
            idlest = n;
        }
    }

    if (idlest == kNoSlot) {
        return kNoSlot;
    }

    // The sessions pinned to the old peer keep its id and move when next
    // seen; its counters go with the slot.
    PeerSlot &slot = slots[idlest];
    slot = PeerSlot{};
    slot.id = peer_id;
    slot.last_used = now;
    header_->peer_slots_reclaimed++;

    return idlest;
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

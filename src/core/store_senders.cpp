#include "store_senders.h"

#include "hashing.h"

namespace affinity {

namespace {

// How far a writer's entry is looked for from its home slot: the table is
// small enough to be searched whole, and a full one evicts.
constexpr uint32_t kSlots = AFFINITY_STORE_SENDERS;

uint64_t sender_key(uint32_t stream, uint64_t instance,
                    uint32_t sender) noexcept
{
    uint8_t bytes[16];

    for (int i = 0; i < 4; i++) {
        bytes[i] = uint8_t(stream >> (8 * i));
        bytes[12 + i] = uint8_t(sender >> (8 * i));
    }
    for (int i = 0; i < 8; i++) {
        bytes[4 + i] = uint8_t(instance >> (8 * i));
    }

    // 0 marks a free slot
    uint64_t key = hash64(bytes, sizeof(bytes), 0);
    return key ? key : 1;
}

}  // namespace

bool store_senders_admit(affinity_store_senders_t &table, uint32_t stream,
                         uint64_t instance, uint32_t sender, uint64_t seq,
                         uint32_t now) noexcept
{
    uint64_t key = sender_key(stream, instance, sender);
    uint32_t home = uint32_t(key % kSlots);
    affinity_store_sender_t *free_slot = nullptr;
    affinity_store_sender_t *oldest = nullptr;

    for (uint32_t i = 0; i < kSlots; i++) {
        affinity_store_sender_t &e = table.entries[(home + i) % kSlots];

        if (e.key == key) {
            if (seq <= e.seq) {
                return false;
            }
            e.seq = seq;
            e.heard = now;
            return true;
        }
        if (e.key == 0) {
            if (free_slot == nullptr) {
                free_slot = &e;
            }
            continue;
        }
        if (oldest == nullptr || e.heard < oldest->heard) {
            oldest = &e;
        }
    }

    // A writer not heard from: its first message, or one of a writer
    // evicted since, is taken.
    affinity_store_sender_t &slot = free_slot ? *free_slot : *oldest;
    slot.key = key;
    slot.seq = seq;
    slot.heard = now;
    slot.reserved = 0;
    return true;
}

}  // namespace affinity

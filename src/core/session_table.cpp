#include "session_table.h"

namespace affinity {

uint64_t SessionTable::buckets_for(size_t region_size) noexcept
{
    size_t fixed = sizeof(ZoneHeader) + kPeerSlots * sizeof(PeerSlot);

    if (region_size <= fixed) {
        return 0;
    }

    return (region_size - fixed) / sizeof(SessionBucket);
}

SessionBucket &SessionTable::bucket_of(uint64_t key) noexcept
{
    // Multiply-shift maps the hash onto [0, buckets) without a division.
    uint64_t n = zone_.header().buckets;
    uint64_t index = static_cast<uint64_t>(
        (static_cast<unsigned __int128>(key) * n) >> 64);

    return zone_.buckets<SessionBucket>()[index];
}

bool SessionTable::expired(const SessionEntry &entry) const noexcept
{
    // A clock that went backwards does not expire anything.
    return now_ > entry.last_used && now_ - entry.last_used > timeout_;
}

void SessionTable::drop(SessionEntry &entry) noexcept
{
    zone_.add_pins(entry.peer, -1);
    entry = SessionEntry{};
    zone_.header().used--;
}

SessionEntry *SessionTable::find(uint64_t key) noexcept
{
    SessionBucket &bucket = bucket_of(key);
    SessionEntry *found = nullptr;

    for (SessionEntry &entry : bucket.entries) {
        if (entry.key == 0) {
            continue;
        }

        if (expired(entry)) {
            drop(entry);
            zone_.header().expiries++;
            continue;
        }

        if (entry.key == key) {
            found = &entry;
        }
    }

    return found;
}

SessionEntry *SessionTable::insert(uint64_t key) noexcept
{
    SessionBucket &bucket = bucket_of(key);
    SessionEntry *victim = nullptr;

    for (SessionEntry &entry : bucket.entries) {
        if (entry.key == 0) {
            victim = &entry;
            break;
        }

        if (expired(entry)) {
            drop(entry);
            zone_.header().expiries++;
            victim = &entry;
            break;
        }

        if (victim == nullptr || entry.last_used < victim->last_used) {
            victim = &entry;
        }
    }

    if (victim->key != 0) {
        drop(*victim);
        zone_.header().evictions++;
    }

    victim->key = key;
    victim->last_used = now_;
    zone_.header().used++;

    return victim;
}

void SessionTable::repin(SessionEntry *entry, uint64_t peer) noexcept
{
    if (entry->peer != 0) {
        zone_.add_pins(entry->peer, -1);
    }

    entry->peer = peer;
    entry->spill = 0;
    zone_.add_pins(peer, 1);
}

}  // namespace affinity

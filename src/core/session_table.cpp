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

void SessionTable::drop(const SessionEntry &entry) noexcept
{
    zone_.add_pins(entry.peer, -1);
    zone_.header().used--;
}

size_t SessionTable::expire(SessionBucket &bucket) noexcept
{
    return bucket.expire(now_, timeout_, [this](const SessionEntry &entry) {
        drop(entry);
        zone_.header().expiries++;
    });
}

SessionEntry *SessionTable::find(uint64_t key) noexcept
{
    SessionBucket &bucket = bucket_of(key);
    SessionEntry *entry = bucket.find(key, expire(bucket));

    if (entry) {
        entry->last_used = now_;
    }

    return entry;
}

SessionEntry *SessionTable::insert(uint64_t key) noexcept
{
    SessionBucket &bucket = bucket_of(key);
    SessionEntry *entry = bucket.push_front(
        expire(bucket), [this](const SessionEntry &victim) {
            drop(victim);
            zone_.header().evictions++;
        });

    entry->key = key;
    entry->last_used = now_;
    zone_.header().used++;

    return entry;
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

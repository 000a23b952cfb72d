#include "session_table.h"

namespace affinity {

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
    SessionBucket &bucket = zone_.bucket_of<SessionBucket>(key);
    return bucket.find(key, expire(bucket), now_);
}

SessionEntry *SessionTable::insert(uint64_t key) noexcept
{
    SessionBucket &bucket = zone_.bucket_of<SessionBucket>(key);
    SessionEntry *entry = bucket.push_front(
        expire(bucket), [this](const SessionEntry &victim) {
            drop(victim);
            zone_.header().evictions++;
        });

    entry->key = key;
    entry->last_used = now_;
    zone_.header().used++;
    zone_.header().inserts++;

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

void SessionTable::pin(uint64_t key, uint64_t peer) noexcept
{
    SessionEntry *entry = find(key);

    if (entry == nullptr) {
        entry = insert(key);
    }

    if (entry->peer != peer) {
        repin(entry, peer);
    }
}

}  // namespace affinity

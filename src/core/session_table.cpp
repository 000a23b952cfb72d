#include "session_table.h"

#include <algorithm>

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
    set_pinned_at(*entry, std::max(pinned_at(*entry), now_ms_));
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

SessionEntry *SessionTable::peek(SessionBucket &bucket, uint64_t key,
                                 size_t live, size_t *index) noexcept
{
    for (size_t i = 0; i < live; i++) {
        if (bucket.entries[i].key == key) {
            *index = i;
            return &bucket.entries[i];
        }
    }
    return nullptr;
}

// The entry of key made to hold peer as of version, used at the sender
// then (never later than now): an existing one made the most recent, or
// a new one.
SessionEntry *SessionTable::learned(uint64_t key, uint64_t peer,
                                    uint64_t version) noexcept
{
    SessionBucket &bucket = zone_.bucket_of<SessionBucket>(key);
    size_t i;
    uint32_t used = uint32_t(std::min<uint64_t>(version / 1000, now_));
    SessionEntry *entry = peek(bucket, key, expire(bucket), &i);

    if (entry) {
        entry = bucket.promote(i);
        entry->last_used = std::max(entry->last_used, used);

    } else {
        entry = insert(key);
        entry->last_used = used;
    }

    if (entry->peer != peer) {
        if (entry->peer != 0) {
            zone_.add_pins(entry->peer, -1);
        }
        entry->peer = peer;
        entry->spill = 0;
        zone_.add_pins(peer, 1);
    }

    set_pinned_at(*entry, version);
    return entry;
}

Learned SessionTable::learn(uint64_t key, uint64_t peer, uint64_t version)
    noexcept
{
    // a version is compared as the entry keeps it
    version = std::min(version, kPinnedMask);

    if (peer == 0 || now_ - std::min<uint64_t>(version / 1000, now_)
                     > timeout_)
    {
        return Learned::Stale;
    }

    SessionBucket &bucket = zone_.bucket_of<SessionBucket>(key);
    size_t i;
    SessionEntry *entry = peek(bucket, key, expire(bucket), &i);

    if (entry
        && (version < pinned_at(*entry)
            || (version == pinned_at(*entry) && peer <= entry->peer)))
    {
        return Learned::Stale;
    }

    learned(key, peer, version);
    return Learned::Applied;
}

Learned SessionTable::claim(uint64_t key, uint64_t peer, uint64_t version)
    noexcept
{
    version = std::min(version, kPinnedMask);

    if (peer == 0 || now_ - std::min<uint64_t>(version / 1000, now_)
                     > timeout_)
    {
        return Learned::Stale;
    }

    SessionBucket &bucket = zone_.bucket_of<SessionBucket>(key);
    size_t i;
    SessionEntry *entry = peek(bucket, key, expire(bucket), &i);

    if (entry && entry->peer != peer) {
        return Learned::Taken;
    }

    learned(key, peer, entry ? std::max(pinned_at(*entry), version)
                             : version);
    return Learned::Applied;
}

}  // namespace affinity

// The session table: session key hash -> pinned peer, in a zone's buckets.
//
// Set-associative: a key maps to one bucket of kSessionWays entries (four
// cache lines); lookups and inserts touch that bucket only, so every
// operation is O(1) and needs no allocation.  Inside a bucket, entries idle
// longer than the timeout are reclaimed first, then the least recently used
// is evicted (exact LRU, see lru_bucket.h).  All functions require the zone
// lock.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lru_bucket.h"
#include "zone.h"

namespace affinity {

struct SessionEntry {
    uint64_t key;           // seeded key hash; 0 = empty
    uint64_t peer;          // pinned peer id
    uint64_t spill;         // peer that took this session's spills, or 0
    uint32_t last_used;     // seconds
    uint32_t reserved;
};

constexpr uint32_t kSessionWays = 8;

struct alignas(64) SessionBucket : LruBucket<SessionEntry, kSessionWays> {
};

static_assert(sizeof(SessionBucket) == 256, "a bucket is four cache lines");

class SessionTable {
public:
    SessionTable(Zone zone, uint32_t now, uint32_t timeout) noexcept
        : zone_(zone), now_(now), timeout_(timeout) {}

    // The live entry of key, made the most recently used; nullptr if
    // absent.  Reclaims the expired entries of the bucket.
    SessionEntry *find(uint64_t key) noexcept;

    // A new entry for key (not present), evicting the bucket's least
    // recently used entry when it is full.  Its peer fields are zeroed.
    // Invalidates entries returned earlier.
    SessionEntry *insert(uint64_t key) noexcept;

    // Points an entry at another peer, keeping the per-peer pin counts.
    void repin(SessionEntry *entry, uint64_t peer) noexcept;

    // Pins key to peer: its entry, made the most recently used, or a new
    // one.
    void pin(uint64_t key, uint64_t peer) noexcept;

private:
    size_t expire(SessionBucket &bucket) noexcept;
    void drop(const SessionEntry &entry) noexcept;

    Zone zone_;
    uint32_t now_;
    uint32_t timeout_;
};

}  // namespace affinity

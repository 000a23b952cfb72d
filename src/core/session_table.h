// The session table: session key hash -> pinned peer, in a zone's buckets.
// A responses zone keeps response ids in the same table.
//
// Set-associative: a key maps to one bucket of kSessionWays entries (four
// cache lines); lookups and inserts touch that bucket only, so every
// operation is O(1) and needs no allocation.  Inside a bucket, entries idle
// longer than the timeout are reclaimed first, then the least recently used
// is evicted (exact LRU, see lru_bucket.h).  All functions require the zone
// lock.
//
// Each pin carries the wall-clock millisecond it was made at, by whichever
// instance made it: what other instances learned (learn(), claim()) is
// applied only over an older pin, so that reading the store's stream again,
// or late, never puts back a pin that was since moved.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lru_bucket.h"
#include "zone.h"

namespace affinity {

struct SessionEntry {
    uint64_t key;           // seeded key hash; 0 = empty
    uint64_t peer;          // pinned peer id
    uint64_t stamps;        // ms of the wall clock: when it was pinned
                            // (pinned_at()), and when a request of it
                            // was last routed here (routed_within())
    uint32_t last_used;     // seconds
    uint32_t spill;         // short id of the peer that took this
                            // session's spills, or 0
};

// SessionEntry::stamps: the pin's millisecond in the low bits (to the
// year 2109), the last routing's modulo 2^22 ms (70 minutes) above it.
constexpr unsigned kPinnedBits = 42;
constexpr uint64_t kPinnedMask = (uint64_t{1} << kPinnedBits) - 1;
constexpr uint64_t kRoutedMask = (uint64_t{1} << (64 - kPinnedBits)) - 1;

inline uint64_t pinned_at(const SessionEntry &e) noexcept
{
    return e.stamps & kPinnedMask;
}

inline void set_pinned_at(SessionEntry &e, uint64_t ms) noexcept
{
    e.stamps = (e.stamps & ~kPinnedMask) | (ms & kPinnedMask);
}

inline void set_routed_at(SessionEntry &e, uint64_t ms) noexcept
{
    e.stamps = pinned_at(e) | ((ms & kRoutedMask) << kPinnedBits);
}

// Whether a request of the session was routed here less than window ms
// before ms (never, for an entry only learned from another instance).
inline bool routed_within(const SessionEntry &e, uint64_t ms,
                          uint64_t window) noexcept
{
    uint64_t routed = e.stamps >> kPinnedBits;

    return routed != 0 && ((ms - routed) & kRoutedMask) < window;
}

constexpr uint32_t kSessionWays = 8;

struct alignas(64) SessionBucket : LruBucket<SessionEntry, kSessionWays> {
};

static_assert(sizeof(SessionBucket) == 256, "a bucket is four cache lines");

enum class Learned {
    Applied,        // the entry holds it now
    Stale,          // the entry holds a newer pin, or it expired already
    Taken           // a response id another peer holds
};

class SessionTable {
public:
    // now_ms: the wall clock, for the pins made here (0: now's seconds).
    SessionTable(Zone zone, uint32_t now, uint32_t timeout,
                 uint64_t now_ms = 0) noexcept
        : zone_(zone), now_(now), timeout_(timeout),
          now_ms_(now_ms ? now_ms : uint64_t(now) * 1000) {}

    // The live entry of key, made the most recently used; nullptr if
    // absent.  Reclaims the expired entries of the bucket.
    SessionEntry *find(uint64_t key) noexcept;

    // A new entry for key (not present), evicting the bucket's least
    // recently used entry when it is full.  Its peer fields are zeroed.
    // Invalidates entries returned earlier.
    SessionEntry *insert(uint64_t key) noexcept;

    // Points an entry at another peer, as of now, keeping the per-peer pin
    // counts.
    void repin(SessionEntry *entry, uint64_t peer) noexcept;

    // Pins key to peer as of now: its entry, made the most recently used,
    // or a new one.
    void pin(uint64_t key, uint64_t peer) noexcept;

    // Another instance pinned key to peer at version (its ms): applied
    // over an older pin, or as a new entry last used then; on a tie the
    // higher peer id wins, so that every instance keeps the same.  Not
    // applied, the entry is left as it was, not even made more recent.
    Learned learn(uint64_t key, uint64_t peer, uint64_t version) noexcept;

    // A response id that peer produced at version, here or at another
    // instance: the first peer to hold it keeps it while its entry lives;
    // the same peer's again refreshes it.
    Learned claim(uint64_t key, uint64_t peer, uint64_t version) noexcept;

private:
    size_t expire(SessionBucket &bucket) noexcept;
    void drop(const SessionEntry &entry) noexcept;
    SessionEntry *peek(SessionBucket &bucket, uint64_t key, size_t live,
                       size_t *index) noexcept;
    SessionEntry *learned(uint64_t key, uint64_t peer, uint64_t version)
        noexcept;

    Zone zone_;
    uint32_t now_;
    uint32_t timeout_;
    uint64_t now_ms_;
};

}  // namespace affinity

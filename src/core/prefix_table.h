// The learned prefix index: level hash -> the few peers that served that
// prompt prefix most recently, in a zone's buckets.
//
// Same design as the session table (set-associative, exact LRU inside the
// bucket, idle expiry, O(1), no allocation).  An entry remembers up to
// kPrefixPeers peers, most recent first, by the low 32 bits of their ids:
// a collision between two peers of one upstream has odds of about n^2/2^33.
// All functions require the zone lock.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lru_bucket.h"
#include "zone.h"

namespace affinity {

constexpr size_t kPrefixPeers = 4;
constexpr int kNotHeld = -1;

struct PrefixEntry {
    uint64_t key;                   // seeded level hash; 0 = empty
    uint32_t peers[kPrefixPeers];   // low 32 bits of peer ids, 0 = none
    uint32_t last_used;             // seconds
    // Per peer, its cache clock when it last got the prefix, in stamps
    // (cache_model.h); 0 in entries of a zone laid out before.
    uint8_t stamps[kPrefixPeers];
};

constexpr uint32_t kPrefixWays = 8;

struct alignas(64) PrefixBucket : LruBucket<PrefixEntry, kPrefixWays> {
};

static_assert(sizeof(PrefixEntry) == 32, "an entry is half a cache line");
static_assert(sizeof(PrefixBucket) == 256, "a bucket is four cache lines");

class PrefixTable {
public:
    PrefixTable(Zone zone, uint32_t now, uint32_t timeout) noexcept
        : zone_(zone), now_(now), timeout_(timeout) {}

    // The key of a level in this zone: its hash mixed with the zone seed.
    uint64_t key(uint64_t level_hash) const noexcept;

    // The live entry of key, made the most recently used; nullptr if absent.
    PrefixEntry *find(uint64_t key) noexcept;

    // Whether key has a live entry, and when it was last used (found or
    // recorded, in seconds), looked at without using it.
    bool peek(uint64_t key, uint32_t *last_used) noexcept;

    // Records that peer served the prefix of key, its cache clock then
    // reading stamp: the peer becomes the entry's most recent; the entry
    // is created, and the bucket's least recently used entry evicted, if
    // needed.  Returns the peer's stamp before, or kNotHeld if the entry
    // did not list it.
    int record(uint64_t key, uint64_t peer_id, uint8_t stamp) noexcept;

private:
    size_t expire(PrefixBucket &bucket) noexcept;

    Zone zone_;
    uint32_t now_;
    uint32_t timeout_;
};

}  // namespace affinity

#include "hashing.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace affinity {

uint64_t hash64(const void *data, size_t len, uint64_t seed) noexcept
{
    return XXH3_64bits_withSeed(data, len, seed);
}

uint64_t peer_id(const char *name, size_t len) noexcept
{
    uint64_t id = hash64(name, len, kPeerIdSeed);
    // 0 marks an empty slot in the zone's tables.
    return id != 0 ? id : 1;
}

uint64_t ring_key_hash(const void *key, size_t len) noexcept
{
    return hash64(key, len, kRingSeed);
}

}  // namespace affinity

// Hashing used throughout the core: XXH3 64-bit, inlined (the key and peer
// hashes run on every request).
#pragma once

#include <cstddef>
#include <cstdint>

namespace affinity {

uint64_t hash64(const void *data, size_t len, uint64_t seed) noexcept;

// Fixed seeds: peer ids and ring positions must be the same in every nginx
// instance and across restarts, unlike the per-zone seed of table keys.
constexpr uint64_t kPeerIdSeed = 0x70656572'69643031ULL;    // "peerid01"
constexpr uint64_t kRingSeed = 0x72696e67'6b657931ULL;      // "ringkey1"
constexpr uint64_t kDealSeed = 0x6465616c'70656572ULL;      // "dealpeer"

uint64_t peer_id(const char *name, size_t len) noexcept;
uint64_t ring_key_hash(const void *key, size_t len) noexcept;

}  // namespace affinity

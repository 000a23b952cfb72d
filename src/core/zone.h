// Layout of an affinity zone in shared memory, and a view over it.
//
// A zone is one contiguous region holding, at fixed offsets:
//   header       magic, layout version, kind, parameters, table counters
//   peer slots   per-peer counters (in-flight, requests, pins), open
//                addressing by peer id; counters are updated atomically
//   buckets      a set-associative table: each bucket is a few cache lines
//                of entries, with LRU and idle expiry inside the bucket
//
// Only plain data addressed by offsets lives here: every nginx process maps
// the region at its own address, and a reload hands the same region to the
// next configuration cycle.
#pragma once

#include <cstddef>
#include <cstdint>

namespace affinity {

constexpr uint64_t kZoneMagic = 0x41464e5a4f4e4531ULL;    // "AFNZONE1"
constexpr uint32_t kLayoutVersion = 2;
constexpr uint32_t kPeerSlots = 256;
constexpr uint32_t kNoSlot = UINT32_MAX;
// Seconds a peer slot must be unused before another peer may take it.
constexpr uint64_t kSlotReclaimIdle = 3600;

enum class ZoneKind : uint32_t { Sessions = 1 };

struct alignas(64) ZoneHeader {
    uint64_t magic;
    uint32_t layout_version;
    uint32_t kind;
    uint64_t region_size;
    uint64_t seed;
    uint64_t peers_offset;
    uint64_t buckets_offset;
    uint64_t buckets;
    uint32_t ways;
    uint32_t entry_size;
    // Table counters: changed only under the zone lock.
    uint64_t used;
    uint64_t evictions;
    uint64_t expiries;
    uint32_t peer_slots_used;
    uint32_t peer_slots_reclaimed;  // slots handed to another peer
};

constexpr size_t kRoutes = 8;      // affinity_route_e values

struct alignas(64) PeerSlot {
    uint64_t id;                // 0 = free
    int64_t inflight;           // atomic
    uint64_t requests;          // atomic
    int64_t pins;               // entries pinned to this peer (zone lock)
    uint64_t failures;          // atomic: tries that failed
    uint64_t last_used;         // atomic: seconds, last claim or request
    uint64_t reserved[2];
    uint64_t routes[kRoutes];   // atomic: requests by routing outcome
};

static_assert(sizeof(PeerSlot) == 128, "a peer slot is two cache lines");

// Atomic helpers for counters in shared memory.  The values are plain
// integers in the region (POD), updated with the compiler's builtins.
inline int64_t atomic_load(const int64_t *v) noexcept
{
    return __atomic_load_n(v, __ATOMIC_RELAXED);
}

inline uint64_t atomic_load(const uint64_t *v) noexcept
{
    return __atomic_load_n(v, __ATOMIC_RELAXED);
}

template <typename T>
inline void atomic_add(T *v, T delta) noexcept
{
    __atomic_fetch_add(v, delta, __ATOMIC_RELAXED);
}

class Zone {
public:
    explicit Zone(void *region) noexcept
        : header_(static_cast<ZoneHeader *>(region)) {}

    ZoneHeader &header() const noexcept { return *header_; }

    PeerSlot *peer_slots() const noexcept
    {
        return reinterpret_cast<PeerSlot *>(
            reinterpret_cast<char *>(header_) + header_->peers_offset);
    }

    template <typename Bucket>
    Bucket *buckets() const noexcept
    {
        return reinterpret_cast<Bucket *>(
            reinterpret_cast<char *>(header_) + header_->buckets_offset);
    }

    // The bucket of a key: multiply-shift maps the 64-bit hash onto
    // [0, buckets) without a division.
    template <typename Bucket>
    Bucket &bucket_of(uint64_t key) const noexcept
    {
        uint64_t index = static_cast<uint64_t>(
            (static_cast<unsigned __int128>(key) * header_->buckets) >> 64);
        return buckets<Bucket>()[index];
    }

    // Slot of a peer id, claimed if absent; kNoSlot when the table is full.
    // Caller holds the zone lock.
    // Finds or claims the counter slot of a peer (caller holds the zone
    // lock).  With every slot taken, the one idle longest, with nothing in
    // flight and unused for kSlotReclaimIdle seconds, is given to the new
    // peer: peers that come and go (servers with "resolve") must not use up
    // the table.  kNoSlot if none can be had.
    uint32_t claim_slot(uint64_t peer_id, uint64_t now) noexcept;

    // Slot of a peer id, or kNoSlot.  Caller holds the zone lock.
    uint32_t find_slot(uint64_t peer_id) const noexcept;

    void add_pins(uint64_t peer_id, int64_t delta) noexcept;

    uint64_t key_hash(const void *key, size_t len) const noexcept;

private:
    ZoneHeader *header_;
};

}  // namespace affinity

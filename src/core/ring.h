// Weighted consistent-hash ring over a fixed peer list, laid out in memory
// the caller owns (as an nginx worker keeps its peer view in one block):
// built once per peer list, read-only afterwards, so lookups need no lock.
// Peers are identified by their position in the list it was built from.
#pragma once

#include <cstddef>
#include <cstdint>

#include "affinity_core.h"

namespace affinity {

constexpr size_t kMaxPeers = AFFINITY_MAX_PEERS;

class Ring {
public:
    struct Point {
        uint64_t hash;
        uint32_t peer;
        uint32_t reserved;
    };

    struct Header {
        uint32_t npeers;
        uint32_t npoints;
    };

    // Bytes a ring of these peers takes; 0 if it cannot be built.
    static size_t size(const affinity_peer_t *peers, size_t npeers,
                       uint32_t points_per_weight) noexcept;

    // Builds the ring in mem (8-byte aligned, size() bytes).  False on bad
    // arguments.  No allocation.
    static bool build(void *mem, size_t size, const affinity_peer_t *peers,
                      size_t npeers, uint32_t points_per_weight) noexcept;

    explicit Ring(const void *mem) noexcept
        : header_(static_cast<const Header *>(mem)) {}

    size_t points() const noexcept { return header_->npoints; }
    size_t peers() const noexcept { return header_->npeers; }

    // Calls visit(peer_index) for each distinct peer in ring order, starting
    // at the first point at or after hash, until visit returns true or every
    // peer was visited.  Returns the index visit accepted, or -1.
    template <typename Visit>
    int walk(uint64_t hash, Visit visit) const noexcept;

private:
    const Point *point_array() const noexcept
    {
        return reinterpret_cast<const Point *>(header_ + 1);
    }

    size_t first_at_or_after(uint64_t hash) const noexcept;

    const Header *header_;
};

static_assert(sizeof(Ring::Header) % alignof(Ring::Point) == 0,
              "the points follow the header aligned");

template <typename Visit>
int Ring::walk(uint64_t hash, Visit visit) const noexcept
{
    size_t n = points();
    size_t npeers = peers();

    if (n == 0) {
        return -1;
    }

    // A peer appears at many points; remember which were offered already.
    uint64_t seen[kMaxPeers / 64] = {};
    const Point *p = point_array();
    size_t distinct = 0;
    size_t start = first_at_or_after(hash);

    for (size_t step = 0; step < n && distinct < npeers; step++) {
        uint32_t peer = p[(start + step) % n].peer;
        uint64_t bit = uint64_t{1} << (peer % 64);

        if (seen[peer / 64] & bit) {
            continue;
        }

        seen[peer / 64] |= bit;
        distinct++;

        if (visit(peer)) {
            return static_cast<int>(peer);
        }
    }

    return -1;
}

}  // namespace affinity

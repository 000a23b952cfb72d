// Weighted consistent-hash ring over a fixed peer list.  Built once per
// upstream at configuration time; read-only afterwards, so lookups need no
// lock.  Peers are identified by their position in the list given to the
// constructor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace affinity {

struct RingPeer {
    uint64_t id;        // stable peer id (hash of its address)
    uint32_t weight;
};

class Ring {
public:
    Ring(const RingPeer *peers, size_t npeers, uint32_t points_per_weight);

    size_t points() const noexcept { return points_.size(); }
    size_t peers() const noexcept { return npeers_; }

    // Calls visit(peer_index) for each distinct peer in ring order, starting
    // at the first point at or after hash, until visit returns true or every
    // peer was visited.  Returns the index visit accepted, or -1.
    template <typename Visit>
    int walk(uint64_t hash, Visit visit) const noexcept;

private:
    struct Point {
        uint64_t hash;
        uint32_t peer;
    };

    size_t first_at_or_after(uint64_t hash) const noexcept;

    std::vector<Point> points_;
    size_t npeers_;
};

template <typename Visit>
int Ring::walk(uint64_t hash, Visit visit) const noexcept
{
    if (points_.empty()) {
        return -1;
    }

    // A peer appears at many points; remember which were offered already.
    // Rings hold at most kMaxPeers peers (checked by the constructor).
    uint64_t seen[4] = {0, 0, 0, 0};
    size_t distinct = 0;
    size_t n = points_.size();
    size_t start = first_at_or_after(hash);

    for (size_t step = 0; step < n && distinct < npeers_; step++) {
        uint32_t peer = points_[(start + step) % n].peer;
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

constexpr size_t kMaxPeers = 256;

}  // namespace affinity

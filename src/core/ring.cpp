#include "ring.h"

#include <algorithm>
#include <stdexcept>

#include "hashing.h"

namespace affinity {

Ring::Ring(const RingPeer *peers, size_t npeers, uint32_t points_per_weight)
    : npeers_(npeers)
{
    if (npeers == 0 || npeers > kMaxPeers || points_per_weight == 0) {
        throw std::invalid_argument("ring: bad peer count or point count");
    }

    size_t total = 0;
    for (size_t i = 0; i < npeers; i++) {
        total += size_t{std::max<uint32_t>(peers[i].weight, 1)}
                 * points_per_weight;
    }

    points_.reserve(total);

    // Each point's position depends only on the peer's id and the point's
    // ordinal, so adding or removing a peer moves only that peer's keys.
    for (size_t i = 0; i < npeers; i++) {
        size_t count = size_t{std::max<uint32_t>(peers[i].weight, 1)}
                       * points_per_weight;

        for (size_t k = 0; k < count; k++) {
            uint64_t material[2] = {peers[i].id, k};
            points_.push_back(
                {hash64(material, sizeof(material), kRingSeed),
                 static_cast<uint32_t>(i)});
        }
    }

    // Ties between equal hashes are broken by peer id, not by list position,
    // so the ring does not depend on the order servers are written in.
    std::sort(points_.begin(), points_.end(),
              [peers](const Point &a, const Point &b) {
                  if (a.hash != b.hash) {
                      return a.hash < b.hash;
                  }
                  return peers[a.peer].id < peers[b.peer].id;
              });
}

size_t Ring::first_at_or_after(uint64_t hash) const noexcept
{
    auto it = std::lower_bound(points_.begin(), points_.end(), hash,
                               [](const Point &p, uint64_t h) {
                                   return p.hash < h;
                               });
    return it == points_.end() ? 0 : static_cast<size_t>(it - points_.begin());
}

}  // namespace affinity

#include "ring.h"

#include <algorithm>

#include "hashing.h"

namespace affinity {

namespace {

size_t point_count(const affinity_peer_t *peers, size_t npeers,
                   uint32_t points_per_weight) noexcept
{
    size_t total = 0;

    for (size_t i = 0; i < npeers; i++) {
        total += size_t{std::max<uint32_t>(peers[i].weight, 1)}
                 * points_per_weight;
    }

    return total;
}

}  // namespace

size_t Ring::size(const affinity_peer_t *peers, size_t npeers,
                  uint32_t points_per_weight) noexcept
{
    if (peers == nullptr || npeers == 0 || npeers > kMaxPeers
        || points_per_weight == 0)
    {
        return 0;
    }

    size_t n = point_count(peers, npeers, points_per_weight);

    return n > UINT32_MAX ? 0 : sizeof(Header) + n * sizeof(Point);
}

bool Ring::build(void *mem, size_t size, const affinity_peer_t *peers,
                 size_t npeers, uint32_t points_per_weight) noexcept
{
    size_t need = Ring::size(peers, npeers, points_per_weight);

    if (need == 0 || mem == nullptr || size < need
        || reinterpret_cast<uintptr_t>(mem) % alignof(Point) != 0)
    {
        return false;
    }

    Header *header = static_cast<Header *>(mem);
    Point *points = reinterpret_cast<Point *>(header + 1);
    size_t n = 0;

    // Each point's position depends only on the peer's id and the point's
    // ordinal, so adding or removing a peer moves only that peer's keys.
    for (size_t i = 0; i < npeers; i++) {
        size_t count = size_t{std::max<uint32_t>(peers[i].weight, 1)}
                       * points_per_weight;

        for (size_t k = 0; k < count; k++) {
            uint64_t material[2] = {peers[i].id, k};
            points[n++] = {hash64(material, sizeof(material), kRingSeed),
                           static_cast<uint32_t>(i), 0};
        }
    }

    // Ties between equal hashes are broken by peer id, not by list position,
    // so the ring does not depend on the order servers are written in.
    // (std::sort works in place: no allocation.)
    std::sort(points, points + n, [peers](const Point &a, const Point &b) {
        if (a.hash != b.hash) {
            return a.hash < b.hash;
        }
        return peers[a.peer].id < peers[b.peer].id;
    });

    header->npeers = static_cast<uint32_t>(npeers);
    header->npoints = static_cast<uint32_t>(n);

    return true;
}

size_t Ring::first_at_or_after(uint64_t hash) const noexcept
{
    const Point *begin = point_array();
    const Point *end = begin + points();
    const Point *it = std::lower_bound(begin, end, hash,
                                       [](const Point &p, uint64_t h) {
                                           return p.hash < h;
                                       });
    return it == end ? 0 : static_cast<size_t>(it - begin);
}

}  // namespace affinity

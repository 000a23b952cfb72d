/*
 * affinity_peers.h - hashing, the peers an upstream balances and its
 * consistent-hash ring.
 * Included by affinity_core.h.
 */

#ifndef AFFINITY_PEERS_H
#define AFFINITY_PEERS_H

#include "affinity_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* XXH3 64-bit of data with the given seed. */
AFFINITY_API uint64_t affinity_hash(const void *data, size_t len,
    uint64_t seed) AFFINITY_NOEXCEPT;

/*
 * The stable identity of an upstream peer, derived from its address text
 * (nginx's peer->name, e.g. "10.0.0.1:8000").  Independent of the peer's
 * position in the list and of any zone, so pins survive reloads and peer
 * list reordering.  Never 0.
 */
AFFINITY_API uint64_t affinity_peer_id(const char *name, size_t len)
    AFFINITY_NOEXCEPT;

/*
 * The hash that places a key on the consistent-hash ring.  Fixed seed, so
 * several nginx instances with the same peer list place a key alike.
 */
AFFINITY_API uint64_t affinity_ring_hash(const void *key, size_t len)
    AFFINITY_NOEXCEPT;


/* ---- peers ----------------------------------------------------------- */

/* The most peers an upstream may have for the balancer. */
#define AFFINITY_MAX_PEERS  256

/* A peer as the balancer knows it, in the order of the upstream's list. */
typedef struct {
    uint64_t    id;         /* affinity_peer_id() */
    uint32_t    weight;     /* nginx "weight=", >= 1 */
    uint32_t    slot;       /* its counter slot in the zone when the list
                               was built, or AFFINITY_NO_SLOT; routing
                               checks it and claims another if it went to
                               another peer since */
} affinity_peer_t;


/* ---- consistent-hash ring --------------------------------------------- */

typedef struct affinity_ring_s  affinity_ring_t;

/*
 * A weighted ring: each peer gets points_per_weight * weight points, laid
 * out in memory the caller provides.  affinity_ring_size() tells how many
 * bytes (0 on bad arguments: no peers, more than AFFINITY_MAX_PEERS, no
 * points); affinity_ring_build() fills mem (8-byte aligned, at least that
 * size) and returns it as the ring, or NULL on bad arguments.  Peer indexes
 * returned by the ring are positions in the array given here.  No
 * allocation; not for the hot path.
 */
AFFINITY_API size_t affinity_ring_size(const affinity_peer_t *peers,
    size_t npeers, uint32_t points_per_weight) AFFINITY_NOEXCEPT;
AFFINITY_API affinity_ring_t *affinity_ring_build(void *mem, size_t size,
    const affinity_peer_t *peers, size_t npeers, uint32_t points_per_weight)
    AFFINITY_NOEXCEPT;
AFFINITY_API size_t affinity_ring_points(const affinity_ring_t *ring)
    AFFINITY_NOEXCEPT;

/*
 * Writes up to max distinct peer indexes in ring order, starting at the
 * first point at or after hash.  Returns how many were written.
 */
AFFINITY_API size_t affinity_ring_walk(const affinity_ring_t *ring,
    uint64_t hash, uint32_t *out, size_t max) AFFINITY_NOEXCEPT;


#ifdef __cplusplus
}
#endif

#endif /* AFFINITY_PEERS_H */

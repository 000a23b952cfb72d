// What a peer's replies teach of its speed: the prefill time of a prompt
// token it does not hold, the decode time of an output token, and the wait
// before its prefill starts by how many requests it had in flight when the
// request was sent.  Learned per peer from the times nginx observes
// (affinity_zone_peer_timed()), kept in the peer's counter slot, and read
// to estimate a request's time to first token there (docs/routing.md).
#pragma once

#include <cstddef>
#include <cstdint>

#include "affinity_core.h"

namespace affinity {

// In-flight counts the wait is learned for: 0 .. kPaceQueues - 1, the last
// for that many or more.
constexpr uint32_t kPaceQueues = AFFINITY_PACE_QUEUES;

// One cache line of a peer slot (zone.h).  Every figure is written with
// relaxed atomics by the worker that saw the reply, without a lock: two
// replies learned at once may lose one update, which an average of many
// does not miss.  0 in a figure: not learned yet.
struct PeerPace {
    uint32_t prefill_ns;                // per prompt token not held
    uint32_t decode_us;                 // per output token
    uint32_t wait_us[kPaceQueues];      // before prefill starts, + 1
    uint32_t replies;                   // learned from
    uint32_t chars_per_token;           // x 256: prompt characters per
                                        // prompt token, from usage
};

static_assert(sizeof(PeerPace) == 64, "the pace fills one line");

// Learns from one reply (affinity_reply_times_t).
void pace_learn(PeerPace &pace, const affinity_reply_times_t &t) noexcept;

// The wait a request sent now would have before its prefill starts, in
// microseconds, with queued requests in flight on the peer before it;
// -1 while nothing is learned at that count or below.
int64_t pace_wait(const PeerPace &pace, uint32_t queued) noexcept;

// How waits grow with the queue, pooled over an upstream's peers: each
// peer's wait at a depth in its own decode time, so that fast and slow
// peers of one engine show one shape.  Flat below the knee (running slots
// free), one step of decode tokens a request beyond it.
struct QueueShape {
    uint32_t knee = 0;      // requests in flight that wait nothing; 0:
                            // no queue seen yet
    double step = 0.0;      // decode tokens a request beyond the knee
};

// The shape of the peers' paces (n of them, null entries skipped).
QueueShape pace_shape(const PeerPace *const *paces, size_t n) noexcept;

// The time to first token of a prompt of `uncached` characters the peer
// does not hold, sent behind `queued` requests, by the shape: the wait
// beyond the knee and the prefill, in microseconds; -1 while the peer's
// decode or prefill is not learned.
int64_t pace_estimate(const PeerPace &pace, const QueueShape &shape,
                      uint32_t queued, uint64_t uncached) noexcept;

// The prefill alone of a prompt of `uncached` characters the peer does not
// hold, in microseconds, from one read of its figures; -1 while its
// prefill is not learned.
int64_t pace_prefill(const PeerPace &pace, uint64_t uncached) noexcept;

}  // namespace affinity

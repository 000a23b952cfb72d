// Peer selection: consistent hashing with bounded loads over the in-flight
// counters every worker shares, and the session routing built on it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "affinity_core.h"
#include "peer_pace.h"
#include "ring.h"
#include "zone.h"

namespace affinity {

// The load picture of one selection: the peers' in-flight counts read once
// from the zone, and the bound each peer may reach.
class LoadBound {
public:
    // Reads each peer's in-flight count from its slot.  A peer whose slot
    // is not its own (unset, or handed to another peer since the caller
    // looked it up) claims one now, so that no peer is balanced blind
    // while a slot can be had (caller holds the zone lock).
    LoadBound(Zone zone, const affinity_peer_t *peers, const uint8_t *states,
              size_t npeers, const affinity_balance_t &balance,
              uint64_t now) noexcept;

    size_t size() const noexcept { return npeers_; }
    bool usable(size_t i) const noexcept
    {
        return states_[i] == AFFINITY_PEER_USABLE;
    }

    // Whether peer i may serve a session already pinned to it: a draining
    // peer (nginx "drain") keeps its sessions but takes nothing new.
    bool serves_pins(size_t i) const noexcept
    {
        return states_[i] == AFFINITY_PEER_USABLE
               || states_[i] == AFFINITY_PEER_DRAINING;
    }

    // Whether peer i may take one more request without passing its bound:
    // inflight + 1 <= max(factor * share, share + slack), where share is the
    // peer's weighted part of all in-flight requests plus this one; with
    // extra, that many requests above the bound.  With other instances
    // (affinity_store), counting what they may be sending it unseen
    // (fits()).
    bool accepts(size_t i, int64_t extra = 0) const noexcept;

    // The usable peer least loaded (less_loaded(); by counts alone unless
    // timed), other than skip; ties go to the first in rotation order
    // starting at rotate.  -1 if none.
    int least_loaded(int skip, uint32_t rotate, bool timed = true) const
        noexcept;

    // The usable peer least loaded; ties go to the first of them in ring
    // order from hash (so that equal prompts meet on an idle fleet), or
    // without a ring in rotation order from rotate.  By counts alone,
    // while requests are presumed placed beside this one (a burst through
    // several instances), a peer dealt() by hash instead.  -1 if none.
    int least_loaded_on_ring(const Ring *ring, uint64_t hash,
                             uint32_t rotate, bool timed = true) const
        noexcept;

    // The first usable peer under its bound in ring order from hash, other
    // than skip; -1 if none.
    int first_on_ring(const Ring &ring, uint64_t hash, int skip) const
        noexcept;

    // Whether peer i may take one more request and stay within the
    // bound's slack (plus extra) of its share: the bound without its
    // factor, inflight + 1 <= share + slack + extra (and fits()).
    bool within_slack(size_t i, int64_t extra) const noexcept;

    int index_of(uint64_t peer_id) const noexcept;

    // Index of the peer whose id has these low 32 bits (prefix entries
    // keep short ids), or -1.
    int index_of_short(uint32_t short_id) const noexcept;

    // The counter slot of peer i, or kNoSlot.
    uint32_t slot(size_t i) const noexcept { return slots_[i]; }

    // The requests in flight on peer i, as this selection counted them.
    int64_t inflight(size_t i) const noexcept { return inflight_[i]; }

    // The estimated time to first token on peer i of a prompt of uncached
    // characters it does not hold, in microseconds (peer_pace.h); -1
    // while its pace is not learned.
    int64_t first_token(size_t i, uint64_t uncached) const noexcept;

    // The prefill alone on peer i of uncached characters, in
    // microseconds; -1 while its prefill is not learned.
    int64_t prefill_time(size_t i, uint64_t uncached) const noexcept;

    // The tokens each peer's KV cache holds, as its engine reported them;
    // 0: unknown.
    const uint64_t *cache_tokens() const noexcept { return cache_tokens_; }

    bool failed(size_t i) const noexcept
    {
        return states_[i] == AFFINITY_PEER_FAILED;
    }

    // Whether peer a is the sooner: by the estimated time to first token
    // of the prompt weigh() set, the prefill ahead of it included, when
    // both peers' paces are learned and the estimates are not a tie; else
    // by fewer in-flight requests per weight (docs/routing.md, "Which peer
    // is less loaded").
    bool less_loaded(size_t a, size_t b, bool timed = true) const noexcept;

    // Whether peer to, which does not hold the first held characters of
    // the prompt, is sooner than peer from, which does: by the estimates
    // with that prefill counted on to alone, when both are learned and
    // not a tie; else by counts, (to's in flight + 2) / its weight at most
    // from's in flight / its weight.
    bool worth_copying(size_t to, size_t from, uint64_t held) const
        noexcept;

    // Whether peer to, which does not hold the first held characters of
    // the prompt, is sooner than peer from, which does, by the estimates
    // even with that prefill counted kMoveCost times.  For a session's own
    // history (history), which from alone holds, the kMoveCost - 1 extra
    // prefills are priced at the slower of the two peers' rates, since
    // what the copy displaces is prefilled again wherever its sessions go.
    // False while either pace is not learned, or the estimates tie.
    bool worth_moving(size_t to, size_t from, uint64_t held,
                      bool history = false) const noexcept;

    // Whether peer i has a running slot free for one more request: its
    // requests in flight, with those presumed of the other instances
    // beside its unheard ones (fits()), below the pooled knee.  False
    // while the knee is not learned.
    bool slot_free(size_t i) const noexcept;

    // The prompt's characters, for less_loaded(); 0: counts only.
    void weigh(uint64_t chars) noexcept { chars_ = chars; }

    // Whether what the other instances may be sending unseen is presumed
    // for this request (fits()); it is, unless routing turns it off.
    void presume(bool on) noexcept { presume_ = on; }

    // The first peer weighed while this instance had requests unheard
    // there and others routed too (-1: none), and their count as routing
    // read it.
    int watched() const noexcept { return watched_; }
    int64_t unheard(size_t i) const noexcept { return unheard_[i]; }

#ifdef AFFINITY_TRACE
    // One line on the decision and the load it was made on (trace.h).
    void trace(Zone zone, size_t chosen, int route) const noexcept;
#endif

private:
    // The requests of other instances presumed beside peer i's unheard
    // ones, when presumed for this request (fits()).
    double presumed(size_t i) const noexcept
    {
        return presume_ ? presumed_ * double(unheard_[i]) : 0.0;
    }

    // Whether one more request on peer i stays within limit, with the
    // requests the other instances may be sending it unseen (see
    // selection.cpp).
    bool fits(size_t i, double limit) const noexcept;

    // Peer i's room below level requests per weight, counting this
    // request: level * weight - (inflight + 1); 0 if unusable or full.
    double room(size_t i, double level) const noexcept;

    // A usable peer for a prompt no holder keeps, drawn with odds by its
    // room below the level this request and those presumed beside it
    // (beside_) fill the least loaded peers to; least when none is found.
    int dealt(uint64_t hash, int least) const noexcept;

    const affinity_peer_t *peers_;
    const PeerSlot *slot_base_;
    const uint8_t *states_;
    size_t npeers_;
    int64_t inflight_[kMaxPeers];
    uint32_t slots_[kMaxPeers];
    uint64_t cache_tokens_[kMaxPeers];
    int64_t unheard_[kMaxPeers];   // this instance's, not yet in the store
    double presumed_ = 0.0;         // the others' beside each unheard
    double beside_ = 0.0;           // the others' requests placed unseen
                                    // beside this one, whole (constructor)
    bool presume_ = true;
    bool shared_ = false;           // other instances route too
    // The first peer weighed (fits()) with unheard requests, -1: none.
    // What the decision consulted, not the bound: set by const checks.
    mutable int watched_ = -1;
    QueueShape shape_;              // the peers' pooled wait (peer_pace.h)
    uint64_t chars_ = 0;            // weigh()
    uint64_t backlog_[kMaxPeers];   // characters (zone.h), 0 when idle
    double share_per_weight_;
    double factor_;
    double slack_;
};

// Implements affinity_route(); see affinity_core.h.
int route(Zone zone, const Ring *ring, const affinity_peer_t *peers,
          const uint8_t *states, size_t npeers,
          const affinity_balance_t &balance,
          const affinity_request_t &request,
          affinity_decision_t &decision) noexcept;

}  // namespace affinity

// Which known holders of a prefix may still have it cached.
//
// An inference engine's prefix cache is an LRU of KV blocks: a prefix a
// replica computed is evicted once enough newer blocks have been written
// after it.  The prefix index remembers who served a prefix, not whether
// it is still there.  So each peer's cache is modelled as an LRU of a
// capacity in characters: the peer's clock (PeerSlot::cache_fill, in the
// prefix zone) counts the characters of prompts sent it beyond the part it
// was presumed to hold, and the index stamps each holder with that clock
// when it got the prefix.  A holder whose clock has since advanced by the
// capacity is presumed to have evicted it, and is not followed.
//
// The clock runs fast: the part of a prompt a peer held is known only to
// the longest level it held (levels stop at max=, and grow by 6 %; turn
// levels end where the previous turn did, but only short of max=), so a
// turn that extends a long conversation counts more new characters than
// the engine computes.  A holder is therefore presumed to evict a prefix
// after kCapacityMarginPercent of its capacity: too small a capacity is
// the costly error (turns thought evicted leave the peer that holds them),
// so the margin errs above (docs/routing.md, "The cache model").
//
// Stamps are one byte, in units of capacity / kStampsPerCapacity, so an
// entry stays half a cache line: the age is taken modulo 256 units, 16
// capacities, and a holder not sent the prefix again for that long passes
// for fresh again until the entry expires or the holder gets it again
// (with a shared store, sixteen capacities of the whole fleet's prompts,
// as for one instance in front of it).
// A capacity changed on reload changes the units: the stamps already in
// the zone mean other ages until their holders get their prefixes again.
// The capacity is the upstream's (prefix_affinity cache=), or else each
// peer's as its engine reported it (affinity_metrics: vLLM's
// cache_config_info, SGLang's max_total_num_tokens).  A peer of unknown
// capacity is not modelled: it is presumed to hold all it got.
//
// The clock counts what this instance sends and, with a shared store
// (affinity_store), what the other instances announce they sent: each
// instance's clock then runs as one instance's would for the whole fleet.
// It misses what reaches the engine past nginx, and what other instances
// sent while the store was away.  An engine that reports the prompt tokens
// it computed (affinity_metrics: prefix cache queries less hits) tells
// what its cache really took in, from every nginx instance and every
// client.  A second clock advances by that, and the peer's clock is kept
// at least as far as it: where this instance's count, which runs fast, is
// ahead, nothing changes; where others fill the engine too, the clock
// follows the engine.  The second clock is kept within a capacity behind
// the first, so that a lead this instance gained alone does not hide
// others' traffic for long.
#pragma once

#include <cstddef>
#include <cstdint>

#include "affinity_core.h"
#include "ring.h"
#include "zone.h"

namespace affinity {

constexpr uint64_t kStampsPerCapacity = 16;
constexpr uint64_t kCapacityOff = AFFINITY_CAPACITY_OFF;
constexpr uint64_t kCapacityMarginPercent = 125;

// The stamp of a clock at fill, in units of unit characters counted from
// base, where the stamp was offset.  A configured or reported capacity
// counts from 0; a learned one from where its unit last changed.
inline uint8_t stamp_at(uint64_t fill, uint64_t base, uint8_t offset,
                        uint64_t unit) noexcept
{
    return static_cast<uint8_t>(offset + (fill - base) / unit);
}

class CacheModel {
public:
    // The clocks of peers[0..npeers) in the prefix zone (slots claimed
    // there if needed; caller holds its lock).  capacity: tokens per
    // peer's cache, or 0 for each peer's reported[i] (the engine's figure
    // in the zone that counts the requests; 0 or no reported figures: the
    // last the prefix zone kept of it), or kCapacityOff for no model.
    // npeers 0: no model, and no zone needed.
    CacheModel(Zone prefixes, const affinity_peer_t *peers, size_t npeers,
               uint64_t capacity, const uint64_t *reported, uint64_t now)
        noexcept;

    // Whether any peer's cache is modelled.
    bool enabled() const noexcept { return enabled_; }

    // Peer i's clock, as a stamp.
    uint8_t stamp(size_t i) const noexcept
    {
        return enabled_ && unit_[i]
                   ? stamp_at(fill_[i], base_[i], offset_[i], unit_[i])
                   : 0;
    }

    // Whether peer i, stamped so when it got a prefix, is presumed to hold
    // it still.  A peer that is not one of this upstream's (i < 0) is
    // taken to hold it: its clock is unknown here.
    bool holds(int i, uint8_t stamp) const noexcept
    {
        return !enabled_ || i < 0 || unit_[i] == 0
               || static_cast<uint8_t>(this->stamp(size_t(i)) - stamp)
                      < kStampsPerCapacity;
    }

    // Peer i was sent chars characters it was not presumed to hold, by
    // this instance or another (affinity_prefixes_filled()).  Whether its
    // clock runs here (it has a slot in the prefix zone).
    bool add(size_t i, uint64_t chars) noexcept;

    // Peer i was chosen for a prompt of these level keys: if one of them
    // is a probe of the peer's, it is taken, its age (characters of the
    // clock since) and its level's length given for the reply to tell
    // (*age, *length; both 0 if none).  Probes older than timeout seconds
    // are dropped.
    void take_probe(size_t i, const uint64_t *keys, size_t nkeys,
                    uint32_t now, uint32_t timeout, uint32_t *age,
                    uint32_t *length) noexcept;

    // Peer i was sent a prompt whose longest level has this key and
    // length (after add()): a probe, if the peer has fewer than its share
    // of the pool and one is free (or past the timeout).
    void watch(size_t i, uint64_t key, uint32_t length, uint32_t now,
               uint32_t timeout) noexcept;

    // peer_id's reply to a prompt that took a probe of this age and
    // length told whether it held the probe's prefix (caller holds the
    // prefix zone's lock): affinity_prefixes_replied().
    static void replied(Zone prefixes, uint64_t peer_id, uint32_t age,
                        uint32_t length, bool held) noexcept;

    // The same from a reply's usage: the probe's prefix counts as held
    // when at least half of it was cached, tokens weighed in the prompt's
    // own characters per token (affinity_prefixes_replied()).
    static void replied_usage(Zone prefixes, uint64_t peer_id, uint32_t age,
                              uint32_t length, uint64_t prompt_chars,
                              uint64_t cached_tokens,
                              uint64_t prompt_tokens) noexcept;

    // peer_id's engine computed this many prompt tokens since it started
    // (caller holds the prefix zone's lock): affinity_prefixes_polled().
    static void engine_computed(Zone prefixes, uint64_t peer_id,
                                double tokens, uint64_t capacity) noexcept;

private:
    // unit_[i] != 0: peer i's cache is modelled, its clock in *slots_[i].
    // Its stamps count from base_[i] and offset_[i] (stamp_at()).
    // learning_[i]: its capacity is learned from its replies; its clock
    // runs (slots_[i]) before its cache is modelled.  Set only when
    // enabled_: with the model off (cache=off), a request costs nothing
    // here.
    Zone zone_;
    uint32_t probes_each_;
    PeerSlot *slots_[kMaxPeers];
    uint64_t fill_[kMaxPeers];
    uint64_t unit_[kMaxPeers];
    uint64_t base_[kMaxPeers];
    uint8_t offset_[kMaxPeers];
    bool learning_[kMaxPeers];
    bool enabled_;
};

}  // namespace affinity

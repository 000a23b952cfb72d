#include "cache_model.h"

#include <algorithm>

namespace affinity {

namespace {

// A probe's key: the low half of its level's, odd so that it is never 0
// (a free probe).
uint32_t probe_key(uint64_t key) noexcept
{
    return static_cast<uint32_t>(key) | 1;
}

// Probes a peer may have at once: the pool shared evenly among the
// upstream's peers, within these.
constexpr size_t kMinProbesEach = 2;
constexpr size_t kMaxProbesEach = 16;

// Characters of a peer's clock a probe is kept for at first: a prompt
// whose conversation ended does not keep it from watching another for
// long.  The ages watched grow beyond it with the prefixes found held.
constexpr uint64_t kFirstProbeLimit = uint64_t{1} << 20;

// Tokens beyond which the product below could overflow: far above any
// engine's cache.
constexpr uint64_t kMaxCapacity = uint64_t{1} << 48;

// Characters of other prompts per stamp, for a cache of this many tokens.
uint64_t stamp_unit(uint64_t tokens) noexcept
{
    return std::max<uint64_t>(std::min(tokens, kMaxCapacity)
                                  * AFFINITY_CHARS_PER_TOKEN
                                  * kCapacityMarginPercent / 100
                                  / kStampsPerCapacity,
                              1);
}

// The peer's stamps from now on in units of unit characters of its clock,
// counted from the stamp it has now: the ages already stamped carry over
// (in the units they were stamped in).  Under the prefix zone's lock.
void restamp(PeerSlot &s, uint32_t unit) noexcept
{
    uint64_t fill = atomic_load(&s.cache_fill);
    uint8_t stamp = s.learned_unit != 0
                    ? stamp_at(fill, s.stamp_base, s.stamp_offset,
                               s.learned_unit)
                    : 0;

    s.stamp_offset = stamp;
    s.stamp_base = fill;
    s.learned_unit = unit;
}

}  // namespace

CacheModel::CacheModel(Zone prefixes, const affinity_peer_t *peers,
                       size_t npeers, uint64_t capacity,
                       const uint64_t *reported, uint64_t now) noexcept
    : zone_(prefixes),
      probes_each_(static_cast<uint32_t>(std::clamp<size_t>(
          npeers ? kCapacityProbes / npeers : 0, kMinProbesEach,
          kMaxProbesEach))),
      enabled_(false)
{
    // No prefixes (the zone may be none), or no model wanted.
    if (npeers == 0 || capacity == kCapacityOff) {
        return;
    }

    PeerSlot *slots = prefixes.peer_slots();

    for (size_t i = 0; i < std::min(npeers, kMaxPeers); i++) {
        uint64_t tokens = capacity ? capacity : reported ? reported[i] : 0;
        // When the prefix zone also counts the upstream's requests, the
        // peer's slot there is the one it already has.  Every peer gets
        // one: with no size known, its replies may teach it, and its clock
        // must run meanwhile.
        uint32_t slot = peers[i].slot;

        slots_[i] = nullptr;
        fill_[i] = 0;
        unit_[i] = 0;
        base_[i] = 0;
        offset_[i] = 0;
        learning_[i] = false;

        if (!prefixes.owns(slot, peers[i].id)) {
            slot = prefixes.claim_slot(peers[i].id, now);
        }

        if (slot == kNoSlot) {
            continue;
        }

        PeerSlot &s = slots[slot];

        // The engine's figure is kept here too: for records that come with
        // none (affinity_prefixes_record()), and while the counters have
        // none (their slot handed over, their zone new), so that the
        // peer's stamps keep their meaning.
        if (capacity == 0) {
            if (tokens == 0) {
                tokens = atomic_load(&s.cache_tokens);
            } else if (atomic_load(&s.cache_tokens) != tokens) {
                atomic_store(&s.cache_tokens, tokens);
            }
        }

        // In use: not to be reclaimed for another peer.
        atomic_store(&s.last_used, now);

        slots_[i] = &s;
        fill_[i] = atomic_load(&s.cache_fill);
        enabled_ = true;

        if (tokens != 0) {
            unit_[i] = stamp_unit(tokens);
            continue;
        }

        learning_[i] = true;
        unit_[i] = s.learned_unit;
        base_[i] = s.stamp_base;
        offset_[i] = s.stamp_offset;
    }
}

bool CacheModel::add(size_t i, uint64_t chars) noexcept
{
    if (!enabled_ || slots_[i] == nullptr) {
        return false;
    }

    fill_[i] += chars;
    atomic_store(&slots_[i]->cache_fill, fill_[i]);
    return true;
}

void CacheModel::take_probe(size_t i, const uint64_t *keys, size_t nkeys,
                            uint32_t now, uint32_t timeout, uint32_t *age,
                            uint32_t *length) noexcept
{
    *age = 0;
    *length = 0;

    if (!enabled_ || !learning_[i] || slots_[i]->probes == 0) {
        return;
    }

    PeerSlot &s = *slots_[i];
    uint32_t n = static_cast<uint32_t>(slots_[i] - zone_.peer_slots());
    uint64_t limit = std::max<uint64_t>(
        2 * uint64_t{std::max(s.learned, s.held_age)}, kFirstProbeLimit);
    CapacityProbe *pool = zone_.probes();
    size_t left = s.probes;

    for (size_t p = 0; p < kCapacityProbes && left > 0; p++) {
        CapacityProbe &probe = pool[p];

        if (probe.key == 0 || probe.slot != n) {
            continue;
        }

        left--;

        uint64_t aged = fill_[i] - probe.fill;

        if (aged > limit || now - probe.since > timeout) {
            probe = CapacityProbe{};
            s.probes--;
            continue;
        }

        for (size_t j = 0; j < nkeys; j++) {
            if (probe_key(keys[j]) == probe.key) {
                if (*length == 0) {
                    *age = static_cast<uint32_t>(
                        std::min<uint64_t>(aged, UINT32_MAX));
                    *length = probe.length;
                }

                probe = CapacityProbe{};
                s.probes--;
                break;
            }
        }
    }
}

void CacheModel::watch(size_t i, uint64_t key, uint32_t length,
                       uint32_t now, uint32_t timeout) noexcept
{
    if (!enabled_ || !learning_[i] || length == 0
        || slots_[i]->probes >= probes_each_)
    {
        return;
    }

    PeerSlot &s = *slots_[i];
    PeerSlot *slots = zone_.peer_slots();
    uint32_t n = static_cast<uint32_t>(slots_[i] - slots);
    uint32_t wanted = probe_key(key);
    CapacityProbe *pool = zone_.probes();
    CapacityProbe *vacant = nullptr;

    for (size_t p = 0; p < kCapacityProbes; p++) {
        CapacityProbe &probe = pool[p];

        if (probe.key == 0) {
            vacant = vacant ? vacant : &probe;
            continue;
        }

        // Any peer's probe past the timeout is given up here: a peer
        // that gets no more requests does not keep its probes.
        if (now - probe.since > timeout) {
            if (probe.slot < kPeerSlots && slots[probe.slot].probes > 0) {
                slots[probe.slot].probes--;
            }

            probe = CapacityProbe{};
            vacant = vacant ? vacant : &probe;
            continue;
        }

        if (probe.slot == n && probe.key == wanted) {
            return;
        }
    }

    if (vacant != nullptr) {
        *vacant = {wanted, length, fill_[i], now, n};
        s.probes++;
    }
}

void CacheModel::replied(Zone prefixes, uint64_t peer_id, uint32_t age,
                         uint32_t length, bool held) noexcept
{
    uint32_t n = prefixes.find_slot(peer_id);

    // A prompt lost before less than its own length of others was sent
    // the peer says nothing of its cache: the request that sent it failed
    // or had not been computed yet (a retry, or concurrent prompts that
    // extend it), or the peer is several engines.
    if (n == kNoSlot || (!held && age < length)) {
        return;
    }

    PeerSlot &s = prefixes.peer_slots()[n];
    uint32_t learned = s.learned;

    if (held) {
        s.held_age = std::max(s.held_age, age);

        if (learned != 0 && age > learned) {
            learned = age;
        }

    } else if (learned == 0) {
        learned = std::max(age, s.held_age);

    } else if (age < learned) {
        learned -= (learned - age) / 4;
    }

    // Read without the lock by the status (affinity_zone_peer_stats()).
    atomic_store(&s.learned, learned);

    if (learned == 0) {
        return;
    }

    uint64_t unit = std::max<uint64_t>(uint64_t{learned}
                                           * kCapacityMarginPercent / 100
                                           / kStampsPerCapacity,
                                       1);
    uint64_t was = s.learned_unit;

    if (was == 0 || unit * 4 > was * 5 || unit * 5 < was * 4) {
        restamp(s, static_cast<uint32_t>(unit));
    }
}

void CacheModel::engine_computed(Zone prefixes, uint64_t peer_id,
                                 double tokens, uint64_t capacity) noexcept
{
    // Counts beyond any engine's lifetime are junk.
    if (!(tokens >= 0 && tokens < 1e18) || capacity == kCapacityOff) {
        return;
    }

    uint32_t n = prefixes.find_slot(peer_id);

    // A peer never modelled here has no clock to move.
    if (n == kNoSlot) {
        return;
    }

    PeerSlot &slot = prefixes.peer_slots()[n];
    uint64_t size = std::min(capacity ? capacity
                                      : atomic_load(&slot.cache_tokens),
                             kMaxCapacity);
    uint64_t was = slot.engine_mark;
    uint32_t count = static_cast<uint32_t>(static_cast<uint64_t>(tokens));
    uint64_t fill = atomic_load(&slot.cache_fill);
    uint32_t mark = static_cast<uint32_t>(was >> 32);

    if (size == 0) {
        slot.engine_mark = 0;
        return;
    }

    // Both counts modulo 2^32: reports come seconds apart.
    uint32_t computed = count - static_cast<uint32_t>(was);
    uint32_t back = static_cast<uint32_t>(was) - count;
    bool went_back = back != 0 && back < (1u << 31);

    if (was == 0) {
        // The first report: a mark to count from.
        mark = static_cast<uint32_t>(fill);

    } else if (went_back && back < size) {
        // A little back: counters read a moment apart (several processes,
        // several ranks).  The old count stays.
        return;

    } else if (went_back
               || uint64_t{computed} > static_cast<uint64_t>(tokens))
    {
        // Back by a capacity or more, or more computed since the last
        // report than in the engine's whole life: the count restarted
        // from zero, and so did the engine, its cache empty.
        fill += stamp_unit(size) * kStampsPerCapacity;
        mark = static_cast<uint32_t>(fill);
        atomic_store(&slot.cache_fill, fill);

    } else if (uint64_t{computed} * AFFINITY_CHARS_PER_TOKEN
               >= (uint64_t{1} << 31))
    {
        // Too far from the last report to compare modulo 2^32 characters
        // (reports missed for long): a new mark.
        mark = static_cast<uint32_t>(fill);

    } else {
        uint32_t chars = static_cast<uint32_t>(uint64_t{computed}
                                               * AFFINITY_CHARS_PER_TOKEN);

        mark += chars;

        // The engine's clock ahead of this one's: caught up, by no more
        // than it moved.  Behind by more than a capacity: held there.  A
        // mark left for hours (reports missed while this instance sent
        // 2^31 characters) may compare wrongly modulo 2^32: the catch-up
        // is still no more than the engine computed.
        int64_t ahead = static_cast<int32_t>(
            mark - static_cast<uint32_t>(fill));
        int64_t limit = static_cast<int64_t>(
            std::min<uint64_t>(size * AFFINITY_CHARS_PER_TOKEN,
                               uint64_t{1} << 30));

        if (ahead > 0) {
            fill += std::min<uint64_t>(uint64_t(ahead), chars);
            mark = static_cast<uint32_t>(fill);
            atomic_store(&slot.cache_fill, fill);
        } else if (ahead < -limit) {
            mark = static_cast<uint32_t>(fill - uint64_t(limit));
        }
    }

    // The mark's high half may be 0, its count too: 0 means no mark.
    uint64_t next = (uint64_t{mark} << 32) | count;
    slot.engine_mark = next != 0 ? next : uint64_t{1} << 32;
}

void CacheModel::replied_usage(Zone prefixes, uint64_t peer_id,
                               uint32_t age, uint32_t length,
                               uint64_t prompt_chars, uint64_t cached_tokens,
                               uint64_t prompt_tokens) noexcept
{
    // Figures beyond any prompt are junk.
    constexpr uint64_t kMaxTokens = uint64_t{1} << 40;

    if (peer_id == 0 || length == 0 || cached_tokens > kMaxTokens
        || prompt_tokens > kMaxTokens || prompt_chars > kMaxTokens
        || (prompt_tokens != 0 && cached_tokens > prompt_tokens))
    {
        return;
    }

    // Characters cached, at the prompt's own characters per token when
    // both are known: at least half the probe's prefix counts as held.
    // The prompt's size may be its body's (past the last level), escapes
    // and all: no more than twice the usual characters a token.
    double per_token = prompt_chars != 0 && prompt_tokens != 0
                       ? std::clamp(double(prompt_chars)
                                        / double(prompt_tokens),
                                    1.0, 2.0 * AFFINITY_CHARS_PER_TOKEN)
                       : double(AFFINITY_CHARS_PER_TOKEN);
    bool held = double(cached_tokens) * per_token * 2
                >= double(length);

    replied(prefixes, peer_id, age, length, held);
}

}  // namespace affinity

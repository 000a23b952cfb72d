#include "selection.h"

#include <algorithm>
#include <cmath>

#include "cache_model.h"
#include "hashing.h"
#include "prefix_table.h"
#include "session_table.h"
#include "trace.h"

namespace affinity {

namespace {

// Requests of one session routed this close together are siblings (an
// agent's parallel calls); a conversation's next turn comes later.
constexpr uint64_t kSiblingsWithin = 1000;     // ms

// Two peers' estimates closer than an eighth of the larger and a
// millisecond are a tie, left to the counts: the estimates are learned
// and noisy, the counts exact.
constexpr int64_t kSoonerShare = 8;
constexpr int64_t kSoonerUs = 1000;

// A move to a peer that lacks a shared level (worth_moving()) counts the
// level's prefill this many times: once for this request, the rest for
// what the copy displaces in a full cache and for the level's next
// requests, which the copy splits between two peers.  docs/routing.md,
// "Prefixes".
constexpr uint64_t kMoveCost = 8;

// The most requests presumed beside one (LoadBound::beside_), and the
// halvings that find the level they fill the peers to (dealt()).
constexpr uint32_t kMostBeside = 64;
constexpr int kFillSteps = 24;

}  // namespace

LoadBound::LoadBound(Zone zone, const affinity_peer_t *peers,
                     const uint8_t *states, size_t npeers,
                     const affinity_balance_t &balance, uint64_t now) noexcept
    : peers_(peers),
      slot_base_(zone.peer_slots()),
      states_(states),
      npeers_(std::min(npeers, kMaxPeers)),
      factor_(balance.factor),
      slack_(balance.slack)
{
    const PeerSlot *slots = zone.peer_slots();
    const PeerPace *paces[kMaxPeers];
    int64_t total = 0;
    int64_t own = 0;                // this instance's unheard, all peers
    uint64_t weights = 0;

    for (size_t i = 0; i < npeers_; i++) {
        int64_t n = 0;
        int64_t unheard = 0;
        uint64_t tokens = 0;
        uint32_t slot = peers[i].slot;

        backlog_[i] = 0;

        if (!zone.owns(slot, peers[i].id)) {
            slot = zone.claim_slot(peers[i].id, now);
        }

        if (slot != kNoSlot) {
            const PeerSlot &s = slots[slot];

            // The requests in flight as routing counts them, the other
            // instances' among them while the engine's figure is fresh.
            n = counted_inflight(s, balance.engine_ttl, now);

            if (engine_fresh(s, balance.engine_ttl, now)) {
                // This instance's requests that the others cannot count
                // yet (fits()): only beside the figure the others' are
                // counted in, which also clears them when a worker died
                // before they were read back; never more than in flight.
                unheard = std::min(unheard_count(atomic_load(&s.unheard)),
                                   n);
            }

            // On the engine figures' cache line: read with them, and the
            // prefill ahead.
            tokens = atomic_load(&s.cache_tokens);
            backlog_[i] = backlog_ahead(s);
        }

        slots_[i] = slot;
        paces[i] = slot != kNoSlot ? &slots[slot].pace : nullptr;
        unheard_[i] = unheard;
        own += unheard;
        inflight_[i] = n;
        cache_tokens_[i] = tokens;

        // Failed peers carry no new load and do not lower everyone's bound.
        if (states[i] != AFFINITY_PEER_FAILED) {
            total += n;
            weights += std::max<uint32_t>(peers[i].weight, 1);
        }
    }

    if (npeers_ > 0) {
        shape_ = pace_shape(paces, npeers_);
    }

    uint32_t instances = zone.instances(now);

    presumed_ = zone.unheard_presumed(instances);
    shared_ = instances > 1;

    // The others' requests placed unseen beside this one: per other
    // instance (presumed_), as many as this instance sends within the
    // time its news takes to come back, before this request and after it
    // (the recent mean of its unheard requests, twice).  Spread one by
    // one, next to none; in a burst through every instance, the burst.
    if (shared_) {
        // Whole requests: a fraction of one is none.
        beside_ = std::floor(std::min(2.0 * presumed_
                                      * zone.learn_beside(own),
                                      double(kMostBeside)));
    }

    // They count in the share the bound is measured from, as this request
    // does: else each instance in a burst holds its pins to a mean the
    // burst has not raised, and moves them off their caches.
    // docs/routing.md, "Several instances".
    share_per_weight_ = weights ? (double(total + 1) + beside_)
                                  / double(weights)
                                : 0.0;
}

int64_t LoadBound::first_token(size_t i, uint64_t uncached) const noexcept
{
    if (slots_[i] == kNoSlot) {
        return -1;
    }

    // The prompts ahead that wait for their prefill, then this one's.
    return pace_estimate(slot_base_[slots_[i]].pace, shape_,
                         uint32_t(std::min<int64_t>(inflight_[i],
                                                    UINT32_MAX)),
                         uncached + backlog_[i]);
}

int64_t LoadBound::prefill_time(size_t i, uint64_t uncached) const noexcept
{
    return slots_[i] == kNoSlot
           ? -1 : pace_prefill(slot_base_[slots_[i]].pace, uncached);
}

namespace {

// Which of two estimates (microseconds, -1: unknown) is the sooner: -1 the
// first, 1 the second, 0 a tie or unknown.
int sooner(int64_t ea, int64_t eb) noexcept
{
    if (ea < 0 || eb < 0) {
        return 0;
    }

    int64_t margin = std::max(ea, eb) / kSoonerShare + kSoonerUs;

    return ea + margin < eb ? -1 : eb + margin < ea ? 1 : 0;
}

}  // namespace

bool LoadBound::less_loaded(size_t a, size_t b, bool timed) const noexcept
{
    int by_time = timed && chars_ != 0
                  ? sooner(first_token(a, chars_), first_token(b, chars_))
                  : 0;

    if (by_time != 0) {
        return by_time < 0;
    }

    return (inflight_[a] + 1) * int64_t(peers_[b].weight)
           < (inflight_[b] + 1) * int64_t(peers_[a].weight);
}

bool LoadBound::worth_copying(size_t to, size_t from, uint64_t held) const
    noexcept
{
    int by_time = chars_ != 0
                  ? sooner(first_token(to, chars_),
                           first_token(from, chars_ > held ? chars_ - held
                                                           : 0))
                  : 0;

    if (by_time != 0) {
        return by_time < 0;
    }

    return (inflight_[to] + 2) * int64_t(peers_[from].weight)
           <= inflight_[from] * int64_t(peers_[to].weight);
}

bool LoadBound::worth_moving(size_t to, size_t from, uint64_t held,
                             bool history) const noexcept
{
    if (chars_ == 0) {
        return false;
    }

    held = std::min<uint64_t>(held, chars_);

    uint64_t extra = (kMoveCost - 1) * held;
    int64_t here = first_token(from, chars_ - held);

    if (!history) {
        return sooner(first_token(to, chars_ + extra), here) < 0;
    }

    int64_t there = first_token(to, chars_);
    int64_t on_to = prefill_time(to, extra);
    int64_t on_from = prefill_time(from, extra);

    if (there < 0 || here < 0 || on_to < 0 || on_from < 0) {
        return false;
    }

    return sooner(there + std::max(on_to, on_from), here) < 0;
}

bool LoadBound::slot_free(size_t i) const noexcept
{
    return shape_.knee != 0
           && double(inflight_[i]) + presumed(i) < double(shape_.knee);
}

bool LoadBound::accepts(size_t i, int64_t extra) const noexcept
{
    double share = share_per_weight_ * std::max<uint32_t>(peers_[i].weight, 1);
    double bound = std::max(factor_ * share, share + slack_);

    return fits(i, bound + double(extra));
}

bool LoadBound::within_slack(size_t i, int64_t extra) const noexcept
{
    double share = share_per_weight_ * std::max<uint32_t>(peers_[i].weight, 1);

    return fits(i, share + slack_ + double(extra));
}

// Requests that reach several instances at once (an agent's parallel
// calls) are each placed before the other instances can count them, and
// each may fill the same room under a peer's bound.  This instance cannot
// see the others' requests of that moment, but it knows its own that the
// store has not yet carried to them: beside each, the others likely send
// as many, one per other instance, or, once the read-backs have shown that
// they send next to none (a front that keeps a session on one instance),
// that little (Zone::unheard_presumed()).  Alone, or with nothing unheard,
// nothing changes.  Why not deal the room out in turns instead, and the
// measurements: docs/routing.md, "Several instances".
bool LoadBound::fits(size_t i, double limit) const noexcept
{
    if (shared_ && unheard_[i] > 0 && watched_ < 0) {
        watched_ = int(i);
    }

    return double(inflight_[i] + 1) + presumed(i) <= limit;
}

int LoadBound::least_loaded(int skip, uint32_t rotate, bool timed) const
    noexcept
{
    int best = -1;

    for (size_t step = 0; step < npeers_; step++) {
        size_t i = (rotate + step) % npeers_;

        if (!usable(i) || static_cast<int>(i) == skip) {
            continue;
        }

        if (best < 0 || less_loaded(i, static_cast<size_t>(best), timed)) {
            best = static_cast<int>(i);
        }
    }

    return best;
}

int LoadBound::least_loaded_on_ring(const Ring *ring, uint64_t hash,
                                    uint32_t rotate, bool timed) const
    noexcept
{
    int least = least_loaded(-1, rotate, timed);

    if (least < 0 || ring == nullptr) {
        return least;
    }

    if (beside_ >= 1.0 && !timed) {
        return dealt(hash, least);
    }

    // The least loaded peer is not more loaded than any: the first peer on
    // the ring that is not more loaded than it ties with it.
    int first = ring->walk(hash, [&](uint32_t peer) {
        return peer < npeers_ && usable(peer)
               && !less_loaded(static_cast<size_t>(least), peer, timed);
    });

    return first >= 0 ? first : least;
}

double LoadBound::room(size_t i, double level) const noexcept
{
    if (!usable(i)) {
        return 0.0;
    }

    double left = level * std::max<uint32_t>(peers_[i].weight, 1)
                  - double(inflight_[i] + 1);

    return left > 0.0 ? left : 0.0;
}

// Requests that reach several instances at once are each placed without
// the others: sent to the least loaded peer, they would all meet there.
// So the room is dealt.  Poured into the least loaded peers, this request
// and those presumed beside it (beside_) fill them up to some level; each
// peer is drawn with odds by its room below that level, by a weighted
// rendezvous hash of the prompt's hash and the peer's id.  Instances that
// see the same load send the same prompt to the same peer, and a burst's
// prompts spread over the room as the fleet would fill it.
// docs/routing.md, "Several instances".
int LoadBound::dealt(uint64_t hash, int least) const noexcept
{
    double low = double(inflight_[least] + 1)
                 / double(std::max<uint32_t>(peers_[least].weight, 1));
    double pour = 1.0 + beside_;

    // The level whose room holds pour requests: between low, where there
    // is none, and low + pour, where the least loaded peer alone has it.
    double below = low;
    double level = low + pour;

    for (int step = 0; step < kFillSteps; step++) {
        double mid = (below + level) / 2.0;
        double total = 0.0;

        for (size_t i = 0; i < npeers_; i++) {
            total += room(i, mid);
        }

        if (total < pour) {
            below = mid;

        } else {
            level = mid;
        }
    }

    // What the halvings leave above the level, times a peer's weight, is
    // no room.
    double none = pour * 2.0 / double(1u << kFillSteps);
    int best = -1;
    double first = 0.0;

    for (size_t i = 0; i < npeers_; i++) {
        double left = room(i, level);

        if (left <= none * std::max<uint32_t>(peers_[i].weight, 1)) {
            continue;
        }

        // An exponential race: the smallest -ln(u) / room wins, each peer
        // with odds room / all the room.
        uint64_t material[2] = {hash, peers_[i].id};
        uint64_t h = hash64(material, sizeof(material), kDealSeed);
        double u = (double(h >> 11) + 0.5) / 9007199254740992.0;  // 2^53
        double at = -std::log(u) / left;

        if (best < 0 || at < first) {
            best = static_cast<int>(i);
            first = at;
        }
    }

    return best >= 0 ? best : least;
}

int LoadBound::first_on_ring(const Ring &ring, uint64_t hash, int skip) const
    noexcept
{
    return ring.walk(hash, [&](uint32_t i) {
        return i < npeers_ && static_cast<int>(i) != skip && usable(i)
               && accepts(i);
    });
}

int LoadBound::index_of(uint64_t peer_id) const noexcept
{
    for (size_t i = 0; i < npeers_; i++) {
        if (peers_[i].id == peer_id) {
            return static_cast<int>(i);
        }
    }

    return -1;
}

int LoadBound::index_of_short(uint32_t short_id) const noexcept
{
    for (size_t i = 0; i < npeers_; i++) {
        if (short_peer_id(peers_[i].id) == short_id) {
            return static_cast<int>(i);
        }
    }

    return -1;
}

namespace {

// The index of the longest scheduled level of levels[0..n) (n > 0): turn
// levels (affinity_json_prompt()) come in among them, and a prompt has at
// least one scheduled level, its own length's when it is shorter than the
// first.
size_t longest_scheduled(const affinity_level_t *levels, size_t n) noexcept
{
    size_t i = n - 1;

    while (i > 0 && levels[i].turn) {
        i--;
    }

    return i;
}

// A decision for peer (an index, -1: none): route() then counts the
// request (its slot) and looks for a probe the prompt takes.
affinity_decision_t decided(int peer, uint32_t route, uint32_t prefix_len)
    noexcept
{
    affinity_decision_t d{};
    d.peer = peer;
    d.route = route;
    d.prefix_len = prefix_len;
    d.slot = kNoSlot;
    d.watched = -1;
    d.estimate_us = -1;
    d.alternative = -1;
    d.alternative_us = -1;
    return d;
}

// Stay or move by what a move costs (route_prefix): when every holder of
// the longest level of a prompt that at least kStayHolders peers hold is
// over the bound or beyond its slack, and a shorter level is held by a
// peer that may take the prompt, the least loaded holder still takes it,
// up to kStayExtra request above the bound, if moving would prefill
// kDocumentChars characters again (a document, not a system prompt's
// tail).  A level one peer holds (a conversation's own history) is left to
// the bound.  docs/routing.md, "Staying or moving".
constexpr size_t kStayHolders = 2;
constexpr uint32_t kDocumentChars = 4096;
constexpr int64_t kStayExtra = 1;

// How far above its share a cache holder is followed: within share +
// slack, plus one request per kDocumentChars of a level that at least
// kStayHolders peers hold, at most kDocumentExtraMax more; a session's
// pinned peer alike, by the longest shared level of its prompt.  A level
// of kDocumentChars or more that one peer holds (a conversation's own
// history) is followed up to the bound: no other peer has it.  The slack
// scales with no fleet size or running-slot count, as the bound does.
// docs/routing.md, "The load bound".
constexpr int64_t kDocumentExtraMax = 2;

// Whether the longest level of the prompt the index knows was used this
// second: by another request of the same conversation, just routed.
bool siblings_by_prompt(PrefixTable &table, const uint64_t *keys,
                        size_t nkeys, uint32_t now) noexcept
{
    uint32_t used;

    for (size_t j = nkeys; j-- > 0;) {
        if (table.peek(keys[j], &used)) {
            return used >= now;
        }
    }
    return false;
}

int64_t document_extra(uint32_t shared_length) noexcept
{
    return std::min<int64_t>(kDocumentExtraMax,
                             shared_length / kDocumentChars);
}

// Placement of a key that has no usable pin: its ring position with bounded
// load, or the least loaded peer when all are over the bound.
int place(const LoadBound &load, const Ring *ring, uint64_t hash, int skip,
          uint32_t rotate) noexcept
{
    int i = ring ? load.first_on_ring(*ring, hash, skip) : -1;

    return i >= 0 ? i : load.least_loaded(skip, rotate);
}

int route_prefix(PrefixTable &table, const uint64_t *keys,
                 const Ring *ring, const LoadBound &load,
                 const CacheModel &cache, const affinity_request_t &request,
                 affinity_decision_t &decision) noexcept;

// The peers of an entry that are presumed to hold its prefix still: their
// indexes (-1 for a peer not in this upstream), and how many.
struct Holders {
    int index[kPrefixPeers];
    size_t count = 0;

    Holders(const PrefixEntry &entry, const LoadBound &load,
            const CacheModel &cache) noexcept
    {
        for (size_t k = 0; k < kPrefixPeers && entry.peers[k] != 0; k++) {
            int i = load.index_of_short(entry.peers[k]);

            if (cache.holds(i, entry.stamps[k])) {
                index[count++] = i;
            }
        }
    }

    bool has(int i) const noexcept
    {
        for (size_t k = 0; k < count; k++) {
            if (index[k] == i) {
                return true;
            }
        }
        return false;
    }

    // Whether a holder that may take the prompt has a running slot free.
    bool free_slot(const LoadBound &load, int64_t extra) const noexcept
    {
        for (size_t k = 0; k < count; k++) {
            int i = index[k];

            if (i >= 0 && load.usable(i) && load.accepts(i)
                && load.within_slack(i, extra) && load.slot_free(size_t(i)))
            {
                return true;
            }
        }
        return false;
    }
};

// The longest level of the prompt that at least kStayHolders peers are
// known to hold (0 if none): what a session would lose by moving, beyond
// its own history.
uint32_t shared_length(PrefixTable &table, const uint64_t *keys,
                       const affinity_request_t &request,
                       const LoadBound &load, const CacheModel &cache)
    noexcept
{
    for (size_t j = request.nlevels; j-- > 0;) {
        PrefixEntry *entry = table.find(keys[j]);

        if (entry != nullptr && entry->peers[kStayHolders - 1] != 0
            && Holders(*entry, load, cache).count >= kStayHolders)
        {
            return request.levels[j].length;
        }
    }

    return 0;
}

// The longest level of the prompt that peer i is presumed to hold; 0 if
// the index lists it for levels of the prompt but presumes them all
// evicted, kNotListed if it lists it for none (the entries expired, or
// other peers pushed it out): then nothing is known either way.
constexpr int64_t kNotListed = -1;

int64_t held_length(PrefixTable &table, const uint64_t *keys,
                    const affinity_request_t &request, const LoadBound &load,
                    const CacheModel &cache, int i) noexcept
{
    int64_t held = kNotListed;

    for (size_t j = request.nlevels; j-- > 0;) {
        PrefixEntry *entry = table.find(keys[j]);

        if (entry == nullptr) {
            continue;
        }

        for (size_t k = 0; k < kPrefixPeers && entry->peers[k] != 0; k++) {
            if (load.index_of_short(entry->peers[k]) == i) {
                if (cache.holds(i, entry->stamps[k])) {
                    return request.levels[j].length;
                }

                held = 0;
                break;
            }
        }
    }

    return held;
}

// Where a session whose pinned peer may take its request goes instead: the
// soonest other peer, when the pinned one would queue the request (no
// running slot free) and that one has a slot free and is sooner even with
// the history the pin holds counted kMoveCost times, once for this
// request (worth_moving(), its history priced at the slower peer); -1:
// the pin stays.  The count bound alone keeps a session queued behind its
// peer's running requests while another replica idles.  docs/routing.md,
// "Staying or moving".
int queued_pin_move(const LoadBound &load, const affinity_request_t &request,
                    PrefixTable &prefixes, const uint64_t *keys,
                    const CacheModel &cache, int pinned) noexcept
{
    if (load.slot_free(size_t(pinned))) {
        return -1;
    }

    int to = load.least_loaded(pinned, request.rotate);

    if (to < 0 || !load.slot_free(size_t(to)) || !load.accepts(size_t(to))) {
        return -1;
    }

    // Not listed: nothing is known of what the pin holds, so all of it.
    int64_t held = held_length(prefixes, keys, request, load, cache, pinned);

    return load.worth_moving(size_t(to), size_t(pinned),
                             held == kNotListed ? UINT64_MAX
                                                : uint64_t(held),
                             true)
           ? to : -1;
}

// A session's placement when it has no usable pin, or a spill away from a
// pin over the bound: by its prompt when the prefix index is there (the
// peers that hold the longest part of it, which after a spill is where the
// conversation went), else by its ring position with bounded load.
int place_session(const LoadBound &load, const Ring *ring,
                  const affinity_request_t &request, PrefixTable *prefixes,
                  const uint64_t *keys, const CacheModel &cache,
                  affinity_decision_t &by_prompt) noexcept
{
    if (prefixes) {
        return route_prefix(*prefixes, keys, ring, load, cache, request,
                            by_prompt);
    }

    by_prompt = decided(-1, AFFINITY_ROUTE_NONE, 0);
    return place(load, ring, request.ring_hash, -1, request.rotate);
}

// A session pinned anew to peer i (index), for good: its previous pin
// holds nothing it can use.
void move_session(SessionTable &table, SessionEntry *entry, uint64_t id,
                  int i, const affinity_decision_t &by_prompt,
                  affinity_decision_t &decision) noexcept
{
    table.repin(entry, id);
    entry->spill = 0;
    decision = decided(i, AFFINITY_ROUTE_SESSION_MOVED,
                       by_prompt.prefix_len);
}

// A session spilled to peer i (index): the pin follows the request, whose
// peer now holds the whole conversation, and the old pin is kept for the
// next spill (docs/routing.md, "Sessions").
void spill_session(SessionTable &table, SessionEntry *entry, uint64_t id,
                   int i, uint32_t prefix_len, affinity_decision_t &decision)
    noexcept
{
    uint64_t previous = entry->peer;

    table.repin(entry, id);
    entry->spill = short_peer_id(previous);
    decision = decided(i, AFFINITY_ROUTE_SESSION_SPILL, prefix_len);
}

// A new session is placed by its prompt when the prefix index knows it
// (prefixes is set): a generated id, or a client that changed its id,
// still lands where the prompt's prefix is cached.
int route_session(Zone zone, const Ring *ring, LoadBound &load,
                  const affinity_peer_t *peers,
                  const affinity_request_t &request,
                  PrefixTable *prefixes, const uint64_t *keys,
                  const CacheModel &cache, affinity_decision_t &decision)
    noexcept
{
    SessionTable table(zone, request.now, request.timeout, request.now_ms);
    SessionEntry *entry = table.find(request.key_hash);
    affinity_decision_t by_prompt;
    uint64_t now_ms = request.now_ms ? request.now_ms
                                     : uint64_t(request.now) * 1000;

    if (entry == nullptr) {
        int i = place_session(load, ring, request, prefixes, keys, cache,
                              by_prompt);

        if (i >= 0) {
            // A generated key has no history: what placed the request is
            // its prompt, and the outcome says so (prefix_hit/prefix_new).
            uint32_t route = request.has_key == AFFINITY_KEY_GENERATED
                             && by_prompt.route != AFFINITY_ROUTE_NONE
                             ? by_prompt.route
                             : uint32_t{AFFINITY_ROUTE_SESSION_NEW};

            entry = table.insert(request.key_hash);
            table.repin(entry, peers[i].id);
            set_routed_at(*entry, now_ms);
            decision = decided(i, route, by_prompt.prefix_len);
        }

        return i;
    }

    // What the other instances may send the pinned peer unseen is presumed
    // only beside another request of this session routed here just
    // before: an agent's parallel calls, which reach the other instances
    // at once too.  A session's next turn, in a burst of other sessions,
    // is not crowded out of its cache by them.
    load.presume(routed_within(*entry, now_ms, kSiblingsWithin));
    set_routed_at(*entry, now_ms);

    int pinned = load.index_of(entry->peer);

    if (pinned >= 0 && prefixes && cache.enabled()
        && held_length(*prefixes, keys, request, load, cache, pinned) == 0)
    {
        // The pinned peer is listed for parts of the prompt but presumed
        // to have evicted them all (cache capacity): the session has
        // nothing left there, and is placed anew by its prompt, as a new
        // one would be, rather than sent back to a cache that lost it.
        int i = route_prefix(*prefixes, keys, ring, load, cache, request,
                             by_prompt);

        if (i >= 0) {
            move_session(table, entry, peers[i].id, i, by_prompt, decision);
            return i;
        }

        // No usable peer for a prompt (all draining, say): the pin may
        // still serve it, below.
    }

    // A draining peer still serves the sessions pinned to it, within the
    // bound and, with the prefix index, within a holder's slack.
    if (pinned >= 0 && load.serves_pins(pinned) && load.accepts(pinned)
        && (prefixes == nullptr || load.within_slack(pinned, 0)
            || load.within_slack(pinned, document_extra(shared_length(
                                    *prefixes, keys, request, load, cache)))))
    {
        int to = prefixes ? queued_pin_move(load, request, *prefixes, keys,
                                            cache, pinned)
                          : -1;

        if (to < 0) {
            decision = decided(pinned, AFFINITY_ROUTE_SESSION_HIT, 0);
            return pinned;
        }

        spill_session(table, entry, peers[to].id, to, 0, decision);
        return to;
    }

    if (pinned < 0 || load.failed(size_t(pinned))) {
        // The pinned peer is gone or failed: its cache is lost to this
        // session anyway, so the session moves for good, to where the
        // longest part of its conversation is held if one is known.
        int i = place_session(load, ring, request, prefixes, keys, cache,
                              by_prompt);

        if (i >= 0) {
            move_session(table, entry, peers[i].id, i, by_prompt, decision);
        }

        return i;
    }

    // The pinned peer is only busy or over the bound.  With the prefix
    // index the request is routed by its prompt, as a new one would be;
    // without it, to the session's previous pin if that has room (it holds
    // all but the latest turns), else to the next peer on the ring.  The
    // pin follows the request, which now holds the whole conversation, and
    // the old pin is kept for the next spill (docs/routing.md, "Sessions").
    int i = -1;

    if (prefixes) {
        i = route_prefix(*prefixes, keys, ring, load, cache, request,
                         by_prompt);

    } else {
        int spill = entry->spill ? load.index_of_short(entry->spill) : -1;

        if (spill >= 0 && spill != pinned && load.usable(spill)
            && load.accepts(spill))
        {
            i = spill;

        } else if (ring) {
            i = load.first_on_ring(*ring, request.ring_hash, pinned);
        }
    }

    if (i == pinned) {
        // The pinned peer holds the longest shared part of the prompt, over
        // the bound by less than a move would cost (kDocumentChars), or is
        // the least loaded peer itself: the session stays.
        decision = decided(pinned, AFFINITY_ROUTE_SESSION_HIT, 0);
        return pinned;
    }

    if (i < 0 && load.serves_pins(pinned)) {
        // Everyone is over the bound: stay where the cache is.
        decision = decided(pinned, AFFINITY_ROUTE_SESSION_HIT, 0);
        return pinned;
    }

    if (i < 0) {
        i = load.least_loaded(pinned, request.rotate);
    }

    if (i >= 0) {
        spill_session(table, entry, peers[i].id, i, by_prompt.prefix_len,
                      decision);
    }

    return i;
}

// Routes by the longest level of the prompt that a usable peer under the
// load bound is presumed to hold, as a router that saw every cache would,
// with the index standing in for the caches.  Among that level's holders
// under the bound and their slack, the least loaded peer of all if it is
// one, else at the prompt's longest scheduled level (and the turn levels
// past it) the most recent holder, else the least loaded holder.
//
// A level with as many holders as an entry remembers is widely held (the
// entry forgot older ones): short (a system prompt, tool schemas), the
// least loaded peer of all takes it, since copying it costs little; long
// (a document), the prompt's ring peer unless a holder is less loaded, so
// that it is not copied into every cache.  A short level fewer hold goes
// to the least loaded peer only when that one is sooner, the copy's
// prefill counted.  When a level's holders are all full, a shorter
// level's are tried, unless the move would prefill a shared document
// again (kDocumentChars).
//
// A prompt no peer is presumed to hold costs the same prefill everywhere:
// it goes to the least loaded peer, ties in the ring order of its longest
// scheduled level, which spreads new conversations and their caches
// evenly.  The alternatives measured: docs/routing.md, "Prefixes".
int route_prefix(PrefixTable &table, const uint64_t *keys,
                 const Ring *ring, const LoadBound &load,
                 const CacheModel &cache, const affinity_request_t &request,
                 affinity_decision_t &decision) noexcept
{
    // Placed by the prompt, not by a session key: sessions that open with
    // the same question share its cache.  The least loaded peer (ties in
    // the ring order of the prompt's longest scheduled level) is found
    // once, when a level is found held or, for a prompt no peer holds, at
    // the end.  Scheduled, not a turn level (affinity_json_prompt()): the
    // turn level that ends a prompt is the prompt's own, and prompts that
    // ask a short question about one document, each placed in an order of
    // its own, would copy it to most peers (t/21-shared-prefix.t).
    size_t scheduled = longest_scheduled(request.levels, request.nlevels);
    uint64_t own = request.levels[scheduled].hash;
    int idlest = -1;
    bool walked = false;

    // The least loaded holder of the longest shared level whose holders
    // are all over the bound, and that level's length.
    int stay = -1;
    uint32_t stay_length = 0;

    for (size_t j = request.nlevels; j-- > 0;) {
        PrefixEntry *entry = table.find(keys[j]);

        if (entry == nullptr) {
            continue;
        }

        Holders holders(*entry, load, cache);

        if (holders.count == 0) {
            continue;
        }

        if (!walked) {
            idlest = load.least_loaded_on_ring(ring, own, request.rotate);
            walked = true;
        }

        int best = -1;
        int over = -1;
        bool shared = holders.count >= kStayHolders;
        // Followed only within share + slack: a shared level, a short one.
        bool slack = shared || request.levels[j].length < kDocumentChars;
        // At the prompt's longest level its holders cannot be told apart
        // by what they hold beyond it (up to one level's spacing): the most
        // recent one most likely got the latest turns (docs/routing.md).
        bool recent = j >= scheduled;
        int64_t extra = shared ? document_extra(request.levels[j].length)
                               : 0;

        for (size_t k = 0; k < holders.count; k++) {
            int i = holders.index[k];

            if (i < 0 || !load.usable(i)) {
                continue;
            }

            if (!load.accepts(i) || (slack && !load.within_slack(i, extra)))
            {
                if (over < 0 || load.less_loaded(i, over)) {
                    over = i;
                }

                continue;
            }

            if (i == idlest || (recent && best < 0)) {
                best = i;
                break;
            }

            if (best < 0 || load.less_loaded(i, best)) {
                best = i;
            }
        }

        // A widely held level is likely held by peers the entry forgot.
        // Short (a system prompt, tool schemas), it is copied at no cost:
        // the least loaded peer takes it.  Long (a document), it goes to
        // the prompt's ring peer unless a holder is less loaded, so that
        // it is not copied into every cache.  A short level two or three
        // peers hold is copied to the least loaded peer if that one holds
        // none of it and is sooner than the holder chosen, the copy's
        // prefill counted (worth_copying()): else a peer that never got a
        // system prompt's first requests would never get any.  Such a
        // copy holds nothing, and is placed as new.  docs/routing.md,
        // "Prefixes".
        bool widely = holders.count == kPrefixPeers;
        bool copyable = !widely
                        && request.levels[j].length < kDocumentChars
                        && holders.count >= kStayHolders;
        bool copy = false;

        if (best >= 0 && (widely || copyable)) {
            uint64_t whole = request.levels[request.nlevels - 1].hash;

            if (request.levels[j].length < kDocumentChars) {
                // Ties in the ring order of the whole prompt, so that prompts
                // that share a long opening and end within one level's
                // spacing spread over the idle peers rather than meet.  By
                // counts: the rest of the prompt is its own, a conversation
                // placed as a new one is (below).
                int spread = load.least_loaded_on_ring(ring, whole,
                                                       request.rotate,
                                                       false);

                copy = copyable && spread >= 0 && !holders.has(spread)
                       && load.worth_copying(size_t(spread), size_t(best),
                                             request.levels[j].length);

                if (spread >= 0 && load.accepts(size_t(spread))
                    && (widely || copy))
                {
                    best = spread;

                } else {
                    copy = false;
                }

            } else {
                int placed = place(load, ring, own, -1, request.rotate);

                if (placed >= 0
                    && !load.less_loaded(size_t(best), size_t(placed)))
                {
                    best = placed;
                }
            }
        }

        // The least loaded peer, when it lacks a shared level, takes the
        // prompt if it is sooner even with the level's prefill counted
        // kMoveCost times (worth_moving()), placed as new as a copy is:
        // - a widely held short level opens a conversation, placed by
        //   counts above: the estimate overrides them only by that much;
        // - otherwise only while every holder that may take the prompt
        //   would queue it and that peer has a running slot free: else a
        //   replica sits idle while the holders of a document queue.
        // docs/routing.md, "Prefixes".
        bool opening = widely && request.levels[j].length < kDocumentChars;

        if (best >= 0 && !copy && shared && idlest >= 0 && idlest != best
            && !holders.has(idlest) && load.accepts(size_t(idlest))
            && (opening
                || (load.slot_free(size_t(idlest))
                    && !load.slot_free(size_t(best))
                    && !holders.free_slot(load, extra)))
            && load.worth_moving(size_t(idlest), size_t(best),
                                 request.levels[j].length))
        {
            best = idlest;
            copy = true;
        }

        if (best >= 0) {
            uint32_t length = request.levels[j].length;

            if (stay >= 0 && stay_length - length >= kDocumentChars
                && load.accepts(size_t(stay), kStayExtra))
            {
                best = stay;
                length = stay_length;
                copy = false;
            }

            decision = copy ? decided(best, AFFINITY_ROUTE_PREFIX_NEW, 0)
                            : decided(best, AFFINITY_ROUTE_PREFIX_HIT, length);
            return best;
        }

        if (stay < 0 && over >= 0 && shared) {
            stay = over;
            stay_length = request.levels[j].length;
        }
    }

    // A prompt no peer is presumed to hold opens a conversation: its next
    // turns' cache goes where it lands.  Placed by counts, which keep the
    // conversations, and the caches they fill, even over the peers: by the
    // estimate, the faster peers took more than their caches hold
    // (docs/routing.md, "Which peer is less loaded").  So is one whose
    // longest held level is a short one every peer holds, above.
    int fresh = load.least_loaded_on_ring(ring, own, request.rotate, false);

    if (fresh >= 0) {
        decision = decided(fresh, AFFINITY_ROUTE_PREFIX_NEW, 0);
    }

    return fresh;
}

// Records every level of the prompt for the peer that got it: later prompts
// that extend any part of it will find it there.  With the cache model,
// the peer's clock advances by the part of the prompt beyond the longest
// level it was presumed to hold, and the levels are stamped with the clock
// after that: the prompt is then the most recent thing in its cache.
// Returns by how many characters the clock advanced (0: none), for the
// other instances (affinity_decision_t.cache_chars).
uint32_t record_levels(PrefixTable &table, const uint64_t *keys,
                       const affinity_request_t &request, size_t nkeys,
                       uint64_t peer_id, size_t peer,
                       CacheModel &cache) noexcept
{
    uint32_t held = 0;
    uint8_t recorded = cache.stamp(peer);

    for (size_t j = 0; j < nkeys; j++) {
        int before = table.record(keys[j], peer_id, recorded);

        if (before != kNotHeld
            && cache.holds(int(peer), static_cast<uint8_t>(before)))
        {
            held = request.levels[j].length;
        }
    }

    if (!cache.enabled() || nkeys == 0) {
        return 0;
    }

    uint64_t size = std::max<uint64_t>(request.prompt_size,
                                       request.levels[nkeys - 1].length);
    uint32_t added = static_cast<uint32_t>(std::min<uint64_t>(
        size - std::min<uint64_t>(held, size), UINT32_MAX));

    if (!cache.add(peer, added)) {
        added = 0;
    }

    uint8_t stamp = cache.stamp(peer);
    uint32_t id = short_peer_id(peer_id);

    // Watched until a prompt that extends it comes back to the peer: its
    // reply then tells whether the peer still had it (cache_model.h).  By
    // its longest scheduled level, which every longer prompt has, not a
    // turn level, which a prompt that adds more messages than turns= has
    // not.
    size_t scheduled = longest_scheduled(request.levels, nkeys);
    cache.watch(peer, keys[scheduled], request.levels[scheduled].length,
                request.now, request.prefix_timeout);

    // A stamp is a sixteenth of the capacity: most prompts leave it as
    // recorded, and the levels need no second pass.
    if (stamp == recorded) {
        return added;
    }

    for (size_t j = 0; j < nkeys; j++) {
        PrefixEntry *entry = table.find(keys[j]);

        if (entry != nullptr && entry->peers[0] == id) {
            entry->stamps[0] = stamp;
        }
    }

    return added;
}

// What the decision was made on, for the reply's times and the reason
// ($affinity_reason): the chosen peer's queue, what it held (held_chars)
// and its estimated time to first token, and the least loaded other peer's
// estimate for the whole prompt.
void explain(const LoadBound &load, const affinity_request_t &request,
             size_t chosen, uint64_t held_chars,
             affinity_decision_t &decision) noexcept
{
    uint64_t size = request.prompt_size;

    if (request.nlevels && request.levels[request.nlevels - 1].length > size)
    {
        size = request.levels[request.nlevels - 1].length;
    }

    uint64_t held = std::min<uint64_t>(held_chars, size);

    decision.queued = uint32_t(std::clamp<int64_t>(load.inflight(chosen), 0,
                                                   UINT32_MAX));
    decision.held_chars = uint32_t(held);
    decision.estimate_us = load.first_token(chosen, size - held);

    int other = load.least_loaded(int(chosen), request.rotate);

    if (other >= 0) {
        decision.alternative = other;
        decision.alternative_us = load.first_token(size_t(other), size);
    }
}

}  // namespace

int route(Zone zone, const Ring *ring, const affinity_peer_t *peers,
          const uint8_t *states, size_t npeers,
          const affinity_balance_t &balance,
          const affinity_request_t &request,
          affinity_decision_t &decision) noexcept
{
    decision = decided(-1, AFFINITY_ROUTE_NONE, 0);

    LoadBound load(zone, peers, states, npeers, balance, request.now);

    uint64_t size = request.prompt_size;

    if (request.nlevels && request.levels
        && request.levels[request.nlevels - 1].length > size)
    {
        size = request.levels[request.nlevels - 1].length;
    }

    load.weigh(size);

    bool sessions = zone.header().kind
                    == static_cast<uint32_t>(ZoneKind::Sessions);
    bool prefixes = request.prefixes != nullptr && request.nlevels > 0
                    && request.levels != nullptr;
    Zone index(request.prefixes);
    PrefixTable table(index, request.now, request.prefix_timeout);

    // Each level's key in this zone, mixed once for lookups and records.
    uint64_t keys[AFFINITY_MAX_LEVELS];
    size_t nkeys = prefixes ? std::min<size_t>(request.nlevels,
                                               AFFINITY_MAX_LEVELS)
                            : 0;
    for (size_t j = 0; j < nkeys; j++) {
        keys[j] = table.key(request.levels[j].hash);
    }

    // Without a configured capacity, each peer's engine may have told its
    // own (affinity_metrics).
    CacheModel cache(index, peers, prefixes ? npeers : 0,
                     request.prefix_capacity, load.cache_tokens(),
                     request.now);

    affinity_request_t capped = request;
    capped.nlevels = static_cast<uint32_t>(nkeys);

    int chosen = -1;

    // A continuation goes where its response is stored, whatever the load:
    // it exists nowhere else.  A session continuing it is pinned there too.
    int owner = request.continues && request.owner
                ? load.index_of(request.owner) : -1;

    if (owner >= 0 && load.serves_pins(size_t(owner))) {
        chosen = owner;
        decision = decided(owner, AFFINITY_ROUTE_RESPONSE_HIT, 0);

        if (request.has_key && sessions) {
            SessionTable(zone, request.now, request.timeout, request.now_ms)
                .pin(request.key_hash, peers[owner].id);
        }

    } else if (request.has_key && sessions) {
        chosen = route_session(zone, ring, load, peers, capped,
                               prefixes ? &table : nullptr, keys, cache,
                               decision);

    } else if (prefixes) {
        // As for sessions: presumed only beside siblings, requests whose
        // longest known part was used this second already.
        load.presume(siblings_by_prompt(table, keys, nkeys, request.now));
        chosen = route_prefix(table, keys, ring, load, cache, capped,
                              decision);

    } else {
        chosen = load.least_loaded(-1, request.rotate);

        if (chosen >= 0) {
            decision = decided(chosen, AFFINITY_ROUTE_FALLBACK, 0);
        }
    }

    if (chosen < 0) {
        decision = decided(-1, AFFINITY_ROUTE_NONE, 0);
        return -1;
    }

    if (request.continues && chosen != owner) {
        decision.route = AFFINITY_ROUTE_RESPONSE_LOST;
    }

    // What the chosen peer held of the prompt: the level matched, or for a
    // session kept on its pin the longest level the pin holds, read before
    // the levels are recorded for it.
    uint64_t held = decision.prefix_len;

    if (prefixes && held == 0
        && decision.route == AFFINITY_ROUTE_SESSION_HIT)
    {
        held = uint64_t(std::max<int64_t>(
            held_length(table, keys, capped, load, cache, chosen), 0));
    }

    // The chosen peer now holds every level of this prompt in its cache:
    // later prompts that extend it will find it, whatever routed this one.
    if (prefixes) {
        cache.take_probe(size_t(chosen), keys, nkeys, request.now,
                         request.prefix_timeout, &decision.probe_age,
                         &decision.probe_length);
        decision.cache_chars = record_levels(table, keys, capped, nkeys,
                                             peers[chosen].id,
                                             size_t(chosen), cache);
    }

    explain(load, request, size_t(chosen), held, decision);

#ifdef AFFINITY_TRACE
    load.trace(zone, size_t(chosen), int(decision.route));
#endif

    decision.slot = load.slot(size_t(chosen));
    decision.backlog_chars = uint32_t(std::min<uint64_t>(
        size - std::min<uint64_t>(decision.held_chars, size), UINT32_MAX));
    zone.acquire(request.row, decision.slot, decision.route, request.now,
                 decision.slot != kNoSlot ? decision.backlog_chars : 0);

    // Placed there or not, the first peer weighed beside unheard requests
    // tells, once the announcement is read back, how many of the other
    // instances' requests those met (affinity_watch_announced()).
    int watched = load.watched();

    if (watched >= 0) {
        decision.watched = watched;
        decision.watched_unheard = uint32_t(load.unheard(size_t(watched)));
    }

    return 0;
}

}  // namespace affinity

// Routing by prompt prefix: affinity_route() with request.prefixes set to a
// prefix index zone and the levels of affinity_json_prompt(), and the
// PrefixTable class behind it (recent peers of a level, LRU, idle expiry).
//
// How a keyless request with levels is routed (selection.cpp,
// route_prefix()): the longest level that one of its recent peers under the
// load bound holds decides, and the least loaded of those peers gets the
// request (PREFIX_HIT), whether the level is a conversation's own or shared
// by many prompts; the least loaded peer (ties in the ring order of the
// prompt's longest level) takes it when it is one of them, and also when the
// level has as many peers as an entry remembers and is shorter than 4,096
// characters (a longer one goes to the prompt's ring peer, from its longest
// scheduled level, unless a holder is less loaded).  A shared level whose
// holders are all over the bound still goes to its least loaded holder, one
// request above the bound, when moving to a shorter level's holder would
// re-prefill 4,096 characters or more.  When no level's peer is under the
// bound the request goes to the least loaded peer, ties in the ring order of
// its own longest level (PREFIX_NEW).  In every case all levels are then
// recorded for the chosen peer, so a hot prefix gains holders as the bound
// spreads its prompts.  Turn levels (at messages' ends) are levels like the
// others, but for a document's ring peer.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "affinity_core.h"
#include "prefix_table.h"
#include "test_support.h"
#include "zone.h"

using namespace affinity_test;

namespace {

constexpr uint32_t kPrefixHit = AFFINITY_ROUTE_PREFIX_HIT;
constexpr uint32_t kPrefixNew = AFFINITY_ROUTE_PREFIX_NEW;

// ---- prompts --------------------------------------------------------------

// Deterministic lowercase text of n characters, different for each seed
// from its first word on.
std::string words(uint32_t seed, size_t n)
{
    static const char *const vocabulary[] = {
        "alpha", "brick", "cloud", "delta", "ember", "fjord", "glass",
        "heron", "ivory", "jolly", "koala", "lemon", "maple", "noble",
        "ocean", "piano", "quartz", "raven", "solar", "tulip", "umber",
        "vivid", "waltz", "xenon", "yodel", "zebra", "amber", "bison",
        "cedar", "dune", "eagle", "flint", "grove", "hazel", "inlet",
        "jade", "kite", "lotus", "mocha", "nectar"};
    const size_t nwords = sizeof(vocabulary) / sizeof(vocabulary[0]);
    uint64_t x = 0x9e3779b97f4a7c15ULL * (seed + 1);
    std::string out;

    while (out.size() < n) {
        x ^= x >> 29;
        x *= 0xbf58476d1ce4e5b9ULL;
        x ^= x >> 32;
        out += vocabulary[x % nwords];
        out += ' ';
    }
    out.resize(n);
    return out;
}

struct Msg {
    std::string role;
    std::string content;
};

// A chat completions body (the texts need no JSON escapes).
std::string chat(const std::vector<Msg> &messages)
{
    std::string body = "{\"model\":\"m\",\"stream\":true,\"messages\":[";
    for (size_t i = 0; i < messages.size(); i++) {
        body += (i ? "," : "");
        body += "{\"role\":\"" + messages[i].role + "\",\"content\":\""
                + messages[i].content + "\"}";
    }
    return body + "]}";
}

std::vector<affinity_level_t> levels_of(const std::string &body)
{
    Prompt p = prompt_levels(body, default_schedule());
    EXPECT_EQ(p.rc, AFFINITY_PROMPT_OK);
    EXPECT_FALSE(p.levels.empty());
    return p.levels;
}

// Length in code points of the canonical text of a body: with a single
// scheduled length longer than the text, its one level has its length.
uint32_t canonical_length(const std::string &body)
{
    Prompt p = prompt_levels(body, {1u << 30});
    EXPECT_EQ(p.rc, AFFINITY_PROMPT_OK);
    EXPECT_EQ(p.levels.size(), 1u);
    return p.levels.empty() ? 0 : p.levels[0].length;
}

// The longest scheduled length not longer than n.
uint32_t longest_level_within(uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t l : default_schedule()) {
        if (l <= n) {
            best = l;
        }
    }
    return best;
}

// A conversation: an optional system prompt, then turns of a user message
// and (before the next turn) the assistant's answer.  Turn t (from 1) ends
// with the t-th user message, so it extends turn t - 1.
class Conversation {
public:
    Conversation(uint32_t id, std::string system, size_t first_user = 300,
                 size_t per_turn = 150)
        : id_(id), system_(std::move(system)), first_user_(first_user),
          per_turn_(per_turn) {}

    std::string body(size_t turn) const
    {
        std::vector<Msg> messages;
        if (!system_.empty()) {
            messages.push_back({"system", system_});
        }
        for (size_t t = 1; t <= turn; t++) {
            uint32_t seed = 1000 + id_ * 64 + uint32_t(t) * 2;
            messages.push_back(
                {"user", words(seed, t == 1 ? first_user_ : per_turn_)});
            if (t < turn) {
                messages.push_back({"assistant", words(seed + 1, per_turn_)});
            }
        }
        return chat(messages);
    }

private:
    uint32_t id_;
    std::string system_;
    size_t first_user_;
    size_t per_turn_;
};

// ---- a fleet: counter zone, prefix index, upstream and router ------------

// The counters (and sessions) in a session zone, the index in a prefix
// zone; or, as the module does without session_affinity, both in the
// prefix zone.
class Fleet {
public:
    static constexpr size_t kMaxTestPeers = 16;

    explicit Fleet(size_t npeers = 4, bool counters_in_prefix_zone = false)
        : prefixes_(1 << 20, AFFINITY_ZONE_PREFIXES),
          counters_(counters_in_prefix_zone ? prefixes_.get()
                                            : sessions_.get()),
          upstream_(counters_, std::vector<uint32_t>(npeers, 1),
                    module_ring_points(uint32_t(npeers))),
          router_(counters_, upstream_)
    {
    }

    Upstream &up() { return upstream_; }
    Router &router() { return router_; }
    affinity_zone_t *prefixes() const { return prefixes_.get(); }
    affinity_zone_t *counters() const { return counters_; }
    TestZone &prefix_zone() { return prefixes_; }
    TestZone &session_zone() { return sessions_; }

    Routed send(const std::string &body, bool release = true,
                const std::string &key = std::string())
    {
        return send(levels_of(body), release, key);
    }

    Routed send(const std::vector<affinity_level_t> &levels,
                bool release = true, const std::string &key = std::string())
    {
        Routed r = release ? router_.route_prompt_released(prefixes(), levels,
                                                           key)
                           : router_.route_prompt(prefixes(), levels, key);
        EXPECT_EQ(r.rc, 0);
        EXPECT_GE(r.decision.peer, 0);
        EXPECT_LT(r.decision.peer, int(upstream_.size()));
        return r;
    }

    // The first peer on the ring from hash.
    int ring_first(uint64_t hash) const
    {
        uint32_t peer = UINT32_MAX;
        EXPECT_EQ(affinity_ring_walk(upstream_.ring(), hash, &peer, 1), 1u);
        return int(peer);
    }

    // The least loaded usable peer, ties going to the first of them on
    // the ring from hash.
    int least_loaded_on_ring(uint64_t hash) const
    {
        uint32_t walk[kMaxTestPeers];
        size_t n = affinity_ring_walk(upstream_.ring(), hash, walk,
                                      kMaxTestPeers);
        int best = -1;
        for (size_t k = 0; k < n; k++) {
            size_t i = walk[k];
            if (upstream_.states()[i] != AFFINITY_PEER_USABLE) {
                continue;
            }
            if (best < 0 || upstream_.inflight(i)
                                < upstream_.inflight(size_t(best)))
            {
                best = int(i);
            }
        }
        return best;
    }

    // The index entry of a level, through the PrefixTable class.
    affinity::PrefixEntry *entry(const affinity_level_t &level)
    {
        affinity::PrefixTable table(affinity::Zone(prefixes_.region()),
                                    router_.now, router_.prefix_timeout);
        return table.find(table.key(level.hash));
    }

    // The peers of an entry, most recent first, as peer indexes.
    std::vector<int> peers_of(const affinity_level_t &level)
    {
        std::vector<int> out;
        affinity::PrefixEntry *e = entry(level);
        if (e == nullptr) {
            return out;
        }
        for (uint32_t id : e->peers) {
            if (id == 0) {
                break;
            }
            int found = -1;
            for (size_t i = 0; i < upstream_.size(); i++) {
                if (affinity::short_peer_id(upstream_.peers()[i].id) == id) {
                    found = int(i);
                }
            }
            out.push_back(found);
        }
        return out;
    }

private:
    TestZone sessions_;
    TestZone prefixes_;
    affinity_zone_t *counters_;
    Upstream upstream_;
    Router router_;
};

// ---- routing --------------------------------------------------------------

// On an idle fleet every peer is as loaded as the others: a cold prompt
// then goes to the first peer on the ring from its longest level, the same
// in every instance.
TEST(PrefixRoute, ColdPromptIsPlacedOnTheRingOfItsLongestLevel)
{
    Fleet a;
    std::set<int> used;
    std::vector<int> placed;

    for (uint32_t i = 0; i < 60; i++) {
        std::string body = chat({{"user", words(i, 700)}});
        std::vector<affinity_level_t> levels = levels_of(body);
        ASSERT_EQ(levels.size(), 2u);      // 100 and 500

        Routed r = a.send(levels);
        EXPECT_EQ(r.decision.route, kPrefixNew) << route_name(r.decision.route);
        EXPECT_EQ(r.decision.prefix_len, 0u);
        EXPECT_EQ(r.decision.peer, a.ring_first(levels.back().hash));
        placed.push_back(r.decision.peer);
        used.insert(r.decision.peer);
    }
    EXPECT_EQ(used.size(), 4u);

    // Another index (another zone seed), and another instance: the same
    // peers, so that several nginx instances agree.
    Fleet b;
    for (uint32_t i = 0; i < 60; i++) {
        Routed r = b.send(chat({{"user", words(i, 700)}}));
        EXPECT_EQ(r.decision.route, kPrefixNew);
        EXPECT_EQ(r.decision.peer, placed[i]) << "prompt " << i;
    }
}

// A prompt no peer holds costs the same prefill everywhere: it goes to the
// least loaded peer, not to a busier ring peer that is merely under the
// bound.
TEST(PrefixRoute, ColdPromptGoesToTheLeastLoadedPeer)
{
    Fleet f;

    for (uint32_t i = 0; i < 40; i++) {
        std::vector<affinity_level_t> levels =
            levels_of(chat({{"user", words(5000 + i, 700)}}));
        const int ring = f.ring_first(levels.back().hash);

        // The ring peer has one request in flight (bound 2.5: it has
        // room), the others none.
        f.up().acquire(size_t(ring));
        ASSERT_TRUE(would_accept(f.up(), size_t(ring)));
        const int least = f.least_loaded_on_ring(levels.back().hash);
        ASSERT_NE(least, ring);

        Routed r = f.send(levels);
        EXPECT_EQ(r.decision.route, kPrefixNew) << route_name(r.decision.route);
        EXPECT_EQ(r.decision.peer, least) << "prompt " << i;
        EXPECT_EQ(f.up().inflight(size_t(r.decision.peer)), 0);
        f.up().release(size_t(ring));
    }
    EXPECT_EQ(f.up().total_inflight(), 0);
}

TEST(PrefixRoute, NextTurnGoesToThePreviousTurnsPeer)
{
    Fleet f;
    Conversation c(7, words(1, 400));

    Routed first = f.send(c.body(1));
    ASSERT_EQ(first.decision.route, kPrefixNew);
    const int peer = first.decision.peer;

    for (size_t turn = 2; turn <= 8; turn++) {
        SCOPED_TRACE(testing::Message() << "turn " << turn);
        f.router().now += 30;
        std::string previous = c.body(turn - 1);
        std::vector<affinity_level_t> before = levels_of(previous);

        Routed r = f.send(c.body(turn));
        EXPECT_EQ(r.decision.route, kPrefixHit) << route_name(r.decision.route);
        EXPECT_EQ(r.decision.peer, peer);
        // The longest level of the previous turn: the longest scheduled
        // length within it.
        EXPECT_EQ(r.decision.prefix_len, before.back().length);
        EXPECT_EQ(r.decision.prefix_len,
                  longest_level_within(canonical_length(previous)));
    }

    // Each request was counted once and released.
    EXPECT_EQ(f.up().stats(size_t(peer)).requests, 8u);
    EXPECT_EQ(f.up().total_inflight(), 0);
}

TEST(PrefixRoute, PrefixZoneCanHoldTheCounters)
{
    // Without session_affinity the module counts in-flight requests in the
    // prefix zone itself; a session key is then not used.
    Fleet f(4, true);
    Conversation c(11, std::string());

    Routed first = f.send(c.body(1), false, "some-key");
    ASSERT_EQ(first.decision.route, kPrefixNew) << route_name(first.decision.route);
    EXPECT_EQ(f.up().inflight(size_t(first.decision.peer)), 1);
    f.up().release(size_t(first.decision.peer));

    for (size_t turn = 2; turn <= 4; turn++) {
        Routed r = f.send(c.body(turn), true, "some-key");
        EXPECT_EQ(r.decision.route, kPrefixHit) << route_name(r.decision.route);
        EXPECT_EQ(r.decision.peer, first.decision.peer);
        EXPECT_EQ(r.decision.prefix_len, levels_of(c.body(turn - 1)).back().length);
    }
    EXPECT_EQ(f.up().stats(size_t(first.decision.peer)).requests, 4u);
    EXPECT_EQ(f.up().total_inflight(), 0);
    EXPECT_EQ(f.up().total_pins(), 0);
}

TEST(PrefixRoute, OverloadedPeerIsAvoidedAndTheNewPeerRecorded)
{
    Fleet f;
    Conversation c(3, words(2, 600));

    Routed t1 = f.send(c.body(1));
    const int p = t1.decision.peer;
    ASSERT_EQ(f.send(c.body(2)).decision.peer, p);

    // Hold 10 requests on p: over the bound (share 11/4, bound 4.75).
    for (int i = 0; i < 10; i++) {
        f.up().acquire(size_t(p));
    }

    std::vector<affinity_level_t> l3 = levels_of(c.body(3));
    Routed t3 = f.send(l3);
    const int q = t3.decision.peer;
    EXPECT_NE(q, p);
    EXPECT_EQ(t3.decision.route, kPrefixNew) << route_name(t3.decision.route);
    EXPECT_EQ(t3.decision.prefix_len, 0u);
    EXPECT_EQ(f.up().inflight(size_t(p)), 10);

    // Recorded for q: the levels it shares with turn 2 now name q first,
    // then p; its own longest level names q only.
    std::vector<affinity_level_t> l2 = levels_of(c.body(2));
    EXPECT_EQ(f.peers_of(l2.back()), (std::vector<int>{q, p}));
    EXPECT_EQ(f.peers_of(l2.front()), (std::vector<int>{q, p}));
    EXPECT_EQ(f.peers_of(l3.back()), (std::vector<int>{q}));

    // Once p is idle again, the conversation goes on where its last turn
    // was served.
    f.up().release_all();
    Routed t4 = f.send(c.body(4));
    EXPECT_EQ(t4.decision.route, kPrefixHit);
    EXPECT_EQ(t4.decision.peer, q);
    EXPECT_EQ(t4.decision.prefix_len, l3.back().length);

    // A request that branches off turn 2 finds both peers, and takes the
    // least loaded of them under the bound.
    f.up().acquire(size_t(q));
    f.up().acquire(size_t(q));
    std::string branch = chat({{"system", words(2, 600)},
                               {"user", words(1000 + 3 * 64 + 2, 300)},
                               {"assistant", words(1000 + 3 * 64 + 3, 150)},
                               {"user", words(999999, 600)}});
    Routed b = f.send(branch);
    EXPECT_EQ(b.decision.route, kPrefixHit);
    EXPECT_EQ(b.decision.peer, p);
    EXPECT_EQ(b.decision.prefix_len, l2.back().length);
}

TEST(PrefixRoute, ConversationsSpreadOverThePeersAndStayOnTheirPeer)
{
    // 300 conversations that share a 2,000-character system prompt, each
    // turn adding about 300 characters.  Their first turns are in flight
    // together, so the bound spreads them although every one of them
    // follows the shared prompt while its peers have room; later turns,
    // one at a time, go to their conversation's peer.
    Fleet f;
    const std::string system = words(424242, 2000);
    const size_t nconv = 300, nturns = 4;
    std::vector<Conversation> convs;
    for (uint32_t i = 0; i < nconv; i++) {
        convs.emplace_back(i, system);
    }

    std::vector<int> peer_of(nconv, -1);
    std::map<uint32_t, size_t> routes;

    for (size_t i = 0; i < nconv; i++) {
        Routed r = f.send(convs[i].body(1), false);
        routes[r.decision.route]++;
        peer_of[i] = r.decision.peer;
        if (r.decision.route == kPrefixHit) {
            EXPECT_GE(r.decision.prefix_len, 1000u);
        }
    }
    f.up().release_all();

    // The first one found nothing; nearly all others found the system
    // prompt on one of its peers.
    EXPECT_GE(routes[kPrefixHit], nconv * 9 / 10);

    for (size_t turn = 2; turn <= nturns; turn++) {
        for (size_t i = 0; i < nconv; i++) {
            f.router().now++;
            Routed r = f.send(convs[i].body(turn));
            routes[r.decision.route]++;
            EXPECT_EQ(r.decision.route, kPrefixHit)
                << "conversation " << i << " turn " << turn << ": "
                << route_name(r.decision.route);
            EXPECT_EQ(r.decision.peer, peer_of[i])
                << "conversation " << i << " turn " << turn;
            EXPECT_EQ(r.decision.prefix_len,
                      levels_of(convs[i].body(turn - 1)).back().length)
                << "conversation " << i << " turn " << turn;
        }
    }

    std::vector<size_t> count(f.up().size(), 0);
    for (int p : peer_of) {
        ASSERT_GE(p, 0);
        count[size_t(p)]++;
    }
    double mean = double(nconv) / double(f.up().size());
    size_t max = *std::max_element(count.begin(), count.end());
    EXPECT_LE(double(max) / mean, 1.3)
        << "conversations per peer: " << count[0] << " " << count[1] << " "
        << count[2] << " " << count[3];
    for (size_t i = 0; i < f.up().size(); i++) {
        EXPECT_EQ(f.up().stats(i).requests, count[i] * nturns);
    }
    EXPECT_EQ(routes[kPrefixHit] + routes[kPrefixNew], nconv * nturns);

    // The system prompt gained holders as the bound spread it; each
    // conversation's own levels are held by its peer only.
    const uint32_t shared_len =
        canonical_length(chat({{"system", system}}));
    std::vector<affinity_level_t> l1 = levels_of(convs[0].body(1));
    const affinity_level_t *shared = nullptr;
    for (const affinity_level_t &l : l1) {
        if (l.length <= shared_len) {
            shared = &l;
        }
    }
    ASSERT_NE(shared, nullptr);
    EXPECT_GE(f.peers_of(*shared).size(), 2u);

    for (size_t i = 0; i < nconv; i++) {
        for (size_t turn = 1; turn < nturns; turn++) {
            std::vector<affinity_level_t> l = levels_of(convs[i].body(turn));
            ASSERT_GT(l.back().length, shared_len);
            EXPECT_EQ(f.peers_of(l.back()), (std::vector<int>{peer_of[i]}))
                << "conversation " << i << " turn " << turn;
        }
    }
}

TEST(PrefixRoute, SharedPrefixIsFollowedWithinTheBound)
{
    // One at a time, conversations on a new system prompt all follow it to
    // the peer that holds it: its cache serves them all.
    Fleet f;
    const std::string system = words(6, 1200);
    std::vector<affinity_level_t> sys = levels_of(chat({{"system", system}}));
    ASSERT_EQ(sys.back().length, 1000u);

    Routed c0 = f.send(Conversation(200, system).body(1));
    EXPECT_EQ(c0.decision.route, kPrefixNew);
    const int holder = c0.decision.peer;
    for (uint32_t i = 1; i < 20; i++) {
        Routed r = f.send(Conversation(200 + i, system).body(1));
        EXPECT_EQ(r.decision.route, kPrefixHit);
        EXPECT_EQ(r.decision.peer, holder);
        EXPECT_EQ(r.decision.prefix_len, 1000u);
    }
    EXPECT_EQ(f.peers_of(sys.back()), (std::vector<int>{holder}));

    // In flight together, they fill the holder up to the bound's slack
    // above its share (a 1,000-character prefix is not worth the factor's
    // longer queue); the next goes to the least loaded peer and becomes a
    // holder too.  Later ones go to the least loaded peer if it is a
    // holder with room (spreading costs nothing then), or if it has two
    // fewer in flight than every holder once two hold the prefix (short,
    // it is copied at little cost), or once the prefix has as many
    // holders as an entry remembers (widely held); else to the least
    // loaded holder with room.
    std::set<int> used;
    for (uint32_t i = 20; i < 60; i++) {
        std::vector<affinity_level_t> l =
            levels_of(Conversation(200 + i, system).body(1));
        std::vector<int> holders = f.peers_of(sys.back());
        const int cold = f.least_loaded_on_ring(l.back().hash);
        int64_t total = 0;
        for (size_t p = 0; p < f.up().size(); p++) {
            total += f.up().inflight(p);
        }
        const double share = double(total + 1) / double(f.up().size());
        int least = -1;
        bool cold_holds = false;
        for (int h : holders) {
            if (!would_accept(f.up(), size_t(h))
                || double(f.up().inflight(size_t(h)) + 1) > share + 2.0)
            {
                continue;
            }
            cold_holds |= h == cold;
            if (least < 0 || f.up().inflight(size_t(h))
                                 < f.up().inflight(size_t(least)))
            {
                least = h;
            }
        }

        const int64_t least_load = least < 0 ? -1
                                             : f.up().inflight(size_t(least));
        // Held by two or more, the short prefix is copied to a peer with
        // two fewer in flight than the holder chosen (nothing learned of
        // the peers' pace: by counts).
        const bool copied = holders.size() >= 2 && !cold_holds
                            && would_accept(f.up(), size_t(cold))
                            && f.up().inflight(size_t(cold)) + 2
                               <= least_load;
        Routed r = f.send(l, false);
        used.insert(r.decision.peer);
        expect_within_bound(f.up(), "after a placement");
        if (least < 0) {
            EXPECT_EQ(r.decision.route, kPrefixNew) << "conversation " << i;
            EXPECT_EQ(r.decision.peer, cold)
                << "conversation " << i << ": not the least loaded peer";
            continue;
        }
        if (copied) {
            // It holds none of the prompt: placed as new.
            EXPECT_EQ(r.decision.route, kPrefixNew) << "conversation " << i;
            EXPECT_EQ(r.decision.prefix_len, 0u);
            EXPECT_EQ(r.decision.peer, cold) << "conversation " << i;
            continue;
        }
        EXPECT_EQ(r.decision.route, kPrefixHit) << "conversation " << i;
        EXPECT_EQ(r.decision.prefix_len, 1000u);
        if (cold_holds || holders.size() == affinity::kPrefixPeers) {
            EXPECT_EQ(r.decision.peer, cold) << "conversation " << i;
        } else {
            EXPECT_EQ(f.up().inflight(size_t(r.decision.peer)) - 1,
                      least_load)
                << "conversation " << i << ": not the least loaded holder";
        }
    }
    EXPECT_GE(used.size(), 2u);
    EXPECT_GE(f.peers_of(sys.back()).size(), 2u);
}

// The conversations on system numbered from first, each served by one of
// holders (the others busy for it): those peers hold its levels.
void make_holders(Fleet &f, const std::string &system, uint32_t first,
                  const std::vector<int> &holders)
{
    for (size_t k = 0; k < holders.size(); k++) {
        for (size_t i = 0; i < f.up().size(); i++) {
            f.up().set_state(i, int(i) == holders[k] ? AFFINITY_PEER_USABLE
                                                     : AFFINITY_PEER_BUSY);
        }
        Routed r = f.send(Conversation(first + uint32_t(k), system).body(1));
        ASSERT_EQ(r.decision.peer, holders[k]);
    }
    for (size_t i = 0; i < f.up().size(); i++) {
        f.up().set_state(i, AFFINITY_PEER_USABLE);
    }
}

// The levels of n conversations on system, numbered from first on, whose
// ring peer is none of holders.
std::vector<std::vector<affinity_level_t>> outside_of(
    Fleet &f, const std::string &system, uint32_t first, size_t n,
    const std::vector<int> &holders)
{
    std::vector<std::vector<affinity_level_t>> outside;
    for (uint32_t i = 0; i < 200 && outside.size() < n; i++) {
        std::vector<affinity_level_t> l =
            levels_of(Conversation(first + i, system).body(1));
        const int ring = f.ring_first(l.back().hash);
        if (std::find(holders.begin(), holders.end(), ring)
            == holders.end())
        {
            outside.push_back(l);
        }
    }
    return outside;
}

// A peer that is neither ring nor one of holders.
int bystander(Fleet &f, int ring, const std::vector<int> &holders)
{
    for (int p = 0; p < int(f.up().size()); p++) {
        if (p != ring && std::find(holders.begin(), holders.end(), p)
                             == holders.end())
        {
            return p;
        }
    }
    return -1;
}

// One request in flight on every peer but idle.
void busy_but(Fleet &f, int idle)
{
    for (size_t p = 0; p < f.up().size(); p++) {
        f.up().acquire(p);
    }
    if (idle >= 0) {
        f.up().release(size_t(idle));
    }
}

// Sends levels with peer alone usable (the others busy for it): peer
// becomes a holder of all of them.
void serve_on(Fleet &f, size_t peer,
              const std::vector<affinity_level_t> &levels)
{
    for (size_t i = 0; i < f.up().size(); i++) {
        f.up().set_state(i, i == peer ? AFFINITY_PEER_USABLE
                                      : AFFINITY_PEER_BUSY);
    }
    Routed r = f.send(levels);
    EXPECT_EQ(r.decision.peer, int(peer));
    for (size_t i = 0; i < f.up().size(); i++) {
        f.up().set_state(i, AFFINITY_PEER_USABLE);
    }
}

// The same with the levels of body (scheduled only).
void serve_on(Fleet &f, size_t peer, const std::string &body)
{
    serve_on(f, peer, levels_of(body));
}

// A system prompt whose message ends 10 characters past a scheduled length
// (`level`) of at least `from`, the next one (`next`) more than `spacing`
// on: model is 8 code points, "system" US text RS 8 + the text.
struct PastLevel {
    std::string text;
    uint32_t level;
    uint32_t next;
};

PastLevel system_past_level(uint32_t seed, uint32_t from, uint32_t spacing)
{
    const std::vector<uint32_t> schedule = default_schedule();
    size_t k = 0;
    while (schedule[k] < from || schedule[k + 1] - schedule[k] < spacing) {
        k++;
    }
    return {words(seed, schedule[k] + 10 - 16), schedule[k], schedule[k + 1]};
}

// The levels of a body with prefix_affinity's default turn levels (turns=8)
// as well as the scheduled ones.
std::vector<affinity_level_t> levels_with_turns(const std::string &body)
{
    Prompt p = prompt_levels(body, default_schedule(), '\0', 8);
    EXPECT_EQ(p.rc, AFFINITY_PROMPT_OK);
    return p.levels;
}

// Behind a long system prompt that every peer holds, a conversation's turn
// adds less than the spacing of the scheduled levels there: by them alone
// its next turn finds only the shared prompt, and goes where a shared
// prompt goes.  Its turn levels make the previous turn's whole prompt a
// level of the next one, held by the peer that served it: each
// conversation comes back to its own peer.
TEST(PrefixRoute, NextTurnFindsItsPeerPastAPromptEveryPeerHolds)
{
    const PastLevel past = system_past_level(301, 20000, 1500);
    const std::string &system = past.text;
    const std::vector<uint32_t> schedule = default_schedule();

    Fleet f;
    make_holders(f, system, 600, {0, 1, 2, 3});

    for (uint32_t peer = 0; peer < 4; peer++) {
        SCOPED_TRACE(testing::Message() << "conversation on peer " << peer);
        Conversation c(700 + peer, system);
        const std::string first = c.body(1);
        const std::string second = c.body(2);
        ASSERT_LT(canonical_length(second), past.next)
            << "no scheduled length past the system prompt";
        serve_on(f, peer, levels_with_turns(first));

        // By scheduled levels only: the shared prompt's level.
        Prompt plain = prompt_levels(second, schedule);
        f.router().now += 1;
        Routed r = f.router().route_prompt(f.prefixes(), plain.levels);
        EXPECT_EQ(r.decision.prefix_len, past.level);
        f.up().release_all();

        // With turn levels: the previous turn whole, on its peer.
        f.router().now += 1;
        r = f.send(levels_with_turns(second));
        EXPECT_EQ(r.decision.route, kPrefixHit) << route_name(r.decision.route);
        EXPECT_EQ(r.decision.peer, int(peer));
        EXPECT_EQ(r.decision.prefix_len, canonical_length(first));
    }
}

// New conversations behind a short system prompt that many peers hold
// (copied to the least loaded peer, below), whose own text ends before the
// next scheduled length: their longest scheduled level is the system
// prompt's.  On an idle fleet, ties among the least loaded peers go in the
// ring order of each whole prompt (its turn level), so they spread rather
// than all meet on one peer.
TEST(PrefixRoute, NewConversationsBehindAHeldPromptSpreadOnAnIdleFleet)
{
    Fleet f(8);
    const std::string system = words(77, 1200);
    const std::vector<int> holders = {0, 2, 4, 6};

    // The system prompt whole (its message's end, 1,216 characters) and
    // its levels held by four peers.
    for (size_t k = 0; k < holders.size(); k++) {
        serve_on(f, size_t(holders[k]), levels_with_turns(
            Conversation(300 + uint32_t(k), system).body(1)));
    }

    std::set<int> by_turns;
    std::set<int> by_schedule;

    for (uint32_t k = 0; k < 8; k++) {
        const std::string body =
            chat({{"system", system}, {"user", words(900 + k, 20)}});
        std::vector<affinity_level_t> plain = levels_of(body);
        ASSERT_EQ(plain.back().length, 1000u) << "within the system prompt";

        Routed r = f.send(levels_with_turns(body));
        EXPECT_EQ(r.decision.prefix_len, 1216u);
        by_turns.insert(r.decision.peer);

        // The same prompts without turn levels tie in one order.
        r = f.send(plain);
        EXPECT_EQ(r.decision.prefix_len, 1000u);
        by_schedule.insert(r.decision.peer);
    }

    EXPECT_EQ(by_schedule.size(), 1u);
    EXPECT_GE(by_turns.size(), 4u);
}

// A prefix held by as many peers as an entry remembers (four of eight
// here) is likely held by the others too (an entry forgets its older
// holders): it goes to the least loaded peer, a remembered holder or not,
// ties in the ring order of the prompt's longest level.
TEST(PrefixRoute, WidelyHeldPrefixGoesToTheLeastLoadedPeer)
{
    Fleet f(8);
    const std::string system = words(77, 1200);
    std::vector<affinity_level_t> sys = levels_of(chat({{"system", system}}));
    ASSERT_EQ(sys.back().length, 1000u);

    const std::vector<int> holders = {0, 2, 4, 6};
    make_holders(f, system, 300, holders);
    std::vector<int> remembered = f.peers_of(sys.back());
    std::sort(remembered.begin(), remembered.end());
    ASSERT_EQ(remembered, holders);

    // New conversations whose ring peer is not a holder.
    std::vector<std::vector<affinity_level_t>> outside =
        outside_of(f, system, 400, 12, holders);
    ASSERT_EQ(outside.size(), 12u);

    // Every peer has one request in flight but one holder, idle: it takes
    // the prompt (and stays one of the four).
    for (size_t k = 0; k < 10; k++) {
        SCOPED_TRACE(testing::Message() << "conversation " << k);
        const int idle = holders[k % holders.size()];
        busy_but(f, idle);

        Routed r = f.send(outside[k]);
        EXPECT_EQ(r.decision.route, kPrefixHit);
        EXPECT_EQ(r.decision.prefix_len, 1000u);
        EXPECT_EQ(r.decision.peer, idle);
        f.up().release_all();
    }

    // Every peer has one request in flight but a peer that is neither a
    // remembered holder nor the prompt's ring peer, idle: it takes the
    // prompt, and becomes the most recent holder.
    const int idle = bystander(f, f.ring_first(outside[11].back().hash),
                               holders);
    ASSERT_GE(idle, 0);
    busy_but(f, idle);
    Routed r = f.send(outside[11]);
    EXPECT_EQ(r.decision.route, kPrefixHit);
    EXPECT_EQ(r.decision.prefix_len, 1000u);
    EXPECT_EQ(r.decision.peer, idle);
    EXPECT_EQ(f.peers_of(sys.back()).front(), idle);
    f.up().release_all();

    // Every peer has one request in flight: a tie, so the ring peer, which
    // becomes a holder.
    busy_but(f, -1);
    const int ring = f.ring_first(outside[10].back().hash);
    Routed tie = f.send(outside[10]);
    EXPECT_EQ(tie.decision.route, kPrefixHit);
    EXPECT_EQ(tie.decision.prefix_len, 1000u);
    EXPECT_EQ(tie.decision.peer, ring);
    EXPECT_EQ(f.peers_of(sys.back()).front(), ring);
    f.up().release_all();
}

// A widely held level of a document's length (4,096 characters or more)
// is not copied to the least loaded peer: it goes to the prompt's ring peer
// unless a remembered holder has fewer requests in flight.
TEST(PrefixRoute, WidelyHeldDocumentGoesToTheRingPeerOrAHolder)
{
    Fleet f(8);
    const std::string document = words(78, 9000);
    std::vector<affinity_level_t> doc =
        levels_of(chat({{"system", document}}));
    ASSERT_GE(doc.back().length, 4096u);

    const std::vector<int> holders = {0, 2, 4, 6};
    make_holders(f, document, 500, holders);

    // Questions about it whose ring peer is not a holder.
    std::vector<std::vector<affinity_level_t>> outside =
        outside_of(f, document, 600, 2, holders);
    ASSERT_EQ(outside.size(), 2u);

    // Every peer has one request in flight but a peer that is neither a
    // holder nor the ring peer, idle: the ring peer takes the question.
    const int ring = f.ring_first(outside[0].back().hash);
    const int idle = bystander(f, ring, holders);
    ASSERT_GE(idle, 0);
    busy_but(f, idle);
    Routed r = f.send(outside[0]);
    EXPECT_EQ(r.decision.route, kPrefixHit);
    EXPECT_EQ(r.decision.prefix_len, doc.back().length);
    EXPECT_EQ(r.decision.peer, ring);
    f.up().release_all();

    // A holder idle among busy peers takes it.
    busy_but(f, holders[1]);
    Routed h = f.send(outside[1]);
    EXPECT_EQ(h.decision.route, kPrefixHit);
    EXPECT_EQ(h.decision.peer, holders[1]);
    f.up().release_all();
}

// A short question about a widely held document goes to the ring peer of
// the prompt's longest scheduled level, not of its turn level at the end,
// which is each question's own: questions about one document meet on one
// ring peer instead of copying it to theirs.
TEST(PrefixRoute, DocumentRingPeerIsTheScheduledLevels)
{
    const PastLevel past = system_past_level(79, 8000, 500);
    const std::string &document = past.text;

    for (uint32_t q = 0; q < 6; q++) {
        SCOPED_TRACE(testing::Message() << "question " << q);
        Fleet f(8);
        make_holders(f, document, 500, {0, 2, 4, 6});

        const std::string body =
            chat({{"system", document}, {"user", words(7000 + q, 40)}});
        std::vector<affinity_level_t> plain = levels_of(body);
        ASSERT_EQ(plain.back().length, past.level);

        Routed r = f.send(levels_with_turns(body));
        EXPECT_EQ(r.decision.route, kPrefixHit);
        EXPECT_EQ(r.decision.prefix_len, past.level);
        EXPECT_EQ(r.decision.peer, f.ring_first(plain.back().hash));
    }
}

// The length of the longest level two bodies share.
uint32_t shared_length(const std::string &a, const std::string &b)
{
    std::vector<affinity_level_t> la = levels_of(a);
    std::vector<affinity_level_t> lb = levels_of(b);
    uint32_t length = 0;
    for (size_t j = 0; j < std::min(la.size(), lb.size()); j++) {
        if (la[j].hash == lb[j].hash) {
            length = la[j].length;
        }
    }
    return length;
}

void hold(Fleet &f, size_t peer, int requests)
{
    for (int i = 0; i < requests; i++) {
        f.up().acquire(peer);
    }
}

// counts[i] requests in flight on peer i.
void hold_each(Fleet &f, const std::vector<int> &counts)
{
    for (size_t peer = 0; peer < counts.size(); peer++) {
        hold(f, peer, counts[peer]);
    }
}

// Stay or move by what a move costs.  A prefix several peers hold (a shared
// document) whose holders are all over the bound: moving the prompt to the
// holder of a shorter level re-prefills the rest.  When that rest is long
// (4,096 characters or more), the least loaded holder takes the prompt one
// request above the bound; two above, or for a shorter rest, or when the
// prefix is one peer's own, the prompt goes to the shorter level's holder
// as before, and when no peer under the bound holds any level of it, to
// the least loaded peer.
TEST(PrefixRoute, LongSharedPrefixTakesOneRequestAboveTheBound)
{
    Fleet f;
    const std::string doc = words(91, 20000);
    auto ask = [&doc](uint32_t q) {
        return chat({{"system", doc}, {"user", words(5000 + q, 200)}});
    };
    // Peers 0 and 1 hold the document; peer 2 only its first 1,200
    // characters (another prompt that starts alike).
    const std::string opening = chat({{"system", doc.substr(0, 1200)
                                                 + words(92, 800)}});
    serve_on(f, 0, ask(0));
    serve_on(f, 1, ask(1));
    serve_on(f, 2, opening);
    const uint32_t document = shared_length(ask(0), ask(9));
    const uint32_t start = shared_length(opening, ask(9));
    ASSERT_GE(document - start, 4096u);
    ASSERT_EQ(f.peers_of(levels_of(ask(9)).front()).size(), 3u);

    // Three in flight on each holder: share (6 + 1) / 4, bound 3.75, so
    // each is over it by less than one request.  A holder takes it.
    hold_each(f, {3, 3});
    ASSERT_FALSE(would_accept(f.up(), 0));
    Routed r = f.send(ask(9));
    EXPECT_EQ(r.decision.route, kPrefixHit) << route_name(r.decision.route);
    EXPECT_TRUE(r.decision.peer == 0 || r.decision.peer == 1)
        << "peer " << r.decision.peer;
    EXPECT_EQ(r.decision.prefix_len, document);
    f.up().release_all();

    // Five on each: bound 4.75, six would be more than one above it.  The
    // holder of the document's opening, under the bound, takes it.
    hold_each(f, {5, 5});
    r = f.send(ask(10));
    EXPECT_EQ(r.decision.route, kPrefixHit);
    EXPECT_EQ(r.decision.peer, 2);
    EXPECT_EQ(r.decision.prefix_len, start);
    f.up().release_all();

    // A short shared prefix (a system prompt of 3,000 characters): the
    // rest a move re-prefills is under 4,096 characters, the bound holds.
    const std::string system = doc.substr(0, 3000);
    auto brief = [&system](uint32_t q) {
        return chat({{"system", system}, {"user", words(6000 + q, 200)}});
    };
    serve_on(f, 0, brief(0));
    serve_on(f, 1, brief(1));
    ASSERT_LT(shared_length(brief(0), brief(9)) - start, 4096u);
    hold_each(f, {3, 3});
    r = f.send(brief(9));
    EXPECT_EQ(r.decision.route, kPrefixHit);
    EXPECT_EQ(r.decision.peer, 2);
    f.up().release_all();

    // A long prefix one peer holds (a conversation of its own, after the
    // same opening): the bound holds too.
    const std::string own = doc.substr(0, 1200) + words(93, 20000);
    auto turn = [&own](uint32_t q) {
        return chat({{"system", own}, {"user", words(7000 + q, 200)}});
    };
    serve_on(f, 0, turn(0));
    const uint32_t history = shared_length(turn(0), turn(1));
    ASSERT_GE(history - start, 4096u);
    for (const affinity_level_t &level : levels_of(turn(1))) {
        if (level.length == history) {
            ASSERT_EQ(f.peers_of(level), (std::vector<int>{0}));
        }
    }
    hold_each(f, {3, 3});
    r = f.send(turn(1));
    EXPECT_EQ(r.decision.route, kPrefixHit);
    EXPECT_EQ(r.decision.peer, 2);
    EXPECT_EQ(r.decision.prefix_len, start);
    f.up().release_all();

    // No peer under the bound holds any level of the document: the least
    // loaded peer takes it, as a new prompt.
    Fleet g;
    serve_on(g, 0, ask(0));
    serve_on(g, 1, ask(1));
    hold_each(g, {3, 3});
    std::vector<affinity_level_t> l = levels_of(ask(11));
    const int cold = g.least_loaded_on_ring(l.back().hash);
    r = g.send(l);
    EXPECT_EQ(r.decision.route, kPrefixNew) << route_name(r.decision.route);
    EXPECT_EQ(r.decision.peer, cold);
    g.up().release_all();

    // A session pinned to a holder of the document, over the bound by less
    // than one request, the other holders busy and a peer that holds the
    // opening only under the bound: the session stays, and its pin with it.
    const std::string key = "document-session";
    Routed first = g.send(ask(12), true, key);
    ASSERT_EQ(first.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_NEW});
    const size_t pinned = size_t(first.decision.peer);
    std::vector<int> holders;
    for (const affinity_level_t &level : levels_of(ask(12))) {
        if (level.length == document) {
            holders = g.peers_of(level);
        }
    }
    ASSERT_NE(std::find(holders.begin(), holders.end(), int(pinned)),
              holders.end());
    size_t other = 0;
    while (std::find(holders.begin(), holders.end(), int(other))
           != holders.end())
    {
        other++;
    }
    ASSERT_LT(other, g.up().size());
    serve_on(g, other, opening);
    for (size_t i = 0; i < g.up().size(); i++) {
        if (i != pinned && i != other) {
            g.up().set_state(i, AFFINITY_PEER_BUSY);
        }
    }
    hold(g, pinned, 3);
    ASSERT_FALSE(would_accept(g.up(), pinned));
    Routed next = g.send(ask(12), true, key);
    EXPECT_EQ(next.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_HIT})
        << route_name(next.decision.route);
    EXPECT_EQ(size_t(next.decision.peer), pinned);
    EXPECT_EQ(g.up().stats(pinned).pins, 1);
}

// Under heavy load the bound lets a peer reach 1.25 times its share; a
// holder of a short level is followed only within the bound's slack (2)
// above its share, plus one request per 4,096 characters (at most two) of
// a level that two or more peers hold.  A session's pinned peer is held to
// the same.  A level of 4,096 characters or more that one peer holds (a
// conversation's own history) is followed up to the bound.
TEST(PrefixRoute, HolderIsFollowedWithinTheSlackOfItsShare)
{
    Fleet f;
    const std::string system = words(94, 1200);
    auto brief = [&system](uint32_t q) {
        return chat({{"system", system}, {"user", words(8000 + q, 200)}});
    };
    serve_on(f, 0, brief(0));

    // 19 in flight on the holder, 15 on the others: share 65 / 4 = 16.25,
    // bound 20.3.  The holder is under the bound but 3.75 above its share:
    // a 1,000-character prefix goes to the least loaded peer instead.
    hold_each(f, {19, 15, 15, 15});
    ASSERT_TRUE(would_accept(f.up(), 0));
    Routed r = f.send(brief(1));
    EXPECT_NE(r.decision.peer, 0);
    EXPECT_EQ(r.decision.route, kPrefixNew) << route_name(r.decision.route);
    f.up().release_all();

    // With the holder alone again: 17 on it, 16 on the others, share
    // 66 / 4 = 16.5, the holder within the slack (18 <= 18.5).  It is
    // followed.
    Fleet e;
    serve_on(e, 0, brief(0));
    hold_each(e, {17, 16, 16, 16});
    r = e.send(brief(2));
    EXPECT_EQ(r.decision.peer, 0);
    EXPECT_EQ(r.decision.route, kPrefixHit);
    e.up().release_all();

    // A 6,000-character history only the holder has, under the first
    // case's load: 3.75 above its share but under the bound, it is
    // followed; at the bound it is not.
    Fleet c;
    const std::string history = words(97, 6000);
    auto turn = [&history](uint32_t q) {
        return chat({{"system", history}, {"user", words(8100 + q, 200)}});
    };
    serve_on(c, 0, turn(0));
    hold_each(c, {19, 15, 15, 15});
    r = c.send(turn(1));
    EXPECT_EQ(r.decision.peer, 0);
    EXPECT_EQ(r.decision.route, kPrefixHit) << route_name(r.decision.route);
    c.up().release_all();
    hold_each(c, {21, 15, 15, 15});
    ASSERT_FALSE(would_accept(c.up(), 0));
    r = c.send(turn(2));
    EXPECT_NE(r.decision.peer, 0);
    c.up().release_all();

    // A 20,000-character document two peers hold: two requests more are
    // allowed.  19 on each holder, 15 on the others: share 69 / 4 =
    // 17.25, 20 <= 17.25 + 2 + 2.
    Fleet g;
    const std::string doc = words(95, 20000);
    auto ask = [&doc](uint32_t q) {
        return chat({{"system", doc}, {"user", words(9000 + q, 200)}});
    };
    serve_on(g, 0, ask(0));
    serve_on(g, 1, ask(1));
    hold_each(g, {19, 19, 15, 15});
    r = g.send(ask(2));
    EXPECT_EQ(r.decision.route, kPrefixHit) << route_name(r.decision.route);
    EXPECT_TRUE(r.decision.peer == 0 || r.decision.peer == 1)
        << "peer " << r.decision.peer;
    EXPECT_EQ(r.decision.prefix_len, shared_length(ask(0), ask(2)));
    g.up().release_all();

    // A session pinned to a peer with a short prompt, under the same load
    // as the first case: it spills to the least loaded peer; a session on
    // the document's holder stays, and so does one whose history of 6,000
    // characters only its pinned peer holds (routed by its prompt).
    // Returns the pinned peer and the decision on the session's next turn.
    auto under_load = [](const std::string &body, const char *key) {
        Fleet h;
        Routed pin = h.send(body, true, key);
        EXPECT_EQ(pin.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_NEW});
        const size_t pinned = size_t(pin.decision.peer);
        std::vector<int> counts(4, 15);
        counts[pinned] = 19;
        hold_each(h, counts);
        EXPECT_TRUE(would_accept(h.up(), pinned));
        Routed next = h.send(body, true, key);
        h.up().release_all();
        return std::make_pair(pinned, next);
    };
    auto spilled = under_load(brief(3), "short-session");
    EXPECT_EQ(spilled.second.decision.route,
              uint32_t{AFFINITY_ROUTE_SESSION_SPILL})
        << route_name(spilled.second.decision.route);
    EXPECT_NE(size_t(spilled.second.decision.peer), spilled.first);
    auto kept = under_load(turn(3), "long-session");
    EXPECT_EQ(kept.second.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_HIT})
        << route_name(kept.second.decision.route);
    EXPECT_EQ(size_t(kept.second.decision.peer), kept.first);

    Routed dpin = g.send(ask(3), true, "document-session");
    ASSERT_EQ(dpin.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_NEW});
    const size_t holder = size_t(dpin.decision.peer);
    ASSERT_TRUE(holder == 0 || holder == 1);
    // The other holder one request less loaded, so that no tie decides:
    // share 68 / 4 = 17, the pinned peer's 20 within 17 + 2 + 2.
    hold_each(g, holder == 0 ? std::vector<int>{19, 18, 15, 15}
                             : std::vector<int>{18, 19, 15, 15});
    r = g.send(ask(3), true, "document-session");
    EXPECT_EQ(r.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_HIT})
        << route_name(r.decision.route);
    EXPECT_EQ(size_t(r.decision.peer), holder);
    g.up().release_all();
}

// With the peers' cache capacity (prefix_capacity, tokens), a holder that
// has since been sent a capacity of prompt text it did not hold is presumed
// to have evicted the prefix: it is not followed, and the prompt is placed
// as a new one.  Prompt text it already held does not count.
TEST(PrefixRoute, HolderPresumedToHaveEvictedIsNotFollowed)
{
    const std::string doc = words(96, 2000);
    auto ask = [&doc](uint32_t q) {
        return chat({{"system", doc}, {"user", words(9100 + q, 100)}});
    };
    uint32_t other = 9200;
    auto others_on_peer_0 = [&other](Fleet &f, uint32_t n) {
        for (uint32_t k = 0; k < n; k++) {
            serve_on(f, 0, chat({{"user", words(other++, 2000)}}));
        }
    };

    for (uint64_t capacity : {uint64_t{0}, uint64_t{1000}}) {
        SCOPED_TRACE("capacity " + std::to_string(capacity));
        Fleet f;
        f.router().prefix_capacity = capacity;  // 5,000 characters
        serve_on(f, 0, ask(0));

        // 4,000 characters of other prompts since: still followed.
        others_on_peer_0(f, 2);
        Routed r = f.send(ask(1));
        EXPECT_EQ(r.decision.route, kPrefixHit) << route_name(r.decision.route);
        EXPECT_EQ(r.decision.peer, 0);

        // 6,000 since it last got the document: presumed evicted.
        others_on_peer_0(f, 3);
        r = f.send(ask(2));
        if (capacity == 0) {
            EXPECT_EQ(r.decision.route, kPrefixHit);
            EXPECT_EQ(r.decision.peer, 0);
        } else {
            EXPECT_EQ(r.decision.route, kPrefixNew)
                << route_name(r.decision.route);
        }
    }

    // A prompt that declares its size (the body's, beyond the levels)
    // counts it: one 6,000-character prompt evicts the document.
    Fleet g;
    g.router().prefix_capacity = 1000;
    serve_on(g, 0, ask(0));
    g.router().prompt_size = 6000;
    serve_on(g, 0, chat({{"user", words(9299, 300)}}));
    g.router().prompt_size = 0;
    Routed r = g.send(ask(3));
    EXPECT_EQ(r.decision.route, kPrefixNew) << route_name(r.decision.route);

    // A conversation that grows turn by turn on its holder counts only
    // what each turn adds.  Three conversations of 3,000 to 4,500
    // characters take turns on one peer: between two turns of one, the
    // other two add about 1,200 new characters, within 7,500; their whole
    // prompts would be 6,600 and more, and from the third turn on over it.
    Fleet h;
    h.router().prefix_capacity = 1500;      // 7,500 characters
    std::vector<Conversation> talks;
    for (uint32_t id : {7, 8, 9}) {
        talks.emplace_back(id, std::string(), 3000, 150);
        serve_on(h, 0, talks.back().body(1));
    }
    for (size_t turn = 2; turn <= 6; turn++) {
        for (size_t c = 0; c < talks.size(); c++) {
            Routed t = h.send(talks[c].body(turn));
            EXPECT_EQ(t.decision.route, kPrefixHit)
                << "conversation " << c << " turn " << turn;
            EXPECT_EQ(t.decision.peer, 0);
        }
    }
    EXPECT_GT(canonical_length(talks[0].body(3)), 3500u);
}

// With no capacity known, the peers' replies teach it.  A conversation's
// next turn to the peer that served the last one takes the probe of it,
// with the characters of other prompts sent the peer since; the reply
// says whether the peer still held it (affinity_prefixes_replied()).
// Held: no model.  Lost: the peer's holders older than that (with the
// margin) are presumed evicted.
TEST(PrefixRoute, CapacityLearnedFromRepliesModelsThePeer)
{
    uint32_t other = 9400;
    auto others_on_peer_0 = [&other](Fleet &f, uint32_t n) {
        for (uint32_t k = 0; k < n; k++) {
            serve_on(f, 0, chat({{"user", words(other++, 2000)}}));
        }
    };
    const uint32_t each = canonical_length(chat({{"user", words(1, 2000)}}));
    // A conversation's second turn, n other prompts after its first, both
    // on peer 0.  Each starts past the prefix timeout: the last one's
    // probes (prompts that will not come back) are dropped.
    auto turn_two_after = [&](Fleet &f, uint32_t id, uint32_t n) {
        Conversation c(id, std::string(), 3000, 150);
        f.router().now += 601;
        serve_on(f, 0, c.body(1));
        others_on_peer_0(f, n);
        return f.send(c.body(2));
    };
    Fleet f;
    const uint64_t peer0 = f.up().peers()[0].id;

    // Three prompts later the first turn is still followed (nothing is
    // modelled), and the second takes its probe.
    Routed r = turn_two_after(f, 21, 3);
    EXPECT_EQ(r.decision.peer, 0);
    EXPECT_EQ(r.decision.route, kPrefixHit) << route_name(r.decision.route);
    ASSERT_GT(r.decision.probe_length, 1000u);
    EXPECT_LE(r.decision.probe_length,
              canonical_length(Conversation(21, "", 3000, 150).body(1)));
    // (Each counts its longest level: the prompt's size is not given.)
    EXPECT_EQ(r.decision.probe_age, 3 * longest_level_within(each));

    // Held, all of it: still no model.
    affinity_prefixes_replied(f.prefixes(), peer0, r.decision.probe_age,
                              r.decision.probe_length, 3600, 900, 900);
    r = turn_two_after(f, 22, 5);
    EXPECT_EQ(r.decision.route, kPrefixHit) << route_name(r.decision.route);
    ASSERT_GT(r.decision.probe_length, 0u);

    // Lost five prompts later: a prefix lasts about that long there (with
    // the margin, 6.25 prompts).
    affinity_prefixes_replied(f.prefixes(), peer0, r.decision.probe_age,
                              r.decision.probe_length, 3600, 0, 900);
    r = turn_two_after(f, 23, 4);
    EXPECT_EQ(r.decision.peer, 0) << "four prompts later: held";
    EXPECT_EQ(r.decision.route, kPrefixHit) << route_name(r.decision.route);
    r = turn_two_after(f, 24, 7);
    EXPECT_EQ(r.decision.route, kPrefixNew)
        << "seven prompts later: presumed evicted, "
        << route_name(r.decision.route);

    // Less than half the probe's prefix cached is lost, at least half is
    // held (at the prompt's own characters per token: here 4).
    Fleet g;
    auto replied_after = [&](Fleet &fleet, uint32_t id, uint32_t n,
                             double share, uint64_t chars) {
        Routed t = turn_two_after(fleet, id, n);
        EXPECT_GT(t.decision.probe_length, 0u);
        uint64_t cached = uint64_t(t.decision.probe_length * share / 4);
        affinity_prefixes_replied(fleet.prefixes(),
                                  fleet.up().peers()[0].id,
                                  t.decision.probe_age,
                                  t.decision.probe_length, chars, cached,
                                  1000);
    };
    replied_after(g, 31, 2, 0.55, 4000);
    EXPECT_EQ(turn_two_after(g, 32, 7).decision.route, kPrefixHit)
        << "more than half held: no eviction seen, no model";
    replied_after(g, 33, 2, 0.45, 4000);
    EXPECT_EQ(turn_two_after(g, 34, 7).decision.route, kPrefixNew)
        << "less than half held: lost two prompts later";

    // A prompt's size taken from its body (escapes, images) weighs a
    // token at 8 characters at most: a fifth cached is not half.
    Fleet h;
    replied_after(h, 35, 2, 0.2, 40000);
    EXPECT_EQ(turn_two_after(h, 36, 7).decision.route, kPrefixNew)
        << "a tenth held at most: lost";

    // Lost right after it was sent (a failed try): nothing learned.
    Fleet k;
    replied_after(k, 37, 0, 0, 4000);
    EXPECT_EQ(turn_two_after(k, 38, 7).decision.route, kPrefixHit);
}

// With no capacity configured, a peer's engine may tell its own
// (affinity_metrics): its holders are then modelled with it, and the
// other peers' not.  Whether the counters are in the prefix zone or not.
TEST(PrefixRoute, EngineReportedCapacityModelsItsPeer)
{
    const std::string doc = words(96, 2000);
    auto ask = [&doc](uint32_t q) {
        return chat({{"system", doc}, {"user", words(9100 + q, 100)}});
    };

    for (bool together : {false, true}) {
        SCOPED_TRACE(together ? "counters in the prefix zone" : "apart");
        Fleet f(4, together);
        affinity_engine_load_t load{};
        load.cache_tokens = 1000;       // 5,000 characters
        load.found = AFFINITY_ENGINE_RUNNING | AFFINITY_ENGINE_CAPACITY;
        engine_reported(f.counters(), f.up().peer(0).slot, load, 1);
        affinity_engine_load_t unsized{};
        unsized.found = AFFINITY_ENGINE_RUNNING;
        engine_reported(f.counters(), f.up().peer(1).slot, unsized, 1);

        serve_on(f, 0, ask(0));
        serve_on(f, 1, ask(1));
        for (uint32_t k = 0; k < 3; k++) {
            serve_on(f, 0, chat({{"user", words(9200 + k, 2000)}}));
            serve_on(f, 1, chat({{"user", words(9300 + k, 2000)}}));
        }

        // 6,000 characters since: peer 0 is presumed to have evicted the
        // document, peer 1 (no size known) not.
        Routed r = f.send(ask(2));
        EXPECT_EQ(r.decision.route, kPrefixHit) << route_name(r.decision.route);
        EXPECT_EQ(r.decision.peer, 1);

        // A later report without the size keeps the one known.
        engine_reported(f.counters(), f.up().peer(0).slot, unsized, 2);
        serve_on(f, 1, chat({{"user", words(9400, 100)}}));
        f.up().set_state(1, AFFINITY_PEER_FAILED);
        r = f.send(ask(3));
        EXPECT_EQ(r.decision.route, kPrefixNew) << route_name(r.decision.route);
    }
}

// A session whose pinned peer is presumed to have evicted every part of
// its prompt has nothing left there: it is placed anew by its prompt
// (session_moved), where it would have stayed with no capacity known.
TEST(PrefixRoute, SessionWhoseCacheIsPresumedEvictedIsPlacedAnew)
{
    const std::string first = chat({{"user", words(9400, 1500)}});

    for (uint64_t capacity : {uint64_t{0}, uint64_t{1000}}) {
        SCOPED_TRACE("capacity " + std::to_string(capacity));
        Fleet f;
        f.router().prefix_capacity = capacity;
        Routed pin = f.send(first, true, "evicted-session");
        ASSERT_EQ(pin.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_NEW});
        const size_t pinned = size_t(pin.decision.peer);

        // Its next turn, after a little: it stays.
        Routed r = f.send(first, true, "evicted-session");
        EXPECT_EQ(r.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_HIT});

        // 6,000 characters of other prompts on its peer.
        for (uint32_t k = 0; k < 3; k++) {
            serve_on(f, pinned, chat({{"user", words(9500 + k, 2000)}}));
        }
        r = f.send(first, true, "evicted-session");
        EXPECT_EQ(r.decision.route,
                  capacity ? uint32_t{AFFINITY_ROUTE_SESSION_MOVED}
                           : uint32_t{AFFINITY_ROUTE_SESSION_HIT})
            << route_name(r.decision.route);

        // Placed anew, it is pinned where it went.
        Routed again = f.send(first, true, "evicted-session");
        EXPECT_EQ(again.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_HIT});
        EXPECT_EQ(again.decision.peer, r.decision.peer);
    }

    // Presumed evicted, but no peer may take a prompt (all draining): the
    // pinned peer still serves its session.
    Fleet d;
    d.router().prefix_capacity = 1000;
    Routed pin = d.send(first, true, "draining-session");
    const size_t pinned = size_t(pin.decision.peer);
    for (uint32_t k = 0; k < 3; k++) {
        serve_on(d, pinned, chat({{"user", words(9510 + k, 2000)}}));
    }
    for (size_t i = 0; i < d.up().size(); i++) {
        d.up().set_state(i, AFFINITY_PEER_DRAINING);
    }
    Routed r = d.send(first, true, "draining-session");
    EXPECT_EQ(r.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_HIT})
        << route_name(r.decision.route);
    EXPECT_EQ(size_t(r.decision.peer), pinned);

    // A session whose prompt the index no longer lists at all (its entries
    // expired; its pin did not) is not presumed anything: it stays.
    Fleet e;
    e.router().prefix_capacity = 1000;
    pin = e.send(first, true, "expired-session");
    e.router().now += e.router().prefix_timeout + 1;
    r = e.send(first, true, "expired-session");
    EXPECT_EQ(r.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_HIT})
        << route_name(r.decision.route);
    EXPECT_EQ(r.decision.peer, pin.decision.peer);
}

// At the prompt's longest level the most recent holder within the slack
// is taken, not the least loaded one: holders cannot be told apart by what
// they hold past that level (all of a long prompt past max=), and the most
// recent one most likely got the latest turns.  Beyond its slack, the next
// one.
TEST(PrefixRoute, LongestLevelGoesToItsMostRecentHolder)
{
    const std::string history = words(97, 40000);
    auto turn = [&history](uint32_t q) {
        return chat({{"user", history}, {"user", words(9700 + q, 200)}});
    };
    const std::vector<affinity_level_t> levels = levels_of(turn(2));
    ASSERT_LT(levels.back().length, canonical_length(turn(2)))
        << "levels stop at max=";

    Fleet f;
    serve_on(f, 0, turn(0));
    serve_on(f, 1, turn(1));                 // the most recent holder
    hold_each(f, {1, 2, 1, 1});
    f.router().prompt_size = turn(2).size();
    Routed r = f.send(levels);
    EXPECT_EQ(r.decision.route, kPrefixHit) << route_name(r.decision.route);
    EXPECT_EQ(r.decision.peer, 1) << "the most recent, though busier";
    f.up().release_all();

    // The most recent beyond its slack: share (15 + 1) / 4 = 4, and
    // 12 + 1 > 4 + 2.
    hold_each(f, {1, 12, 1, 1});
    r = f.send(levels);
    EXPECT_EQ(r.decision.route, kPrefixHit) << route_name(r.decision.route);
    EXPECT_EQ(r.decision.peer, 0);
    f.up().release_all();
}

// Past the prompt's longest scheduled level its holders cannot be told
// apart by what they hold beyond it: at a turn level there, as at that
// scheduled level, the most recent holder within the slack is taken, not
// the least loaded one.
TEST(PrefixRoute, TurnLevelGoesToItsMostRecentHolder)
{
    const PastLevel past = system_past_level(302, 20000, 1500);
    Conversation c(800, past.text);
    const std::string first = c.body(1);
    const std::string second = c.body(2);
    ASSERT_LT(canonical_length(second), past.next);

    Fleet f;
    serve_on(f, 0, levels_with_turns(first));
    f.router().now += 1;
    serve_on(f, 1, levels_with_turns(first));       // the most recent

    // Peer 1 busier than peer 0 but within the slack of its share:
    // (5 + 1) / 4 + 2 = 3.5, and 2 + 1 <= 3.5.
    hold_each(f, {1, 2, 1, 1});
    Routed r = f.send(levels_with_turns(second));
    EXPECT_EQ(r.decision.route, kPrefixHit) << route_name(r.decision.route);
    EXPECT_EQ(r.decision.prefix_len, canonical_length(first));
    EXPECT_EQ(r.decision.peer, 1) << "the most recent, though busier";
    f.up().release_all();
}

// A session that spills with no holder of its prompt under the bound goes
// to the least loaded peer, not to the next peer on the ring that is
// merely under the bound.
TEST(PrefixRoute, SpillWithNoHolderGoesToTheLeastLoadedPeer)
{
    const std::string key = "spilling-session";
    const std::string body = chat({{"user", words(9600, 300)}});

    Fleet f;
    Routed pin = f.send(body, true, key);
    ASSERT_EQ(pin.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_NEW});
    const size_t pinned = size_t(pin.decision.peer);

    // The ring's next peer from the session's key, other than its own.
    uint32_t walk[Fleet::kMaxTestPeers];
    const uint64_t hash = affinity_ring_hash(key.data(), key.size());
    size_t n = affinity_ring_walk(f.up().ring(), hash, walk,
                                  Fleet::kMaxTestPeers);
    int next = -1;
    for (size_t k = 0; k < n && next < 0; k++) {
        if (walk[k] != pinned) {
            next = int(walk[k]);
        }
    }
    ASSERT_GE(next, 0);

    // The pin beyond its slack, the ring's next peer under the bound, and
    // one other peer the least loaded: 19, 15, 13 and 15 in some order.
    size_t least = 0;
    while (least == pinned || int(least) == next) {
        least++;
    }
    std::vector<int> counts(4, 15);
    counts[pinned] = 19;
    counts[least] = 13;
    hold_each(f, counts);
    ASSERT_TRUE(would_accept(f.up(), size_t(next)));

    Routed r = f.send(body, true, key);
    EXPECT_EQ(r.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_SPILL})
        << route_name(r.decision.route);
    EXPECT_EQ(r.decision.peer, int(least));
    f.up().release_all();
}

TEST(PrefixRoute, FailedPeerIsNeverChosen)
{
    Fleet f;
    const size_t failed = 1;
    f.up().set_state(failed, AFFINITY_PEER_FAILED);

    for (uint32_t i = 0; i < 100; i++) {
        Conversation c(300 + i, words(7, 800));
        for (size_t turn = 1; turn <= 3; turn++) {
            Routed r = f.send(c.body(turn));
            ASSERT_NE(r.decision.peer, int(failed))
                << "conversation " << i << " turn " << turn;
        }
    }

    // A conversation whose peer fails moves, and stays where it moved.
    f.up().set_state(failed, AFFINITY_PEER_USABLE);
    Conversation c(0, std::string());
    uint32_t id = 0;
    int p = -1;
    for (; id < 1000; id++) {
        c = Conversation(1000 + id, std::string());
        std::vector<affinity_level_t> l = levels_of(c.body(1));
        if (f.ring_first(l.back().hash) == int(failed)) {
            p = f.send(l).decision.peer;
            break;
        }
    }
    ASSERT_EQ(p, int(failed));
    f.up().set_state(failed, AFFINITY_PEER_FAILED);

    Routed t2 = f.send(c.body(2));
    EXPECT_NE(t2.decision.peer, int(failed));
    EXPECT_EQ(t2.decision.route, kPrefixNew);
    Routed t3 = f.send(c.body(3));
    EXPECT_EQ(t3.decision.route, kPrefixHit);
    EXPECT_EQ(t3.decision.peer, t2.decision.peer);

    // Requests in flight on the failed peer do not count against the
    // others.
    for (int i = 0; i < 20; i++) {
        f.up().acquire(failed);
    }
    Routed t4 = f.send(c.body(4));
    EXPECT_EQ(t4.decision.route, kPrefixHit);
    EXPECT_EQ(t4.decision.peer, t2.decision.peer);
}

TEST(PrefixRoute, BusyPeerIsSkippedButKept)
{
    Fleet f;
    Conversation c(17, words(8, 300));
    const int p = f.send(c.body(1)).decision.peer;

    f.up().set_state(size_t(p), AFFINITY_PEER_BUSY);
    Routed t2 = f.send(c.body(2));
    EXPECT_NE(t2.decision.peer, p);

    f.up().set_state(size_t(p), AFFINITY_PEER_USABLE);
    // Both served turn 1; turn 2 is known on its new peer only.
    std::vector<affinity_level_t> l1 = levels_of(c.body(1));
    EXPECT_EQ(f.peers_of(l1.back()), (std::vector<int>{t2.decision.peer, p}));
    Routed t3 = f.send(c.body(3));
    EXPECT_EQ(t3.decision.peer, t2.decision.peer);
}

// A prompt cached on a draining peer is not bound to it, unlike a session:
// it goes elsewhere, and its sessions there stay.
TEST(PrefixRoute, DrainingPeerTakesNoPrompts)
{
    Fleet f;
    Conversation c(19, words(8, 400));
    const int p = f.send(c.body(1)).decision.peer;
    ASSERT_GE(p, 0);

    f.up().set_state(size_t(p), AFFINITY_PEER_DRAINING);
    Routed t2 = f.send(c.body(2));
    EXPECT_NE(t2.decision.peer, p);
    EXPECT_EQ(t2.decision.route, kPrefixNew);

    for (uint32_t i = 0; i < 50; i++) {
        Conversation other(500 + i, words(3, 600));
        EXPECT_NE(f.send(other.body(1)).decision.peer, p) << i;
    }
}

TEST(PrefixRoute, SessionDecidesAndTheLevelsAreRecorded)
{
    Fleet f;
    Conversation c(21, words(9, 500));
    std::vector<affinity_level_t> l1 = levels_of(c.body(1));
    std::vector<affinity_level_t> l2 = levels_of(c.body(2));

    // A key whose ring peer is neither where turn 1 nor turn 2 would go by
    // their own levels.
    std::string key;
    int s = -1;
    for (size_t i = 0; i < 1000 && s < 0; i++) {
        std::string k = key_name(i);
        int peer = f.ring_first(affinity_ring_hash(k.data(), k.size()));
        if (peer != f.ring_first(l1.back().hash)
            && peer != f.ring_first(l2.back().hash)) {
            key = k;
            s = peer;
        }
    }
    ASSERT_GE(s, 0);

    // A new session is placed by its prompt (cold here: the ring position
    // of its longest level), not by its key, and pinned there: sessions
    // that open with the same question share its cache.
    const int placed = f.ring_first(l1.back().hash);
    ASSERT_NE(placed, s);

    Routed t1 = f.send(l1, true, key);
    EXPECT_EQ(t1.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_NEW})
        << route_name(t1.decision.route);
    EXPECT_EQ(t1.decision.peer, placed);
    EXPECT_EQ(t1.decision.prefix_len, 0u);
    EXPECT_EQ(f.session_zone().info().used, 1u);
    EXPECT_EQ(f.peers_of(l1.back()), (std::vector<int>{placed}));

    // From then on the session decides.
    Routed again = f.send(l2, true, key);
    EXPECT_EQ(again.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_HIT});
    EXPECT_EQ(again.decision.peer, placed);

    // Without the key, the next turn finds the session's peer by prefix.
    Routed t2 = f.send(l2);
    EXPECT_EQ(t2.decision.route, kPrefixHit) << route_name(t2.decision.route);
    EXPECT_EQ(t2.decision.peer, placed);
    EXPECT_EQ(t2.decision.prefix_len, l2.back().length);
    EXPECT_EQ(f.session_zone().info().used, 1u);
}

TEST(PrefixRoute, SessionSpillGoesToAHolderAndThePinFollows)
{
    // A session's pin over the bound: the request goes to the least loaded
    // peer holding the longest part of its prompt, and the pin follows it
    // (that peer now holds the whole conversation).
    Fleet f;
    Conversation c(24, words(12, 500));
    const std::string key = "spilling-session";

    Routed t1 = f.send(c.body(1), true, key);
    ASSERT_EQ(t1.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_NEW});
    const size_t first = size_t(t1.decision.peer);

    for (int i = 0; i < 10; i++) {
        f.up().acquire(first);
    }
    Routed t2 = f.send(c.body(2), true, key);
    ASSERT_EQ(t2.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_SPILL});
    const size_t second = size_t(t2.decision.peer);
    EXPECT_NE(second, first);

    // The pin followed: with room everywhere, the session stays there.
    f.up().release_all();
    Routed t3 = f.send(c.body(3), true, key);
    EXPECT_EQ(t3.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_HIT});
    EXPECT_EQ(size_t(t3.decision.peer), second);
    EXPECT_EQ(f.up().stats(second).pins, 1);
    EXPECT_EQ(f.up().stats(first).pins, 0);

    // Over the bound there: the first peer holds turn 1, the longest part
    // of the prompt that a peer with room holds, and says how much.
    for (int i = 0; i < 10; i++) {
        f.up().acquire(second);
    }
    std::vector<affinity_level_t> l1 = levels_of(c.body(1));
    Routed t4 = f.send(c.body(4), true, key);
    EXPECT_EQ(t4.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_SPILL});
    EXPECT_EQ(size_t(t4.decision.peer), first);
    EXPECT_EQ(t4.decision.prefix_len, l1.back().length);
    EXPECT_EQ(f.up().stats(first).pins, 1);
    EXPECT_EQ(f.up().stats(second).pins, 0);
}

TEST(PrefixRoute, NewSessionGoesWhereItsPromptIsCached)
{
    // A conversation served without an id; then a new id (generated, or a
    // client that changed its id) continues it: the session is pinned
    // where the conversation's prefix is, not where its key hashes.
    Fleet f;
    Conversation c(22, words(10, 500));
    std::vector<affinity_level_t> l1 = levels_of(c.body(1));
    std::vector<affinity_level_t> l2 = levels_of(c.body(2));

    Routed t1 = f.send(l1);
    ASSERT_EQ(t1.decision.route, kPrefixNew);
    const int home = t1.decision.peer;

    Routed r = f.send(l2, true, "fresh");
    EXPECT_EQ(r.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_NEW});
    EXPECT_EQ(r.decision.peer, home);
    EXPECT_EQ(r.decision.prefix_len, l1.back().length);

    Routed next = f.send(l2, true, "fresh");
    EXPECT_EQ(next.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_HIT});
    EXPECT_EQ(next.decision.peer, home);
}

TEST(PrefixRoute, GeneratedKeyIsReportedByWhatPlacedIt)
{
    // A generated key has no history: its first request is reported as
    // what its prompt found (a hit here), not as a new session, and it is
    // pinned all the same.  A client's own new key stays session_new.
    Fleet f;
    Conversation c(23, words(10, 500));
    std::vector<affinity_level_t> l1 = levels_of(c.body(1));
    std::vector<affinity_level_t> l2 = levels_of(c.body(2));

    f.router().key_origin = AFFINITY_KEY_GENERATED;
    Routed first = f.send(l1, true, "generated-1");
    EXPECT_EQ(first.decision.route, kPrefixNew);
    const int home = first.decision.peer;

    Routed r = f.send(l2, true, "generated-2");
    EXPECT_EQ(r.decision.route, kPrefixHit);
    EXPECT_EQ(r.decision.peer, home);
    EXPECT_EQ(r.decision.prefix_len, l1.back().length);

    Routed next = f.send(l1, true, "generated-2");
    EXPECT_EQ(next.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_HIT});
    EXPECT_EQ(next.decision.peer, home);

    f.router().key_origin = AFFINITY_KEY_CLIENT;
    EXPECT_EQ(f.send(l2, true, "client-own").decision.route,
              uint32_t{AFFINITY_ROUTE_SESSION_NEW});
}

TEST(PrefixRoute, IndexEntriesExpireAfterThePrefixTimeout)
{
    Fleet f;
    f.router().prefix_timeout = 600;
    Conversation c(31, words(10, 300));

    const int p = f.send(c.body(1)).decision.peer;

    // Idle for exactly the timeout: still known.
    f.router().now += 600;
    Routed t2 = f.send(c.body(2));
    EXPECT_EQ(t2.decision.route, kPrefixHit);
    EXPECT_EQ(t2.decision.peer, p);

    // Idle for longer: forgotten, placed like a cold prompt.
    f.router().now += 601;
    std::vector<affinity_level_t> l3 = levels_of(c.body(3));
    Routed t3 = f.send(l3);
    EXPECT_EQ(t3.decision.route, kPrefixNew);
    EXPECT_EQ(t3.decision.peer, f.ring_first(l3.back().hash));
    EXPECT_GT(f.prefix_zone().info().expiries, 0u);
}

TEST(PrefixRoute, WithoutLevelsTheRequestFallsBack)
{
    Fleet f;
    Routed r = f.router().route_prompt(f.prefixes(), {});
    EXPECT_EQ(r.rc, 0);
    EXPECT_EQ(r.decision.route, uint32_t{AFFINITY_ROUTE_FALLBACK});
    EXPECT_EQ(r.decision.prefix_len, 0u);

    r = f.router().route_prompt(nullptr, levels_of(chat({{"user", "hi"}})));
    EXPECT_EQ(r.rc, 0);
    EXPECT_EQ(r.decision.route, uint32_t{AFFINITY_ROUTE_FALLBACK});
    EXPECT_EQ(f.prefix_zone().info().used, 0u);
}

TEST(PrefixRoute, NoUsablePeerRecordsNothing)
{
    Fleet f;
    for (size_t i = 0; i < f.up().size(); i++) {
        f.up().set_state(i, AFFINITY_PEER_FAILED);
    }
    Routed r = f.router().route_prompt(f.prefixes(),
                                       levels_of(chat({{"user", words(1, 900)}})));
    EXPECT_EQ(r.rc, -1);
    EXPECT_EQ(r.decision.peer, -1);
    EXPECT_EQ(r.decision.route, uint32_t{AFFINITY_ROUTE_NONE});
    EXPECT_EQ(r.decision.prefix_len, 0u);
    EXPECT_EQ(f.prefix_zone().info().used, 0u);
    EXPECT_EQ(f.up().total_inflight(), 0);
}

TEST(PrefixRoute, ShortFirstPromptIsItsOwnLevel)
{
    // A prompt shorter than the first level is indexed at its own length;
    // repeating it finds it.
    Fleet f;
    std::string body = chat({{"user", "hello"}});
    std::vector<affinity_level_t> l = levels_of(body);
    ASSERT_EQ(l.size(), 1u);
    ASSERT_LT(l[0].length, 100u);

    Routed first = f.send(l);
    EXPECT_EQ(first.decision.route, kPrefixNew);
    Routed again = f.send(l);
    EXPECT_EQ(again.decision.route, kPrefixHit);
    EXPECT_EQ(again.decision.peer, first.decision.peer);
    EXPECT_EQ(again.decision.prefix_len, l[0].length);
}

// ---- the prefix table -----------------------------------------------------

class PrefixTableTest : public testing::Test {
protected:
    TestZone zone_{1 << 20, AFFINITY_ZONE_PREFIXES};

    affinity::PrefixTable table(uint32_t now, uint32_t timeout = 600)
    {
        return affinity::PrefixTable(affinity::Zone(zone_.region()), now,
                                     timeout);
    }

    std::vector<uint32_t> peers(affinity::PrefixEntry *e)
    {
        std::vector<uint32_t> out;
        for (uint32_t id : e->peers) {
            if (id != 0) {
                out.push_back(id);
            }
        }
        return out;
    }
};

TEST_F(PrefixTableTest, EntriesExpireAfterTheTimeout)
{
    const uint64_t k = table(0).key(12345);
    EXPECT_EQ(table(1000).record(k, 7, 0), affinity::kNotHeld);
    EXPECT_EQ(zone_.info().used, 1u);

    // Idle for the timeout: live (and refreshed by the lookup).
    ASSERT_NE(table(1600).find(k), nullptr);
    ASSERT_NE(table(2200).find(k), nullptr);
    // A clock that went backwards expires nothing.
    ASSERT_NE(table(100).find(k), nullptr);

    // Idle for longer: gone, counted as an expiry.
    EXPECT_EQ(table(2801).find(k), nullptr);
    EXPECT_EQ(zone_.info().used, 0u);
    EXPECT_EQ(zone_.info().expiries, 1u);
    EXPECT_EQ(zone_.info().evictions, 0u);

    // Recorded anew.
    EXPECT_EQ(table(2801).record(k, 7, 0), affinity::kNotHeld);
    EXPECT_EQ(table(2802).record(k, 7, 5), 0) << "its stamp before";
    EXPECT_EQ(table(2802).record(k, 7, 6), 5);
}

TEST_F(PrefixTableTest, FullBucketEvictsTheLeastRecentlyUsed)
{
    // Keys are placed by multiply-shift, (key * buckets) >> 64: small keys
    // all fall in the first bucket of 8 ways.
    for (uint64_t k = 1; k <= 8; k++) {
        EXPECT_EQ(table(1000).record(k, 100 + k, 0), affinity::kNotHeld);
    }
    ASSERT_EQ(zone_.info().used, 8u);
    ASSERT_EQ(zone_.info().evictions, 0u);

    // Key 1 is used again; 2 is now the least recently used.
    ASSERT_NE(table(1000).find(1), nullptr);
    EXPECT_EQ(table(1000).record(9, 109, 0), affinity::kNotHeld);
    ASSERT_EQ(zone_.info().evictions, 1u) << "keys 1..9 share a bucket";
    EXPECT_EQ(zone_.info().used, 8u);
    EXPECT_EQ(table(1000).find(2), nullptr);
    EXPECT_NE(table(1000).find(1), nullptr);
    EXPECT_NE(table(1000).find(9), nullptr);

    // Recording refreshes too: 3 stays, 4 goes.
    EXPECT_EQ(table(1000).record(3, 103, 0), 0);
    EXPECT_EQ(table(1000).record(10, 110, 0), affinity::kNotHeld);
    EXPECT_EQ(table(1000).find(4), nullptr);
    EXPECT_NE(table(1000).find(3), nullptr);
    EXPECT_EQ(zone_.info().evictions, 2u);

    // Expired entries make room before anything is evicted.
    for (uint64_t k : {1, 3, 9}) {
        ASSERT_NE(table(1500).find(k), nullptr);
    }
    EXPECT_EQ(table(2000).record(11, 111, 0), affinity::kNotHeld);
    EXPECT_EQ(zone_.info().evictions, 2u);
    EXPECT_EQ(zone_.info().expiries, 5u);      // 5, 6, 7, 8, 10
    EXPECT_EQ(zone_.info().used, 4u);
}

TEST_F(PrefixTableTest, KeepsFourPeersMostRecentFirst)
{
    const uint64_t k = 42;
    affinity::PrefixTable t = table(1000);

    EXPECT_EQ(t.record(k, 1, 0), affinity::kNotHeld);
    for (uint64_t peer : {2, 3, 4, 5}) {
        EXPECT_EQ(t.record(k, peer, uint8_t(peer)), affinity::kNotHeld);
    }
    ASSERT_NE(t.find(k), nullptr);
    EXPECT_EQ(peers(t.find(k)), (std::vector<uint32_t>{5, 4, 3, 2}));

    // A peer already there moves to the front, with its new stamp; the
    // others keep theirs.
    EXPECT_EQ(t.record(k, 3, 30), 3);
    EXPECT_EQ(peers(t.find(k)), (std::vector<uint32_t>{3, 5, 4, 2}));
    EXPECT_EQ(t.record(k, 3, 31), 30);
    EXPECT_EQ(peers(t.find(k)), (std::vector<uint32_t>{3, 5, 4, 2}));
    EXPECT_EQ(t.record(k, 2, 20), 2);
    EXPECT_EQ(peers(t.find(k)), (std::vector<uint32_t>{2, 3, 5, 4}));
    // A new one pushes the least recent out.
    EXPECT_EQ(t.record(k, 6, 60), affinity::kNotHeld);
    EXPECT_EQ(peers(t.find(k)), (std::vector<uint32_t>{6, 2, 3, 5}));
    const affinity::PrefixEntry *e = t.find(k);
    EXPECT_EQ((std::vector<int>{e->stamps[0], e->stamps[1], e->stamps[2],
                                e->stamps[3]}),
              (std::vector<int>{60, 20, 31, 5}));
    EXPECT_EQ(zone_.info().used, 1u);

    // Peers are kept by the low 32 bits of their ids (never 0).
    const uint64_t k2 = 43;
    t.record(k2, 0xabcdef0012345678ULL, 0);
    t.record(k2, 0x0000000100000000ULL, 0);
    EXPECT_EQ(peers(t.find(k2)), (std::vector<uint32_t>{1, 0x12345678u}));
    EXPECT_EQ(affinity::short_peer_id(0x0000000100000000ULL), 1u);
}

TEST_F(PrefixTableTest, KeysDependOnTheZoneSeed)
{
    TestZone other(1 << 20, AFFINITY_ZONE_PREFIXES);
    affinity::PrefixTable a = table(0);
    affinity::PrefixTable b(affinity::Zone(other.region()), 0, 600);

    size_t same = 0;
    for (uint64_t h = 0; h < 1000; h++) {
        EXPECT_EQ(a.key(h), a.key(h));
        EXPECT_NE(a.key(h), 0u);
        same += a.key(h) == b.key(h);
    }
    EXPECT_EQ(same, 0u);
}

}  // namespace

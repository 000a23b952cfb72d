// CacheModel: each peer's KV cache modelled as an LRU of a capacity, with a
// clock per peer in the prefix zone and one-byte stamps in the index.
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "affinity_core.h"
#include "cache_model.h"
#include "test_support.h"
#include "zone.h"

using namespace affinity_test;

namespace {

// Characters after which a holder is presumed to have evicted a prefix
// for a capacity in tokens (cache_model.h: 4 characters a token, 125 %).
uint64_t evicts_after(uint64_t tokens)
{
    return tokens * AFFINITY_CHARS_PER_TOKEN * 125 / 100;
}

std::vector<affinity_peer_t> two_peers()
{
    return {{affinity_peer_id("10.0.0.1", 8), 1, AFFINITY_NO_SLOT},
            {affinity_peer_id("10.0.0.2", 8), 1, AFFINITY_NO_SLOT}};
}

TEST(CacheModel, WithNoCapacityEveryHolderHolds)
{
    TestZone zone(1 << 20, AFFINITY_ZONE_PREFIXES);
    std::vector<affinity_peer_t> peers = two_peers();
    affinity::CacheModel cache(affinity::Zone(zone.region()), peers.data(),
                               peers.size(), 0, nullptr, 1000);

    cache.add(0, 1u << 30);
    EXPECT_TRUE(cache.holds(0, 0));
    EXPECT_TRUE(cache.holds(1, 200));
    EXPECT_EQ(zone.info().peer_slots_used, 2u)
        << "their clocks run: their replies may teach a capacity";

    // No model wanted at all: no clock either.
    TestZone off(1 << 20, AFFINITY_ZONE_PREFIXES);
    affinity::CacheModel none(affinity::Zone(off.region()), peers.data(),
                              peers.size(), AFFINITY_CAPACITY_OFF, nullptr,
                              1000);
    EXPECT_FALSE(none.enabled());
    EXPECT_TRUE(none.holds(0, 0));
    EXPECT_EQ(off.info().peer_slots_used, 0u);
}

TEST(CacheModel, HolderEvictsAfterItsCapacityOfNewCharacters)
{
    TestZone zone(1 << 20, AFFINITY_ZONE_PREFIXES);
    std::vector<affinity_peer_t> peers = two_peers();
    const uint64_t tokens = 1000;
    const uint64_t after = evicts_after(tokens);      // 5,000 characters

    affinity::CacheModel first(affinity::Zone(zone.region()), peers.data(),
                               peers.size(), tokens, nullptr, 1000);
    ASSERT_TRUE(first.enabled());
    const uint8_t got = first.stamp(0);

    // Within a sixteenth of the capacity of it: still held.
    first.add(0, after - after / 16 - 1);
    EXPECT_TRUE(first.holds(0, got));
    // The other peer's clock did not move: what it got is held.
    EXPECT_TRUE(first.holds(1, first.stamp(1)));

    // The clock lives in the zone: the next request sees it.
    affinity::CacheModel next(affinity::Zone(zone.region()), peers.data(),
                              peers.size(), tokens, nullptr, 1001);
    EXPECT_TRUE(next.holds(0, got));
    next.add(0, after / 16 + 2);
    EXPECT_FALSE(next.holds(0, got)) << "a capacity of new characters";
    EXPECT_TRUE(next.holds(0, next.stamp(0))) << "what it got since";
    EXPECT_TRUE(next.holds(1, first.stamp(1)));

    // A peer of another upstream (no index here) is taken to hold.
    EXPECT_TRUE(next.holds(-1, 0));
}

TEST(CacheModel, StampsWrapAfterSixteenCapacities)
{
    // The documented limit of one-byte stamps: an entry left untouched
    // for 16 capacities passes for fresh again.
    TestZone zone(1 << 20, AFFINITY_ZONE_PREFIXES);
    std::vector<affinity_peer_t> peers = two_peers();
    affinity::CacheModel cache(affinity::Zone(zone.region()), peers.data(),
                               peers.size(), 1000, nullptr, 1000);
    const uint8_t got = cache.stamp(0);
    const uint64_t unit = evicts_after(1000) / 16;

    cache.add(0, 255 * unit);
    EXPECT_FALSE(cache.holds(0, got));
    cache.add(0, unit);
    EXPECT_TRUE(cache.holds(0, got));
}

TEST(CacheModel, UsesTheCounterSlotWhenThePrefixZoneCountsRequests)
{
    TestZone zone(1 << 20, AFFINITY_ZONE_PREFIXES);
    std::vector<affinity_peer_t> peers = two_peers();
    for (affinity_peer_t &p : peers) {
        p.slot = affinity_zone_peer_slot(zone.get(), p.id, 1000);
    }
    ASSERT_EQ(zone.info().peer_slots_used, 2u);

    affinity::CacheModel cache(affinity::Zone(zone.region()), peers.data(),
                               peers.size(), 1000, nullptr, 1000);
    cache.add(1, 12345);
    EXPECT_EQ(zone.info().peer_slots_used, 2u) << "no other slot claimed";
    affinity::Zone z(zone.region());
    EXPECT_EQ(z.peer_slots()[peers[1].slot].cache_fill, 12345u);
}

// Without a configured capacity, each peer's engine's figure: a peer whose
// engine told none is not modelled.  The figure is kept in the prefix zone
// for records that come without figures (other instances' prefixes).
TEST(CacheModel, EachPeerMayHaveItsEnginesCapacity)
{
    TestZone zone(1 << 20, AFFINITY_ZONE_PREFIXES);
    std::vector<affinity_peer_t> peers = two_peers();
    const uint64_t reported[] = {1000, 0};

    affinity::CacheModel cache(affinity::Zone(zone.region()), peers.data(),
                               peers.size(), 0, reported, 1000);
    ASSERT_TRUE(cache.enabled());
    EXPECT_EQ(zone.info().peer_slots_used, 2u) << "a clock for each";
    const uint8_t got0 = cache.stamp(0);
    const uint8_t got1 = cache.stamp(1);

    cache.add(0, evicts_after(1000) + 1);
    cache.add(1, 1u << 30);
    EXPECT_FALSE(cache.holds(0, got0));
    EXPECT_TRUE(cache.holds(1, got1)) << "unknown capacity: holds";

    // A record with no figures finds peer 0's in the prefix zone.
    affinity::CacheModel record(affinity::Zone(zone.region()), peers.data(),
                                peers.size(), 0, nullptr, 1001);
    EXPECT_TRUE(record.enabled());
    EXPECT_EQ(record.stamp(0), cache.stamp(0));
    EXPECT_FALSE(record.holds(0, got0));
    EXPECT_TRUE(record.holds(1, 0));

    // A configured capacity is everyone's, whatever the engines say.
    affinity::CacheModel configured(affinity::Zone(zone.region()),
                                    peers.data(), peers.size(), 100000,
                                    reported, 1002);
    EXPECT_TRUE(configured.holds(0, got0))
        << "a hundred times the capacity: 5,001 characters are little";
}

// What an engine reports it computed moves its peer's clock where this
// instance counted less: the prompts of other instances and clients.
TEST(CacheModel, EngineCountOfComputedTokensMovesTheClock)
{
    TestZone zone(1 << 20, AFFINITY_ZONE_PREFIXES);
    std::vector<affinity_peer_t> peers = two_peers();
    affinity::Zone z(zone.region());
    const uint64_t tokens = 1000;               // evicts after 5,000 chars
    auto report = [&](size_t i, double computed) {
        affinity_engine_load_t load{};
        load.queried_tokens = computed + 500;
        load.hit_tokens = 500;
        load.found = AFFINITY_ENGINE_RUNNING | AFFINITY_ENGINE_COMPUTED;
        affinity_prefixes_polled(zone.get(), peers[i].id, &load, tokens);
    };
    auto model = [&]() {
        return affinity::CacheModel(z, peers.data(), peers.size(), tokens,
                                    nullptr, 1000);
    };
    auto fill = [&](size_t i) {
        return z.peer_slots()[z.find_slot(peers[i].id)].cache_fill;
    };

    // Peer 0 got a prefix; its engine had computed 10,000 tokens before.
    uint8_t got = model().stamp(0);
    report(0, 10000);
    EXPECT_EQ(fill(0), 0u) << "the first report only marks";

    // Its engine computed 1,600 tokens more (6,400 characters) that this
    // instance never sent: presumed evicted.
    report(0, 11600);
    EXPECT_EQ(fill(0), 6400u);
    EXPECT_FALSE(model().holds(0, got));
    EXPECT_EQ(fill(1), 0u) << "the other peer's clock stays";

    // What this instance sent itself is not counted twice: 2,000 chars
    // sent, 500 tokens (2,000 chars) computed.
    got = model().stamp(0);
    model().add(0, 2000);
    report(0, 12100);
    EXPECT_EQ(fill(0), 8400u);
    // Its own count runs ahead (4,000 chars for 200 tokens computed):
    // kept, and the engine's only counts once it is ahead again.
    model().add(0, 4000);
    report(0, 12300);
    EXPECT_EQ(fill(0), 12400u);
    report(0, 13700);   // 5,600 more chars: 3,200 behind, then 2,400 ahead
    EXPECT_EQ(fill(0), 14800u);

    // A lead of this instance's own is kept within a capacity (4,000
    // characters) of the engine's clock: 20,000 chars sent alone, none
    // computed, then 5,000 tokens computed by others.
    model().add(0, 20000);
    report(0, 13700);
    EXPECT_EQ(fill(0), 34800u);
    report(0, 18700);       // 20,000 chars: 16,000 beyond the lead kept
    EXPECT_EQ(fill(0), 50800u);

    // A count that went back: a restarted engine, its cache empty.
    got = model().stamp(0);
    EXPECT_TRUE(model().holds(0, got));
    report(0, 100);
    EXPECT_FALSE(model().holds(0, got));

    // Junk and partial reports change nothing.
    uint64_t before = fill(0);
    affinity_engine_load_t junk{};
    junk.queried_tokens = 1e30;
    junk.found = AFFINITY_ENGINE_COMPUTED;
    affinity_prefixes_polled(zone.get(), peers[0].id, &junk, tokens);
    junk.queried_tokens = 1e9;
    junk.found = AFFINITY_ENGINE_RUNNING;
    affinity_prefixes_polled(zone.get(), peers[0].id, &junk, tokens);
    EXPECT_EQ(fill(0), before);
}

// The engine's counts as they come: an idle engine's zeros, counters read
// a moment apart, a count past 2^32, no model wanted, a slot handed over.
TEST(CacheModel, EngineCountsAsTheyCome)
{
    TestZone zone(1 << 20, AFFINITY_ZONE_PREFIXES);
    std::vector<affinity_peer_t> peers = two_peers();
    affinity::Zone z(zone.region());
    const uint64_t tokens = 1000;
    auto report = [&](double computed, uint64_t capacity = 1000,
                      size_t i = 0) {
        affinity_engine_load_t load{};
        load.queried_tokens = computed;
        load.found = AFFINITY_ENGINE_COMPUTED;
        affinity_prefixes_polled(zone.get(), peers[i].id, &load, capacity);
    };
    auto model = [&](uint64_t capacity = 1000) {
        return affinity::CacheModel(z, peers.data(), peers.size(), capacity,
                                    nullptr, 1000);
    };
    auto slot = [&](size_t i = 0) -> affinity::PeerSlot & {
        return z.peer_slots()[z.find_slot(peers[i].id)];
    };

    // An idle engine on a fresh zone: zeros, again and again.
    uint8_t got = model().stamp(0);
    for (int k = 0; k < 3; k++) {
        report(0);
    }
    EXPECT_EQ(slot().cache_fill, 0u);
    EXPECT_TRUE(model().holds(0, got));

    // A count a little lower than the last (counters read a moment apart)
    // is not a restart; counting goes on from the higher one.
    report(500);
    EXPECT_EQ(slot().cache_fill, 2000u);
    report(490);
    EXPECT_EQ(slot().cache_fill, 2000u);
    report(510);
    EXPECT_EQ(slot().cache_fill, 2040u);
    EXPECT_TRUE(model().holds(0, got));

    // Past 2^32 tokens (the other peer's engine): 150 computed, not a
    // restart.
    const double wrap = 4294967296.0;
    report(wrap - 100, tokens, 1);
    EXPECT_EQ(slot(1).cache_fill, 0u);
    report(wrap + 50, tokens, 1);
    EXPECT_EQ(slot(1).cache_fill, 600u);

    // A restart once the count had passed 2^31 (modulo 2^32): to 100 is
    // no step back modulo 2^32, but more than the engine's whole life.
    got = model().stamp(1);
    report(wrap + 1.5e9, tokens, 1);    // too far to compare: a new mark
    report(wrap + 3e9, tokens, 1);      // again
    report(wrap + 3e9 + 10, tokens, 1);
    EXPECT_TRUE(model().holds(1, got));
    report(100, tokens, 1);
    EXPECT_FALSE(model().holds(1, got));
    const uint64_t restarted = slot(1).cache_fill;

    // Back by exactly a capacity: a restart too.
    got = model().stamp(1);
    report(100 + tokens, tokens, 1);
    EXPECT_EQ(slot(1).cache_fill, restarted + tokens * 4);
    got = model().stamp(1);
    report(100, tokens, 1);
    EXPECT_FALSE(model().holds(1, got));

    // cache=off: no model, whatever the engine says.
    affinity::CacheModel off = model(AFFINITY_CAPACITY_OFF);
    EXPECT_FALSE(off.enabled());
    off.add(0, uint64_t{1} << 30);
    EXPECT_TRUE(off.holds(0, 200));
    EXPECT_EQ(off.stamp(1), 0);
    const uint64_t unmoved = slot(1).cache_fill;
    report(wrap + 5000, AFFINITY_CAPACITY_OFF, 1);
    EXPECT_EQ(slot(1).cache_fill, unmoved);

    // A slot handed to another peer forgets the size and the mark.
    slot().cache_tokens = tokens;
    uint32_t n = z.find_slot(peers[0].id);
    z.hand_over(z.peer_slots()[n], 12345, 1000);
    EXPECT_EQ(z.peer_slots()[n].cache_tokens, 0u);
    EXPECT_EQ(z.peer_slots()[n].engine_mark, 0u);
    EXPECT_EQ(z.peer_slots()[n].cache_fill, 0u);
}

}  // namespace

namespace {

affinity::PeerSlot &slot_of(affinity::Zone z, uint64_t peer_id)
{
    uint32_t n = z.find_slot(peer_id);
    EXPECT_NE(n, AFFINITY_NO_SLOT);
    return z.peer_slots()[n];
}

}  // namespace

// A capacity learned from replies: the first eviction's age, no less than
// the oldest held; raised at once by a held age above it, lowered by a
// quarter of the way to an evicted age below it.
TEST(CacheModel, LearnedCapacityFollowsTheReplies)
{
    TestZone zone(1 << 20, AFFINITY_ZONE_PREFIXES);
    affinity::Zone z(zone.region());
    std::vector<affinity_peer_t> peers = two_peers();
    affinity::CacheModel cache(z, peers.data(), peers.size(), 0, nullptr,
                               1000);
    const uint64_t id = peers[0].id;

    affinity::CacheModel::replied(z, id, 5000, 100, true);
    EXPECT_EQ(slot_of(z, id).learned, 0u) << "held: no model yet";
    EXPECT_EQ(slot_of(z, id).learned_unit, 0u);

    affinity::CacheModel::replied(z, id, 3000, 100, false);
    EXPECT_EQ(slot_of(z, id).learned, 5000u) << "no less than held";
    EXPECT_EQ(slot_of(z, id).learned_unit, 5000u * 125 / 100 / 16);

    affinity::CacheModel::replied(z, id, 8000, 100, true);
    EXPECT_EQ(slot_of(z, id).learned, 8000u);
    affinity::CacheModel::replied(z, id, 6000, 100, true);
    EXPECT_EQ(slot_of(z, id).learned, 8000u) << "held below: nothing new";

    affinity::CacheModel::replied(z, id, 4000, 100, false);
    EXPECT_EQ(slot_of(z, id).learned, 7000u);
    affinity::CacheModel::replied(z, id, 9000, 100, false);
    EXPECT_EQ(slot_of(z, id).learned, 7000u) << "evicted above: consistent";

    EXPECT_EQ(slot_of(z, peers[1].id).learned, 0u) << "the other's own";

    // Lost before less than its own length of others: says nothing (a
    // failed try, or a prompt not computed yet).
    affinity::CacheModel::replied(z, peers[1].id, 900, 1000, false);
    EXPECT_EQ(slot_of(z, peers[1].id).learned, 0u);
    affinity::CacheModel::replied(z, peers[1].id, 1000, 1000, false);
    EXPECT_EQ(slot_of(z, peers[1].id).learned, 1000u);

    // A peer never seen here has no clock: nothing to learn.
    affinity::CacheModel::replied(z, affinity_peer_id("10.9.9.9", 8), 10, 1,
                                  false);
    EXPECT_EQ(zone.info().peer_slots_used, 2u);
}

// The learned capacity models the peer: a stamp older than it (with the
// 125 % margin) is presumed evicted.  A new unit (the capacity moved by
// more than a quarter) counts on from the stamp of the moment, so what
// was stamped before keeps its age.
TEST(CacheModel, LearnedCapacityModelsThePeerAndKeepsItsStamps)
{
    TestZone zone(1 << 20, AFFINITY_ZONE_PREFIXES);
    affinity::Zone z(zone.region());
    std::vector<affinity_peer_t> peers = two_peers();
    const uint64_t id = peers[0].id;

    affinity::CacheModel before(z, peers.data(), peers.size(), 0, nullptr,
                                1000);
    before.add(0, 123456);
    EXPECT_TRUE(before.holds(0, 0));
    affinity::CacheModel::replied(z, id, 16000, 100, false);

    // 20,000 characters of the clock: 16 stamps of 1,250.
    affinity::CacheModel learned(z, peers.data(), peers.size(), 0, nullptr,
                                 1001);
    EXPECT_EQ(learned.stamp(0), 0) << "counted on from the stamps before";
    EXPECT_TRUE(learned.holds(0, 0)) << "what was stamped before: fresh";
    const uint8_t got = learned.stamp(0);
    learned.add(0, 18000);
    EXPECT_TRUE(learned.holds(0, got));
    learned.add(0, 2600);
    EXPECT_FALSE(learned.holds(0, got)) << "20,600 characters later";
    EXPECT_TRUE(learned.holds(1, 0)) << "the other peer: nothing learned";

    // Held far older: a new unit (5,000), from the stamp of the moment.
    affinity::CacheModel at(z, peers.data(), peers.size(), 0, nullptr, 1002);
    const uint8_t now = at.stamp(0);
    affinity::CacheModel::replied(z, id, 64000, 100, true);
    affinity::CacheModel wider(z, peers.data(), peers.size(), 0, nullptr,
                               1003);
    EXPECT_EQ(wider.stamp(0), now);
    EXPECT_FALSE(wider.holds(0, got)) << "its age carried over";
    const uint8_t fresh = wider.stamp(0);
    wider.add(0, 70000);
    EXPECT_TRUE(wider.holds(0, fresh)) << "within 80,000 now";
}

// A probe is taken by the next prompt to the peer that contains its level,
// with the clock's characters since; dropped after the prefix timeout, or
// once older than 2^20 characters or twice what is known of the capacity.
// Each peer has at most its share of the zone's pool (here 16).
TEST(CacheModel, ProbesAreTakenByPromptsThatExtendThem)
{
    TestZone zone(1 << 20, AFFINITY_ZONE_PREFIXES);
    affinity::Zone z(zone.region());
    std::vector<affinity_peer_t> peers = two_peers();
    affinity::CacheModel cache(z, peers.data(), peers.size(), 0, nullptr,
                               1000);
    uint32_t age = 1, length = 1;
    const uint64_t has_it[] = {5, 78};
    const uint64_t has_not[] = {5, 6};

    cache.add(0, 1000);
    cache.watch(0, 78, 500, 1000, 600);
    cache.watch(0, 78, 500, 1000, 600);     // watched already: not twice
    cache.watch(0, 88, 700, 1000, 600);
    EXPECT_EQ(slot_of(z, peers[0].id).probes, 2);
    cache.add(0, 2000);

    cache.take_probe(1, has_it, 2, 1000, 600, &age, &length);
    EXPECT_EQ(length, 0u) << "another peer's prompt";
    cache.take_probe(0, has_not, 2, 1000, 600, &age, &length);
    EXPECT_EQ(length, 0u);
    cache.take_probe(0, has_it, 2, 1000, 600, &age, &length);
    EXPECT_EQ(age, 2000u);
    EXPECT_EQ(length, 500u);
    cache.take_probe(0, has_it, 2, 1000, 600, &age, &length);
    EXPECT_EQ(length, 0u) << "taken once";
    EXPECT_EQ(slot_of(z, peers[0].id).probes, 1);

    // 88 is still watched; past the timeout it is dropped.
    const uint64_t eighty_eight[] = {88};
    cache.take_probe(0, eighty_eight, 1, 1601, 600, &age, &length);
    EXPECT_EQ(length, 0u);
    EXPECT_EQ(slot_of(z, peers[0].id).probes, 0);

    // Sixteen at most.  (A probe keeps half a key, odd: keys that differ
    // in the lowest bit only are one.)
    for (uint64_t k = 1000; k < 1020; k++) {
        cache.watch(0, 2 * k, 100, 1601, 600);
    }
    EXPECT_EQ(slot_of(z, peers[0].id).probes, 16);
    const uint64_t last[] = {2 * 1019};
    cache.take_probe(0, last, 1, 1601, 600, &age, &length);
    EXPECT_EQ(length, 0u) << "the seventeenth was not watched";
    const uint64_t sixteenth[] = {2 * 1015};
    cache.take_probe(0, sixteenth, 1, 1601, 600, &age, &length);
    EXPECT_EQ(length, 100u);

    // The other peer gets its own share; the first peer's probes past the
    // timeout make room in the pool as it looks for one.
    for (uint64_t k = 2000; k < 2016; k++) {
        cache.watch(1, 2 * k, 100, 2300, 600);
    }
    EXPECT_EQ(slot_of(z, peers[1].id).probes, 16);
    EXPECT_EQ(slot_of(z, peers[0].id).probes, 16 - 1 - 16 + 1)
        << "the first peer's, past the timeout, given up";

    // Older than 2^20 characters of the clock, or than twice what is
    // known to be held if that is more: dropped.
    affinity::CacheModel fresh(z, peers.data(), peers.size(), 0, nullptr,
                               3000);
    const uint64_t one_eleven[] = {111};
    fresh.watch(0, 111, 400, 3000, 600);
    fresh.add(0, (1u << 20) + 1);
    fresh.take_probe(0, one_eleven, 1, 3000, 600, &age, &length);
    EXPECT_EQ(length, 0u);
    affinity::CacheModel::replied(z, peers[0].id, 1u << 20, 100, true);
    affinity::CacheModel next(z, peers.data(), peers.size(), 0, nullptr,
                              3001);
    next.watch(0, 111, 400, 3001, 600);
    next.add(0, (1u << 21) - 1);
    next.take_probe(0, one_eleven, 1, 3001, 600, &age, &length);
    EXPECT_EQ(age, (1u << 21) - 1) << "within twice the oldest held";

    // A configured or reported capacity learns nothing: no probes.
    affinity::CacheModel sized(z, peers.data(), peers.size(), 1000, nullptr,
                               3002);
    sized.watch(0, 222, 400, 3002, 600);
    const uint64_t two_twenty_two[] = {222};
    sized.take_probe(0, two_twenty_two, 1, 3002, 600, &age, &length);
    EXPECT_EQ(length, 0u);
}

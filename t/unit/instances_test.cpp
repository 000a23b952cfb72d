// Several nginx instances in front of the same peers (affinity_store with
// affinity_metrics): the requests this instance announced to the store
// that it has not yet taken (affinity_zone_peer_announced, _heard), the
// other instances heard from (affinity_zone_instance_seen, _instances),
// and what routing makes of them.
#include <string>

#include <gtest/gtest.h>

#include "test_support.h"

using namespace affinity_test;

namespace {

// What routing reads beside the engines' figures (engine_ttl 3 s), and
// an engine's report of peer 0 at now: nothing running there.
const affinity_balance_t kWithEngines{1.25, 2.0, 3, 0};

void report_idle(affinity_zone_t *zone, Upstream &up, uint32_t now)
{
    affinity_engine_load_t load{};
    load.found = AFFINITY_ENGINE_RUNNING;
    affinity_zone_peer_polled(zone, up.peer(0).slot, &load, now);
}

// An agent's sibling requests reach several instances at once.  While one
// this instance sent peer 0 is unheard, each other instance heard from
// lately may be sending peer 0 one too: the peer is counted with it.
TEST(Instances, UnheardRequestsCountOncePerOtherInstance)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up, kWithEngines);   // factor 1.25, slack 2
    uint32_t slot = up.peer(0).slot;

    report_idle(z.get(), up, 1000);
    up.acquire(0);
    uintptr_t first = affinity_zone_peer_announced(z.get(), slot);
    EXPECT_NE(first, 0u);
    EXPECT_EQ(up.stats(0).unheard, 1);

    // Alone: 1 + 1 <= max(1.25 x 0.5, 0.5 + 2).
    EXPECT_EQ(affinity_zone_instances(z.get(), 1000), 1u);
    EXPECT_EQ(router.route_key_released(key_on_peer0(0)).decision.peer, 0);

    // With another instance: 1 + 1 + 1 > 2.5, the session goes elsewhere.
    affinity_zone_instance_seen(z.get(), 42, 1000);
    EXPECT_EQ(affinity_zone_instances(z.get(), 1000), 2u);
    int placed = router.route_key_released(key_on_peer0(1)).decision.peer;
    EXPECT_GE(placed, 1);

    // The store took the news: the other instance counts the request
    // itself, nothing is presumed.
    affinity_zone_peer_heard(z.get(), first);
    EXPECT_EQ(up.stats(0).unheard, 0);
    EXPECT_EQ(router.route_key_released(key_on_peer0(2)).decision.peer, 0);

    // Two instances more, and two unheard: 1 + 3 x 2 + 1 > 2.5 where
    // 1 + 2 x 0 + 1 fits once they are heard.
    affinity_zone_instance_seen(z.get(), 43, 1000);
    affinity_zone_instance_seen(z.get(), 44, 1000);
    uintptr_t second = affinity_zone_peer_announced(z.get(), slot);
    EXPECT_GE(router.route_key_released(key_on_peer0(3)).decision.peer, 1);
    affinity_zone_peer_heard(z.get(), second);
    EXPECT_EQ(router.route_key_released(key_on_peer0(4)).decision.peer, 0);

    // Unheard again, but the others were last heard from 11 s ago: alone.
    router.now = 1011;
    report_idle(z.get(), up, 1011);
    affinity_zone_peer_announced(z.get(), slot);
    EXPECT_EQ(up.stats(0).unheard, 1);
    EXPECT_EQ(affinity_zone_instances(z.get(), 1011), 1u);
    EXPECT_EQ(router.route_key_released(key_on_peer0(5)).decision.peer, 0);
}

// A session pinned to a peer stays there while its requests fit, and
// spills while the siblings this instance sent are unheard.
TEST(Instances, PinnedSiblingsSpillWhileUnheard)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up, kWithEngines);
    uint32_t slot = up.peer(0).slot;
    std::string key = key_on_peer0(0);

    report_idle(z.get(), up, 1000);
    affinity_zone_instance_seen(z.get(), 42, 1000);
    EXPECT_EQ(router.route_key(key).decision.peer, 0);
    EXPECT_EQ(router.route_key(key).decision.route,
              uint32_t(AFFINITY_ROUTE_SESSION_HIT))
        << "nothing unheard: 1 + 1 <= 2.5";
    up.release(0);

    affinity_zone_peer_announced(z.get(), slot);
    Routed r = router.route_key(key);
    EXPECT_NE(r.decision.peer, 0);
    EXPECT_EQ(r.decision.route, uint32_t(AFFINITY_ROUTE_SESSION_SPILL));
}

// The others' requests are counted through the engine's figure; without
// one (never reported, or older than engine_ttl: its metrics fail) this
// instance counts its own requests alone, and presumes none unheard,
// which a worker killed before the store answered may have left.
TEST(Instances, UnheardCountOnlyBesideAFreshEngineFigure)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up, kWithEngines);
    uint32_t slot = up.peer(0).slot;

    affinity_zone_instance_seen(z.get(), 42, 1000);
    up.acquire(0);
    affinity_zone_peer_announced(z.get(), slot);
    EXPECT_EQ(router.route_key_released(key_on_peer0(0)).decision.peer, 0)
        << "never reported";

    report_idle(z.get(), up, 1000);
    affinity_zone_peer_announced(z.get(), slot);
    EXPECT_GE(router.route_key_released(key_on_peer0(1)).decision.peer, 1)
        << "reported: 1 + 1 + 1 > 2.5";

    router.now = 1004;
    affinity_zone_instance_seen(z.get(), 42, 1004);
    EXPECT_EQ(up.stats(0).unheard, 1);
    EXPECT_EQ(router.route_key_released(key_on_peer0(2)).decision.peer, 0)
        << "the report is older than engine_ttl";
}

TEST(Instances, UnheardNeverBelowZeroAndClearedByTheEngine)
{
    TestZone z;
    Upstream up(z.get(), {1, 1});
    uint32_t slot = up.peer(0).slot;
    uintptr_t tickets[3];

    for (uintptr_t &ticket : tickets) {
        ticket = affinity_zone_peer_announced(z.get(), slot);
    }
    affinity_zone_peer_heard(z.get(), tickets[0]);
    EXPECT_EQ(up.stats(0).unheard, 2);
    EXPECT_EQ(up.stats(1).unheard, 0);

    // A worker that died before the store answered leaves its count until
    // the engine's next report.
    report_idle(z.get(), up, 1000);
    EXPECT_EQ(up.stats(0).unheard, 0);

    // An answer to a request counted before the report takes nothing off,
    // neither at zero nor from a request counted after it.
    affinity_zone_peer_heard(z.get(), tickets[1]);
    EXPECT_EQ(up.stats(0).unheard, 0);
    uintptr_t after = affinity_zone_peer_announced(z.get(), slot);
    EXPECT_NE(after, tickets[2]);
    affinity_zone_peer_heard(z.get(), tickets[2]);
    EXPECT_EQ(up.stats(0).unheard, 1);
    affinity_zone_peer_heard(z.get(), after);
    EXPECT_EQ(up.stats(0).unheard, 0);

    // Many reports later, the same.
    uintptr_t old = affinity_zone_peer_announced(z.get(), slot);
    for (uint32_t t = 1001; t < 1300; t++) {
        report_idle(z.get(), up, t);
    }
    affinity_zone_peer_announced(z.get(), slot);
    affinity_zone_peer_heard(z.get(), old);
    EXPECT_EQ(up.stats(0).unheard, 1);

    // No ticket, or one of no slot, changes nothing.
    EXPECT_EQ(affinity_zone_peer_announced(z.get(), AFFINITY_NO_SLOT), 0u);
    EXPECT_EQ(affinity_zone_peer_announced(z.get(), AFFINITY_PEER_SLOTS),
              0u);
    affinity_zone_peer_heard(z.get(), 0);
    affinity_zone_peer_heard(z.get(), ~uintptr_t{0});
    EXPECT_EQ(up.stats(0).unheard, 1);
}

TEST(Instances, TheOnesHeardFromInTheLastTenSeconds)
{
    TestZone z;
    affinity_zone_info_t info;
    affinity_zone_info(z.get(), &info);

    EXPECT_EQ(affinity_zone_instances(z.get(), 1000), 1u);

    // Itself, or no id: not another instance.
    affinity_zone_instance_seen(z.get(), info.seed, 1000);
    affinity_zone_instance_seen(z.get(), 0, 1000);
    EXPECT_EQ(affinity_zone_instances(z.get(), 1000), 1u);

    affinity_zone_instance_seen(z.get(), 7, 1000);
    affinity_zone_instance_seen(z.get(), 7, 1005);
    affinity_zone_instance_seen(z.get(), 8, 1003);
    EXPECT_EQ(affinity_zone_instances(z.get(), 1010), 3u);
    EXPECT_EQ(affinity_zone_instances(z.get(), 1014), 2u);
    EXPECT_EQ(affinity_zone_instances(z.get(), 1016), 1u);

    // More instances than the zone remembers: the one heard from longest
    // ago gives way, one heard from again keeps its place.
    TestZone many;
    for (uint64_t k = 0; k < 16; k++) {
        affinity_zone_instance_seen(many.get(), 100 + k, uint32_t(2000 + k));
    }
    EXPECT_EQ(affinity_zone_instances(many.get(), 2020), 7u)
        << "110 .. 115, heard from at 2010 .. 2015, and itself";
    affinity_zone_instance_seen(many.get(), 200, 2016);
    affinity_zone_instance_seen(many.get(), 101, 2017);
    EXPECT_EQ(affinity_zone_instances(many.get(), 2011), 17u)
        << "100 gave way to 200, 101 kept its place";
    EXPECT_EQ(affinity_zone_instances(many.get(), 2025), 4u)
        << "102 .. 115 last heard from more than 10 s ago: 115, 200, "
           "101 and itself";
}

}  // namespace

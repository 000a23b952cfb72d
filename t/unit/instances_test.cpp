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

// An agent's sibling requests reach several instances at once.  While one
// this instance sent peer 0 is unheard, each other instance heard from
// lately may be sending peer 0 one too: the peer is counted with it.
TEST(Instances, UnheardRequestsCountOncePerOtherInstance)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);     // factor 1.25, slack 2
    uint32_t slot = up.peer(0).slot;

    up.acquire(0);
    affinity_zone_peer_announced(z.get(), slot);
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
    affinity_zone_peer_heard(z.get(), slot);
    EXPECT_EQ(up.stats(0).unheard, 0);
    EXPECT_EQ(router.route_key_released(key_on_peer0(2)).decision.peer, 0);

    // Two instances more, and two unheard: 1 + 3 x 2 + 1 > 2.5 where
    // 1 + 2 x 0 + 1 fits once they are heard.
    affinity_zone_instance_seen(z.get(), 43, 1000);
    affinity_zone_instance_seen(z.get(), 44, 1000);
    affinity_zone_peer_announced(z.get(), slot);
    EXPECT_GE(router.route_key_released(key_on_peer0(3)).decision.peer, 1);
    affinity_zone_peer_heard(z.get(), slot);
    EXPECT_EQ(router.route_key_released(key_on_peer0(4)).decision.peer, 0);

    // Unheard again, but the others were last heard from 11 s ago: alone.
    affinity_zone_peer_announced(z.get(), slot);
    router.now = 1011;
    EXPECT_EQ(affinity_zone_instances(z.get(), 1011), 1u);
    EXPECT_EQ(router.route_key_released(key_on_peer0(5)).decision.peer, 0);
}

// A session pinned to a peer stays there while its requests fit, and
// spills while the siblings this instance sent are unheard.
TEST(Instances, PinnedSiblingsSpillWhileUnheard)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);
    uint32_t slot = up.peer(0).slot;
    std::string key = key_on_peer0(0);

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

TEST(Instances, UnheardNeverBelowZeroAndClearedByTheEngine)
{
    TestZone z;
    Upstream up(z.get(), {1, 1});
    uint32_t slot = up.peer(0).slot;

    affinity_zone_peer_heard(z.get(), slot);
    EXPECT_EQ(up.stats(0).unheard, 0);

    for (int i = 0; i < 3; i++) {
        affinity_zone_peer_announced(z.get(), slot);
    }
    affinity_zone_peer_heard(z.get(), slot);
    EXPECT_EQ(up.stats(0).unheard, 2);
    EXPECT_EQ(up.stats(1).unheard, 0);

    // A worker that died before the store answered leaves its count until
    // the engine's next report.
    affinity_engine_load_t load{};
    load.found = AFFINITY_ENGINE_RUNNING;
    affinity_zone_peer_polled(z.get(), slot, &load, 1000);
    EXPECT_EQ(up.stats(0).unheard, 0);

    // An answer that comes after the report takes nothing off.
    affinity_zone_peer_heard(z.get(), slot);
    affinity_zone_peer_announced(z.get(), slot);
    EXPECT_EQ(up.stats(0).unheard, 1);

    // Slots out of range change nothing.
    affinity_zone_peer_announced(z.get(), AFFINITY_NO_SLOT);
    affinity_zone_peer_heard(z.get(), AFFINITY_PEER_SLOTS);
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

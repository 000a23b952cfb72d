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
    engine_reported(zone, up.peer(0).slot, load, now);
}

// Four equal peers routed with the engines' figures (factor 1.25, slack
// 2), and peer 0's counter slot: each test names them (auto &[...]).
struct FourPeers {
    TestZone z;
    Upstream up{z.get(), {1, 1, 1, 1}};
    Router router{z.get(), up, kWithEngines};
    uint32_t slot = up.peer(0).slot;
};

// An agent's sibling requests reach several instances at once.  While one
// this instance sent peer 0 is unheard, each other instance heard from
// lately may be sending peer 0 one too: the peer is counted with it.
TEST(Instances, UnheardRequestsCountOncePerOtherInstance)
{
    FourPeers four;
    auto &[z, up, router, slot] = four;

    report_idle(z.get(), up, 1000);
    up.acquire(0);
    uintptr_t first = affinity_zone_peer_announced(z.get(), slot);
    EXPECT_NE(first, 0u);
    EXPECT_EQ(up.stats(0).unheard, 1);

    // Alone: 1 + 1 <= max(1.25 x 0.5, 0.5 + 2), and nothing to learn
    // from (affinity_watch_announced()).
    EXPECT_EQ(affinity_zone_instances(z.get(), 1000), 1u);
    Routed alone = router.route_key_released(key_on_peer0(0));
    EXPECT_EQ(alone.decision.peer, 0);
    EXPECT_EQ(alone.decision.watched, -1);

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

    // Two instances more, and one unheard: 1 + 3 x 1 + 1 > 2.5, where
    // 1 + 1 fits once it is heard.
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
    FourPeers four;
    auto &[z, up, router, slot] = four;
    std::string key = key_on_peer0(0);

    report_idle(z.get(), up, 1000);
    affinity_zone_instance_seen(z.get(), 42, 1000);
    EXPECT_EQ(router.route_key(key).decision.peer, 0);
    EXPECT_EQ(router.route_key(key).decision.route,
              uint32_t(AFFINITY_ROUTE_SESSION_HIT))
        << "nothing unheard: 1 + 1 <= 2.5";
    up.release(0);

    EXPECT_EQ(router.route_key(key).decision.watched, -1)
        << "nothing unheard: nothing to watch";
    up.release(0);

    affinity_zone_peer_announced(z.get(), slot);
    Routed r = router.route_key(key);
    EXPECT_NE(r.decision.peer, 0);
    EXPECT_EQ(r.decision.route, uint32_t(AFFINITY_ROUTE_SESSION_SPILL));

    // Spilled, the decision still weighed its pinned peer beside the
    // unheard request: that is what its read-back will teach of.
    EXPECT_EQ(r.decision.watched, 0);
    EXPECT_EQ(r.decision.watched_unheard, 1u);
}

// What the others may send unseen is presumed beside a session's siblings
// only: a session's next turn, seconds later, in a burst of other sessions
// this instance sent its peer, stays with its cache.
TEST(Instances, ASessionsNextTurnIsNotCrowdedOutByOthers)
{
    FourPeers four;
    auto &[z, up, router, slot] = four;
    std::string key = key_on_peer0(0);

    report_idle(z.get(), up, 1000);
    affinity_zone_instance_seen(z.get(), 42, 1000);
    ASSERT_EQ(router.route_key_released(key).decision.peer, 0);

    // Its next turn, 5 s on, beside another session's unheard request on
    // peer 0: 1 + 1 <= 2.5, nothing presumed.
    router.now = 1005;
    report_idle(z.get(), up, 1005);
    affinity_zone_instance_seen(z.get(), 42, 1005);
    up.acquire(0);
    affinity_zone_peer_announced(z.get(), slot);
    Routed next = router.route_key(key);
    EXPECT_EQ(next.decision.peer, 0);
    EXPECT_EQ(next.decision.route, uint32_t(AFFINITY_ROUTE_SESSION_HIT));

    // A sibling of that turn, the same moment: the others may be sending
    // its siblings too, 1 + 1 + 1 + 1 > 2.5.
    Routed sibling = router.route_key(key);
    EXPECT_NE(sibling.decision.peer, 0);
    EXPECT_EQ(sibling.decision.route, uint32_t(AFFINITY_ROUTE_SESSION_SPILL));
}

// Without a session key, siblings are told by their prompt: its longest
// level the index knows used this second.
TEST(Instances, APromptsNextTurnIsNotCrowdedOutByOthers)
{
    FourPeers four;
    auto &[z, up, router, slot] = four;
    TestZone prefixes(1 << 20, AFFINITY_ZONE_PREFIXES);
    std::string history(600, 'h');
    auto body = [&](const std::string &turn) {
        return "{\"model\":\"m\",\"messages\":[{\"role\":\"user\","
               "\"content\":\"" + history + "\"},{\"role\":\"user\","
               "\"content\":\"" + turn + "\"}]}";
    };
    std::vector<affinity_level_t> first =
        prompt_levels(body("first"), default_schedule(), '\0', 8).levels;

    report_idle(z.get(), up, 1000);
    affinity_zone_instance_seen(z.get(), 42, 1000);
    Routed placed = router.route_prompt_released(prefixes.get(), first);
    ASSERT_GE(placed.decision.peer, 0);
    size_t holder = size_t(placed.decision.peer);
    uint32_t holder_slot = up.peer(holder).slot;

    // The next turn, 5 s on, beside an unheard request on the holder,
    // whose engine reported it idle.
    router.now = 1005;
    affinity_engine_load_t idle{};
    idle.found = AFFINITY_ENGINE_RUNNING;
    engine_reported(z.get(), holder_slot, idle, 1005);
    affinity_zone_instance_seen(z.get(), 42, 1005);
    up.acquire(holder);
    affinity_zone_peer_announced(z.get(), holder_slot);
    std::vector<affinity_level_t> next =
        prompt_levels(body("second"), default_schedule(), '\0', 8).levels;
    Routed turn = router.route_prompt(prefixes.get(), next);
    EXPECT_EQ(turn.decision.peer, int(holder));
    EXPECT_EQ(turn.decision.route, uint32_t(AFFINITY_ROUTE_PREFIX_HIT));

    // Its sibling, the same second, finds the history used this second:
    // the others' siblings are presumed, and it goes elsewhere.
    affinity_zone_peer_announced(z.get(), holder_slot);
    std::vector<affinity_level_t> sibling =
        prompt_levels(body("third"), default_schedule(), '\0', 8).levels;
    Routed spilled = router.route_prompt(prefixes.get(), sibling);
    EXPECT_NE(spilled.decision.peer, int(holder));
}

// The others' requests are counted through the engine's figure; without
// one (never reported, or older than engine_ttl: its metrics fail) this
// instance counts its own requests alone, and presumes none unheard,
// which a worker killed before the store answered may have left.
TEST(Instances, UnheardCountOnlyBesideAFreshEngineFigure)
{
    FourPeers four;
    auto &[z, up, router, slot] = four;

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

// Behind a front that sends each session to one instance, a session's
// parallel calls all come here, and the unheard ones met none of the
// others' requests: once enough say so, nothing is presumed beside them,
// and the siblings stay with their session.
TEST(Instances, UnheardThatMetNothingPresumeNothing)
{
    FourPeers four;
    auto &[z, up, router, slot] = four;

    report_idle(z.get(), up, 1000);
    affinity_zone_instance_seen(z.get(), 42, 1000);
    affinity_zone_instance_seen(z.get(), 43, 1000);
    affinity_zone_instance_seen(z.get(), 44, 1000);
    uint32_t learned = 99, met = 99;
    EXPECT_EQ(affinity_zone_unheard_presumed(z.get(), 1000, &learned, &met),
              3.0)
        << "nothing learned: one per other instance";
    EXPECT_EQ(learned, 0u);
    EXPECT_EQ(met, 0u);

    up.acquire(0);
    affinity_zone_peer_announced(z.get(), slot);
    EXPECT_GE(router.route_key_released(key_on_peer0(0)).decision.peer, 1)
        << "1 + 3 x 1 + 1 > 2.5";

    // 63 unheard requests that met nothing: not yet trusted (a spread
    // front's bursts are uneven: a few dozen lessons may show next to
    // nothing by chance).
    for (int k = 0; k < 63; k++) {
        affinity_zone_unheard_met(z.get(), 1, 0);
    }
    EXPECT_GE(router.route_key_released(key_on_peer0(1)).decision.peer, 1);

    affinity_zone_unheard_met(z.get(), 1, 0);
    EXPECT_EQ(affinity_zone_unheard_presumed(z.get(), 1000, &learned, &met),
              0.0);
    EXPECT_EQ(learned, 64u);
    EXPECT_EQ(met, 0u);
    EXPECT_EQ(router.route_key_released(key_on_peer0(2)).decision.peer, 0)
        << "1 + 0 x 1 + 1 <= 2.5";

    // A few requests alongside, as if by chance: still next to nothing
    // (under 0.05 per other instance).
    affinity_zone_unheard_met(z.get(), 1, 1);
    affinity_zone_unheard_met(z.get(), 1, 1);
    double few = affinity_zone_unheard_presumed(z.get(), 1000, nullptr,
                                                nullptr);
    EXPECT_DOUBLE_EQ(few, 2.0 / 66);
    EXPECT_EQ(router.route_key_released(key_on_peer0(3)).decision.peer, 0)
        << "1 + 0.03 x 1 + 1 <= 2.5";

    // The front changes: requests spread at random again.  The later
    // lessons weigh as the earlier, and a mean that is not next to nothing
    // understates the bursts: one per other instance.
    for (int k = 0; k < 16; k++) {
        affinity_zone_unheard_met(z.get(), 1, 3);
    }
    EXPECT_EQ(affinity_zone_unheard_presumed(z.get(), 1000, &learned, &met),
              3.0)
        << "50 met by 82 unheard";
    EXPECT_EQ(learned, 82u);
    EXPECT_EQ(met, 50u);
    EXPECT_GE(router.route_key_released(key_on_peer0(4)).decision.peer, 1)
        << "1 + 3 x 1 + 1 > 2.5";

    // Alone again, the others unheard from for 10 s: none.
    EXPECT_EQ(affinity_zone_unheard_presumed(z.get(), 1011, nullptr, nullptr),
              0.0);

    // Forgotten by halves: after 1024 unheard that met nothing, those of
    // the spread front (50 met) weigh less than 0.05 per other instance.
    for (int k = 0; k < 1024; k++) {
        affinity_zone_unheard_met(z.get(), 1, 0);
    }
    double mean = affinity_zone_unheard_presumed(z.get(), 1000, &learned,
                                                 nullptr);
    EXPECT_GT(mean, 0.0);
    EXPECT_LT(mean, 0.05);
    EXPECT_LT(learned, 1024u);
    EXPECT_GE(learned, 512u);
}

// A worker's watch: a request announced while others were unheard counts
// the other instances' requests on its peer read before it is read back.
TEST(Instances, WatchCountsTheOthersReadBeforeTheReadBack)
{
    affinity_unheard_watch_t watch{};
    uint32_t unheard = 0, others = 0;

    EXPECT_EQ(affinity_watch_announced(&watch, 11, 0), 0u)
        << "nothing unheard beside it: nothing to learn";
    uint32_t first = affinity_watch_announced(&watch, 11, 2);
    uint32_t second = affinity_watch_announced(&watch, 12, 1);
    EXPECT_NE(first, 0u);
    EXPECT_NE(first, second);

    affinity_watch_sent_elsewhere(&watch, 11);
    affinity_watch_sent_elsewhere(&watch, 13);
    affinity_watch_sent_elsewhere(&watch, 11);
    ASSERT_EQ(affinity_watch_read_back(&watch, first, &unheard, &others), 1);
    EXPECT_EQ(unheard, 2u);
    EXPECT_EQ(others, 2u);
    EXPECT_EQ(affinity_watch_read_back(&watch, first, &unheard, &others), 0)
        << "once";

    affinity_watch_sent_elsewhere(&watch, 12);
    ASSERT_EQ(affinity_watch_read_back(&watch, second, &unheard, &others), 1);
    EXPECT_EQ(unheard, 1u);
    EXPECT_EQ(others, 1u);

    // Numbers it never gave, or given AFFINITY_WATCHED announcements ago.
    EXPECT_EQ(affinity_watch_read_back(&watch, 0, &unheard, &others), 0);
    EXPECT_EQ(affinity_watch_read_back(&watch, 999, &unheard, &others), 0);
    uint32_t old = affinity_watch_announced(&watch, 11, 1);
    for (int k = 0; k < AFFINITY_WATCHED; k++) {
        affinity_watch_announced(&watch, 14, 1);
    }
    EXPECT_EQ(affinity_watch_read_back(&watch, old, &unheard, &others), 0);

    // The numbers go round without 0.
    watch.last = UINT32_MAX;
    EXPECT_EQ(affinity_watch_announced(&watch, 11, 1), 1u);
}

TEST(Instances, TheOnesHeardFromInTheLastTenSeconds)
{
    TestZone z;
    affinity_zone_info_t info;
    affinity_zone_info(z.get(), &info);

    EXPECT_EQ(affinity_zone_instances(z.get(), 1000), 1u);

    // Itself, or no id: not another instance.
    affinity_zone_instance_seen(z.get(), info.instance, 1000);
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

// Peer 0 idle, the others one request each, every engine fresh.
void load_one_each(affinity_zone_t *zone, Upstream &up, uint32_t now)
{
    affinity_engine_load_t idle{};
    idle.found = AFFINITY_ENGINE_RUNNING;
    for (size_t i = 0; i < 4; i++) {
        engine_reported(zone, up.peer(i).slot, idle, now);
    }
    up.acquire(1);
    up.acquire(2);
    up.acquire(3);
}

std::vector<affinity_level_t> new_prompt(int n)
{
    std::string body = "{\"model\":\"m\",\"messages\":[{\"role\":"
                       "\"user\",\"content\":\"question "
                       + std::to_string(n) + " " + std::string(300, 'q')
                       + "\"}]}";
    return prompt_levels(body, default_schedule(), '\0', 8).levels;
}

// Requests spread one by one: this instance routes one with none of its
// own unheard, nor do the others, and the least loaded peer takes every
// new prompt, alone or not.
TEST(Instances, SpreadOneByOneNewPromptsGoToTheLeastLoaded)
{
    FourPeers four;
    auto &[z, up, router, slot] = four;
    TestZone prefixes(1 << 22, AFFINITY_ZONE_PREFIXES);

    load_one_each(z.get(), up, 1000);
    for (int n = 0; n < 50; n++) {
        EXPECT_EQ(router.route_prompt_released(prefixes.get(), new_prompt(n))
                      .decision.peer, 0);
    }

    affinity_zone_instance_seen(z.get(), 42, 1000);
    affinity_zone_instance_seen(z.get(), 43, 1000);
    affinity_zone_instance_seen(z.get(), 44, 1000);
    for (int n = 50; n < 150; n++) {
        EXPECT_EQ(router.route_prompt_released(prefixes.get(), new_prompt(n))
                      .decision.peer, 0);
    }
    EXPECT_EQ(affinity_zone_unheard_beside(z.get()), 0.0);
}

// Requests spread one by one now and then go out while another is
// unheard: the mean rises by a sliver, which is no whole request beside,
// and nothing changes.  Nor with weights: the least loaded peer by
// requests per weight still takes every new prompt.
TEST(Instances, ASliverOfAMeanChangesNothing)
{
    TestZone z;
    Upstream up{z.get(), {4, 4}};
    Router router{z.get(), up, kWithEngines};
    TestZone prefixes(1 << 22, AFFINITY_ZONE_PREFIXES);
    affinity_engine_load_t idle{};
    idle.found = AFFINITY_ENGINE_RUNNING;
    engine_reported(z.get(), up.peer(0).slot, idle, 1000);
    engine_reported(z.get(), up.peer(1).slot, idle, 1000);
    for (int n = 0; n < 3; n++) {
        up.acquire(0);
    }
    for (int n = 0; n < 6; n++) {
        up.acquire(1);
    }
    affinity_zone_instance_seen(z.get(), 42, 1000);

    // One decision beside an unheard request: a mean of 1/32.
    uintptr_t ticket = affinity_zone_peer_announced(z.get(), up.peer(1).slot);
    router.route_prompt_released(prefixes.get(), new_prompt(0));
    affinity_zone_peer_heard(z.get(), ticket);
    EXPECT_GT(affinity_zone_unheard_beside(z.get()), 0.0);
    for (int n = 1; n < 51; n++) {
        EXPECT_EQ(router.route_prompt_released(prefixes.get(), new_prompt(n))
                      .decision.peer, 0)
            << "4 of 4 in flight per weight, against 7 of 4";
    }
}

// In bursts through every instance: this one routes each request with
// another of its own unheard, and each other instance is presumed to
// place twice that beside it (before it and after), unseen.  Sent to the
// least loaded peer, all would meet there; so the room the burst fills
// is dealt, each peer drawn with odds by its room.
TEST(Instances, InBurstsNewPromptsAreDealtOverTheRoom)
{
    FourPeers four;
    auto &[z, up, router, slot] = four;
    TestZone prefixes(1 << 22, AFFINITY_ZONE_PREFIXES);

    load_one_each(z.get(), up, 1000);
    affinity_zone_peer_announced(z.get(), up.peer(1).slot);
    EXPECT_EQ(up.stats(1).unheard, 1);

    // Alone: nobody else places anything.
    for (int n = 0; n < 50; n++) {
        EXPECT_EQ(router.route_prompt_released(prefixes.get(), new_prompt(n))
                      .decision.peer, 0);
    }

    // One other instance: the mean of this one's unheard requests rises
    // to just under 1 within a few dozen decisions (1/32 each), and
    // 2 x 1 x 0.97, one whole request, is presumed beside each.  The two
    // fill the peers to 2.25: room 1.25 on peer 0 and 0.25 on each other,
    // odds 5/8 and 1/8.
    affinity_zone_instance_seen(z.get(), 42, 1000);
    for (int n = 50; n < 250; n++) {
        router.route_prompt_released(prefixes.get(), new_prompt(n));
    }
    EXPECT_GT(affinity_zone_unheard_beside(z.get()), 0.9);
    EXPECT_LE(affinity_zone_unheard_beside(z.get()), 1.0);
    int dealt[4] = {};
    for (int n = 250; n < 1450; n++) {
        Routed r = router.route_prompt_released(prefixes.get(), new_prompt(n));
        EXPECT_EQ(r.decision.route, uint32_t(AFFINITY_ROUTE_PREFIX_NEW));
        dealt[r.decision.peer]++;
    }
    EXPECT_GT(dealt[0], 680) << "odds 5 in 8";
    EXPECT_LT(dealt[0], 820);
    for (int i = 1; i < 4; i++) {
        EXPECT_GT(dealt[i], 100) << "peer " << i << ": odds 1 in 8";
        EXPECT_LT(dealt[i], 200) << "peer " << i;
    }

    // The draw is the prompt's: an instance that sees the same load sends
    // it to the same peer, and so does this one again while the load is
    // the same.
    std::vector<affinity_level_t> again = new_prompt(5000);
    int first = router.route_prompt_released(prefixes.get(), again)
                    .decision.peer;
    EXPECT_EQ(router.route_prompt_released(prefixes.get(), again)
                  .decision.route, uint32_t(AFFINITY_ROUTE_PREFIX_HIT));
    TestZone other_zone;
    Upstream other_up{other_zone.get(), {1, 1, 1, 1}};
    Router other{other_zone.get(), other_up, kWithEngines};
    TestZone other_prefixes(1 << 22, AFFINITY_ZONE_PREFIXES);
    load_one_each(other_zone.get(), other_up, 1000);
    affinity_zone_peer_announced(other_zone.get(), other_up.peer(1).slot);
    affinity_zone_instance_seen(other_zone.get(), 41, 1000);
    for (int n = 50; n < 250; n++) {
        other.route_prompt_released(other_prefixes.get(), new_prompt(n));
    }
    EXPECT_EQ(other.route_prompt_released(other_prefixes.get(), again)
                  .decision.peer, first);

    // Heard in time again, the mean falls to none within a few hundred
    // decisions, and the least loaded peer takes the new prompts.
    affinity_engine_load_t idle{};
    idle.found = AFFINITY_ENGINE_RUNNING;
    engine_reported(z.get(), up.peer(1).slot, idle, 1000);
    EXPECT_EQ(up.stats(1).unheard, 0) << "the engine's report clears it";
    for (int n = 3000; n < 3400; n++) {
        router.route_prompt_released(prefixes.get(), new_prompt(n));
    }
    EXPECT_EQ(affinity_zone_unheard_beside(z.get()), 0.0);
    EXPECT_EQ(router.route_prompt_released(prefixes.get(), new_prompt(3400))
                  .decision.peer, 0);
    affinity_zone_peer_announced(z.get(), up.peer(1).slot);
    for (int n = 3500; n < 3700; n++) {
        router.route_prompt_released(prefixes.get(), new_prompt(n));
    }

    // A peer above the level gets none: at 3 in flight, peer 3 has no
    // room below 2.25.
    up.acquire(3);
    up.acquire(3);
    for (int n = 2000; n < 2200; n++) {
        EXPECT_NE(router.route_prompt_released(prefixes.get(), new_prompt(n))
                      .decision.peer, 3);
    }
}

// The share the load bound is measured from counts the requests presumed
// placed beside this one: in a burst, a session's pin is not held to a
// mean the burst has not yet raised.
TEST(Instances, ThoseBesideCountInTheShare)
{
    FourPeers four;
    auto &[z, up, router, slot] = four;
    TestZone prefixes(1 << 22, AFFINITY_ZONE_PREFIXES);
    std::string key = key_on_peer0(0);
    std::string other = key_on_peer0(1);

    ASSERT_EQ(router.route_key_released(key).decision.peer, 0);
    ASSERT_EQ(router.route_key_released(other).decision.peer, 0);
    load_one_each(z.get(), up, 1000);
    for (int n = 0; n < 3; n++) {
        up.acquire(0);
    }
    affinity_zone_peer_announced(z.get(), up.peer(1).slot);

    // Alone: share (6 + 1) / 4, bound 1.75 + 2; 3 + 1 > 3.75.  The
    // spill takes the pin along (docs/routing.md, "Sessions").
    Routed alone = router.route_key_released(key);
    EXPECT_NE(alone.decision.peer, 0);
    EXPECT_EQ(alone.decision.route, uint32_t(AFFINITY_ROUTE_SESSION_SPILL));

    // One other instance, this one's mean of unheard requests near 1:
    // one whole request beside, share (6 + 1 + 1) / 4, bound 2 + 2; 3 + 1
    // fits.
    affinity_zone_instance_seen(z.get(), 42, 1000);
    for (int n = 0; n < 200; n++) {
        router.route_prompt_released(prefixes.get(), new_prompt(n));
    }
    Routed shared = router.route_key_released(other);
    EXPECT_EQ(shared.decision.peer, 0);
    EXPECT_EQ(shared.decision.route, uint32_t(AFFINITY_ROUTE_SESSION_HIT));
}

}  // namespace

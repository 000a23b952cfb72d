// Responses API continuations: the table of response ids in a responses
// zone (affinity_responses_owner/learn), and routing to the peer that
// stored a response whatever its load (affinity_route with continues).
#include <string>

#include <gtest/gtest.h>

#include "test_support.h"

using namespace affinity_test;

namespace {

uint64_t id_key(affinity_zone_t *zone, const std::string &id)
{
    return affinity_zone_key_hash(zone, id.data(), id.size());
}

TEST(ResponseTable, LearnsAndForgetsAfterTheTimeout)
{
    TestZone z(1 << 20, AFFINITY_ZONE_RESPONSES);
    uint64_t peer = peer_id_of(peer_name(2));
    uint64_t key = id_key(z.get(), "resp_abc");

    EXPECT_EQ(affinity_responses_owner(z.get(), key, 100, 60), 0u);
    affinity_responses_learn(z.get(), key, peer, 100000, 100, 60);
    EXPECT_EQ(affinity_responses_owner(z.get(), key, 150, 60), peer);

    // A lookup keeps it alive; idle past the timeout it is gone.
    EXPECT_EQ(affinity_responses_owner(z.get(), key, 200, 60), peer);
    EXPECT_EQ(affinity_responses_owner(z.get(), key, 261, 60), 0u);

    affinity_zone_info_t info = z.info();
    EXPECT_EQ(info.kind, uint32_t(AFFINITY_ZONE_RESPONSES));
    EXPECT_EQ(info.inserts, 1u);
    EXPECT_EQ(info.used, 0u);
    EXPECT_EQ(info.expiries, 1u);
}

// An id stays with the peer that produced it first while it lives: a
// reply reusing it elsewhere (an engine lets clients choose ids) cannot
// take the owner's follow-ups.
TEST(ResponseTable, AnIdKeepsItsFirstOwnerAndOneEntry)
{
    TestZone z(1 << 20, AFFINITY_ZONE_RESPONSES);
    Upstream up(z.get(), {1, 1, 1});
    uint64_t key = id_key(z.get(), "resp_abc");

    EXPECT_EQ(affinity_responses_learn(z.get(), key, up.peer(0).id, 10000,
                                       10, 3600),
              AFFINITY_LEARNED);
    EXPECT_EQ(affinity_responses_learn(z.get(), key, up.peer(0).id, 11000,
                                       11, 3600),
              AFFINITY_LEARNED);
    EXPECT_EQ(affinity_responses_learn(z.get(), key, up.peer(1).id, 12000,
                                       12, 3600),
              AFFINITY_LEARNED_TAKEN);
    EXPECT_EQ(affinity_responses_owner(z.get(), key, 13, 3600),
              up.peer(0).id);
    EXPECT_EQ(z.info().used, 1u);
    EXPECT_EQ(z.info().conflicts, 1u);

    // The pin counts of a responses zone are the ids each peer holds.
    EXPECT_EQ(up.stats(0).pins, 1);
    EXPECT_EQ(up.stats(1).pins, 0);

    // Peer id 0 is never learned.
    affinity_responses_learn(z.get(), id_key(z.get(), "x"), 0, 14000, 14,
                             3600);
    EXPECT_EQ(z.info().used, 1u);
}

TEST(ResponseTable, IsBoundedAndEvictsTheLeastRecentlyUsed)
{
    TestZone z(AFFINITY_ZONE_MIN_SIZE, AFFINITY_ZONE_RESPONSES);
    uint64_t peer = peer_id_of(peer_name(0));
    uint64_t capacity = z.info().capacity;
    ASSERT_GT(capacity, 0u);

    for (uint64_t i = 0; i < capacity * 3; i++) {
        affinity_responses_learn(z.get(),
                                 id_key(z.get(), "resp_" + std::to_string(i)),
                                 peer, 10000, 10, 3600);
    }

    affinity_zone_info_t info = z.info();
    EXPECT_LE(info.used, capacity);
    EXPECT_EQ(info.inserts, capacity * 3);
    EXPECT_EQ(info.evictions, capacity * 3 - info.used);

    // The newest are there.
    std::string last = "resp_" + std::to_string(capacity * 3 - 1);
    EXPECT_EQ(affinity_responses_owner(z.get(), id_key(z.get(), last), 10,
                                       3600),
              peer);
}

TEST(ResponseRouting, ContinuationGoesToTheOwnerWhateverItsLoad)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);

    // The owner is far over the bound: it still gets its continuations.
    for (int i = 0; i < 20; i++) {
        up.acquire(2);
    }

    for (int i = 0; i < 5; i++) {
        Routed r = router.route_continuation(up.peer(2).id);
        ASSERT_EQ(r.rc, 0);
        EXPECT_EQ(r.decision.peer, 2);
        EXPECT_EQ(r.decision.route, uint32_t(AFFINITY_ROUTE_RESPONSE_HIT));
    }

    EXPECT_EQ(up.stats(2).routes[AFFINITY_ROUTE_RESPONSE_HIT], 5u);
    EXPECT_EQ(up.inflight(2), 25);
}

TEST(ResponseRouting, DrainingOwnerStillServesItsResponses)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1});
    Router router(z.get(), up);
    up.set_state(1, AFFINITY_PEER_DRAINING);

    Routed r = router.route_continuation(up.peer(1).id);
    EXPECT_EQ(r.decision.peer, 1);
    EXPECT_EQ(r.decision.route, uint32_t(AFFINITY_ROUTE_RESPONSE_HIT));
}

TEST(ResponseRouting, LostOwnerIsRoutedAsUsual)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1});
    Router router(z.get(), up);

    // Failed, busy for this request (tried), unknown, or gone from the list.
    for (affinity_peer_state_e s : {AFFINITY_PEER_FAILED, AFFINITY_PEER_BUSY}) {
        up.set_state(0, s);
        Routed r = router.route_continuation(up.peer(0).id);
        ASSERT_EQ(r.rc, 0);
        EXPECT_NE(r.decision.peer, 0);
        EXPECT_EQ(r.decision.route, uint32_t(AFFINITY_ROUTE_RESPONSE_LOST));
    }
    up.set_state(0, AFFINITY_PEER_USABLE);

    Routed unknown = router.route_continuation(0);
    EXPECT_EQ(unknown.rc, 0);
    EXPECT_EQ(unknown.decision.route, uint32_t(AFFINITY_ROUTE_RESPONSE_LOST));

    Routed gone = router.route_continuation(peer_id_of("10.9.9.9:1"));
    EXPECT_EQ(gone.rc, 0);
    EXPECT_EQ(gone.decision.route, uint32_t(AFFINITY_ROUTE_RESPONSE_LOST));
    EXPECT_EQ(up.stats(size_t(gone.decision.peer))
                  .routes[AFFINITY_ROUTE_RESPONSE_LOST],
              gone.decision.peer == unknown.decision.peer ? 2u : 1u);
}

TEST(ResponseRouting, LostWithASessionKeyFollowsTheSession)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);

    Routed first = router.route_key_released("chain-1");
    ASSERT_EQ(first.rc, 0);
    size_t pinned = size_t(first.decision.peer);
    size_t other = (pinned + 1) % up.size();
    up.set_state(other, AFFINITY_PEER_FAILED);

    Routed r = router.route_continuation(up.peer(other).id, "chain-1");
    EXPECT_EQ(size_t(r.decision.peer), pinned);
    EXPECT_EQ(r.decision.route, uint32_t(AFFINITY_ROUTE_RESPONSE_LOST));
}

TEST(ResponseRouting, SessionPinFollowsWhereItsResponsesLive)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);

    Routed first = router.route_key_released("chain-2");
    size_t pinned = size_t(first.decision.peer);
    size_t owner = (pinned + 2) % up.size();

    Routed r = router.route_continuation(up.peer(owner).id, "chain-2");
    up.release(owner);
    EXPECT_EQ(size_t(r.decision.peer), owner);
    EXPECT_EQ(r.decision.route, uint32_t(AFFINITY_ROUTE_RESPONSE_HIT));

    // The session's next request without an id goes there too.
    Routed next = router.route_key_released("chain-2");
    EXPECT_EQ(size_t(next.decision.peer), owner);
    EXPECT_EQ(next.decision.route, uint32_t(AFFINITY_ROUTE_SESSION_HIT));
    EXPECT_EQ(up.total_pins(), 1);

    // A new session that continues a response is pinned to its owner.
    Routed fresh = router.route_continuation(up.peer(pinned).id, "chain-3");
    up.release(pinned);
    EXPECT_EQ(size_t(fresh.decision.peer), pinned);
    EXPECT_EQ(router.route_key_released("chain-3").decision.peer,
              int(pinned));
    EXPECT_EQ(up.total_pins(), 2);
}

TEST(ResponseRouting, OwnerIdWithoutContinuesIsIgnored)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1});
    Router router(z.get(), up);

    affinity_request_t r{};
    r.now = 1000;
    r.timeout = 3600;
    r.owner = up.peer(1).id;
    for (int i = 0; i < 6; i++) {
        up.acquire(1);
    }
    affinity_balance_t balance{1.25, 2.0, 0, 0};
    affinity_decision_t d{};
    ASSERT_EQ(affinity_route(z.get(), up.ring(), up.peers().data(),
                             up.states().data(), up.size(), &balance, &r, &d),
              0);
    EXPECT_NE(d.peer, 1);
    EXPECT_EQ(d.route, uint32_t(AFFINITY_ROUTE_FALLBACK));
}

}  // namespace

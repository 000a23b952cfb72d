// Peer selection: bounded loads, spills, moves, and the keyless fallback.
//
// The bound (selection.h, LoadBound::accepts): with T requests in flight on
// the peers that are not FAILED, W the sum of their weights, and
//   share_i = (T + 1) * weight_i / W      (this request included)
// peer i may take a request when
//   inflight_i + 1 <= max(factor * share_i, share_i + slack).
// Pins, spills and new placements only go to a usable peer that passes this
// test; only when no usable peer passes it does the request go to the least
// loaded one (or stay on its pinned peer).  With n equal, usable peers and
// slack >= 1 some peer always passes: the least loaded one has
// inflight + 1 <= (T + n) / n = share + (n - 1) / n < share + slack.  So the
// chosen peer ends with inflight <= max(factor * mean, mean + slack), where
// mean = T' / n and T' = T + 1 is the total after the placement; the other
// peers did not change and their bound only grew.  Without releases, after
// every placement every peer satisfies
//   inflight_i <= max(factor * mean, mean + slack).
#include <cstring>
#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "affinity_core.h"
#include "test_support.h"

using namespace affinity_test;

namespace {

constexpr uint32_t kHit = AFFINITY_ROUTE_SESSION_HIT;
constexpr uint32_t kNew = AFFINITY_ROUTE_SESSION_NEW;
constexpr uint32_t kMoved = AFFINITY_ROUTE_SESSION_MOVED;
constexpr uint32_t kSpill = AFFINITY_ROUTE_SESSION_SPILL;
constexpr uint32_t kFallback = AFFINITY_ROUTE_FALLBACK;

TEST(BoundedLoad, HotKeyNeverOverloadsAPeer)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up, {kFactor, kSlack, 0, 0});

    Routed first = router.route_key("hot");
    ASSERT_EQ(first.rc, 0);
    ASSERT_EQ(first.decision.route, kNew);
    int current = first.decision.peer;

    std::map<uint32_t, size_t> routes;

    // 400 concurrent requests of one session, none finished.  A hit goes to
    // the current pin; a spill goes elsewhere and the pin follows it.
    for (int n = 1; n < 400; n++) {
        Routed r = router.route_key("hot");
        ASSERT_EQ(r.rc, 0);
        ASSERT_GE(r.decision.peer, 0);
        routes[r.decision.route]++;

        ASSERT_TRUE(r.decision.route == kHit || r.decision.route == kSpill)
            << route_name(r.decision.route);
        if (r.decision.route == kHit) {
            EXPECT_EQ(r.decision.peer, current);
        } else {
            EXPECT_NE(r.decision.peer, current);
            current = r.decision.peer;
        }

        expect_within_bound(up, "after a placement");
        if (testing::Test::HasFailure()) {
            FAIL() << "at request " << n;
        }
    }

    EXPECT_EQ(up.total_inflight(), 400);
    EXPECT_GT(routes[kSpill], 0u);
    EXPECT_GT(routes[kHit], 0u);

    // The load is spread over every peer.
    for (size_t i = 0; i < up.size(); i++) {
        EXPECT_GT(up.inflight(i), 0) << i;
    }

    // One session, one pin, where the last spill went.
    EXPECT_EQ(z.info().used, 1u);
    EXPECT_EQ(up.total_pins(), 1);
    EXPECT_EQ(up.stats(size_t(current)).pins, 1);

    // Once the load is gone the session stays on its current peer.
    up.release_all();
    Routed after = router.route_key("hot");
    EXPECT_EQ(after.decision.route, kHit);
    EXPECT_EQ(after.decision.peer, current);
}

TEST(BoundedLoad, BoundHoldsWithBackgroundLoadAndManyKeys)
{
    // Concurrent requests of many sessions, a few hot, with some finishing.
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up, {kFactor, kSlack, 0, 0});
    std::vector<int> live;     // peers of requests in flight

    uint32_t x = 1;
    for (int n = 0; n < 4000; n++) {
        x = x * 1103515245u + 12345u;
        size_t k = (x >> 16) % 10 < 5 ? (x >> 8) % 3 : (x >> 8) % 500;
        Routed r = router.route_key(key_name(k));
        ASSERT_EQ(r.rc, 0);
        ASSERT_GE(r.decision.peer, 0);
        live.push_back(r.decision.peer);

        // Releases lower the mean afterwards, so the bound is checked on
        // the peer just chosen, against the total including its request.
        double mean = double(up.total_inflight()) / double(up.size());
        ASSERT_LE(double(up.inflight(size_t(r.decision.peer))),
                  bound_for(mean) + 1e-9)
            << "peer " << r.decision.peer << " at request " << n;

        if ((x >> 20) % 3 == 0 && !live.empty()) {
            size_t j = (x >> 4) % live.size();
            up.release(size_t(live[j]));
            live.erase(live.begin() + long(j));
        }
    }
}

TEST(BoundedLoad, WeightedBoundHolds)
{
    TestZone z;
    Upstream up(z.get(), {1, 3, 2});
    Router router(z.get(), up, {kFactor, kSlack, 0, 0});
    const double weights = 6;

    for (int n = 0; n < 600; n++) {
        Routed r = router.route_key(n % 2 ? "hot" : key_name(size_t(n)));
        ASSERT_EQ(r.rc, 0);

        double total = double(up.total_inflight());
        for (size_t i = 0; i < up.size(); i++) {
            double share = total * up.peers()[i].weight / weights;
            ASSERT_LE(double(up.inflight(i)), bound_for(share) + 1e-9)
                << "peer " << i << " at request " << n;
        }
    }

    // Heavier peers carry more.
    EXPECT_GT(up.inflight(1), up.inflight(2));
    EXPECT_GT(up.inflight(2), up.inflight(0));
    EXPECT_GT(up.inflight(0), 0);
}

TEST(BoundedLoad, FailedPeersLoadDoesNotRaiseTheBound)
{
    // Requests still in flight on a failed peer are no capacity of the
    // others: the bound is over the peers that can take requests.
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up, {kFactor, kSlack, 0, 0});

    Routed first = router.route_key("hot");
    ASSERT_EQ(first.decision.route, kNew);
    const size_t pinned = size_t(first.decision.peer);
    const size_t failed = (pinned + 1) % up.size();

    for (int i = 0; i < 100; i++) {
        up.acquire(failed);
    }
    up.set_state(failed, AFFINITY_PEER_FAILED);

    for (int n = 0; n < 60; n++) {
        Routed r = router.route_key("hot");
        ASSERT_EQ(r.rc, 0);
        ASSERT_NE(size_t(r.decision.peer), failed);

        int64_t total = up.total_inflight() - up.inflight(failed);
        double mean = double(total) / double(up.size() - 1);
        for (size_t i = 0; i < up.size(); i++) {
            if (i != failed) {
                ASSERT_LE(double(up.inflight(i)), bound_for(mean) + 1e-9)
                    << "peer " << i << " at request " << n;
            }
        }
    }
    (void) pinned;
    EXPECT_EQ(up.total_pins(), 1);
    EXPECT_EQ(up.stats(failed).pins, 0);
}

TEST(BoundedLoad, SpillsPreferThePreviousPin)
{
    // When the pin spills, the pin follows the request and the old pin is
    // remembered: the next spill goes back to it when it has room (its
    // cache holds all of the session but the latest turns).
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up, {kFactor, kSlack, 0, 0});

    Routed first = router.route_key("hot");
    ASSERT_EQ(first.decision.route, kNew);

    int current = first.decision.peer;
    int previous = -1;
    size_t spills = 0, back = 0;

    for (int n = 1; n < 400; n++) {
        bool previous_fits = previous >= 0 && previous != current
                             && would_accept(up, size_t(previous));

        Routed r = router.route_key(n % 3 ? "hot" : key_name(size_t(n)));
        ASSERT_EQ(r.rc, 0);

        if (n % 3 == 0) {
            continue;       // background load of other sessions
        }

        if (r.decision.route == kHit) {
            EXPECT_EQ(r.decision.peer, current) << "request " << n;
            continue;
        }

        ASSERT_EQ(r.decision.route, kSpill) << route_name(r.decision.route);
        spills++;
        if (previous_fits) {
            EXPECT_EQ(r.decision.peer, previous)
                << "spill went elsewhere though the previous pin had room, "
                   "request " << n;
            back++;
        }
        previous = current;
        current = r.decision.peer;
    }

    EXPECT_GT(spills, 10u);
    EXPECT_GT(back, 0u);
    EXPECT_EQ(up.total_pins(), int64_t(z.info().used));
}

TEST(BoundedLoad, PreviousPinIsPreferredOverRingOrder)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up, {kFactor, kSlack, 0, 0});
    std::string key = "sticky";

    Routed first = router.route_key_released(key);
    ASSERT_EQ(first.decision.route, kNew);
    const size_t p0 = size_t(first.decision.peer);

    // The key's ring order: p0, then r1, r2, ...
    uint32_t walk[4];
    ASSERT_EQ(affinity_ring_walk(up.ring(),
                                 affinity_ring_hash(key.data(), key.size()),
                                 walk, 4),
              4u);
    ASSERT_EQ(walk[0], p0);
    const size_t r1 = walk[1], r2 = walk[2];

    // p0 and r1 busy: the spill goes to r2, which becomes the pin.
    up.set_state(p0, AFFINITY_PEER_BUSY);
    up.set_state(r1, AFFINITY_PEER_BUSY);
    Routed s1 = router.route_key_released(key);
    EXPECT_EQ(s1.decision.route, kSpill);
    EXPECT_EQ(size_t(s1.decision.peer), r2);

    // r2 busy, r1 free: the previous pin p0 is busy, so the ring decides:
    // r1 becomes the pin, r2 the previous one.
    up.set_state(r2, AFFINITY_PEER_BUSY);
    up.set_state(r1, AFFINITY_PEER_USABLE);
    Routed s2 = router.route_key_released(key);
    EXPECT_EQ(s2.decision.route, kSpill);
    EXPECT_EQ(size_t(s2.decision.peer), r1);

    // r1 busy, everyone else free: back to r2, the previous pin, although
    // p0 comes first on the ring.
    up.set_state(r1, AFFINITY_PEER_BUSY);
    up.set_state(r2, AFFINITY_PEER_USABLE);
    up.set_state(p0, AFFINITY_PEER_USABLE);
    Routed s3 = router.route_key_released(key);
    EXPECT_EQ(s3.decision.route, kSpill);
    EXPECT_EQ(size_t(s3.decision.peer), r2);

    // And r2 is the pin now.
    up.set_state(r1, AFFINITY_PEER_USABLE);
    Routed hit = router.route_key_released(key);
    EXPECT_EQ(hit.decision.route, kHit);
    EXPECT_EQ(size_t(hit.decision.peer), r2);
    EXPECT_EQ(up.total_pins(), 1);
    EXPECT_EQ(up.stats(r2).pins, 1);
}

TEST(BoundedLoad, OverloadedSpillPeerIsReplaced)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up, {kFactor, kSlack, 0, 0});

    Routed first = router.route_key_released("k");
    const size_t pinned = size_t(first.decision.peer);

    up.set_state(pinned, AFFINITY_PEER_BUSY);
    Routed s1 = router.route_key_released("k");
    ASSERT_EQ(s1.decision.route, kSpill);
    const size_t spill = size_t(s1.decision.peer);

    // The spill peer gets heavily loaded by others.
    for (int i = 0; i < 30; i++) {
        up.acquire(spill);
    }
    ASSERT_FALSE(would_accept(up, spill));

    Routed s2 = router.route_key_released("k");
    EXPECT_EQ(s2.decision.route, kSpill);
    EXPECT_NE(size_t(s2.decision.peer), spill);
    EXPECT_NE(size_t(s2.decision.peer), pinned);
}

TEST(Selection, FailedPinnedPeerMovesTheSession)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);

    Routed first = router.route_key_released("dave");
    ASSERT_EQ(first.decision.route, kNew);
    const size_t old_peer = size_t(first.decision.peer);

    up.set_state(old_peer, AFFINITY_PEER_FAILED);
    Routed moved = router.route_key_released("dave");
    ASSERT_EQ(moved.rc, 0);
    EXPECT_EQ(moved.decision.route, kMoved);
    ASSERT_GE(moved.decision.peer, 0);
    const size_t new_peer = size_t(moved.decision.peer);
    EXPECT_NE(new_peer, old_peer);

    EXPECT_EQ(up.stats(old_peer).pins, 0);
    EXPECT_EQ(up.stats(new_peer).pins, 1);
    EXPECT_EQ(z.info().used, 1u);

    // Following requests stay on the new peer, also once the old one is
    // back: the session's state is there now.
    EXPECT_EQ(router.route_key_released("dave").decision.route, kHit);
    up.set_state(old_peer, AFFINITY_PEER_USABLE);
    for (int i = 0; i < 5; i++) {
        Routed r = router.route_key_released("dave");
        EXPECT_EQ(r.decision.route, kHit);
        EXPECT_EQ(size_t(r.decision.peer), new_peer);
    }
    EXPECT_EQ(up.stats(old_peer).pins, 0);
    EXPECT_EQ(up.stats(new_peer).pins, 1);
}

TEST(Selection, BusyPinnedPeerSpillsAndThePinFollows)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);

    Routed first = router.route_key_released("erin");
    const size_t pinned = size_t(first.decision.peer);

    up.set_state(pinned, AFFINITY_PEER_BUSY);
    Routed r = router.route_key_released("erin");
    ASSERT_EQ(r.rc, 0);
    EXPECT_EQ(r.decision.route, kSpill);
    const size_t spill = size_t(r.decision.peer);
    EXPECT_NE(spill, pinned);

    // The peer that took the spill holds the whole session now.
    for (int i = 0; i < 3; i++) {
        Routed again = router.route_key_released("erin");
        EXPECT_EQ(again.decision.route, kHit);
        EXPECT_EQ(size_t(again.decision.peer), spill);
    }
    EXPECT_EQ(up.total_pins(), 1);
    EXPECT_EQ(up.stats(spill).pins, 1);

    // Usable again, the old pin is the first choice for the next spill.
    up.set_state(pinned, AFFINITY_PEER_USABLE);
    up.set_state(spill, AFFINITY_PEER_BUSY);
    Routed back = router.route_key_released("erin");
    EXPECT_EQ(back.decision.route, kSpill);
    EXPECT_EQ(size_t(back.decision.peer), pinned);
}

TEST(Selection, OverloadedPinnedPeerSpillsAndThePinFollows)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up, {kFactor, kSlack, 0, 0});

    Routed first = router.route_key_released("fay");
    const size_t pinned = size_t(first.decision.peer);

    for (int i = 0; i < 20; i++) {
        up.acquire(pinned);
    }
    ASSERT_FALSE(would_accept(up, pinned));

    Routed r = router.route_key_released("fay");
    EXPECT_EQ(r.decision.route, kSpill);
    const size_t spill = size_t(r.decision.peer);
    EXPECT_NE(spill, pinned);
    EXPECT_EQ(up.stats(spill).pins, 1);
    EXPECT_EQ(up.stats(pinned).pins, 0);

    // The overload passes; the session stays where it went.
    for (int i = 0; i < 20; i++) {
        up.release(pinned);
    }
    Routed after = router.route_key_released("fay");
    EXPECT_EQ(after.decision.route, kHit);
    EXPECT_EQ(size_t(after.decision.peer), spill);
}

// nginx "drain": a draining peer serves the sessions pinned to it, and
// nothing else; it is not failed, so its sessions do not move.
TEST(Selection, DrainingPeerKeepsItsSessionsAndTakesNoNewOnes)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);

    std::map<std::string, int> pin;
    for (int k = 0; k < 200; k++) {
        std::string key = "drain-" + std::to_string(k);
        Routed r = router.route_key_released(key);
        ASSERT_EQ(r.decision.route, kNew);
        pin[key] = r.decision.peer;
    }

    const size_t draining = size_t(pin.begin()->second);
    const int64_t pins_before = up.stats(draining).pins;
    ASSERT_GT(pins_before, 0);
    up.set_state(draining, AFFINITY_PEER_DRAINING);

    for (const auto &[key, peer] : pin) {
        Routed r = router.route_key_released(key);
        ASSERT_EQ(r.rc, 0);
        EXPECT_EQ(r.decision.route, kHit) << key;
        EXPECT_EQ(r.decision.peer, peer) << key;
    }
    EXPECT_EQ(up.stats(draining).pins, pins_before);

    // New sessions and keyless requests go elsewhere.
    for (int k = 0; k < 200; k++) {
        Routed r = router.route_key_released("new-" + std::to_string(k));
        EXPECT_EQ(r.decision.route, kNew);
        EXPECT_NE(size_t(r.decision.peer), draining);
        Routed f = router.route_nokey();
        EXPECT_NE(size_t(f.decision.peer), draining);
        up.release(size_t(f.decision.peer));
    }
    EXPECT_EQ(up.stats(draining).pins, pins_before);

    // Back in service, it takes new sessions again.
    up.set_state(draining, AFFINITY_PEER_USABLE);
    bool took = false;
    for (int k = 0; k < 200 && !took; k++) {
        Routed r = router.route_key_released("later-" + std::to_string(k));
        took = size_t(r.decision.peer) == draining;
    }
    EXPECT_TRUE(took);
}

// Draining does not lift the bound: an overloaded draining peer spills its
// session, which then stays where it went.
TEST(Selection, OverloadedDrainingPeerSpills)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up, {kFactor, kSlack, 0, 0});

    Routed first = router.route_key_released("gus");
    const size_t pinned = size_t(first.decision.peer);
    up.set_state(pinned, AFFINITY_PEER_DRAINING);

    for (int i = 0; i < 20; i++) {
        up.acquire(pinned);
    }
    ASSERT_FALSE(would_accept(up, pinned));

    Routed r = router.route_key_released("gus");
    EXPECT_EQ(r.decision.route, kSpill);
    EXPECT_NE(size_t(r.decision.peer), pinned);
    EXPECT_EQ(up.stats(pinned).pins, 0);

    // Everyone over the bound: a pinned draining peer still keeps its
    // session rather than refusing it.
    Routed second = router.route_key_released("hal");
    const size_t hal = size_t(second.decision.peer);
    for (size_t i = 0; i < up.size(); i++) {
        for (int j = 0; j < 40; j++) {
            up.acquire(i);
        }
    }
    up.set_state(hal, AFFINITY_PEER_DRAINING);
    for (size_t i = 0; i < up.size(); i++) {
        if (i != hal) {
            up.set_state(i, AFFINITY_PEER_BUSY);
        }
    }
    Routed stay = router.route_key_released("hal");
    EXPECT_EQ(stay.decision.route, kHit);
    EXPECT_EQ(size_t(stay.decision.peer), hal);
}

// With only draining peers left, a request without a session on them is
// refused by the balancer (nginx then tries round robin and backups).
TEST(Selection, OnlyDrainingPeersRefuseNewWork)
{
    TestZone z;
    Upstream up(z.get(), {1, 1});
    Router router(z.get(), up);

    Routed first = router.route_key_released("ida");
    ASSERT_EQ(first.rc, 0);
    up.set_state(0, AFFINITY_PEER_DRAINING);
    up.set_state(1, AFFINITY_PEER_DRAINING);

    EXPECT_EQ(router.route_nokey().rc, -1);
    EXPECT_EQ(router.route_key_released("someone-new").rc, -1);

    Routed again = router.route_key_released("ida");
    ASSERT_EQ(again.rc, 0);
    EXPECT_EQ(again.decision.peer, first.decision.peer);
    EXPECT_EQ(again.decision.route, kHit);
}

TEST(Selection, OnlyTheFailedPeersKeysMove)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);
    const size_t nkeys = 1000;

    std::vector<int> pin(nkeys);
    for (size_t k = 0; k < nkeys; k++) {
        Routed r = router.route_key_released(key_name(k));
        ASSERT_EQ(r.decision.route, kNew);
        pin[k] = r.decision.peer;
    }

    for (size_t failed = 0; failed < up.size(); failed++) {
        SCOPED_TRACE(testing::Message() << "failed peer " << failed);
        up.set_state(failed, AFFINITY_PEER_FAILED);

        size_t moved = 0;
        for (size_t k = 0; k < nkeys; k++) {
            Routed r = router.route_key_released(key_name(k));
            ASSERT_EQ(r.rc, 0);
            if (pin[k] == int(failed)) {
                ASSERT_EQ(r.decision.route, kMoved) << "key " << k;
                ASSERT_NE(r.decision.peer, int(failed));
                pin[k] = r.decision.peer;
                moved++;
            } else {
                ASSERT_EQ(r.decision.route, kHit) << "key " << k;
                ASSERT_EQ(r.decision.peer, pin[k]) << "key " << k;
            }
        }

        EXPECT_GT(moved, 0u);
        EXPECT_EQ(up.stats(failed).pins, 0);
        EXPECT_EQ(up.total_pins(), int64_t(nkeys));
        up.set_state(failed, AFFINITY_PEER_USABLE);
    }
}

TEST(Selection, MovedKeysFollowTheRing)
{
    // A failed peer's sessions go where the ring sends them without it:
    // several nginx instances move them alike.
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1, 1});
    Router router(z.get(), up);

    std::vector<int> pin(300);
    for (size_t k = 0; k < pin.size(); k++) {
        pin[k] = router.route_key_released(key_name(k)).decision.peer;
    }

    up.set_state(2, AFFINITY_PEER_FAILED);
    for (size_t k = 0; k < pin.size(); k++) {
        std::string key = key_name(k);
        Routed r = router.route_key_released(key);
        if (pin[k] != 2) {
            continue;
        }
        uint32_t walk[5];
        affinity_ring_walk(up.ring(), affinity_ring_hash(key.data(), key.size()),
                           walk, 5);
        ASSERT_EQ(walk[0], 2u);
        EXPECT_EQ(uint32_t(r.decision.peer), walk[1]) << key;
    }
}

TEST(Selection, PeerRemovedFromTheListMovesItsKeysOnly)
{
    // A reload drops a server: the zone still has pins to its id.
    TestZone z;
    Upstream five(z.get(), {1, 1, 1, 1, 1});
    Router router5(z.get(), five);

    std::vector<uint64_t> pin_id(500);
    for (size_t k = 0; k < pin_id.size(); k++) {
        Routed r = router5.route_key_released(key_name(k));
        pin_id[k] = five.peer(size_t(r.decision.peer)).id;
    }

    // The new configuration: peers 0, 1, 2, 3 (same names, same ids).
    Upstream four(z.get(), {1, 1, 1, 1});
    const uint64_t removed = five.peer(4).id;
    Router router4(z.get(), four);

    for (size_t k = 0; k < pin_id.size(); k++) {
        Routed r = router4.route_key_released(key_name(k));
        ASSERT_EQ(r.rc, 0);
        uint64_t now = four.peer(size_t(r.decision.peer)).id;
        if (pin_id[k] == removed) {
            EXPECT_EQ(r.decision.route, kMoved);
        } else {
            EXPECT_EQ(r.decision.route, kHit);
            EXPECT_EQ(now, pin_id[k]);
        }
    }
}

TEST(Selection, PinsSurviveAReorderedPeerList)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);

    std::vector<uint64_t> pin_id(300);
    for (size_t k = 0; k < pin_id.size(); k++) {
        Routed r = router.route_key_released(key_name(k));
        pin_id[k] = up.peer(size_t(r.decision.peer)).id;
    }

    // Same servers, written in reverse order.
    std::vector<affinity_peer_t> peers(up.peers().rbegin(), up.peers().rend());
    std::vector<uint8_t> states(peers.size(), AFFINITY_PEER_USABLE);
    RingPtr ring = make_ring(peers);
    affinity_balance_t balance{1.25, 2, 0, 0};

    for (size_t k = 0; k < pin_id.size(); k++) {
        std::string key = key_name(k);
        affinity_request_t req{};
        req.key_hash = affinity_zone_key_hash(z.get(), key.data(), key.size());
        req.ring_hash = affinity_ring_hash(key.data(), key.size());
        req.has_key = 1;
        req.now = 1000;
        req.timeout = 3600;
        affinity_decision_t d{};
        ASSERT_EQ(affinity_route(z.get(), ring.get(), peers.data(),
                                 states.data(), peers.size(), &balance, &req,
                                 &d),
                  0);
        EXPECT_EQ(d.route, kHit);
        EXPECT_EQ(peers[size_t(d.peer)].id, pin_id[k]);
        affinity_zone_peer_release(z.get(), AFFINITY_NO_ROW, d.slot);
    }
}

TEST(Fallback, NoKeyGoesToTheLeastLoadedPeer)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);

    const int loads[4] = {3, 1, 2, 5};
    for (size_t i = 0; i < 4; i++) {
        for (int n = 0; n < loads[i]; n++) {
            up.acquire(i);
        }
    }

    for (int round = 0; round < 4; round++) {
        Routed r = router.route_nokey();
        ASSERT_EQ(r.rc, 0);
        EXPECT_EQ(r.decision.route, kFallback);
        EXPECT_EQ(r.decision.peer, 1);
        up.release(1);
    }

    // Nothing was pinned.
    EXPECT_EQ(z.info().used, 0u);
    EXPECT_EQ(up.total_pins(), 0);
    // Each request was counted.
    EXPECT_EQ(up.stats(1).requests, 1u + 4u);
}

TEST(Fallback, SkipsBusyAndFailedPeers)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1});
    Router router(z.get(), up);

    up.acquire(0);
    up.acquire(0);
    up.set_state(1, AFFINITY_PEER_BUSY);
    up.set_state(2, AFFINITY_PEER_FAILED);

    for (int i = 0; i < 5; i++) {
        Routed r = router.route_nokey();
        ASSERT_EQ(r.rc, 0);
        EXPECT_EQ(r.decision.peer, 0);
        EXPECT_EQ(r.decision.route, kFallback);
    }
}

TEST(Fallback, TiesAreSpreadOverThePeers)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);

    std::vector<int> count(4, 0);
    for (int i = 0; i < 400; i++) {
        Routed r = router.route_nokey();
        ASSERT_EQ(r.rc, 0);
        count[size_t(r.decision.peer)]++;
        up.release(size_t(r.decision.peer));
    }
    for (int c : count) {
        EXPECT_EQ(c, 100);
    }
}

TEST(Fallback, RespectsWeights)
{
    TestZone z;
    Upstream up(z.get(), {3, 1});
    Router router(z.get(), up);

    // Less in flight per weight on the heavy peer: 2/3 against 1/1.
    up.acquire(0);
    up.acquire(0);
    up.acquire(1);
    EXPECT_EQ(router.route_nokey().decision.peer, 0);
    up.release(0);

    // More on the heavy peer: 6/3 against 1/1.
    for (int i = 0; i < 4; i++) {
        up.acquire(0);
    }
    ASSERT_EQ(up.inflight(0), 6);
    EXPECT_EQ(router.route_nokey().decision.peer, 1);
    up.release_all();

    // Concurrent keyless requests split 3:1.
    for (int i = 0; i < 400; i++) {
        ASSERT_EQ(router.route_nokey().rc, 0);
    }
    EXPECT_NEAR(double(up.inflight(0)), 300.0, 3.0);
    EXPECT_NEAR(double(up.inflight(1)), 100.0, 3.0);
}

TEST(Selection, NoUsablePeerRefusesAndCountsNothing)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1});
    Router router(z.get(), up);

    // A session pinned while the peers were fine.
    Routed pinned = router.route_key_released("pinned");
    ASSERT_EQ(pinned.decision.route, kNew);

    auto snapshot = [&]() {
        std::vector<int64_t> v;
        for (size_t i = 0; i < up.size(); i++) {
            affinity_peer_stats_t s = up.stats(i);
            v.push_back(s.inflight);
            v.push_back(int64_t(s.requests));
            v.push_back(s.pins);
        }
        v.push_back(int64_t(z.info().used));
        return v;
    };

    for (affinity_peer_state_e state :
         {AFFINITY_PEER_FAILED, AFFINITY_PEER_BUSY}) {
        SCOPED_TRACE(testing::Message() << "all peers in state " << state);
        for (size_t i = 0; i < up.size(); i++) {
            up.set_state(i, state);
        }
        auto before = snapshot();

        for (const char *key : {"new-key", "pinned"}) {
            Routed r = router.route_key(key);
            EXPECT_EQ(r.rc, -1) << key;
            EXPECT_EQ(r.decision.peer, -1) << key;
            EXPECT_EQ(r.decision.route, uint32_t{AFFINITY_ROUTE_NONE}) << key;
        }

        Routed r = router.route_nokey();
        EXPECT_EQ(r.rc, -1);
        EXPECT_EQ(r.decision.peer, -1);
        EXPECT_EQ(r.decision.route, uint32_t{AFFINITY_ROUTE_NONE});

        EXPECT_EQ(snapshot(), before);
    }

    // Peers back: the old pin is intact, the refused key was never pinned.
    for (size_t i = 0; i < up.size(); i++) {
        up.set_state(i, AFFINITY_PEER_USABLE);
    }
    Routed r = router.route_key_released("pinned");
    EXPECT_EQ(r.decision.route, kHit);
    EXPECT_EQ(r.decision.peer, pinned.decision.peer);
    EXPECT_EQ(router.route_key_released("new-key").decision.route, kNew);
}

TEST(Selection, NoPeersAtAll)
{
    TestZone z;
    affinity_balance_t balance{1.25, 2, 0, 0};
    affinity_request_t req{};
    req.has_key = 1;
    req.key_hash = 99;
    req.ring_hash = 99;
    affinity_decision_t d;
    std::memset(&d, 7, sizeof(d));

    EXPECT_EQ(affinity_route(z.get(), nullptr, nullptr, nullptr, 0, &balance,
                             &req, &d),
              -1);
    EXPECT_EQ(d.peer, -1);
    EXPECT_EQ(d.probe_length, 0u);
    EXPECT_EQ(d.cache_chars, 0u);
    EXPECT_EQ(z.info().used, 0u);
}

TEST(Selection, WithoutARingKeysGoToTheLeastLoaded)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1});
    affinity_balance_t balance{1.25, 2, 0, 0};

    up.acquire(0);
    up.acquire(2);

    affinity_request_t req{};
    std::string key = "no-ring";
    req.key_hash = affinity_zone_key_hash(z.get(), key.data(), key.size());
    req.ring_hash = affinity_ring_hash(key.data(), key.size());
    req.has_key = 1;
    req.now = 10;
    req.timeout = 100;
    affinity_decision_t d{};

    ASSERT_EQ(affinity_route(z.get(), nullptr, up.peers().data(),
                             up.states().data(), up.size(), &balance, &req,
                             &d),
              0);
    EXPECT_EQ(d.route, kNew);
    EXPECT_EQ(d.peer, 1);

    ASSERT_EQ(affinity_route(z.get(), nullptr, up.peers().data(),
                             up.states().data(), up.size(), &balance, &req,
                             &d),
              0);
    EXPECT_EQ(d.route, kHit);
    EXPECT_EQ(d.peer, 1);
}

TEST(Selection, PeersWithoutSlotsAreRoutedButNotCounted)
{
    TestZone z;
    Upstream up(z.get(), {1, 1});
    up.peer(0).slot = AFFINITY_NO_SLOT;
    up.peer(1).slot = AFFINITY_NO_SLOT;
    Router router(z.get(), up);

    Routed r = router.route_key("k");
    ASSERT_EQ(r.rc, 0);
    EXPECT_GE(r.decision.peer, 0);
    Routed nk = router.route_nokey();
    ASSERT_EQ(nk.rc, 0);
    EXPECT_GE(nk.decision.peer, 0);
}

}  // namespace

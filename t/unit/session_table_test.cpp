// The session table: pins, spreading, idle expiry, LRU eviction and the
// per-peer pin counts, through affinity_route() and the SessionTable class.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "affinity_core.h"
#include "session_table.h"
#include "test_support.h"
#include "zone.h"

using namespace affinity_test;

namespace {

constexpr uint32_t kHit = AFFINITY_ROUTE_SESSION_HIT;
constexpr uint32_t kNew = AFFINITY_ROUTE_SESSION_NEW;

TEST(SessionRoute, NewKeyIsPinnedAndHitsAfterwards)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);

    Routed first = router.route_key_released("alice");
    ASSERT_EQ(first.rc, 0);
    EXPECT_EQ(first.decision.route, kNew);
    ASSERT_GE(first.decision.peer, 0);
    ASSERT_LT(first.decision.peer, 4);
    EXPECT_EQ(z.info().used, 1u);
    EXPECT_EQ(up.stats(size_t(first.decision.peer)).pins, 1);

    for (int i = 0; i < 20; i++) {
        router.now++;
        Routed r = router.route_key_released("alice");
        ASSERT_EQ(r.rc, 0);
        EXPECT_EQ(r.decision.route, kHit) << route_name(r.decision.route);
        EXPECT_EQ(r.decision.peer, first.decision.peer);
    }

    // Hits neither add entries nor pins.
    EXPECT_EQ(z.info().used, 1u);
    EXPECT_EQ(up.total_pins(), 1);

    // Each request was counted once on its peer, and released.
    affinity_peer_stats_t s = up.stats(size_t(first.decision.peer));
    EXPECT_EQ(s.requests, 21u);
    EXPECT_EQ(s.inflight, 0);
}

TEST(SessionRoute, NewKeyGoesToItsRingPeerWhenIdle)
{
    // Without load, placement is plain consistent hashing: the key's first
    // peer on the ring.  (Several nginx instances then agree.)
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1, 1});
    Router router(z.get(), up);

    for (size_t k = 0; k < 200; k++) {
        std::string key = key_name(k);
        uint32_t ring_first = UINT32_MAX;
        ASSERT_EQ(affinity_ring_walk(up.ring(),
                                     affinity_ring_hash(key.data(), key.size()),
                                     &ring_first, 1),
                  1u);
        Routed r = router.route_key_released(key);
        ASSERT_EQ(r.rc, 0);
        EXPECT_EQ(r.decision.route, kNew);
        EXPECT_EQ(uint32_t(r.decision.peer), ring_first);
    }
}

TEST(SessionRoute, KeysAreIndependent)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);

    std::map<std::string, int> pin;
    for (size_t k = 0; k < 100; k++) {
        Routed r = router.route_key_released(key_name(k));
        ASSERT_EQ(r.decision.route, kNew);
        pin[key_name(k)] = r.decision.peer;
    }
    EXPECT_EQ(z.info().used, 100u);

    for (size_t k = 100; k-- > 0;) {
        Routed r = router.route_key_released(key_name(k));
        EXPECT_EQ(r.decision.route, kHit);
        EXPECT_EQ(r.decision.peer, pin[key_name(k)]);
    }
}

void expect_spread(const std::vector<int64_t> &pins, double max_ratio)
{
    int64_t total = 0, most = 0;
    for (int64_t p : pins) {
        total += p;
        most = std::max(most, p);
    }
    double mean = double(total) / double(pins.size());
    EXPECT_LE(double(most) / mean, max_ratio)
        << "pins " << testing::PrintToString(pins);
}

TEST(SessionRoute, ThousandKeysSpreadEvenlyOverFourPeers)
{
    // Requests that end at once: placement by the ring alone.
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);

    for (size_t k = 0; k < 1000; k++) {
        Routed r = router.route_key_released(key_name(k));
        ASSERT_EQ(r.rc, 0);
        ASSERT_EQ(r.decision.route, kNew);
    }

    std::vector<int64_t> pins;
    for (size_t i = 0; i < up.size(); i++) {
        pins.push_back(up.stats(i).pins);
    }
    EXPECT_EQ(z.info().used, 1000u);
    EXPECT_EQ(up.total_pins(), 1000);
    expect_spread(pins, 1.3);
}

TEST(SessionRoute, ThousandConcurrentKeysSpreadEvenlyOverFourPeers)
{
    // Requests that stay in flight: bounded load keeps the spread even.
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);

    for (size_t k = 0; k < 1000; k++) {
        Routed r = router.route_key(key_name(k));
        ASSERT_EQ(r.rc, 0);
        ASSERT_EQ(r.decision.route, kNew);
    }

    std::vector<int64_t> pins, inflight;
    for (size_t i = 0; i < up.size(); i++) {
        pins.push_back(up.stats(i).pins);
        inflight.push_back(up.inflight(i));
    }
    EXPECT_EQ(up.total_inflight(), 1000);
    expect_spread(pins, 1.3);
    expect_spread(inflight, 1.3);
}

TEST(SessionRoute, IdlePinsExpire)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1});
    Router router(z.get(), up);
    router.timeout = 60;
    const uint32_t t0 = 5000;

    router.now = t0;
    Routed first = router.route_key_released("bob");
    ASSERT_EQ(first.decision.route, kNew);

    // Used within the timeout: still pinned, and the use refreshes it.
    router.now = t0 + 50;
    EXPECT_EQ(router.route_key_released("bob").decision.route, kHit);
    router.now = t0 + 100;
    EXPECT_EQ(router.route_key_released("bob").decision.route, kHit);
    EXPECT_EQ(z.info().expiries, 0u);

    // Idle longer than the timeout: the pin is gone, the key starts anew.
    router.now = t0 + 100 + 61;
    Routed again = router.route_key_released("bob");
    EXPECT_EQ(again.decision.route, kNew);
    EXPECT_EQ(z.info().expiries, 1u);
    EXPECT_EQ(z.info().used, 1u);
    EXPECT_EQ(up.total_pins(), 1);

    // Nothing else changed: the ring puts it where it was.
    EXPECT_EQ(again.decision.peer, first.decision.peer);

    router.now++;
    EXPECT_EQ(router.route_key_released("bob").decision.route, kHit);
}

TEST(SessionRoute, ExpiryCountsEveryIdleEntry)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);
    router.timeout = 30;
    router.now = 100;

    for (size_t k = 0; k < 500; k++) {
        router.route_key_released(key_name(k));
    }
    ASSERT_EQ(z.info().used, 500u);

    router.now = 100 + 31;
    size_t renewed = 0;
    for (size_t k = 0; k < 500; k++) {
        Routed r = router.route_key_released(key_name(k));
        ASSERT_EQ(r.rc, 0);
        if (r.decision.route == kNew) {
            renewed++;
        }
    }

    EXPECT_EQ(renewed, 500u);
    EXPECT_EQ(z.info().expiries, 500u);
    EXPECT_EQ(z.info().used, 500u);
    EXPECT_EQ(up.total_pins(), 500);
}

TEST(SessionRoute, ClockGoingBackwardsExpiresNothing)
{
    TestZone z;
    Upstream up(z.get(), {1, 1});
    Router router(z.get(), up);
    router.timeout = 10;
    router.now = 100000;

    Routed first = router.route_key_released("carol");
    ASSERT_EQ(first.decision.route, kNew);

    router.now = 5;
    Routed r = router.route_key_released("carol");
    EXPECT_EQ(r.decision.route, kHit);
    EXPECT_EQ(r.decision.peer, first.decision.peer);
    EXPECT_EQ(z.info().expiries, 0u);
}

TEST(SessionRoute, SmallZoneEvictsLeastRecentlyUsed)
{
    TestZone z(AFFINITY_ZONE_MIN_SIZE);
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);

    const uint64_t capacity = z.info().capacity;
    ASSERT_GT(capacity, 0u);
    const size_t nkeys = size_t(capacity) * 10;
    router.timeout = uint32_t(nkeys * 4);     // nothing expires here

    // An old key that stays in use: with LRU it survives, with FIFO it
    // would be one of the first to go.
    Routed hot = router.route_key_released("hot");
    ASSERT_EQ(hot.decision.route, kNew);
    size_t created = 1;

    for (size_t k = 0; k < nkeys; k++) {
        router.now++;
        Routed r = router.route_key_released(key_name(k));
        ASSERT_EQ(r.rc, 0) << "key " << k;
        ASSERT_GE(r.decision.peer, 0);
        ASSERT_LT(r.decision.peer, int(up.size()));
        ASSERT_EQ(r.decision.route, kNew);
        created++;

        if (k % 4 == 0) {
            router.now++;
            Routed h = router.route_key_released("hot");
            ASSERT_EQ(h.decision.route, kHit) << "hot key lost after " << k;
            ASSERT_EQ(h.decision.peer, hot.decision.peer);
        }

        if (k % 97 == 0) {
            ASSERT_LE(z.info().used, capacity);
        }
    }

    affinity_zone_info_t info = z.info();
    EXPECT_LE(info.used, capacity);
    EXPECT_GT(info.evictions, 0u);
    EXPECT_EQ(info.expiries, 0u);

    // Ten times more keys than entries fill every way of every bucket.
    EXPECT_EQ(info.used, capacity);

    // Every entry ever created is still there or was evicted.
    EXPECT_EQ(info.used + info.evictions, created);

    // Pins and entries agree.
    EXPECT_EQ(up.total_pins(), int64_t(info.used));

    // The most recently used keys are all still there, but those whose
    // bucket took a whole bucket of keys used after them: keys hash with
    // the zone's random seed, so a bucket now and then takes more than
    // its share of the last fifty.  Looked up without inserting, so that
    // a key found missing does not evict the next.
    const uint64_t ways = affinity::kSessionWays;
    const affinity::Zone zone(z.region());
    auto hash = [&](const std::string &key) {
        return affinity_zone_key_hash(z.get(), key.data(), key.size());
    };
    auto bucket = [&](const std::string &key) {
        return &zone.bucket_of<affinity::SessionBucket>(hash(key));
    };
    const size_t hot_after = (nkeys - 1) / 4 * 4;    // its last use
    affinity::SessionTable table(zone, router.now, router.timeout);
    size_t kept = 0;

    for (size_t k = nkeys - 50; k < nkeys; k++) {
        const affinity::SessionBucket *b = bucket(key_name(k));
        uint64_t later = k < hot_after && bucket("hot") == b ? 1 : 0;

        for (size_t j = k + 1; j < nkeys; j++) {
            later += bucket(key_name(j)) == b ? 1 : 0;
        }

        bool there = table.find(hash(key_name(k))) != nullptr;

        EXPECT_EQ(there, later < ways) << "key " << k << ", " << later
                                       << " used after it in its bucket";
        kept += there ? 1 : 0;
    }
    EXPECT_GE(kept, 40u);
    EXPECT_EQ(router.route_key_released("hot").decision.route, kHit);

    // And the oldest untouched ones are gone (reinserting them now).
    size_t lost = 0;
    for (size_t k = 0; k < 50; k++) {
        if (router.route_key_released(key_name(k)).decision.route == kNew) {
            lost++;
        }
    }
    EXPECT_EQ(lost, 50u);
}

TEST(SessionRoute, PinsPerPeerSumToUsed)
{
    TestZone z(AFFINITY_ZONE_MIN_SIZE);
    Upstream up(z.get(), {1, 2, 1, 3});
    Router router(z.get(), up);
    router.timeout = 50;

    auto check = [&](const char *when) {
        EXPECT_EQ(up.total_pins(), int64_t(z.info().used)) << when;
        for (size_t i = 0; i < up.size(); i++) {
            EXPECT_GE(up.stats(i).pins, 0) << when;
        }
    };

    for (size_t k = 0; k < 800; k++) {
        router.route_key_released(key_name(k));
    }
    check("after new pins");

    // Moves (a failed peer), spills (a busy one), evictions and expiry.
    up.set_state(1, AFFINITY_PEER_FAILED);
    up.set_state(2, AFFINITY_PEER_BUSY);
    for (size_t k = 0; k < 800; k++) {
        router.route_key_released(key_name(k));
    }
    check("after moves and spills");

    up.set_state(1, AFFINITY_PEER_USABLE);
    up.set_state(2, AFFINITY_PEER_USABLE);
    for (size_t k = 800; k < 8000; k++) {
        router.now += (k % 10 == 0);
        router.route_key_released(key_name(k));
    }
    check("after evictions");
    EXPECT_GT(z.info().evictions, 0u);

    router.now += 1000;
    for (size_t k = 0; k < 300; k++) {
        router.route_key_released("late-" + std::to_string(k));
    }
    check("after expiries");
    EXPECT_GT(z.info().expiries, 0u);
}

// ---- the SessionTable class itself ---------------------------------------

class SessionTableTest : public testing::Test {
protected:
    SessionTableTest()
        : zone_(affinity::Zone(z_.region()))
    {
        peer_a_ = peer_id_of("a:80");
        peer_b_ = peer_id_of("b:80");
        slot_a_ = affinity_zone_peer_slot(z_.get(), peer_a_, 0);
        slot_b_ = affinity_zone_peer_slot(z_.get(), peer_b_, 0);
    }

    int64_t pins(uint32_t slot) const
    {
        affinity_peer_stats_t s{};
        affinity_zone_peer_stats(z_.get(), slot, &s);
        return s.pins;
    }

    // Hashes that share a bucket: the table maps a hash to a bucket by its
    // high bits, so neighbouring hashes go to the same bucket.
    static uint64_t neighbour(uint64_t i) { return 0x8000000000000001ULL + i; }

    TestZone z_;
    affinity::Zone zone_;
    uint64_t peer_a_, peer_b_;
    uint32_t slot_a_, slot_b_;
};

TEST_F(SessionTableTest, InsertFindRepin)
{
    affinity::SessionTable table(zone_, 100, 60);

    EXPECT_EQ(table.find(42), nullptr);

    affinity::SessionEntry *e = table.insert(42);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->key, 42u);
    EXPECT_EQ(e->peer, 0u);
    EXPECT_EQ(e->spill, 0u);
    EXPECT_EQ(z_.info().used, 1u);

    table.repin(e, peer_a_);
    EXPECT_EQ(e->peer, peer_a_);
    EXPECT_EQ(pins(slot_a_), 1);
    EXPECT_EQ(table.find(42), e);

    e->spill = peer_b_;
    table.repin(e, peer_b_);
    EXPECT_EQ(e->peer, peer_b_);
    EXPECT_EQ(e->spill, 0u) << "a new pin forgets the old spill peer";
    EXPECT_EQ(pins(slot_a_), 0);
    EXPECT_EQ(pins(slot_b_), 1);
    EXPECT_EQ(z_.info().used, 1u);

    EXPECT_EQ(table.find(43), nullptr);
}

TEST_F(SessionTableTest, FindReclaimsExpiredEntries)
{
    {
        affinity::SessionTable table(zone_, 100, 60);
        for (uint64_t i = 0; i < 3; i++) {
            table.repin(table.insert(neighbour(i)), peer_a_);
        }
    }
    ASSERT_EQ(z_.info().used, 3u);
    ASSERT_EQ(pins(slot_a_), 3);

    {
        // Not yet idle for longer than the timeout; a lookup is a use.
        affinity::SessionTable table(zone_, 150, 60);
        EXPECT_NE(table.find(neighbour(0)), nullptr);
        EXPECT_EQ(z_.info().expiries, 0u);
    }

    {
        // 1 and 2 were idle since 100, 0 only since 150.
        affinity::SessionTable table(zone_, 100 + 61, 60);
        EXPECT_NE(table.find(neighbour(0)), nullptr);
        EXPECT_EQ(table.find(neighbour(1)), nullptr);
        EXPECT_EQ(table.find(neighbour(2)), nullptr);
    }
    EXPECT_EQ(z_.info().used, 1u);
    EXPECT_EQ(z_.info().expiries, 2u);
    EXPECT_EQ(pins(slot_a_), 1);

    {
        affinity::SessionTable table(zone_, 161 + 61, 60);
        EXPECT_EQ(table.find(neighbour(0)), nullptr);
    }
    EXPECT_EQ(z_.info().used, 0u);
    EXPECT_EQ(z_.info().expiries, 3u);
    EXPECT_EQ(pins(slot_a_), 0);
}

TEST_F(SessionTableTest, FullBucketEvictsTheLeastRecentlyUsed)
{
    const uint32_t ways = affinity::kSessionWays;
    const uint32_t timeout = 1000000;

    // Fill one bucket, one entry per second.
    for (uint32_t i = 0; i < ways; i++) {
        affinity::SessionTable table(zone_, 10 + i, timeout);
        table.repin(table.insert(neighbour(i)), peer_a_);
    }
    ASSERT_EQ(z_.info().used, ways);

    // The oldest entry is used again.
    {
        affinity::SessionTable table(zone_, 100, timeout);
        ASSERT_NE(table.find(neighbour(0)), nullptr);
    }

    // A new key in the full bucket evicts the least recently used one:
    // neighbour(1), not neighbour(0) which was inserted first.
    {
        affinity::SessionTable table(zone_, 101, timeout);
        ASSERT_EQ(table.find(neighbour(ways)), nullptr);
        table.repin(table.insert(neighbour(ways)), peer_b_);
    }

    EXPECT_EQ(z_.info().evictions, 1u) << "the keys did not share a bucket";
    EXPECT_EQ(z_.info().used, ways);
    EXPECT_EQ(pins(slot_a_), int64_t(ways) - 1);
    EXPECT_EQ(pins(slot_b_), 1);

    affinity::SessionTable table(zone_, 102, timeout);
    EXPECT_NE(table.find(neighbour(0)), nullptr);
    EXPECT_EQ(table.find(neighbour(1)), nullptr);
    for (uint32_t i = 2; i <= ways; i++) {
        EXPECT_NE(table.find(neighbour(i)), nullptr) << i;
    }
}

TEST_F(SessionTableTest, FullBucketReusesExpiredEntriesBeforeEvicting)
{
    const uint32_t ways = affinity::kSessionWays;

    for (uint32_t i = 0; i < ways; i++) {
        // Entry 3 is much older than the others.
        uint32_t t = i == 3 ? 10 : 1000 + i;
        affinity::SessionTable table(zone_, t, 500);
        table.repin(table.insert(neighbour(i)), peer_a_);
    }

    {
        affinity::SessionTable table(zone_, 1100, 500);
        table.repin(table.insert(neighbour(ways)), peer_b_);
    }

    EXPECT_EQ(z_.info().evictions, 0u);
    EXPECT_EQ(z_.info().expiries, 1u);
    EXPECT_EQ(z_.info().used, ways);
    EXPECT_EQ(pins(slot_a_) + pins(slot_b_), int64_t(ways));

    affinity::SessionTable table(zone_, 1101, 500);
    EXPECT_EQ(table.find(neighbour(3)), nullptr);
    EXPECT_NE(table.find(neighbour(ways)), nullptr);
}

TEST(SessionTableGeometry, TableFillsTheRegionAfterTheRows)
{
    // The header, the peer slots, the probes and the worker rows (at most
    // a quarter of the rest) come first; the table has every bucket that
    // fits after them.
    const size_t fixed = sizeof(affinity::ZoneHeader)
                         + affinity::kPeerSlots * sizeof(affinity::PeerSlot)
                         + affinity::kCapacityProbes
                               * sizeof(affinity::CapacityProbe);
    const size_t row_bytes = sizeof(affinity::WorkerRow)
                             + affinity::kPeerSlots * sizeof(int32_t);

    for (size_t size : {size_t{AFFINITY_ZONE_MIN_SIZE}, size_t{1} << 20,
                        size_t{3} << 20, size_t{8} << 20}) {
        for (uint32_t rows : {1u, 16u, 64u, 256u, 1000u}) {
            AlignedBuffer buf(size);
            affinity_zone_t *zone = nullptr;
            ASSERT_EQ(affinity_zone_attach(buf.get(), size,
                                           AFFINITY_ZONE_SESSIONS, rows,
                                           &zone, nullptr, 0),
                      AFFINITY_ATTACH_CREATED)
                << size << " " << rows;

            affinity_zone_info_t info{};
            affinity_zone_info(zone, &info);
            uint64_t buckets = info.capacity / affinity::kSessionWays;
            size_t used = fixed + info.rows * row_bytes
                          + buckets * sizeof(affinity::SessionBucket);

            EXPECT_GE(info.rows, 4u);
            EXPECT_LE(info.rows, std::max<uint32_t>(rows, 4u));
            EXPECT_LE(info.rows, uint32_t{AFFINITY_MAX_WORKER_ROWS});
            EXPECT_LE(info.rows * row_bytes,
                      std::max<size_t>((size - fixed) / 4, 4 * row_bytes));
            EXPECT_LE(used, size);
            EXPECT_GT(used + sizeof(affinity::SessionBucket) + 128, size)
                << "room for another bucket";
        }
    }
}

}  // namespace

TEST_F(SessionTableTest, EvictionOrderIsExactWithinOneSecond)
{
    // Every entry used in the same second: order of use alone decides.
    const uint32_t ways = affinity::kSessionWays;
    const uint32_t now = 500;
    affinity::SessionTable table(zone_, now, 3600);

    for (uint32_t i = 0; i < ways; i++) {
        table.repin(table.insert(neighbour(i)), peer_a_);
    }
    ASSERT_NE(table.find(neighbour(0)), nullptr);

    // Two new keys push out the two least recently used: 1 and 2.
    table.repin(table.insert(neighbour(ways)), peer_b_);
    table.repin(table.insert(neighbour(ways + 1)), peer_b_);
    EXPECT_EQ(z_.info().evictions, 2u) << "the keys did not share a bucket";

    EXPECT_EQ(table.find(neighbour(1)), nullptr);
    EXPECT_EQ(table.find(neighbour(2)), nullptr);
    EXPECT_NE(table.find(neighbour(0)), nullptr);
    EXPECT_NE(table.find(neighbour(ways)), nullptr);
    EXPECT_NE(table.find(neighbour(ways + 1)), nullptr);
    for (uint32_t i = 3; i < ways; i++) {
        EXPECT_NE(table.find(neighbour(i)), nullptr) << i;
    }
}

// The shared-memory zone: attaching, reattaching, and the peer counters.
#include <cstring>
#include <algorithm>
#include <set>
#include <vector>
#include <string>

#include <gtest/gtest.h>

#include "affinity_core.h"
#include "test_support.h"

using namespace affinity_test;

namespace {

constexpr size_t kMiB = 1 << 20;

affinity_attach_e attach(void *region, size_t size, affinity_zone_t **zone,
                         std::string *error = nullptr,
                         affinity_zone_kind_e kind = AFFINITY_ZONE_SESSIONS)
{
    char err[256];
    std::memset(err, 'x', sizeof(err));
    err[sizeof(err) - 1] = '\0';
    affinity_attach_e rc =
        affinity_zone_attach(region, size, kind, kTestRows, zone, err,
                             sizeof(err));
    if (error) {
        *error = err;
    }
    return rc;
}

// Counts a request on the peer that holds slot.
void acquire_slot(affinity_zone_t *zone, uint32_t slot, uint32_t now)
{
    affinity_peer_stats_t s{};
    affinity_zone_peer_stats(zone, slot, &s);
    affinity_zone_peer_acquire(zone, AFFINITY_NO_ROW, s.id, slot, now);
}

affinity_zone_info_t info_of(const affinity_zone_t *zone)
{
    affinity_zone_info_t info{};
    affinity_zone_info(zone, &info);
    return info;
}

TEST(ZoneAttach, FreshRegionIsCreated)
{
    AlignedBuffer buf(kMiB);
    affinity_zone_t *zone = nullptr;

    ASSERT_EQ(attach(buf.get(), buf.size(), &zone), AFFINITY_ATTACH_CREATED);
    ASSERT_NE(zone, nullptr);

    affinity_zone_info_t info = info_of(zone);
    EXPECT_EQ(info.kind, uint32_t{AFFINITY_ZONE_SESSIONS});
    EXPECT_GT(info.capacity, 0u);
    EXPECT_EQ(info.used, 0u);
    EXPECT_EQ(info.evictions, 0u);
    EXPECT_EQ(info.expiries, 0u);
    EXPECT_EQ(info.peer_slots, uint32_t{AFFINITY_MAX_PEERS});
    EXPECT_EQ(info.peer_slots_used, 0u);

    // Most of a 1 MiB region holds sessions, at well under 1 KiB each.
    EXPECT_GT(info.capacity, kMiB / 1024);
    EXPECT_LT(info.capacity, kMiB);
}

TEST(ZoneAttach, CreatedRegardlessOfPreviousContents)
{
    for (unsigned char fill : {0x00, 0x5a, 0xff}) {
        AlignedBuffer buf(kMiB, fill);
        affinity_zone_t *zone = nullptr;
        ASSERT_EQ(attach(buf.get(), buf.size(), &zone),
                  AFFINITY_ATTACH_CREATED) << int(fill);
        EXPECT_EQ(info_of(zone).used, 0u);
        EXPECT_EQ(info_of(zone).peer_slots_used, 0u);
    }
}

TEST(ZoneAttach, CapacityGrowsWithTheRegion)
{
    AlignedBuffer small(AFFINITY_ZONE_MIN_SIZE), mid(kMiB), big(4 * kMiB);
    affinity_zone_t *zs, *zm, *zb;

    ASSERT_EQ(attach(small.get(), small.size(), &zs), AFFINITY_ATTACH_CREATED);
    ASSERT_EQ(attach(mid.get(), mid.size(), &zm), AFFINITY_ATTACH_CREATED);
    ASSERT_EQ(attach(big.get(), big.size(), &zb), AFFINITY_ATTACH_CREATED);

    EXPECT_GT(info_of(zs).capacity, 0u);
    EXPECT_GT(info_of(zm).capacity, info_of(zs).capacity);
    EXPECT_GT(info_of(zb).capacity, info_of(zm).capacity);
}

TEST(ZoneAttach, AttachingAgainReusesTheZone)
{
    AlignedBuffer buf(kMiB);
    affinity_zone_t *zone = nullptr;
    ASSERT_EQ(attach(buf.get(), buf.size(), &zone), AFFINITY_ATTACH_CREATED);

    // Some state: peers with counters, and pinned sessions.
    Upstream up(zone, {1, 1, 1});
    Router router(zone, up);
    std::vector<int> pinned;
    for (size_t k = 0; k < 50; k++) {
        Routed r = router.route_key(key_name(k));
        ASSERT_EQ(r.rc, 0);
        ASSERT_EQ(r.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_NEW});
        pinned.push_back(r.decision.peer);
    }
    affinity_zone_info_t before = info_of(zone);
    affinity_peer_stats_t stats0 = up.stats(0);

    // The next configuration cycle attaches to the same region.
    affinity_zone_t *again = nullptr;
    std::string err;
    ASSERT_EQ(attach(buf.get(), buf.size(), &again, &err),
              AFFINITY_ATTACH_REUSED) << err;
    ASSERT_NE(again, nullptr);

    affinity_zone_info_t after = info_of(again);
    EXPECT_EQ(after.seed, before.seed);
    EXPECT_EQ(after.capacity, before.capacity);
    EXPECT_EQ(after.used, 50u);
    EXPECT_EQ(after.peer_slots_used, 3u);

    // Same key hashes, same slots, same counters.
    EXPECT_EQ(affinity_zone_key_hash(again, "k", 1),
              affinity_zone_key_hash(zone, "k", 1));
    for (size_t i = 0; i < up.size(); i++) {
        EXPECT_EQ(affinity_zone_peer_slot(again, up.peer(i).id, 0),
                  up.peer(i).slot);
    }
    affinity_peer_stats_t s{};
    affinity_zone_peer_stats(again, up.peer(0).slot, &s);
    EXPECT_EQ(s.id, stats0.id);
    EXPECT_EQ(s.inflight, stats0.inflight);
    EXPECT_EQ(s.requests, stats0.requests);
    EXPECT_EQ(s.pins, stats0.pins);

    // And the pins are still there.
    Router router2(again, up);
    for (size_t k = 0; k < 50; k++) {
        Routed r = router2.route_key_released(key_name(k));
        ASSERT_EQ(r.rc, 0);
        EXPECT_EQ(r.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_HIT});
        EXPECT_EQ(r.decision.peer, pinned[k]);
    }
}

TEST(ZoneAttach, TooSmallOrMisaligned)
{
    AlignedBuffer buf(2 * AFFINITY_ZONE_MIN_SIZE);
    affinity_zone_t *zone = reinterpret_cast<affinity_zone_t *>(&buf);
    std::string err;

    EXPECT_EQ(attach(buf.get(), AFFINITY_ZONE_MIN_SIZE - 1, &zone, &err),
              AFFINITY_ATTACH_TOO_SMALL);
    EXPECT_EQ(zone, nullptr);
    EXPECT_FALSE(err.empty());

    zone = reinterpret_cast<affinity_zone_t *>(&buf);
    EXPECT_EQ(attach(buf.get(), 0, &zone), AFFINITY_ATTACH_TOO_SMALL);
    EXPECT_EQ(zone, nullptr);

    zone = reinterpret_cast<affinity_zone_t *>(&buf);
    EXPECT_EQ(attach(buf.get(), 4096, &zone), AFFINITY_ATTACH_TOO_SMALL);
    EXPECT_EQ(zone, nullptr);

    // Large enough but not 64-byte aligned.
    for (size_t shift : {1u, 8u, 16u, 32u, 63u}) {
        zone = reinterpret_cast<affinity_zone_t *>(&buf);
        err.clear();
        EXPECT_EQ(attach(static_cast<char *>(buf.get()) + shift,
                         AFFINITY_ZONE_MIN_SIZE, &zone, &err),
                  AFFINITY_ATTACH_TOO_SMALL) << "shift " << shift;
        EXPECT_EQ(zone, nullptr);
        EXPECT_FALSE(err.empty());
    }

    zone = reinterpret_cast<affinity_zone_t *>(&buf);
    EXPECT_EQ(attach(nullptr, kMiB, &zone), AFFINITY_ATTACH_TOO_SMALL);
    EXPECT_EQ(zone, nullptr);

    // Exactly the minimum is enough.
    EXPECT_EQ(attach(buf.get(), AFFINITY_ZONE_MIN_SIZE, &zone),
              AFFINITY_ATTACH_CREATED);
    EXPECT_NE(zone, nullptr);
    EXPECT_GT(info_of(zone).capacity, 0u);
}

TEST(ZoneAttach, DifferentSizeIsIncompatible)
{
    AlignedBuffer buf(2 * kMiB);
    affinity_zone_t *zone = nullptr;
    ASSERT_EQ(attach(buf.get(), kMiB, &zone), AFFINITY_ATTACH_CREATED);

    Upstream up(zone, {1, 1});
    Router router(zone, up);
    Routed first = router.route_key_released("kept");
    ASSERT_EQ(first.rc, 0);
    uint64_t seed = info_of(zone).seed;

    for (size_t size : {kMiB / 2, kMiB + 64, 2 * kMiB}) {
        affinity_zone_t *other = reinterpret_cast<affinity_zone_t *>(&buf);
        std::string err;
        EXPECT_EQ(attach(buf.get(), size, &other, &err),
                  AFFINITY_ATTACH_INCOMPATIBLE) << size;
        EXPECT_EQ(other, nullptr);
        EXPECT_FALSE(err.empty());
        EXPECT_NE(err.find_first_not_of('x'), std::string::npos);
        EXPECT_LT(err.size(), 255u) << "error not NUL-terminated";
    }

    // The refused attaches left the zone alone.
    affinity_zone_t *again = nullptr;
    ASSERT_EQ(attach(buf.get(), kMiB, &again), AFFINITY_ATTACH_REUSED);
    EXPECT_EQ(info_of(again).seed, seed);
    EXPECT_EQ(info_of(again).used, 1u);
    Router router2(again, up);
    Routed r = router2.route_key_released("kept");
    EXPECT_EQ(r.decision.route, uint32_t{AFFINITY_ROUTE_SESSION_HIT});
    EXPECT_EQ(r.decision.peer, first.decision.peer);
}

TEST(ZoneAttach, DifferentKindIsIncompatible)
{
    AlignedBuffer buf(kMiB);
    affinity_zone_t *zone = nullptr;
    ASSERT_EQ(attach(buf.get(), buf.size(), &zone), AFFINITY_ATTACH_CREATED);

    std::string err;
    affinity_zone_t *other = nullptr;
    EXPECT_EQ(attach(buf.get(), buf.size(), &other, &err,
                     static_cast<affinity_zone_kind_e>(2)),
              AFFINITY_ATTACH_INCOMPATIBLE);
    EXPECT_EQ(other, nullptr);
    EXPECT_FALSE(err.empty());
}

TEST(ZoneAttach, ErrorBufferIsOptionalAndBounded)
{
    AlignedBuffer buf(kMiB);
    affinity_zone_t *zone = nullptr;

    EXPECT_EQ(affinity_zone_attach(buf.get(), 100, AFFINITY_ZONE_SESSIONS,
                                   kTestRows, &zone, nullptr, 0),
              AFFINITY_ATTACH_TOO_SMALL);

    char tiny[8];
    std::memset(tiny, 'x', sizeof(tiny));
    EXPECT_EQ(affinity_zone_attach(buf.get(), 100, AFFINITY_ZONE_SESSIONS,
                                   kTestRows, &zone, tiny, sizeof(tiny)),
              AFFINITY_ATTACH_TOO_SMALL);
    EXPECT_NE(std::memchr(tiny, '\0', sizeof(tiny)), nullptr);
    EXPECT_GT(std::strlen(tiny), 0u);

    ASSERT_EQ(affinity_zone_attach(buf.get(), kMiB, AFFINITY_ZONE_SESSIONS,
                                   kTestRows, &zone, nullptr, 0),
              AFFINITY_ATTACH_CREATED);
    EXPECT_EQ(affinity_zone_attach(buf.get(), kMiB / 2,
                                   AFFINITY_ZONE_SESSIONS, kTestRows, &zone,
                                   nullptr, 0),
              AFFINITY_ATTACH_INCOMPATIBLE);
    std::memset(tiny, 'x', sizeof(tiny));
    EXPECT_EQ(affinity_zone_attach(buf.get(), kMiB / 2,
                                   AFFINITY_ZONE_SESSIONS, kTestRows, &zone,
                                   tiny, sizeof(tiny)),
              AFFINITY_ATTACH_INCOMPATIBLE);
    EXPECT_NE(std::memchr(tiny, '\0', sizeof(tiny)), nullptr);
}

TEST(ZonePeerSlots, ClaimIsIdempotentAndDistinct)
{
    TestZone z;
    std::set<uint32_t> slots;

    for (size_t i = 0; i < 20; i++) {
        uint64_t id = peer_id_of(peer_name(i));
        uint32_t slot = affinity_zone_peer_slot(z.get(), id, 0);
        ASSERT_NE(slot, AFFINITY_NO_SLOT);
        EXPECT_LT(slot, z.info().peer_slots);
        EXPECT_TRUE(slots.insert(slot).second) << "slot shared by two ids";

        // Claiming again gives the same slot and claims nothing new.
        EXPECT_EQ(affinity_zone_peer_slot(z.get(), id, 0), slot);
        EXPECT_EQ(affinity_zone_peer_slot(z.get(), id, 0), slot);
        EXPECT_EQ(z.info().peer_slots_used, i + 1);
    }

    // Earlier ids still find their slots.
    for (size_t i = 0; i < 20; i++) {
        EXPECT_EQ(slots.count(affinity_zone_peer_slot(
                      z.get(), peer_id_of(peer_name(i)), 0)),
                  1u);
    }
    EXPECT_EQ(z.info().peer_slots_used, 20u);
}

TEST(ZonePeerSlots, IdsThatCollideStillGetTheirOwnSlots)
{
    // Ids equal modulo the table size (and modulo smaller powers of two).
    TestZone z;
    std::set<uint32_t> slots;
    for (uint64_t k = 1; k <= 10; k++) {
        uint64_t id = 7 + k * 256 * 1024;
        uint32_t slot = affinity_zone_peer_slot(z.get(), id, 0);
        ASSERT_NE(slot, AFFINITY_NO_SLOT);
        EXPECT_TRUE(slots.insert(slot).second);
    }
    for (uint64_t k = 1; k <= 10; k++) {
        uint64_t id = 7 + k * 256 * 1024;
        affinity_peer_stats_t s{};
        affinity_zone_peer_stats(z.get(),
                                 affinity_zone_peer_slot(z.get(), id, 0), &s);
        EXPECT_EQ(s.id, id);
    }
}

TEST(ZonePeerSlots, StatsStartAtZero)
{
    TestZone z;
    uint64_t id = peer_id_of("10.1.2.3:80");
    uint32_t slot = affinity_zone_peer_slot(z.get(), id, 0);
    ASSERT_NE(slot, AFFINITY_NO_SLOT);

    affinity_peer_stats_t s;
    std::memset(&s, 0x77, sizeof(s));
    affinity_zone_peer_stats(z.get(), slot, &s);
    EXPECT_EQ(s.id, id);
    EXPECT_EQ(s.inflight, 0);
    EXPECT_EQ(s.requests, 0u);
    EXPECT_EQ(s.pins, 0);

    // A slot that is nobody's reads as all zeroes.
    std::memset(&s, 0x77, sizeof(s));
    affinity_zone_peer_stats(z.get(), AFFINITY_NO_SLOT, &s);
    EXPECT_EQ(s.id, 0u);
    EXPECT_EQ(s.inflight, 0);
    EXPECT_EQ(s.requests, 0u);
    EXPECT_EQ(s.pins, 0);
}

TEST(ZonePeerSlots, AcquireAndReleaseMoveInflight)
{
    TestZone z;
    uint32_t a = affinity_zone_peer_slot(z.get(), peer_id_of("a:1"), 0);
    uint32_t b = affinity_zone_peer_slot(z.get(), peer_id_of("b:1"), 0);
    ASSERT_NE(a, b);

    auto stats = [&](uint32_t slot) {
        affinity_peer_stats_t s{};
        affinity_zone_peer_stats(z.get(), slot, &s);
        return s;
    };

    for (int i = 0; i < 5; i++) {
        acquire_slot(z.get(), a, 0);
    }
    EXPECT_EQ(stats(a).inflight, 5);
    EXPECT_EQ(stats(a).requests, 5u);
    EXPECT_EQ(stats(b).inflight, 0);
    EXPECT_EQ(stats(b).requests, 0u);

    affinity_zone_peer_release(z.get(), AFFINITY_NO_ROW, a);
    affinity_zone_peer_release(z.get(), AFFINITY_NO_ROW, a);
    EXPECT_EQ(stats(a).inflight, 3);
    EXPECT_EQ(stats(a).requests, 5u) << "requests count starts, not ends";

    acquire_slot(z.get(), b, 0);
    EXPECT_EQ(stats(b).inflight, 1);
    EXPECT_EQ(stats(a).inflight, 3);

    for (int i = 0; i < 3; i++) {
        affinity_zone_peer_release(z.get(), AFFINITY_NO_ROW, a);
    }
    EXPECT_EQ(stats(a).inflight, 0);

    // No slot: ignored.
    acquire_slot(z.get(), AFFINITY_NO_SLOT, 0);
    affinity_zone_peer_release(z.get(), AFFINITY_NO_ROW, AFFINITY_NO_SLOT);
    EXPECT_EQ(stats(a).inflight, 0);
    EXPECT_EQ(stats(b).inflight, 1);
}

TEST(ZonePeerSlots, TableRefusesThe257thId)
{
    TestZone z;
    std::set<uint32_t> slots;

    for (size_t i = 0; i < AFFINITY_MAX_PEERS; i++) {
        uint32_t slot =
            affinity_zone_peer_slot(z.get(), peer_id_of(peer_name(i)), 0);
        ASSERT_NE(slot, AFFINITY_NO_SLOT) << i;
        slots.insert(slot);
    }
    EXPECT_EQ(slots.size(), size_t{AFFINITY_MAX_PEERS});
    EXPECT_EQ(z.info().peer_slots_used, uint32_t{AFFINITY_MAX_PEERS});

    EXPECT_EQ(affinity_zone_peer_slot(
                  z.get(), peer_id_of(peer_name(AFFINITY_MAX_PEERS)), 0),
              AFFINITY_NO_SLOT);
    EXPECT_EQ(z.info().peer_slots_used, uint32_t{AFFINITY_MAX_PEERS});

    // The table being full does not lose the ids it has.
    for (size_t i = 0; i < AFFINITY_MAX_PEERS; i++) {
        uint64_t id = peer_id_of(peer_name(i));
        uint32_t slot = affinity_zone_peer_slot(z.get(), id, 0);
        ASSERT_NE(slot, AFFINITY_NO_SLOT);
        affinity_peer_stats_t s{};
        affinity_zone_peer_stats(z.get(), slot, &s);
        EXPECT_EQ(s.id, id);
    }
}

// Peers that come and go (servers with "resolve") would use up a table
// whose slots are never freed: a full table hands the slot of the peer idle
// longest, with nothing in flight, to the new one after a minute unused.
TEST(ZonePeerSlots, FullTableHandsOverTheIdlestSlot)
{
    TestZone z;
    const uint32_t t0 = 100000;
    std::vector<uint32_t> slot_of(AFFINITY_MAX_PEERS);

    for (size_t i = 0; i < AFFINITY_MAX_PEERS; i++) {
        slot_of[i] = affinity_zone_peer_slot(
            z.get(), peer_id_of(peer_name(i)), t0 + uint32_t(i % 16));
        ASSERT_NE(slot_of[i], AFFINITY_NO_SLOT);
    }

    const uint64_t newcomer = peer_id_of(peer_name(AFFINITY_MAX_PEERS));

    // Nobody has been idle for a minute yet.
    EXPECT_EQ(affinity_zone_peer_slot(z.get(), newcomer, t0 + 59),
              AFFINITY_NO_SLOT);
    EXPECT_EQ(z.info().peer_slots_missing, 1u);

    // Peer 16 (claimed at t0 like peer 0) has a request in flight, and
    // peer 0 served one later: of the slots idle since t0, peer 32's is
    // the first free one found.  Peers claimed later are younger.
    acquire_slot(z.get(), slot_of[16], t0);
    acquire_slot(z.get(), slot_of[0], t0 + 30);
    affinity_zone_peer_release(z.get(), AFFINITY_NO_ROW, slot_of[0]);

    // At t0 + 89, the slots claimed at t0 have been idle for 89 s and
    // peer 0's for 59 s only.
    uint32_t given = affinity_zone_peer_slot(z.get(), newcomer, t0 + 89);
    ASSERT_NE(given, AFFINITY_NO_SLOT);
    EXPECT_NE(given, slot_of[0]);
    EXPECT_NE(given, slot_of[16]);

    affinity_peer_stats_t s{};
    affinity_zone_peer_stats(z.get(), given, &s);
    EXPECT_EQ(s.id, newcomer);
    EXPECT_EQ(s.requests, 0u);
    EXPECT_EQ(s.inflight, 0);
    EXPECT_EQ(z.info().peer_slots_reclaimed, 1u);
    EXPECT_EQ(z.info().peer_slots_used, uint32_t{AFFINITY_MAX_PEERS});

    // It was the slot of a peer claimed at t0 (i % 16 == 0).
    size_t old = std::find(slot_of.begin(), slot_of.end(), given)
                 - slot_of.begin();
    ASSERT_LT(old, slot_of.size());
    EXPECT_EQ(old % 16, 0u);

    // The newcomer keeps its slot; the old peer is refused until another
    // slot has been idle long enough.
    EXPECT_EQ(affinity_zone_peer_slot(z.get(), newcomer, t0 + 89), given);
    uint32_t back = affinity_zone_peer_slot(z.get(),
                                            peer_id_of(peer_name(old)),
                                            t0 + 89);
    EXPECT_NE(back, given);
}

// A peer whose slot went to another peer is routed without its counts
// rather than with the newcomer's when no slot can be had, and the zone
// says so.
TEST(ZonePeerSlots, RoutingIgnoresASlotHandedOver)
{
    TestZone z;
    Upstream up(z.get(), {1, 1});

    // Fill the table so that peer 0's slot is the only idle one.
    const uint32_t t0 = 100000;
    for (size_t i = 2; i < AFFINITY_MAX_PEERS; i++) {
        ASSERT_NE(affinity_zone_peer_slot(z.get(), peer_id_of(peer_name(i)),
                                          t0 + 5000),
                  AFFINITY_NO_SLOT);
    }
    acquire_slot(z.get(), up.peer(1).slot, t0 + 5000);

    const uint64_t newcomer = peer_id_of("newcomer:1");
    uint32_t given = affinity_zone_peer_slot(z.get(), newcomer, t0 + 5000);
    ASSERT_EQ(given, up.peer(0).slot);
    for (int i = 0; i < 10; i++) {
        acquire_slot(z.get(), given, t0 + 5000);
    }

    // Peer 0 looks idle (0 in flight), not loaded with the newcomer's 10,
    // and a request routed to it does not count on the newcomer.
    Router router(z.get(), up);
    router.now = t0 + 5000;
    Routed r = router.route_nokey();
    ASSERT_EQ(r.rc, 0);
    EXPECT_EQ(r.decision.peer, 0);

    affinity_peer_stats_t s{};
    affinity_zone_peer_stats(z.get(), given, &s);
    EXPECT_EQ(s.inflight, 10);
    EXPECT_EQ(s.id, newcomer);
    EXPECT_EQ(r.decision.slot, AFFINITY_NO_SLOT);
    EXPECT_GE(z.info().peer_slots_missing, 1u);
}

// A request counted outside routing (backup servers, sticky hints) names
// its peer: a slot that went to another peer is not counted on.
TEST(ZonePeerSlots, AcquireRefusesASlotThatIsNotThePeers)
{
    TestZone z;
    uint64_t a = peer_id_of("a:1"), b = peer_id_of("b:1");
    uint32_t slot = affinity_zone_peer_slot(z.get(), a, 0);

    EXPECT_EQ(affinity_zone_peer_acquire(z.get(), AFFINITY_NO_ROW, b, slot,
                                         0),
              -1);
    EXPECT_EQ(affinity_zone_peer_acquire(z.get(), AFFINITY_NO_ROW, a,
                                         AFFINITY_NO_SLOT, 0),
              -1);

    affinity_peer_stats_t s{};
    affinity_zone_peer_stats(z.get(), slot, &s);
    EXPECT_EQ(s.inflight, 0);
    EXPECT_EQ(s.requests, 0u);

    EXPECT_EQ(affinity_zone_peer_acquire(z.get(), AFFINITY_NO_ROW, a, slot,
                                         0),
              0);
    affinity_zone_peer_stats(z.get(), slot, &s);
    EXPECT_EQ(s.inflight, 1);
}

// A slot handed over starts the new peer's counters from zero (a request
// counted on the old peer at that very moment is kept: zone.cpp,
// hand_over()).
TEST(ZonePeerSlots, HandOverRestartsTheCounters)
{
    TestZone z;
    const uint32_t t0 = 100000;
    std::vector<uint32_t> slot_of(AFFINITY_MAX_PEERS);

    for (size_t i = 0; i < AFFINITY_MAX_PEERS; i++) {
        slot_of[i] = affinity_zone_peer_slot(z.get(),
                                             peer_id_of(peer_name(i)), t0);
    }
    for (size_t i = 1; i < AFFINITY_MAX_PEERS; i++) {
        acquire_slot(z.get(), slot_of[i], t0 + 100);
    }

    // Peer 0 served and ended 3 requests at t0; one more is counted on it
    // just as its slot goes to a newcomer.
    for (int i = 0; i < 3; i++) {
        acquire_slot(z.get(), slot_of[0], t0);
        affinity_zone_peer_release(z.get(), AFFINITY_NO_ROW, slot_of[0]);
    }
    uint32_t given = affinity_zone_peer_slot(z.get(), peer_id_of("new:1"),
                                             t0 + 100);
    ASSERT_EQ(given, slot_of[0]);

    affinity_peer_stats_t s{};
    affinity_zone_peer_stats(z.get(), given, &s);
    EXPECT_EQ(s.requests, 0u);
    EXPECT_EQ(s.inflight, 0);
    EXPECT_EQ(s.routes[AFFINITY_ROUTE_FALLBACK], 0u);
}

// A peer that lost its slot claims another as soon as one is free of
// in-flight requests and idle: it is never balanced blind while a slot can
// be had, and its requests are counted there.
TEST(ZonePeerSlots, RoutingClaimsASlotForAPeerWithout)
{
    TestZone z;
    Upstream up(z.get(), {1, 1});
    const uint32_t t0 = 100000;

    for (size_t i = 2; i < AFFINITY_MAX_PEERS; i++) {
        ASSERT_NE(affinity_zone_peer_slot(z.get(), peer_id_of(peer_name(i)),
                                          t0),
                  AFFINITY_NO_SLOT);
    }

    // Peer 0's slot goes to a newcomer (peer 0 idle since time 0, peer 1
    // served a request at t0).
    acquire_slot(z.get(), up.peer(1).slot, t0);
    affinity_zone_peer_release(z.get(), AFFINITY_NO_ROW, up.peer(1).slot);
    uint32_t old_slot = up.peer(0).slot;
    ASSERT_EQ(affinity_zone_peer_slot(z.get(), peer_id_of("newcomer:1"),
                                      t0),
              old_slot);

    // A minute later the others are idle too: routing peer 0 claims one.
    Router router(z.get(), up);
    router.now = t0 + 120;
    Routed r;
    do {
        r = router.route_nokey();
        ASSERT_EQ(r.rc, 0);
    } while (r.decision.peer != 0);

    // (Possibly its old slot again: the newcomer has been idle as long.)
    EXPECT_NE(r.decision.slot, AFFINITY_NO_SLOT);
    EXPECT_EQ(up.peer(0).slot, r.decision.slot);
    affinity_peer_stats_t s{};
    affinity_zone_peer_stats(z.get(), r.decision.slot, &s);
    EXPECT_EQ(s.id, up.peer(0).id);
    EXPECT_EQ(s.inflight, 1);
    EXPECT_EQ(z.info().peer_slots_missing, 0u);
}

}  // namespace

// Hashes: peer ids, ring positions of keys, seeded key hashes.
#include <cstring>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "affinity_core.h"
#include "hashing.h"
#include "test_support.h"

using namespace affinity_test;

namespace {

uint64_t id_of(const std::string &s)
{
    return affinity_peer_id(s.data(), s.size());
}

TEST(PeerId, SameNameSameId)
{
    std::string a = "10.0.0.1:8000";
    std::string b(a.begin(), a.end());     // another buffer, same text

    EXPECT_EQ(id_of(a), id_of(b));
    EXPECT_EQ(id_of(a), id_of("10.0.0.1:8000"));
}

TEST(PeerId, DifferentNamesDifferentIds)
{
    std::set<uint64_t> ids;
    const size_t n = 10000;

    for (size_t i = 0; i < n; i++) {
        ids.insert(id_of(peer_name(i)));
    }

    EXPECT_EQ(ids.size(), n);

    // Names that differ only slightly.
    EXPECT_NE(id_of("10.0.0.1:8000"), id_of("10.0.0.1:8001"));
    EXPECT_NE(id_of("10.0.0.1:8000"), id_of("10.0.0.10:800"));
    EXPECT_NE(id_of("backend:80"), id_of("Backend:80"));
    EXPECT_NE(id_of("a"), id_of("a "));
}

TEST(PeerId, NeverZero)
{
    EXPECT_NE(affinity_peer_id("", 0), 0u);
    EXPECT_NE(affinity_peer_id(nullptr, 0), 0u);

    for (size_t i = 0; i < 10000; i++) {
        EXPECT_NE(id_of(peer_name(i)), 0u);
    }

    // Every one-byte name, through the internal function as well.
    for (unsigned c = 0; c < 256; c++) {
        char ch = static_cast<char>(c);
        EXPECT_NE(affinity::peer_id(&ch, 1), 0u);
    }
}

TEST(PeerId, UsesOnlyTheGivenBytes)
{
    const char text[] = "10.0.0.1:8000GARBAGE";
    EXPECT_EQ(affinity_peer_id(text, 13), id_of("10.0.0.1:8000"));
}

TEST(PeerId, IndependentOfZoneAndOfPeerList)
{
    // Ids come from the name alone: two zones, two upstream lists, the same
    // server -> the same id.
    TestZone z1, z2;
    Upstream u1(z1.get(), {1, 1, 1});
    Upstream u2(z2.get(), {2, 1});

    EXPECT_EQ(u1.peer(0).id, u2.peer(0).id);
    EXPECT_EQ(u1.peer(1).id, u2.peer(1).id);
    EXPECT_EQ(u1.peer(0).id, id_of(peer_name(0)));
}

TEST(RingHash, StableAndIndependentOfZone)
{
    TestZone z1, z2;
    affinity_zone_info_t i1 = z1.info(), i2 = z2.info();

    // Two zones get their own random seeds...
    ASSERT_NE(i1.seed, i2.seed);

    std::string key = "user-42";

    // ...so the zone key hash of a key differs between them...
    EXPECT_NE(affinity_zone_key_hash(z1.get(), key.data(), key.size()),
              affinity_zone_key_hash(z2.get(), key.data(), key.size()));

    // ...while its ring position depends on the key alone.
    uint64_t h = affinity_ring_hash(key.data(), key.size());
    EXPECT_EQ(h, affinity_ring_hash(key.data(), key.size()));
    EXPECT_EQ(h, affinity::ring_key_hash(key.data(), key.size()));
    EXPECT_EQ(h, affinity_ring_hash("user-42", 7));

    EXPECT_NE(h, affinity_ring_hash("user-43", 7));
}

TEST(RingHash, DiffersFromPeerIdOfTheSameBytes)
{
    // Distinct seeds: a key never lands exactly on a peer's own hash.
    std::string s = "10.0.0.1:8000";
    EXPECT_NE(affinity_ring_hash(s.data(), s.size()), id_of(s));
}

TEST(ZoneKeyHash, StableWithinAZoneAndNeverZero)
{
    TestZone z;
    std::set<uint64_t> hashes;

    for (size_t i = 0; i < 10000; i++) {
        std::string k = key_name(i);
        uint64_t h = affinity_zone_key_hash(z.get(), k.data(), k.size());
        EXPECT_NE(h, 0u);
        EXPECT_EQ(h, affinity_zone_key_hash(z.get(), k.data(), k.size()));
        hashes.insert(h);
    }

    EXPECT_EQ(hashes.size(), 10000u);
    EXPECT_NE(affinity_zone_key_hash(z.get(), "", 0), 0u);
}

TEST(AffinityHash, SeedChangesTheHash)
{
    const char data[] = "some session key";
    size_t len = sizeof(data) - 1;

    uint64_t h0 = affinity_hash(data, len, 0);
    uint64_t h1 = affinity_hash(data, len, 1);
    uint64_t h2 = affinity_hash(data, len, 0x9e3779b97f4a7c15ULL);

    EXPECT_NE(h0, h1);
    EXPECT_NE(h0, h2);
    EXPECT_NE(h1, h2);

    // Same seed, same input: same hash.
    EXPECT_EQ(h1, affinity_hash(data, len, 1));

    // Seeds matter for short and empty inputs too.
    EXPECT_NE(affinity_hash("", 0, 1), affinity_hash("", 0, 2));
    EXPECT_NE(affinity_hash("x", 1, 1), affinity_hash("x", 1, 2));

    // And every seed gives a different function over many seeds.
    std::set<uint64_t> seen;
    for (uint64_t seed = 0; seed < 1000; seed++) {
        seen.insert(affinity_hash(data, len, seed));
    }
    EXPECT_EQ(seen.size(), 1000u);
}

TEST(AffinityHash, DependsOnEveryByte)
{
    std::string base(100, 'a');
    uint64_t h = affinity_hash(base.data(), base.size(), 7);

    for (size_t i = 0; i < base.size(); i++) {
        std::string s = base;
        s[i] = 'b';
        EXPECT_NE(affinity_hash(s.data(), s.size(), 7), h) << "byte " << i;
    }

    // Length matters, not only content.
    EXPECT_NE(affinity_hash(base.data(), 99, 7), h);
}

}  // namespace

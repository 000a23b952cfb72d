// The weighted consistent-hash ring, through the C API.
#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "affinity_core.h"
#include "test_support.h"

using namespace affinity_test;

namespace {

std::vector<affinity_peer_t> ring_peers(const std::vector<uint32_t> &w,
                                        size_t first_name = 0)
{
    std::vector<affinity_peer_t> peers;
    for (size_t i = 0; i < w.size(); i++) {
        peers.push_back({peer_id_of(peer_name(first_name + i)), w[i],
                         AFFINITY_NO_SLOT});
    }
    return peers;
}

// Ring positions of n pseudo-random keys (fixed seed: reproducible).
std::vector<uint64_t> random_key_hashes(size_t n, uint32_t seed = 12345)
{
    std::mt19937_64 rng(seed);
    std::vector<uint64_t> hashes;
    hashes.reserve(n);

    for (size_t i = 0; i < n; i++) {
        std::string key = "key-" + std::to_string(rng());
        hashes.push_back(affinity_ring_hash(key.data(), key.size()));
    }
    return hashes;
}

// The peer a key belongs to: the first one the walk offers.
uint32_t owner(const affinity_ring_t *ring, uint64_t hash)
{
    uint32_t out = UINT32_MAX;
    size_t n = affinity_ring_walk(ring, hash, &out, 1);
    EXPECT_EQ(n, 1u);
    return out;
}

uint64_t owner_id(const affinity_ring_t *ring,
                  const std::vector<affinity_peer_t> &peers,
                  uint64_t hash)
{
    uint32_t i = owner(ring, hash);
    EXPECT_LT(i, peers.size());
    return i < peers.size() ? peers[i].id : 0;
}

std::vector<double> shares(const affinity_ring_t *ring, size_t npeers,
                           const std::vector<uint64_t> &hashes)
{
    std::vector<double> count(npeers, 0.0);
    for (uint64_t h : hashes) {
        uint32_t i = owner(ring, h);
        if (i < npeers) {
            count[i] += 1;
        }
    }
    for (double &c : count) {
        c /= double(hashes.size());
    }
    return count;
}

TEST(Ring, PointCountFollowsWeights)
{
    auto peers = ring_peers({1, 2, 3});
    RingPtr ring = make_ring(peers, 10);
    ASSERT_NE(ring.get(), nullptr);
    EXPECT_EQ(affinity_ring_points(ring.get()), (1u + 2u + 3u) * 10u);

    EXPECT_EQ(affinity_ring_points(nullptr), 0u);
}

// Each peer's share of the ring is a sum of points_per_weight arcs, so its
// relative deviation from the fair share is about sqrt(0.75 / points) for 4
// peers: 6.8% at the module's 160 points per weight, 1.9% at 2000.
constexpr uint32_t kDensePoints = 2000;

TEST(Ring, EvenWithEqualPeers)
{
    auto peers = ring_peers({1, 1, 1, 1});
    RingPtr ring = make_ring(peers, kDensePoints);
    ASSERT_NE(ring.get(), nullptr);

    auto s = shares(ring.get(), peers.size(), random_key_hashes(100000));

    for (size_t i = 0; i < s.size(); i++) {
        EXPECT_NEAR(s[i], 0.25, 0.25 * 0.10) << "peer " << i;
    }
}

TEST(Ring, EvenWithEqualPeersForOtherPeerSets)
{
    // Not a lucky choice of names: several sets of 4 peers.
    for (size_t set = 1; set <= 5; set++) {
        auto peers = ring_peers({1, 1, 1, 1}, set * 4);
        RingPtr ring = make_ring(peers, kDensePoints);
        ASSERT_NE(ring.get(), nullptr);

        auto s = shares(ring.get(), peers.size(),
                        random_key_hashes(100000, uint32_t(set)));

        for (size_t i = 0; i < s.size(); i++) {
            EXPECT_NEAR(s[i], 0.25, 0.25 * 0.10)
                << "set " << set << " peer " << i;
        }
    }
}

TEST(Ring, EvenEnoughAtTheModulesDensity)
{
    // 160 points per weight: within 10 points of percentage of 25%.
    for (size_t set = 0; set <= 5; set++) {
        auto peers = ring_peers({1, 1, 1, 1}, set * 4);
        RingPtr ring = make_ring(peers, kPointsPerWeight);
        ASSERT_NE(ring.get(), nullptr);

        auto s = shares(ring.get(), peers.size(),
                        random_key_hashes(100000, uint32_t(set + 100)));

        for (size_t i = 0; i < s.size(); i++) {
            EXPECT_NEAR(s[i], 0.25, 0.10) << "set " << set << " peer " << i;
        }
    }
}

TEST(Ring, RespectsWeights)
{
    auto peers = ring_peers({1, 1, 2});
    RingPtr ring = make_ring(peers);
    ASSERT_NE(ring.get(), nullptr);

    auto s = shares(ring.get(), peers.size(), random_key_hashes(100000));

    EXPECT_NEAR(s[2], 0.50, 0.07);
    EXPECT_NEAR(s[0], 0.25, 0.07);
    EXPECT_NEAR(s[1], 0.25, 0.07);
}

TEST(Ring, RemovingAPeerMovesOnlyItsKeys)
{
    auto all = ring_peers({1, 1, 1, 1, 1});
    RingPtr before = make_ring(all);
    ASSERT_NE(before.get(), nullptr);

    for (size_t removed = 0; removed < all.size(); removed++) {
        auto rest = all;
        rest.erase(rest.begin() + long(removed));
        RingPtr after = make_ring(rest);
        ASSERT_NE(after.get(), nullptr);

        size_t moved = 0, kept = 0;

        for (uint64_t h : random_key_hashes(20000)) {
            uint64_t was = owner_id(before.get(), all, h);
            uint64_t now = owner_id(after.get(), rest, h);

            ASSERT_NE(now, all[removed].id);

            if (was == all[removed].id) {
                moved++;
            } else {
                ASSERT_EQ(now, was) << "a key of a remaining peer moved";
                kept++;
            }
        }

        // The removed peer did own keys, which went elsewhere.
        EXPECT_GT(moved, 0u);
        EXPECT_GT(kept, moved);
    }
}

TEST(Ring, AddingAPeerMovesKeysOnlyOntoIt)
{
    auto old_peers = ring_peers({1, 1, 1, 1, 1});
    auto new_peers = ring_peers({1, 1, 1, 1, 1, 1});
    uint64_t added = new_peers.back().id;

    RingPtr before = make_ring(old_peers);
    RingPtr after = make_ring(new_peers);
    ASSERT_NE(before.get(), nullptr);
    ASSERT_NE(after.get(), nullptr);

    size_t moved = 0;
    auto hashes = random_key_hashes(60000);

    for (uint64_t h : hashes) {
        uint64_t was = owner_id(before.get(), old_peers, h);
        uint64_t now = owner_id(after.get(), new_peers, h);

        if (now != was) {
            ASSERT_EQ(now, added) << "a key moved between old peers";
            moved++;
        }
    }

    // About a sixth of the keys move to the new peer.
    EXPECT_NEAR(double(moved) / double(hashes.size()), 1.0 / 6, 0.05);
}

TEST(Ring, AddingAPeerInTheMiddleOfTheListMovesKeysOnlyOntoIt)
{
    // Positions in the list shift; ids do not.
    auto old_peers = ring_peers({1, 1, 1, 1});
    auto new_peers = old_peers;
    affinity_peer_t extra{peer_id_of("192.168.1.1:80"), 1, AFFINITY_NO_SLOT};
    new_peers.insert(new_peers.begin() + 1, extra);

    RingPtr before = make_ring(old_peers);
    RingPtr after = make_ring(new_peers);
    ASSERT_NE(before.get(), nullptr);
    ASSERT_NE(after.get(), nullptr);

    for (uint64_t h : random_key_hashes(20000)) {
        uint64_t was = owner_id(before.get(), old_peers, h);
        uint64_t now = owner_id(after.get(), new_peers, h);
        if (now != was) {
            ASSERT_EQ(now, extra.id);
        }
    }
}

TEST(Ring, IndependentOfPeerOrder)
{
    auto peers = ring_peers({1, 2, 1, 3, 1, 1, 2});
    RingPtr ring = make_ring(peers);
    ASSERT_NE(ring.get(), nullptr);

    std::mt19937 rng(7);
    auto hashes = random_key_hashes(20000);

    for (int round = 0; round < 5; round++) {
        auto shuffled = peers;
        std::shuffle(shuffled.begin(), shuffled.end(), rng);
        RingPtr other = make_ring(shuffled);
        ASSERT_NE(other.get(), nullptr);
        EXPECT_EQ(affinity_ring_points(other.get()),
                  affinity_ring_points(ring.get()));

        for (uint64_t h : hashes) {
            ASSERT_EQ(owner_id(ring.get(), peers, h),
                      owner_id(other.get(), shuffled, h));
        }

        // The whole walk order (fallback order) is the same too.
        for (size_t k = 0; k < 200; k++) {
            uint32_t a[16], b[16];
            size_t na = affinity_ring_walk(ring.get(), hashes[k], a, 16);
            size_t nb = affinity_ring_walk(other.get(), hashes[k], b, 16);
            ASSERT_EQ(na, peers.size());
            ASSERT_EQ(nb, peers.size());
            for (size_t j = 0; j < na; j++) {
                ASSERT_EQ(peers[a[j]].id, shuffled[b[j]].id);
            }
        }
    }
}

void expect_walk_visits_each_once(const affinity_ring_t *ring, size_t npeers,
                                  uint64_t hash)
{
    std::vector<uint32_t> out(npeers + 10, UINT32_MAX);
    size_t n = affinity_ring_walk(ring, hash, out.data(), out.size());

    ASSERT_EQ(n, npeers);

    std::set<uint32_t> seen;
    for (size_t i = 0; i < n; i++) {
        ASSERT_LT(out[i], npeers);
        ASSERT_TRUE(seen.insert(out[i]).second)
            << "peer " << out[i] << " offered twice";
    }
    EXPECT_EQ(out[n], UINT32_MAX) << "wrote past the count it returned";

    // The first peer of the walk is the key's owner, and a shorter walk is
    // a prefix of the full one.
    EXPECT_EQ(owner(ring, hash), out[0]);

    std::vector<uint32_t> prefix(3, UINT32_MAX);
    size_t np = affinity_ring_walk(ring, hash, prefix.data(), prefix.size());
    ASSERT_EQ(np, std::min<size_t>(3, npeers));
    for (size_t i = 0; i < np; i++) {
        EXPECT_EQ(prefix[i], out[i]);
    }
}

TEST(Ring, WalkOffersEachPeerExactlyOnce)
{
    for (size_t npeers : {1u, 2u, 5u, 63u, 64u, 65u, 200u, 256u}) {
        std::vector<uint32_t> w(npeers);
        for (size_t i = 0; i < npeers; i++) {
            w[i] = uint32_t(1 + i % 3);
        }
        auto peers = ring_peers(w);
        RingPtr ring = make_ring(peers, 20);
        ASSERT_NE(ring.get(), nullptr) << npeers;

        auto hashes = random_key_hashes(50, uint32_t(npeers));
        hashes.push_back(0);
        hashes.push_back(UINT64_MAX);

        for (uint64_t h : hashes) {
            SCOPED_TRACE(testing::Message() << npeers << " peers, hash " << h);
            expect_walk_visits_each_once(ring.get(), npeers, h);
        }
    }
}

TEST(Ring, WalkEdgeCases)
{
    auto peers = ring_peers({1, 1, 1});
    RingPtr ring = make_ring(peers);
    ASSERT_NE(ring.get(), nullptr);

    uint32_t out[4] = {9, 9, 9, 9};
    EXPECT_EQ(affinity_ring_walk(ring.get(), 1, out, 0), 0u);
    EXPECT_EQ(out[0], 9u);
    EXPECT_EQ(affinity_ring_walk(nullptr, 1, out, 4), 0u);

    // Hashes past the last point wrap around to the first.
    EXPECT_EQ(owner(ring.get(), UINT64_MAX), owner(ring.get(), 0));
}

TEST(Ring, BadArgumentsGiveNull)
{
    auto peers = ring_peers(std::vector<uint32_t>(257, 1));
    uint64_t mem[64];

    EXPECT_EQ(affinity_ring_size(peers.data(), 0, 160), 0u);
    EXPECT_EQ(affinity_ring_size(nullptr, 0, 160), 0u);
    EXPECT_EQ(affinity_ring_size(peers.data(), 257, 160), 0u);
    EXPECT_EQ(affinity_ring_size(peers.data(), 4, 0), 0u);
    EXPECT_EQ(affinity_ring_build(mem, sizeof(mem), peers.data(), 257, 1),
              nullptr);

    // Memory too small, or misaligned: refused, nothing written past it.
    size_t need = affinity_ring_size(peers.data(), 2, 1);
    ASSERT_GT(need, 0u);
    ASSERT_LE(need, sizeof(mem) - 8);
    mem[need / 8] = 0x5a5a5a5a5a5a5a5aULL;
    EXPECT_EQ(affinity_ring_build(mem, need - 1, peers.data(), 2, 1), nullptr);
    EXPECT_EQ(affinity_ring_build(reinterpret_cast<char *>(mem) + 4, need,
                                  peers.data(), 2, 1),
              nullptr);
    EXPECT_NE(affinity_ring_build(mem, need, peers.data(), 2, 1), nullptr);
    EXPECT_EQ(mem[need / 8], 0x5a5a5a5a5a5a5a5aULL);

    // The limits themselves are fine.
    RingPtr max_ring = make_ring(
        std::vector<affinity_peer_t>(peers.begin(),
                                     peers.begin() + AFFINITY_MAX_PEERS),
        1);
    ASSERT_NE(max_ring.get(), nullptr);
    EXPECT_EQ(affinity_ring_points(max_ring.get()), size_t{AFFINITY_MAX_PEERS});

    RingPtr one = make_ring({peers[0]}, 1);
    ASSERT_NE(one.get(), nullptr);
    EXPECT_EQ(owner(one.get(), 42), 0u);
}

}  // namespace

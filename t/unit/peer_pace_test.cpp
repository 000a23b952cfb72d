// The pace a peer's replies teach (affinity_zone_peer_timed()): each figure
// converges on a synthetic peer, ignores a reply far off the rest, follows
// a peer that slows down, and stays the peer's own.

#include <cstdint>

#include <gtest/gtest.h>

#include "affinity_core.h"
#include "test_support.h"

using affinity_test::TestZone;
using affinity_test::peer_id_of;
using affinity_test::peer_name;

namespace {

// A synthetic peer: prefill_us per thousand tokens not held, decode_us per
// output token, and a wait of wait_us per request in flight before.
struct Synthetic {
    uint32_t prefill_us_per_k;
    uint32_t decode_us;
    uint32_t wait_us;

    affinity_reply_times_t reply(uint32_t queued, uint32_t prompt,
                                 uint32_t cached, uint32_t output,
                                 bool streamed = true) const
    {
        uint64_t first = uint64_t(wait_us) * queued
                         + uint64_t(prefill_us_per_k) * (prompt - cached)
                           / 1000;
        uint64_t total = first + uint64_t(decode_us) * (output - 1);

        affinity_reply_times_t t{};
        t.first_ms = uint32_t((streamed ? first : total) / 1000);
        t.total_ms = uint32_t(total / 1000);
        t.queued = queued;
        t.streamed = streamed;
        t.prompt_chars = prompt * 4;
        t.prompt_tokens = prompt;
        t.cached_tokens = cached;
        t.output_tokens = output;
        return t;
    }
};

class PeerPace : public ::testing::Test {
protected:
    void SetUp() override
    {
        for (int i = 0; i < 2; i++) {
            id[i] = peer_id_of(peer_name(i));
            slot[i] = affinity_zone_peer_slot(zone.get(), id[i], 1000);
            ASSERT_NE(slot[i], AFFINITY_NO_SLOT);
        }
    }

    affinity_peer_pace_t pace(int i) const
    {
        affinity_peer_pace_t p;
        affinity_zone_peer_pace(zone.get(), slot[i], &p);
        return p;
    }

    void teach(int i, const affinity_reply_times_t &t)
    {
        affinity_zone_peer_timed(zone.get(), slot[i], id[i], &t);
    }

    TestZone zone;
    uint64_t id[2];
    uint32_t slot[2];
};

// Prefill 50 ms per thousand tokens, decode 20 ms a token, 400 ms of wait
// per request ahead: an engine at real speed.
const Synthetic kPeer{50000, 20000, 400000};

}  // namespace

TEST_F(PeerPace, NothingLearnedAtFirst)
{
    affinity_peer_pace_t p = pace(0);

    EXPECT_EQ(p.replies, 0u);
    EXPECT_EQ(p.prefill_ns, 0u);
    EXPECT_EQ(p.decode_us, 0u);
    EXPECT_EQ(p.wait_us[0], -1);
    EXPECT_EQ(p.wait_us[5], -1);
}

TEST_F(PeerPace, ConvergesOnASyntheticPeer)
{
    for (int n = 0; n < 200; n++) {
        uint32_t queued = uint32_t(n % 6);
        teach(0, kPeer.reply(queued, 2000 + 37 * (n % 11), 0, 50 + n % 30));
    }

    affinity_peer_pace_t p = pace(0);

    EXPECT_EQ(p.replies, 200u);
    EXPECT_NEAR(p.decode_us, 20000, 1000);
    EXPECT_NEAR(p.prefill_ns, 50000, 5000);   // ms-resolution times
    EXPECT_NEAR(p.chars_per_token, 4 * 256, 4);

    for (uint32_t q = 0; q < 6; q++) {
        EXPECT_NEAR(p.wait_us[q], 400000.0 * q, 20000) << q;
    }

    // Deeper than any queue seen: grown as the learned ones grew.
    EXPECT_NEAR(p.wait_us[8], 400000.0 * 8, 60000);
}

TEST_F(PeerPace, CachedTokensAreNotPrefilled)
{
    for (int n = 0; n < 100; n++) {
        teach(0, kPeer.reply(0, 4000, 3000, 40));
    }

    // 1,000 tokens prefilled in 50 ms: the rate, not 4,000 in 50 ms.
    EXPECT_NEAR(pace(0).prefill_ns, 50000, 5000);
}

TEST_F(PeerPace, OutliersMoveLittle)
{
    for (int n = 0; n < 100; n++) {
        teach(0, kPeer.reply(n % 3, 2000, 0, 50));
    }

    affinity_peer_pace_t before = pace(0);

    // One reply fifty times as slow as the rest.
    Synthetic stalled{kPeer.prefill_us_per_k * 50, kPeer.decode_us * 50,
                      kPeer.wait_us * 50};
    teach(0, stalled.reply(1, 2000, 0, 50));

    affinity_peer_pace_t after = pace(0);

    EXPECT_LE(after.decode_us, before.decode_us * 9 / 8 + 1);
    EXPECT_LE(after.wait_us[1], before.wait_us[1] * 9 / 8 + 1000 / 8 + 1);
}

TEST_F(PeerPace, FollowsAPeerThatSlowsDown)
{
    for (int n = 0; n < 100; n++) {
        teach(0, kPeer.reply(n % 3, 2000, 0, 50));
    }

    // Its engine now runs 2.5 times slower: within sixty replies (a
    // minute of a busy peer), twenty at each depth, the figures follow.
    Synthetic slower{kPeer.prefill_us_per_k * 5 / 2, kPeer.decode_us * 5 / 2,
                     kPeer.wait_us * 5 / 2};

    for (int n = 0; n < 60; n++) {
        teach(0, slower.reply(n % 3, 2000, 0, 50));
    }

    affinity_peer_pace_t p = pace(0);

    EXPECT_NEAR(p.decode_us, 50000, 3000);
    EXPECT_NEAR(p.prefill_ns, 125000, 15000);
    EXPECT_NEAR(p.wait_us[2], 2000000, 150000);
}

TEST_F(PeerPace, WholeBodiesTeachOnceTheDecodeIsKnown)
{
    // A whole body's header comes with its last token: nothing to learn of
    // the wait before the decode is known.
    for (int n = 0; n < 10; n++) {
        teach(0, kPeer.reply(1, 2000, 0, 50, false));
    }

    EXPECT_EQ(pace(0).wait_us[1], -1);

    for (int n = 0; n < 50; n++) {
        teach(0, kPeer.reply(0, 2000, 0, 50));
    }
    for (int n = 0; n < 50; n++) {
        teach(0, kPeer.reply(1, 2000, 0, 50, false));
    }

    EXPECT_NEAR(pace(0).wait_us[1], 400000, 40000);
}

TEST_F(PeerPace, OnePeersRepliesLeaveAnotherAlone)
{
    for (int n = 0; n < 50; n++) {
        teach(0, kPeer.reply(n % 3, 2000, 0, 50));
    }

    affinity_peer_pace_t other = pace(1);

    EXPECT_EQ(other.replies, 0u);
    EXPECT_EQ(other.decode_us, 0u);
    EXPECT_EQ(other.wait_us[0], -1);

    // A reply for a slot that changed hands since is not learned.
    affinity_reply_times_t t = kPeer.reply(0, 2000, 0, 50);
    affinity_zone_peer_timed(zone.get(), slot[1], id[0], &t);
    EXPECT_EQ(pace(1).replies, 0u);
}

TEST_F(PeerPace, NonsenseIsHarmless)
{
    affinity_reply_times_t t{};
    t.first_ms = 10;
    t.total_ms = 5;             // ends before it began
    teach(0, t);
    EXPECT_EQ(pace(0).replies, 0u);

    t = kPeer.reply(UINT32_MAX, UINT32_MAX / 8, UINT32_MAX, UINT32_MAX);
    t.first_ms = UINT32_MAX;
    t.total_ms = UINT32_MAX;
    teach(0, t);
    affinity_zone_peer_timed(zone.get(), AFFINITY_NO_SLOT, id[0], &t);
    affinity_zone_peer_timed(nullptr, slot[0], id[0], &t);
    affinity_zone_peer_timed(zone.get(), slot[0], id[0], nullptr);

    affinity_peer_pace_t p = pace(0);
    EXPECT_GE(p.wait_us[AFFINITY_PACE_QUEUES - 1], 0);
}

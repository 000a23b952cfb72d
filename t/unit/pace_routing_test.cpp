// Routing by the estimated time to first token (selection.h, less_loaded()):
// the queue shape pooled over the peers, a slow peer getting less once
// queues form, the prefill ahead (backlog) waited behind, and counts as
// before while nothing is learned.

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "affinity_core.h"
#include "peer_pace.h"
#include "test_support.h"
#include "zone.h"

using affinity_test::Routed;
using affinity_test::Router;
using affinity_test::TestZone;
using affinity_test::Upstream;

namespace {

// Running slots of the synthetic engines, and the decode tokens a request
// beyond them waits (a reply's average decode over the slots).
constexpr uint32_t kSlots = 4;
constexpr uint32_t kStepTokens = 50;

// An engine: prefill per thousand tokens not held and decode per token, in
// microseconds.  Its wait is kStepTokens decode tokens per request beyond
// kSlots.
struct Engine {
    uint32_t prefill_us_per_k;
    uint32_t decode_us;

    affinity_reply_times_t reply(uint32_t queued) const
    {
        uint32_t prompt = 1000;
        uint32_t output = 100;
        uint64_t wait = queued + 1 > kSlots
                        ? uint64_t(queued + 1 - kSlots) * kStepTokens
                          * decode_us
                        : 0;
        uint64_t first = wait + prefill_us_per_k * uint64_t(prompt) / 1000;
        uint64_t total = first + uint64_t(decode_us) * (output - 1);

        affinity_reply_times_t t{};
        t.first_ms = uint32_t(first / 1000);
        t.total_ms = uint32_t(total / 1000);
        t.queued = queued;
        t.streamed = 1;
        t.prompt_chars = prompt * 4;
        t.prompt_tokens = prompt;
        t.output_tokens = output;
        return t;
    }
};

const Engine kFast{50000, 20000};
const Engine kSlow{125000, 50000};

// Teaches peer i of up the engine's pace: replies sent with nothing in
// flight (prefill), then at every depth.
void teach_peer(affinity_zone_t *zone, Upstream &up, size_t i,
                const Engine &engine)
{
    for (int round = 0; round < 40; round++) {
        for (uint32_t q = 0; q < AFFINITY_PACE_QUEUES; q++) {
            affinity_reply_times_t t = engine.reply(q);
            affinity_zone_peer_timed(zone, up.peer(i).slot, up.peer(i).id,
                                     &t);
        }
    }
}

class PaceRouting : public ::testing::Test {
protected:
    void teach(size_t i, const Engine &engine)
    {
        teach_peer(zone.get(), up, i, engine);
    }

    // A prompt that opens with a system prompt both peers hold (a level of
    // 2,000 characters), then a level of its own: placed among the
    // holders.  (A prompt no peer holds opens a conversation, placed by
    // counts: see below.)
    std::vector<affinity_level_t> prompt(int n, uint32_t length = 2500)
    {
        std::string text = "prompt " + std::to_string(n);
        affinity_level_t own{};
        own.length = length;
        own.hash = affinity_hash(text.data(), text.size(), 0);
        return {system(), own};
    }

    static affinity_level_t system()
    {
        affinity_level_t level{};
        level.length = 2000;
        level.hash = affinity_hash("system", 6, 0);
        return level;
    }

    void SetUp() override
    {
        uint64_t hash = system().hash;

        for (size_t i = 0; i < up.size(); i++) {
            affinity_prefixes_record(prefixes.get(), &hash, 1, up.peer(i).id,
                                     router.now, router.prefix_timeout, 0);
        }
    }

    // A long prompt (200,000 characters, all but the system prompt not
    // held: 2.5 s of prefill at 50 ms a thousand tokens), sent and not
    // started yet.
    Routed send_long(int n)
    {
        router.prompt_size = 200000;
        Routed r = router.route_prompt(prefixes.get(), prompt(n, 4000));
        router.prompt_size = 0;
        return r;
    }

    // A prompt routed now sees the other peer's estimate as its own, give
    // or take its prefill: nothing waits ahead on either.
    void expect_nothing_ahead(const std::vector<affinity_level_t> &levels)
    {
        Routed r = router.route_prompt(prefixes.get(), levels);
        ASSERT_EQ(r.rc, 0);
        EXPECT_LT(r.decision.alternative_us, r.decision.estimate_us + 100000);
    }

    void fill(size_t i, int n)
    {
        for (int k = 0; k < n; k++) {
            up.acquire(i);
        }
    }

    TestZone zone;
    TestZone prefixes{1 << 20, AFFINITY_ZONE_PREFIXES};
    Upstream up{zone.get(), {1, 1}};
    Router router{zone.get(), up};
};

}  // namespace

TEST(QueueShape, PooledOverPeersOfDifferentSpeeds)
{
    TestZone zone;
    affinity::PeerPace paces[2] = {};
    const Engine engines[2] = {kFast, kSlow};

    for (int i = 0; i < 2; i++) {
        for (int round = 0; round < 40; round++) {
            for (uint32_t q = 0; q < AFFINITY_PACE_QUEUES; q++) {
                affinity::pace_learn(paces[i], engines[i].reply(q));
            }
        }
    }

    const affinity::PeerPace *both[2] = {&paces[0], &paces[1]};
    affinity::QueueShape shape = affinity::pace_shape(both, 2);

    EXPECT_EQ(shape.knee, kSlots);
    EXPECT_NEAR(shape.step, double(kStepTokens), kStepTokens / 10.0);

    // Beyond the knee the slow peer waits as much longer as it decodes.
    int64_t fast = affinity::pace_estimate(paces[0], shape, 6, 0);
    int64_t slow = affinity::pace_estimate(paces[1], shape, 6, 0);

    EXPECT_NEAR(double(slow) / double(fast), 2.5, 0.25);

    // Below it, only the prefill: the slow peer's by its own rate.
    EXPECT_EQ(affinity::pace_estimate(paces[0], shape, 2, 0), 0);
    EXPECT_NEAR(double(affinity::pace_estimate(paces[1], shape, 2, 4000)),
                125000.0, 12500.0);
}

TEST(QueueShape, NoQueueSeenYetIsFlat)
{
    affinity::PeerPace pace{};

    for (int round = 0; round < 40; round++) {
        for (uint32_t q = 0; q < kSlots; q++) {
            affinity::pace_learn(pace, kFast.reply(q));
        }
    }

    const affinity::PeerPace *one[1] = {&pace};
    affinity::QueueShape shape = affinity::pace_shape(one, 1);

    EXPECT_EQ(shape.knee, 0u);
    EXPECT_EQ(affinity::pace_estimate(pace, shape, 10, 0), 0);

    affinity::PeerPace unknown{};
    EXPECT_EQ(affinity::pace_estimate(unknown, shape, 0, 1000), -1);
}

TEST_F(PaceRouting, ASlowPeerGetsLessOnceQueuesForm)
{
    teach(0, kSlow);
    teach(1, kFast);

    // Both beyond their running slots, as many in flight: each new prompt
    // waits 2.5 times less on the fast peer, until its queue is as long in
    // time.
    fill(0, 6);
    fill(1, 6);

    int fast = 0;

    for (int n = 0; n < 3; n++) {
        Routed r = router.route_prompt(prefixes.get(), prompt(n));
        ASSERT_EQ(r.rc, 0);
        EXPECT_EQ(r.decision.route, uint32_t(AFFINITY_ROUTE_PREFIX_HIT));
        fast += r.decision.peer == 1;
    }

    EXPECT_EQ(fast, 3);
}

TEST_F(PaceRouting, EqualPeersAreLeftToTheCounts)
{
    teach(0, kFast);
    teach(1, kFast);
    fill(0, 1);
    fill(1, 1);

    // The same speed, below the knee, nothing ahead: the estimates tie,
    // the counts decide, as without a pace, and the requests alternate.
    for (int n = 0; n < 4; n++) {
        Routed r = router.route_prompt(prefixes.get(), prompt(n));
        ASSERT_EQ(r.rc, 0);

        if (n % 2 == 1) {
            EXPECT_EQ(up.inflight(0), up.inflight(1)) << "after " << n + 1;
        }
    }
}

TEST_F(PaceRouting, ThePrefillAheadIsWaitedBehind)
{
    teach(0, kFast);
    teach(1, kFast);

    // A long prompt is sent to one peer and has not started: its prefill
    // is ahead of any request sent there.
    Routed longest = send_long(100);
    ASSERT_EQ(longest.rc, 0);
    EXPECT_EQ(longest.decision.backlog_chars, 198000u);
    size_t busy = size_t(longest.decision.peer);
    size_t other = 1 - busy;

    // The other peer as many in flight, none of them ahead of a prefill.
    fill(other, 1);

    Routed r = router.route_prompt(prefixes.get(), prompt(1));
    ASSERT_EQ(r.rc, 0);
    EXPECT_EQ(size_t(r.decision.peer), other);
    EXPECT_GT(r.decision.alternative_us, r.decision.estimate_us + 2000000);

    // Its first byte came: nothing ahead there any more.
    affinity_zone_peer_started(zone.get(), longest.decision.slot,
                               longest.decision.backlog_chars);
    fill(busy, 1);

    expect_nothing_ahead(prompt(2));
}

TEST_F(PaceRouting, TheLastRequestOutClearsTheBacklog)
{
    teach(0, kFast);
    teach(1, kFast);

    // A try that never reported its start (its worker died): the backlog
    // it left goes when the peer has nothing in flight.
    Routed r = send_long(1);
    ASSERT_EQ(r.rc, 0);
    size_t busy = size_t(r.decision.peer);

    up.release(busy);
    fill(0, 1);
    fill(1, 1);

    expect_nothing_ahead(prompt(2));
}

TEST_F(PaceRouting, ANewConversationIsPlacedByCounts)
{
    teach(0, kSlow);
    teach(1, kFast);
    fill(0, 6);
    fill(1, 6);

    // Held nowhere: where it lands, its next turns' cache lands too, so
    // the counts keep the conversations even, whatever the speeds.
    std::string text = "a conversation of its own";
    affinity_level_t level{};
    level.length = 2000;
    level.hash = affinity_hash(text.data(), text.size(), 0);

    for (int n = 0; n < 4; n++) {
        level.hash++;
        Routed r = router.route_prompt(prefixes.get(), {level});
        ASSERT_EQ(r.rc, 0);
        EXPECT_EQ(r.decision.route, uint32_t(AFFINITY_ROUTE_PREFIX_NEW));

        if (n % 2 == 1) {
            EXPECT_EQ(up.inflight(0), up.inflight(1)) << "after " << n + 1;
        }
    }
}

TEST_F(PaceRouting, WithoutAPaceTheCountsDecide)
{
    fill(0, 3);
    fill(1, 1);

    Routed r = router.route_prompt(prefixes.get(), prompt(1));
    ASSERT_EQ(r.rc, 0);
    EXPECT_EQ(r.decision.peer, 1);
    EXPECT_EQ(r.decision.estimate_us, -1);
}

TEST_F(PaceRouting, TheStatusShowsTheWaitRoutingEstimates)
{
    uint32_t slots[3] = {up.peer(0).slot, up.peer(1).slot, AFFINITY_NO_SLOT};
    int64_t waits[3];

    // Nothing learned: no estimate.
    affinity_zone_peers_wait(zone.get(), slots, 3, 0, router.now, waits);
    EXPECT_EQ(waits[0], -1);
    EXPECT_EQ(waits[1], -1);
    EXPECT_EQ(waits[2], -1);

    teach(0, kFast);
    teach(1, kFast);

    // The long prompt's prefill is ahead of anything sent to its peer.
    Routed longest = send_long(100);
    ASSERT_EQ(longest.rc, 0);
    size_t busy = size_t(longest.decision.peer);

    affinity_zone_peers_wait(zone.get(), slots, 3, 0, router.now, waits);
    EXPECT_GT(waits[busy], 2000000);
    EXPECT_GE(waits[1 - busy], 0);
    EXPECT_LT(waits[1 - busy], 100000);
    EXPECT_EQ(waits[2], -1);

    // Its first byte came: nothing ahead there any more.
    affinity_zone_peer_started(zone.get(), longest.decision.slot,
                               longest.decision.backlog_chars);
    affinity_zone_peers_wait(zone.get(), slots, 2, 0, router.now, waits);
    EXPECT_LT(waits[busy], 100000);

    // An engine that reports a queue here knows nothing of (the other
    // instances' requests): counted while its figure is fresh, as routing
    // counts it.
    size_t idle = 1 - busy;
    affinity_engine_load_t queue{};
    queue.running = kSlots;
    queue.waiting = 4;
    queue.found = AFFINITY_ENGINE_RUNNING | AFFINITY_ENGINE_WAITING;
    affinity_test::engine_reported(zone.get(), slots[idle], queue,
                                   router.now);

    int64_t alone[2];
    affinity_zone_peers_wait(zone.get(), slots, 2, 0, router.now, alone);
    affinity_zone_peers_wait(zone.get(), slots, 2, 3, router.now, waits);
    EXPECT_LT(alone[idle], 100000) << "without the engine's figure";
    EXPECT_GT(waits[idle], alone[idle] + 4 * int64_t(kStepTokens)
                                         * kFast.decode_us / 2)
        << "four requests wait beyond the running slots";

    // Once the figure is older than the time to live, it is not counted.
    affinity_zone_peers_wait(zone.get(), slots, 2, 3, router.now + 4, waits);
    EXPECT_EQ(waits[idle], alone[idle]);
}

// A short prefix two peers hold (a system prompt) goes to a third peer
// that lacks it when that one is sooner with the prefix's prefill counted
// there, and stays with a holder when it is not.
TEST(ShortPrefixCopy, GoesToASoonerPeerThatLacksIt)
{
    TestZone zone;
    TestZone prefixes{1 << 20, AFFINITY_ZONE_PREFIXES};
    Upstream up{zone.get(), {1, 1, 1}};
    Router router{zone.get(), up, {1.25, 4.0, 0, 0}};

    affinity_level_t system{};
    system.length = 2000;
    system.hash = affinity_hash("system", 6, 0);

    for (size_t i = 0; i < 2; i++) {
        affinity_prefixes_record(prefixes.get(), &system.hash, 1,
                                 up.peer(i).id, router.now,
                                 router.prefix_timeout, 0);
    }

    for (size_t i = 0; i < 3; i++) {
        teach_peer(zone.get(), up, i, kFast);
    }

    auto prompt = [&](int n) {
        std::string text = "a question " + std::to_string(n);
        affinity_level_t own{};
        own.length = 2100;
        own.hash = affinity_hash(text.data(), text.size(), 0);
        return std::vector<affinity_level_t>{system, own};
    };

    // Beyond the running slots, as many in flight everywhere: the
    // holders are sooner, by the system prompt's prefill.
    for (size_t i = 0; i < 3; i++) {
        for (int k = 0; k < 6; k++) {
            up.acquire(i);
        }
    }

    Routed held = router.route_prompt(prefixes.get(), prompt(1));
    ASSERT_EQ(held.rc, 0);
    EXPECT_NE(held.decision.peer, 2);

    // The third peer a request fewer than the least loaded holder: one
    // request's wait sooner, far more than the prefill.  By counts alone
    // it would not be worth the copy.
    up.release(2);

    Routed copied = router.route_prompt(prefixes.get(), prompt(2));
    ASSERT_EQ(copied.rc, 0);
    EXPECT_EQ(copied.decision.peer, 2);

    // It held none of the prompt: placed as new, its whole prompt ahead
    // of what is sent there next.
    EXPECT_EQ(copied.decision.route, uint32_t(AFFINITY_ROUTE_PREFIX_NEW));
    EXPECT_EQ(copied.decision.prefix_len, 0u);
    EXPECT_EQ(copied.decision.held_chars, 0u);
    EXPECT_EQ(copied.decision.backlog_chars, 2100u);
}

// A document two peers hold (a level past 4,096 characters) whose holders
// would queue a request, while a third peer that lacks it has a running
// slot free: the third takes the request when it is sooner even with the
// document's prefill counted kMoveCost times, and not otherwise.
// A fleet of equal weights with a prefix index, and the helpers the
// fixtures below share.
class PrefixFleet : public ::testing::Test {
protected:
    explicit PrefixFleet(size_t peers)
        : up(zone.get(), std::vector<uint32_t>(peers, 1))
    {
    }

    // A scheduled level of length characters, hashed from name.
    static affinity_level_t level_of(const std::string &name,
                                     uint32_t length)
    {
        affinity_level_t level{};
        level.length = length;
        level.hash = affinity_hash(name.data(), name.size(), 0);
        return level;
    }

    // Records level as served by peer i.
    void hold(size_t i, const affinity_level_t &level)
    {
        affinity_prefixes_record(prefixes.get(), &level.hash, 1,
                                 up.peer(i).id, router.now,
                                 router.prefix_timeout, 0);
    }

    // A prompt of level, then text of its own: a level 300 characters on.
    Routed ask_after(const affinity_level_t &level, const std::string &text)
    {
        affinity_level_t own = level_of(text, level.length + 300);

        return router.route_prompt(prefixes.get(), {level, own});
    }

    void fill(size_t i, int n)
    {
        for (int k = 0; k < n; k++) {
            up.acquire(i);
        }
    }

    TestZone zone;
    TestZone prefixes{1 << 20, AFFINITY_ZONE_PREFIXES};
    Upstream up;
    Router router{zone.get(), up, {1.25, 8.0, 0, 0}};
};

class QueuedHolder : public PrefixFleet {
protected:
    QueuedHolder() : PrefixFleet(3) {}

    void SetUp() override
    {
        document = level_of("document", 6000);

        for (size_t i = 0; i < 3; i++) {
            teach_peer(zone.get(), up, i, kFast);
        }
    }

    // A question about the document.
    Routed ask(int n)
    {
        return ask_after(document, "a question " + std::to_string(n));
    }

    affinity_level_t document{};
};

TEST_F(QueuedHolder, IsLeftForAFreePeerThatIsSooner)
{
    hold(0, document);
    hold(1, document);

    // Three requests beyond the running slots on each holder: one sent
    // now waits four steps of decode, far more than eight prefills of
    // 6,000 characters; the third peer has a slot free.
    fill(0, kSlots + 3);
    fill(1, kSlots + 3);
    fill(2, kSlots - 1);

    Routed moved = ask(1);
    ASSERT_EQ(moved.rc, 0);
    EXPECT_EQ(moved.decision.peer, 2);

    // It held none of the prompt: placed as new, the whole prompt its
    // backlog.
    EXPECT_EQ(moved.decision.route, uint32_t(AFFINITY_ROUTE_PREFIX_NEW));
    EXPECT_EQ(moved.decision.held_chars, 0u);
    EXPECT_EQ(moved.decision.backlog_chars, 6300u);
}

TEST_F(QueuedHolder, StaysWhenTheFreePeerHasNoSlotOrIsNotSoonerEnough)
{
    hold(0, document);
    hold(1, document);

    // The third peer's running slots are all taken: the request would
    // queue there too.
    fill(0, kSlots + 3);
    fill(1, kSlots + 3);
    fill(2, kSlots);

    Routed full = ask(1);
    ASSERT_EQ(full.rc, 0);
    EXPECT_NE(full.decision.peer, 2);
    EXPECT_EQ(full.decision.route, uint32_t(AFFINITY_ROUTE_PREFIX_HIT));
    up.release(size_t(full.decision.peer));

    // A slot free, and the holders queue one request only: one step of
    // decode, 50 tokens at 20 ms.  Eight prefills of a 6,000-character
    // document take 0.6 s at 50 ms a thousand tokens: the move is sooner.
    // Eight of a 12,000-character one take 1.2 s: it is not.
    up.release(2);

    for (size_t i = 0; i < 2; i++) {
        while (up.inflight(i) > int64_t(kSlots)) {
            up.release(i);
        }
    }

    document.length = 12000;

    Routed longer = ask(2);
    ASSERT_EQ(longer.rc, 0);
    EXPECT_NE(longer.decision.peer, 2);
    EXPECT_EQ(longer.decision.route, uint32_t(AFFINITY_ROUTE_PREFIX_HIT));
    up.release(size_t(longer.decision.peer));

    document.length = 6000;

    Routed shorter = ask(3);
    ASSERT_EQ(shorter.rc, 0);
    EXPECT_EQ(shorter.decision.peer, 2);
}

TEST_F(QueuedHolder, AConversationsOwnHistoryIsLeftToTheBound)
{
    // One peer holds the level: a conversation's own history, which a
    // move would split; whether it stays is the bound's to say.
    hold(0, document);
    fill(0, kSlots + 3);
    fill(1, kSlots - 1);
    fill(2, kSlots - 1);

    Routed r = ask(1);
    ASSERT_EQ(r.rc, 0);
    EXPECT_EQ(r.decision.peer, 0);
    EXPECT_EQ(r.decision.route, uint32_t(AFFINITY_ROUTE_PREFIX_HIT));
}

TEST_F(QueuedHolder, AHolderWithASlotFreeIsNotLeft)
{
    // The document is the prompt's longest scheduled level: its most
    // recent holder that may take it wins, here one that would queue.
    // Another holder has a slot free, so no copy is made on the third.
    hold(0, document);
    hold(1, document);
    fill(1, kSlots + 3);
    fill(0, kSlots - 1);

    Routed r = router.route_prompt(prefixes.get(), {document});
    ASSERT_EQ(r.rc, 0);
    EXPECT_NE(r.decision.peer, 2);
    EXPECT_EQ(r.decision.route, uint32_t(AFFINITY_ROUTE_PREFIX_HIT));
}

// A session pinned to a peer that would queue its next turn (no running
// slot free), while another peer has a slot free: the turn moves there
// when that is sooner even with the history the pin holds counted
// kMoveCost times, the extra ones at the slower peer's rate, and the pin
// follows.
class QueuedPin : public PrefixFleet {
protected:
    explicit QueuedPin(const Engine &pin = kFast)
        : PrefixFleet(3), pin_engine(pin)
    {
    }

    void SetUp() override
    {
        teach_peer(zone.get(), up, 0, pin_engine);

        for (size_t i = 1; i < 3; i++) {
            teach_peer(zone.get(), up, i, kFast);
        }
    }

    // The session's history, held by peer 0, where its first turn pins it.
    void open(uint32_t length)
    {
        history = level_of("history", length);
        hold(0, history);

        Routed first = router.route_prompt_released(
            prefixes.get(), {history}, "session");
        ASSERT_EQ(first.rc, 0);
        ASSERT_EQ(first.decision.peer, 0);
    }

    // The session's next turn: its history, then 300 characters more.
    Routed next(const std::string &turn)
    {
        affinity_level_t own = level_of(turn, history.length + 300);

        return router.route_prompt(prefixes.get(), {history, own},
                                   "session");
    }

    // The next turn, expected on peer by route.
    void expect_next(const std::string &turn, int peer, uint32_t route)
    {
        Routed r = next(turn);
        ASSERT_EQ(r.rc, 0);
        EXPECT_EQ(r.decision.peer, peer);
        EXPECT_EQ(r.decision.route, route);
    }

    const Engine &pin_engine;
    affinity_level_t history{};
};

class SlowQueuedPin : public QueuedPin {
protected:
    SlowQueuedPin() : QueuedPin(kSlow) {}
};

TEST_F(QueuedPin, MovesToAFreePeerThatIsSooner)
{
    // Three requests beyond the pin's running slots: four steps of decode
    // (4 s) against eight prefills of 6,000 characters (0.6 s).
    open(6000);
    fill(0, kSlots + 3);
    fill(1, kSlots - 1);
    fill(2, kSlots);

    expect_next("turn 2", 1, AFFINITY_ROUTE_SESSION_SPILL);

    // The pin followed: the third turn goes to peer 1, now that it has a
    // slot to spare.
    up.release(1);
    up.release(1);
    expect_next("turn 3", 1, AFFINITY_ROUTE_SESSION_HIT);
}

TEST_F(QueuedPin, StaysWhenNoPeerIsFreeOrTheMoveIsNotSooner)
{
    // Every other peer's slots are taken: the turn would queue there too.
    open(6000);
    fill(0, kSlots + 3);
    fill(1, kSlots);
    fill(2, kSlots);

    expect_next("turn 2", 0, AFFINITY_ROUTE_SESSION_HIT);

    // A slot free on peer 1, and the pin queues one request only: one
    // step of decode (1 s) against eight prefills of 12,000 characters
    // (1.2 s).
    up.release(1);
    while (up.inflight(0) > int64_t(kSlots)) {
        up.release(0);
    }

    history.length = 12000;
    hold(0, history);
    expect_next("turn 3", 0, AFFINITY_ROUTE_SESSION_HIT);
}

TEST_F(SlowQueuedPin, PricesTheHistoryAtTheSlowerPeer)
{
    // The pin is slow: one step of its decode is 2.5 s.  Seven more
    // prefills of a 12,000-character history take 1.05 s on the fast peer
    // but 2.6 s on the slow one: priced at the slower, the move is not
    // sooner.
    open(12000);
    fill(0, kSlots);
    fill(1, kSlots - 1);
    fill(2, kSlots);

    expect_next("turn 2", 0, AFFINITY_ROUTE_SESSION_HIT);
    up.release(0);

    // With 6,000 characters (1.3 s at the slow rate) it is.
    history.length = 6000;
    hold(0, history);
    expect_next("turn 3", 1, AFFINITY_ROUTE_SESSION_SPILL);
}

// A short level every listed peer holds (a system prompt) opens a new
// conversation, placed by counts: a peer the entry does not list takes it
// instead when it is sooner by the estimates with the level's prefill
// counted kMoveCost times, whether or not anyone would queue.
class WidelyHeldOpening : public PrefixFleet {
protected:
    WidelyHeldOpening() : PrefixFleet(5) {}

    void SetUp() override
    {
        system = level_of("system", 2000);

        teach_peer(zone.get(), up, 0, kSlow);

        for (size_t i = 1; i < 5; i++) {
            teach_peer(zone.get(), up, i, kFast);
        }

        for (size_t i = 0; i < 4; i++) {
            hold(i, system);
        }
    }

    Routed open(int n)
    {
        return ask_after(system, "a new conversation " + std::to_string(n));
    }

    affinity_level_t system{};
};

TEST_F(WidelyHeldOpening, GoesToASoonerPeerTheEntryDoesNotList)
{
    // By counts the slow holder is the least loaded: two requests beyond
    // its slots, each a step of its slow decode.  The unlisted fast peer
    // queues three steps of its own decode, sooner by far.
    fill(0, kSlots + 1);
    for (size_t i = 1; i < 4; i++) {
        fill(i, kSlots + 3);
    }
    fill(4, kSlots + 2);

    Routed moved = open(1);
    ASSERT_EQ(moved.rc, 0);
    EXPECT_EQ(moved.decision.peer, 4);
    EXPECT_EQ(moved.decision.route, uint32_t(AFFINITY_ROUTE_PREFIX_NEW));
    EXPECT_EQ(moved.decision.held_chars, 0u);
    up.release(4);

    // Five steps of the fast decode tie with two of the slow one: counts
    // decide, and the slow holder takes it.
    fill(4, 2);

    Routed kept = open(2);
    ASSERT_EQ(kept.rc, 0);
    EXPECT_EQ(kept.decision.peer, 0);
}

// The engines' own load: reading their Prometheus text
// (affinity_engine_metrics) and counting it in the load bound
// (affinity_engine_answer, affinity_balance_t.engine_ttl).
#include <string>

#include <gtest/gtest.h>

#include "test_support.h"

using namespace affinity_test;

namespace {

// When the other instances' news below was stamped: half a second into
// second 1000, after the engines were asked at its start (engine_reported).
constexpr uint64_t kNews = 1000500;

// An engine's report of requests running, nothing waiting.
affinity_engine_load_t running(double requests)
{
    affinity_engine_load_t load{};
    load.running = requests;
    load.found = AFFINITY_ENGINE_RUNNING;
    return load;
}

affinity_engine_load_t parse(const std::string &text, int *rc = nullptr)
{
    affinity_engine_load_t load;
    int r = affinity_engine_metrics(text.data(), text.size(), &load);
    if (rc) {
        *rc = r;
    }
    return load;
}

TEST(EngineMetrics, Vllm)
{
    int rc;
    affinity_engine_load_t l = parse(
        "# HELP vllm:num_requests_running Number of requests in model "
        "execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n"
        "vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 2.0\n"
        "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 7.0\n"
        "vllm:num_requests_waiting_by_reason{reason=\"x\"} 99\n"
        "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n"
        "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.75\n"
        "vllm:prompt_tokens_total{model_name=\"m\"} 123456.0\n",
        &rc);
    EXPECT_EQ(rc, 0);
    EXPECT_DOUBLE_EQ(l.running, 5.0);
    EXPECT_DOUBLE_EQ(l.waiting, 7.0);
    EXPECT_DOUBLE_EQ(l.cache_usage, 0.75);
    EXPECT_EQ(l.found, uint32_t(AFFINITY_ENGINE_RUNNING
                                | AFFINITY_ENGINE_WAITING
                                | AFFINITY_ENGINE_CACHE));
}

TEST(EngineMetrics, SglangAndOlderVllm)
{
    affinity_engine_load_t s = parse(
        "sglang:num_running_reqs{model_name=\"m\"} 4\n"
        "sglang:num_queue_reqs{model_name=\"m\"} 1\r\n"
        "sglang:token_usage{model_name=\"m\"} 0.5 1763900000000\n");
    EXPECT_DOUBLE_EQ(s.running, 4.0);
    EXPECT_DOUBLE_EQ(s.waiting, 1.0);
    EXPECT_DOUBLE_EQ(s.cache_usage, 0.5);

    affinity_engine_load_t v = parse(
        "vllm:num_requests_running 1\nvllm:gpu_cache_usage_perc 0.1\n");
    EXPECT_DOUBLE_EQ(v.running, 1.0);
    EXPECT_DOUBLE_EQ(v.cache_usage, 0.1);
}

TEST(EngineMetrics, LabelsMayHoldBracesAndQuotes)
{
    affinity_engine_load_t l = parse(
        "vllm:num_requests_running{model_name=\"a}b\\\"c} 9\"} 2\n");
    EXPECT_DOUBLE_EQ(l.running, 2.0);
}

// The KV cache's size: vLLM puts it in an info metric's labels, SGLang in a
// gauge.  Data-parallel engines' sizes add up.
TEST(EngineMetrics, CacheSize)
{
    affinity_engine_load_t v = parse(
        "# TYPE vllm:cache_config_info gauge\n"
        "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\","
        "enable_prefix_caching=\"True\",engine=\"0\","
        "gpu_memory_utilization=\"0.9\",num_cpu_blocks=\"None\","
        "num_gpu_blocks=\"4096\",prefix_caching_hash_algo=\"sha256\"} 1.0\n"
        "vllm:cache_config_info{engine=\"1\",num_gpu_blocks=\"1024\", "
        "block_size=\"32\"} 1.0\n"
        "vllm:num_requests_running{engine=\"0\"} 1\n");
    EXPECT_DOUBLE_EQ(v.cache_tokens, 4096.0 * 16 + 1024.0 * 32);
    EXPECT_TRUE(v.found & AFFINITY_ENGINE_CAPACITY);

    affinity_engine_load_t s = parse(
        "sglang:max_total_num_tokens{model_name=\"m\"} 471258.0\n"
        "sglang:num_running_reqs{model_name=\"m\"} 0\n");
    EXPECT_DOUBLE_EQ(s.cache_tokens, 471258.0);
    EXPECT_TRUE(s.found & AFFINITY_ENGINE_CAPACITY);

    // Not yet sized, junk, or a label's name only as part of another's.
    const char *unsized[] = {
        "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"}"
        " 1.0\n",
        "vllm:cache_config_info{block_size=\"16\"} 1.0\n",
        "vllm:cache_config_info 1.0\n",
        "vllm:cache_config_info{block_size=\"-16\",num_gpu_blocks=\"-4\"}"
        " 1\n",
        "vllm:cache_config_info{block_size=\"16\",xnum_gpu_blocks=\"4\"}"
        " 1\n",
        "vllm:cache_config_info{block_size=16,num_gpu_blocks=\"4\"} 1\n",
        "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"4} 1\n",
        "vllm:cache_config_info{block_size=\"1e300\","
        "num_gpu_blocks=\"1e300\"} 1\n",
        "sglang:max_total_num_tokens 0\n",
        "sglang:max_total_num_tokens NaN\n",
        "sglang:max_total_num_tokens 1e30\n",
    };
    for (const char *t : unsized) {
        affinity_engine_load_t l = parse(t);
        EXPECT_DOUBLE_EQ(l.cache_tokens, 0.0) << t;
        EXPECT_FALSE(l.found & AFFINITY_ENGINE_CAPACITY) << t;
    }
}

// The prompt tokens an engine computed: its prefix cache's queries less
// its hits, in tokens, only with both counters.
TEST(EngineMetrics, PrefixCacheCounters)
{
    affinity_engine_load_t v = parse(
        "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} "
        "9000.0\n"
        "vllm:prefix_cache_queries_total{engine=\"1\",model_name=\"m\"} "
        "1000.0\n"
        "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 4000\n"
        "vllm:num_requests_running 0\n");
    EXPECT_TRUE(v.found & AFFINITY_ENGINE_COMPUTED);
    EXPECT_DOUBLE_EQ(v.queried_tokens - v.hit_tokens, 6000.0);

    affinity_engine_load_t s = parse(
        "sglang:prompt_tokens_total{model_name=\"m\"} 500\n"
        "sglang:cached_tokens_total{model_name=\"m\"} 200\n"
        "sglang:num_queue_reqs 0\n");
    EXPECT_TRUE(s.found & AFFINITY_ENGINE_COMPUTED);
    EXPECT_DOUBLE_EQ(s.queried_tokens - s.hit_tokens, 300.0);

    for (const char *t : {
             "vllm:prefix_cache_queries_total 10\n",
             "vllm:prefix_cache_hits_total 10\n",
             "vllm:prefix_cache_queries_total 10\n"
             "vllm:prefix_cache_hits_total 11\n",
         })
    {
        affinity_engine_load_t l = parse(t);
        EXPECT_FALSE(l.found & AFFINITY_ENGINE_COMPUTED) << t;
        EXPECT_EQ(l.found, 0u) << t;
    }
}

// A page cut short: its last line, without a line feed, may hold half a
// number, and is not read.
TEST(EngineMetrics, LastLineWithoutLineFeedIsNotRead)
{
    affinity_engine_load_t l = parse(
        "vllm:num_requests_running 3\n"
        "vllm:prefix_cache_queries_total 90000\n"
        "vllm:prefix_cache_hits_total 12");
    EXPECT_DOUBLE_EQ(l.running, 3.0);
    EXPECT_FALSE(l.found & AFFINITY_ENGINE_COMPUTED);

    int rc = 0;
    parse("vllm:num_requests_running 3", &rc);
    EXPECT_EQ(rc, -1);
}

TEST(EngineMetrics, JunkGivesNothing)
{
    const char *texts[] = {
        "",
        "<html>502 Bad Gateway</html>",
        "vllm:num_requests_running{model_name=\"m\"\n",
        "vllm:num_requests_running{model_name=\"m\"} abc\n",
        "vllm:num_requests_running -1\n",
        "vllm:num_requests_running NaN\n",
        "vllm:num_requests_running +Inf\n",
        "vllm:num_requests_running 1e400\n",
        "vllm:num_requests_running_x 3\n",
        "# vllm:num_requests_running 3\n",
        "vllm:kv_cache_usage_perc 0.5\n",
        // each finite, their sum not: no engine queues 1e308 requests
        "vllm:num_requests_waiting 1e308\nvllm:num_requests_waiting 1e308\n",
    };
    for (const char *t : texts) {
        int rc = 0;
        affinity_engine_load_t l = parse(t, &rc);
        EXPECT_EQ(rc, -1) << t;
        EXPECT_DOUBLE_EQ(l.running + l.waiting, 0.0) << t;
    }
}

// Peer 0 is busy with another instance's requests: its engine says 10 in
// flight where this instance counts none.
TEST(EngineLoad, OtherInstancesRequestsCount)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    affinity_engine_load_t busy{};
    busy.running = 4;
    busy.waiting = 6;
    busy.found = AFFINITY_ENGINE_RUNNING | AFFINITY_ENGINE_WAITING;
    engine_reported(z.get(), up.peer(0).slot, busy, 1000);

    affinity_peer_stats_t s = up.stats(0);
    EXPECT_EQ(s.engine_load, 10);
    EXPECT_EQ(s.engine_time, 1000u);
    EXPECT_DOUBLE_EQ(s.cache_usage, -1.0);

    affinity_balance_t without{1.25, 2.0, 0, 0};
    affinity_balance_t with{1.25, 2.0, 3, 0};
    Router blind(z.get(), up, without);
    Router seeing(z.get(), up, with);
    blind.now = seeing.now = 1001;

    EXPECT_EQ(blind.route_key_released(key_on_peer0(0)).decision.peer, 0)
        << "without engine_ttl the figure is not used";
    EXPECT_NE(seeing.route_key_released(key_on_peer0(1)).decision.peer, 0)
        << "with it, the session is placed past the busy peer";

    // A figure older than engine_ttl counts no more.
    seeing.now = 1004;
    EXPECT_EQ(seeing.route_key_released(key_on_peer0(2)).decision.peer, 0);
}

TEST(EngineLoad, RequestsSentSinceTheReportAreAdded)
{
    TestZone z;
    Upstream up(z.get(), {1, 1});
    affinity_engine_load_t load = running(5);

    // 2 in flight here when the engine said 5 (these 2 among them).
    up.acquire(0);
    up.acquire(0);
    engine_reported(z.get(), up.peer(0).slot, load, 1000);
    // 3 more sent since: 5 + 3 = 8 as far as routing knows.
    up.acquire(0);
    up.acquire(0);
    up.acquire(0);

    affinity_balance_t with{1.0, 0.0, 3, 0};
    Router router(z.get(), up, with);
    router.now = 1001;
    // Peer 1 has 7 here: below 8, so a keyless request goes there.
    for (int i = 0; i < 7; i++) {
        up.acquire(1);
    }
    EXPECT_EQ(router.route_nokey().decision.peer, 1);

    // Without the engine's figure, peer 0 (5 here) looks less loaded.
    affinity_balance_t without{1.0, 0.0, 0, 0};
    Router blind(z.get(), up, without);
    EXPECT_EQ(blind.route_nokey().decision.peer, 0);
}

// Requests another instance said it sent (affinity_store) count on top of
// the engine's figure until the engine reports again.
TEST(EngineLoad, RequestsSentElsewhereCountUntilTheNextReport)
{
    TestZone z;
    Upstream up(z.get(), {1, 1});
    affinity_balance_t with{1.0, 0.0, 3, 0};
    Router router(z.get(), up, with);
    router.now = 1001;

    affinity_engine_load_t load = running(0);
    engine_reported(z.get(), up.peer(0).slot, load, 1000);
    engine_reported(z.get(), up.peer(1).slot, load, 1000);

    // Both engines idle; 4 requests here on peer 1, and another instance
    // sent 6 to peer 0 since: peer 1 is the less loaded.
    for (int i = 0; i < 4; i++) {
        up.acquire(1);
    }
    for (int i = 0; i < 6; i++) {
        affinity_zone_peer_sent_elsewhere(z.get(), up.peer(0).id, kNews);
    }
    EXPECT_EQ(up.stats(0).engine_elsewhere, 6);
    EXPECT_EQ(up.stats(1).engine_elsewhere, 0);
    EXPECT_EQ(router.route_nokey().decision.peer, 1);

    // The engine reports again (the 6 ended): peer 0 is idle once more.
    engine_reported(z.get(), up.peer(0).slot, load, 1001);
    EXPECT_EQ(up.stats(0).engine_elsewhere, 0);
    EXPECT_EQ(router.route_nokey().decision.peer, 0);

    // An unknown peer changes nothing.
    affinity_zone_peer_sent_elsewhere(z.get(), 12345, kNews);
    EXPECT_EQ(up.stats(0).engine_elsewhere, 0);
    EXPECT_EQ(up.stats(1).engine_elsewhere, 0);
}

// Requests that ended since the engine reported, here or, as another
// instance said (affinity_store), there, no longer count on the peer:
// otherwise every peer would look as busy as at the report until the next.
TEST(EngineLoad, RequestsEndedSinceTheReportAreTakenOff)
{
    TestZone z;
    Upstream up(z.get(), {1, 1});
    affinity_balance_t with{1.0, 0.0, 3, 0};
    Router router(z.get(), up, with);
    router.now = 1001;

    // Peer 0's engine counts 6 requests of another instance; peer 1's
    // counts the 4 this instance has in flight there.
    affinity_engine_load_t six = running(6);
    affinity_engine_load_t four = running(4);
    for (int i = 0; i < 4; i++) {
        up.acquire(1);
    }
    engine_reported(z.get(), up.peer(0).slot, six, 1000);
    engine_reported(z.get(), up.peer(1).slot, four, 1000);
    EXPECT_EQ(router.route_nokey_released().decision.peer, 1);

    // Three of the other instance's end: 3 on peer 0 against 4.
    for (int i = 0; i < 3; i++) {
        affinity_zone_peer_ended_elsewhere(z.get(), up.peer(0).id, kNews);
    }
    EXPECT_EQ(up.stats(0).engine_elsewhere, -3);
    EXPECT_EQ(router.route_nokey_released().decision.peer, 0);

    // Two of this instance's end: 2 on peer 1 against 3.
    up.release(1);
    up.release(1);
    EXPECT_EQ(router.route_nokey_released().decision.peer, 1);

    // One sent there since and one ended: still 3.
    affinity_zone_peer_sent_elsewhere(z.get(), up.peer(0).id, kNews);
    affinity_zone_peer_ended_elsewhere(z.get(), up.peer(0).id, kNews);
    EXPECT_EQ(up.stats(0).engine_elsewhere, -3);
    EXPECT_EQ(router.route_nokey_released().decision.peer, 1);

    // More ends than the figure held (some ended before the engine
    // reported): never fewer than the requests in flight here.
    for (int i = 0; i < 10; i++) {
        affinity_zone_peer_ended_elsewhere(z.get(), up.peer(0).id, kNews);
    }
    up.acquire(0);
    EXPECT_EQ(router.route_nokey_released().decision.peer, 0)
        << "1 against 2";
    up.acquire(0);
    up.acquire(0);
    EXPECT_EQ(router.route_nokey_released().decision.peer, 1)
        << "3 against 2";

    // The engine reports again: what ended is in its figure.
    engine_reported(z.get(), up.peer(0).slot, six, 1001);
    EXPECT_EQ(up.stats(0).engine_elsewhere, 0);

    // Without a figure nothing is counted: this instance could not tell
    // where the others' requests were counted.
    TestZone other;
    Upstream unpolled(other.get(), {1, 1});
    affinity_zone_peer_ended_elsewhere(other.get(), unpolled.peer(0).id,
                                       kNews);
    EXPECT_EQ(unpolled.stats(0).engine_elsewhere, 0);
}

// The news of a request, however late it is read, counts only if it came
// after the engine was asked: a request that started before is in the
// figure already, one that ended before is not in it.  So a request's
// start and end count both or neither, or its end corrects a figure that
// counts it.
TEST(EngineLoad, NewsCountsAgainstWhenTheEngineWasAsked)
{
    TestZone z;
    Upstream up(z.get(), {1, 1});
    uint64_t peer = up.peer(0).id;
    affinity_engine_load_t one = running(1);

    // Started at 999.9 s and ended at 1000.2 s, read after a report asked
    // for at 1000.1 s (which counted it running): the end is taken off.
    affinity_engine_asked_t asked;
    affinity_engine_ask(z.get(), up.peer(0).slot, 1000100, kAnswerWithin,
                        &asked);
    affinity_engine_answer(z.get(), up.peer(0).slot, &one, 1000, &asked);
    affinity_zone_peer_sent_elsewhere(z.get(), peer, 999900);
    EXPECT_EQ(up.stats(0).engine_elsewhere, 0) << "in the figure already";
    affinity_zone_peer_ended_elsewhere(z.get(), peer, 1000200);
    EXPECT_EQ(up.stats(0).engine_elsewhere, -1);

    // Started and ended before it was asked, read only now: nothing.
    affinity_engine_load_t idle = running(0);
    affinity_engine_ask(z.get(), up.peer(0).slot, 1001300, kAnswerWithin,
                        &asked);
    affinity_engine_answer(z.get(), up.peer(0).slot, &idle, 1001, &asked);
    affinity_zone_peer_sent_elsewhere(z.get(), peer, 1001000);
    affinity_zone_peer_ended_elsewhere(z.get(), peer, 1001200);
    EXPECT_EQ(up.stats(0).engine_elsewhere, 0);

    // Both after it: counted, then taken off.
    affinity_zone_peer_sent_elsewhere(z.get(), peer, 1001300);
    EXPECT_EQ(up.stats(0).engine_elsewhere, 1) << "at the very moment";
    affinity_zone_peer_ended_elsewhere(z.get(), peer, 1001900);
    EXPECT_EQ(up.stats(0).engine_elsewhere, 0);

    // Read while the engine answers: one that started after it was asked
    // is not in the figure it answers, one that started before is.
    affinity_engine_ask(z.get(), up.peer(0).slot, 1002000, kAnswerWithin,
                        &asked);
    affinity_zone_peer_sent_elsewhere(z.get(), peer, 1001950);
    affinity_zone_peer_sent_elsewhere(z.get(), peer, 1002100);
    affinity_engine_answer(z.get(), up.peer(0).slot, &idle, 1002, &asked);
    EXPECT_EQ(up.stats(0).engine_elsewhere, 1);
}

// This instance's requests likewise: one that ends while the engine
// answers is in its figure, and taken off as ended.
TEST(EngineLoad, RequestsHereCountAgainstWhenTheEngineWasAsked)
{
    TestZone z;
    Upstream up(z.get(), {1, 1});
    affinity_balance_t with{1.0, 0.0, 3, 0};
    Router router(z.get(), up, with);
    router.now = 1001;

    affinity_engine_load_t two = running(2);
    affinity_engine_asked_t asked;

    up.acquire(0);
    up.acquire(0);
    affinity_engine_ask(z.get(), up.peer(0).slot, 1000000, kAnswerWithin,
                        &asked);
    up.release(0);
    up.release(0);
    affinity_engine_answer(z.get(), up.peer(0).slot, &two, 1000, &asked);

    // Peer 0 has none, peer 1 one: a keyless request goes to peer 0.
    up.acquire(1);
    EXPECT_EQ(router.route_nokey_released().decision.peer, 0)
        << "the request that ended is not counted";
}

// One ask of an engine waits for its answer at a time, whichever worker
// made it: a poll that comes round while an engine slower than the
// interval still owes the last one its answer drops its own ask, so that
// the news since the first ask is kept for the answer that comes.
TEST(EngineLoad, OneAskOfAnEngineAtATime)
{
    TestZone z;
    Upstream up(z.get(), {1, 1});
    uint32_t slot = up.peer(0).slot;
    uint64_t peer = up.peer(0).id;
    affinity_engine_load_t idle = running(0);
    affinity_engine_load_t five = running(5);
    affinity_engine_asked_t first, second, third;

    EXPECT_EQ(affinity_engine_ask(z.get(), slot, 1000000, kAnswerWithin,
                                  &first), 1);
    affinity_zone_peer_sent_elsewhere(z.get(), peer, 1000100);
    EXPECT_EQ(affinity_engine_awaiting(z.get(), slot, 1000500,
                                       kAnswerWithin), 1);
    EXPECT_EQ(affinity_engine_ask(z.get(), slot, 1000500, kAnswerWithin,
                                  &second), 0);
    EXPECT_EQ(second.ms, 0u);
    EXPECT_EQ(affinity_engine_answer(z.get(), slot, &idle, 1000, &first),
              1);
    EXPECT_EQ(up.stats(0).engine_elsewhere, 1)
        << "the news its answer does not show";

    // An answer to the dropped ask, or one answer twice, changes nothing.
    EXPECT_EQ(affinity_engine_answer(z.get(), slot, &five, 1001, &second),
              0);
    EXPECT_EQ(affinity_engine_answer(z.get(), slot, &five, 1001, &first),
              0);
    EXPECT_EQ(up.stats(0).engine_load, 0);
    EXPECT_EQ(up.stats(0).engine_elsewhere, 1);

    // Answered: the next poll asks.
    EXPECT_EQ(affinity_engine_awaiting(z.get(), slot, 1000600,
                                       kAnswerWithin), 0);
    EXPECT_EQ(affinity_engine_ask(z.get(), slot, 1000600, kAnswerWithin,
                                  &second), 1);

    // Given up (no answer to take): the next asks at once.
    affinity_engine_give_up(z.get(), slot, &second);
    EXPECT_EQ(affinity_engine_ask(z.get(), slot, 1000700, kAnswerWithin,
                                  &third), 1);

    // Abandoned (its worker is gone): the next asks once it is older than
    // its answer could be, or when the clock went back.
    EXPECT_EQ(affinity_engine_ask(z.get(), slot,
                                  1000700 + kAnswerWithin - 1,
                                  kAnswerWithin, &second), 0);
    EXPECT_EQ(affinity_engine_ask(z.get(), slot, 1000700 + kAnswerWithin,
                                  kAnswerWithin, &second), 1);
    EXPECT_EQ(affinity_engine_ask(z.get(), slot, 1001200, kAnswerWithin,
                                  &third), 0)
        << "another worker's clock, read a moment before";
    EXPECT_EQ(affinity_engine_ask(z.get(), slot, 999000, kAnswerWithin,
                                  &third), 1);
    affinity_engine_answer(z.get(), slot, &five, 1002, &third);
    EXPECT_EQ(up.stats(0).engine_load, 5);
}

TEST(EngineLoad, PollingIsOneCallerPerInterval)
{
    TestZone z;
    EXPECT_EQ(affinity_engine_claim_poll(z.get(), 10000, 1000), 1);
    EXPECT_EQ(affinity_engine_claim_poll(z.get(), 10500, 1000), 0);
    EXPECT_EQ(affinity_engine_claim_poll(z.get(), 11000, 1000), 1);
    EXPECT_EQ(affinity_engine_claim_poll(z.get(), 11000, 1000), 0);
}

}  // namespace

// Microbenchmarks of what the balancer runs per request: hashing a key,
// routing a session through the zone (lookup, bound check, ring walk,
// counters), and finding a session field in JSON bodies of several sizes.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "affinity_core.h"

namespace {

struct Fleet {
    explicit Fleet(size_t npeers, size_t zone_bytes = 8 << 20)
        : region(std::aligned_alloc(64, zone_bytes)), peers(npeers),
          states(npeers, AFFINITY_PEER_USABLE)
    {
        affinity_zone_attach(region, zone_bytes, AFFINITY_ZONE_SESSIONS, 16,
                             &zone, nullptr, 0);

        for (size_t i = 0; i < npeers; i++) {
            std::string name = "10.0.0." + std::to_string(i + 1) + ":8000";
            peers[i].id = affinity_peer_id(name.data(), name.size());
            peers[i].weight = 1;
            peers[i].slot = affinity_zone_peer_slot(zone, peers[i].id, 0);
        }

        ring_mem.resize(affinity_ring_size(peers.data(), npeers, 160) / 8 + 1);
        ring = affinity_ring_build(ring_mem.data(), ring_mem.size() * 8,
                                   peers.data(), npeers, 160);
        row = affinity_zone_worker_claim(zone, 1, 0, 0);
    }

    ~Fleet()
    {
        std::free(region);
    }

    // Routes key and releases the in-flight count, as a request would.
    int route(const std::string &key, uint32_t now)
    {
        affinity_request_t request{};
        request.has_key = 1;
        request.key_hash = affinity_zone_key_hash(zone, key.data(),
                                                  key.size());
        request.ring_hash = affinity_ring_hash(key.data(), key.size());
        request.now = now;
        request.timeout = 3600;
        request.row = row;

        affinity_decision_t decision;
        affinity_route(zone, ring, peers.data(), states.data(), peers.size(),
                       &balance, &request, &decision);
        affinity_zone_peer_release(zone, row, decision.slot);
        return decision.peer;
    }

    void *region;
    affinity_zone_t *zone = nullptr;
    affinity_ring_t *ring = nullptr;
    std::vector<uint64_t> ring_mem;     // the ring's memory, as a view's
    uint32_t row = AFFINITY_NO_ROW;     // the worker row, as a worker has
    std::vector<affinity_peer_t> peers;
    std::vector<uint8_t> states;        // per request, as in get_peer
    affinity_balance_t balance{1.25, 2, 0, 0};
};

// The in-flight count of one request start and end, without (0) and with
// (1) the worker row that gives a dead worker's requests back.
void BM_InflightCount(benchmark::State &state)
{
    Fleet fleet(4);
    uint32_t row = state.range(0) ? fleet.row : AFFINITY_NO_ROW;
    uint32_t slot = fleet.peers[1].slot;
    uint64_t id = fleet.peers[1].id;

    for (auto _ : state) {
        affinity_zone_peer_acquire(fleet.zone, row, id, slot, 1000);
        affinity_zone_peer_release(fleet.zone, row, slot);
    }
}
BENCHMARK(BM_InflightCount)->Arg(0)->Arg(1);

std::vector<std::string> session_keys(size_t n)
{
    std::vector<std::string> keys;
    for (size_t i = 0; i < n; i++) {
        keys.push_back("3f2b9c1e-5d4a-4e8b-9a7c-" + std::to_string(100000 + i));
    }
    return keys;
}

void BM_KeyHashes(benchmark::State &state)
{
    Fleet fleet(8);
    std::string key = "3f2b9c1e-5d4a-4e8b-9a7c-1234567890ab";

    for (auto _ : state) {
        benchmark::DoNotOptimize(
            affinity_zone_key_hash(fleet.zone, key.data(), key.size()));
        benchmark::DoNotOptimize(affinity_ring_hash(key.data(), key.size()));
    }
}
BENCHMARK(BM_KeyHashes);

// A pinned session: table lookup, bound check, counters.
void BM_RouteSessionHit(benchmark::State &state)
{
    Fleet fleet(static_cast<size_t>(state.range(0)));
    auto keys = session_keys(10000);

    for (auto &k : keys) {
        fleet.route(k, 1000);
    }

    size_t i = 0;
    for (auto _ : state) {
        benchmark::DoNotOptimize(fleet.route(keys[i++ % keys.size()], 1000));
    }
}
BENCHMARK(BM_RouteSessionHit)->Arg(4)->Arg(16)->Arg(64);

// New sessions: ring walk and insert (evicting when the zone is full).
void BM_RouteSessionNew(benchmark::State &state)
{
    Fleet fleet(static_cast<size_t>(state.range(0)), 1 << 20);
    uint64_t n = 0;

    for (auto _ : state) {
        std::string key = "new-session-" + std::to_string(n++);
        benchmark::DoNotOptimize(fleet.route(key, 1000));
    }
}
BENCHMARK(BM_RouteSessionNew)->Arg(4)->Arg(64);

std::string chat_body(size_t bytes)
{
    std::string text;
    while (text.size() < bytes) {
        text += "The quick brown fox jumps over the lazy dog. ";
    }
    text.resize(bytes);

    return R"({"model":"llama-3-8b","messages":[{"role":"system","content":")"
           + text + R"("}],"temperature":0.2,"user":"session-42"})";
}

// A session field after the prompt: the body is parsed whole first.
void BM_JsonFieldAfterPrompt(benchmark::State &state)
{
    std::string body = chat_body(static_cast<size_t>(state.range(0)));
    std::string padded = body + std::string(AFFINITY_JSON_PADDING, '\0');
    affinity_json_t *json = affinity_json_create(1 << 20);
    char out[256];
    size_t len;

    for (auto _ : state) {
        affinity_json_load(json, padded.data(), body.size());
        benchmark::DoNotOptimize(affinity_json_field(json, "user", 4, out,
                                                     sizeof(out), &len));
        affinity_json_unload(json);
    }

    affinity_json_destroy(json);

    state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(body.size()));
}
BENCHMARK(BM_JsonFieldAfterPrompt)->Arg(4 << 10)->Arg(32 << 10)->Arg(128 << 10);

// Parsing, prompt extraction and level hashing of a multi-turn chat body
// with the module's default levels (the walk stops at the longest, 32k
// characters; the parser validates the whole body).
// Chat text as clients send it: mostly plain, a line break (escaped) every
// line or so, the odd non-ASCII character.
std::string conversation_body(size_t bytes)
{
    std::string body = R"({"model":"llama-3-8b","temperature":0.2,"messages":[)"
                       R"({"role":"system","content":"You are a helpful )"
                       R"(assistant. Answer briefly and cite sources."})";
    for (size_t turn = 0; body.size() < bytes; turn++) {
        body += turn % 2 ? R"(,{"role":"assistant","content":")"
                         : R"(,{"role":"user","content":")";
        for (int line = 0; line < 12; line++) {
            body += "Line " + std::to_string(line) + " of turn "
                    + std::to_string(turn)
                    + ": the quick brown fox jumps over the lazy dog at the "
                      "caf\xc3\xa9 by the river bank.\\n";
        }
        body += "\"}";
    }
    body += "]}";
    return body;
}

// The levels of a chat body of range(0) bytes, with `turns` turn levels.
void prompt_levels(benchmark::State &state, size_t turns)
{
    std::string body = conversation_body(static_cast<size_t>(state.range(0)));
    std::string padded = body + std::string(AFFINITY_JSON_PADDING, '\0');
    const uint32_t seeds[] = {100, 500, 1000};
    uint32_t schedule[AFFINITY_MAX_LEVELS];
    size_t nschedule = affinity_level_schedule(seeds, 3, 256, 6, 32 * 1024,
                                               schedule, AFFINITY_MAX_LEVELS);
    affinity_level_t levels[AFFINITY_MAX_LEVELS];
    size_t nlevels = 0;
    affinity_json_t *json = affinity_json_create(2 << 20);

    for (auto _ : state) {
        affinity_json_load(json, padded.data(), body.size());
        benchmark::DoNotOptimize(affinity_json_prompt(
            json, schedule, nschedule, turns, levels, AFFINITY_MAX_LEVELS,
            &nlevels));
        affinity_json_unload(json);
    }

    affinity_json_destroy(json);

    state.counters["levels"] = double(nlevels);
    state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(body.size()));
}

// prefix_affinity's default turns=8.
void BM_PromptLevels(benchmark::State &state)
{
    prompt_levels(state, 8);
}
BENCHMARK(BM_PromptLevels)
    ->Arg(4 << 10)->Arg(32 << 10)->Arg(128 << 10)->Arg(1 << 20);

// turns=0: what the turn levels cost.
void BM_PromptLevelsWithoutTurns(benchmark::State &state)
{
    prompt_levels(state, 0);
}
BENCHMARK(BM_PromptLevelsWithoutTurns)->Arg(4 << 10)->Arg(32 << 10);

// A Responses API object as vLLM writes it: the id first, "object" after
// the instructions, then the output text; about `bytes` long.
std::string response_body(size_t bytes, const std::string &id)
{
    std::string head = "{\"id\":\"" + id + "\",\"created_at\":1763900000,"
                       "\"incomplete_details\":null,\"instructions\":"
                       "\"You are a helpful assistant.\",\"metadata\":{},"
                       "\"model\":\"llm\",\"object\":\"response\","
                       "\"output\":[{\"type\":\"message\",\"id\":\"msg_1\","
                       "\"status\":\"completed\",\"role\":\"assistant\","
                       "\"content\":[{\"type\":\"output_text\",\"text\":\"";
    std::string tail = "\",\"annotations\":[]}]}],\"status\":\"completed\","
                       "\"usage\":{\"input_tokens\":812,\"output_tokens\":96}}";
    std::string text;
    while (head.size() + text.size() + tail.size() < bytes) {
        text += "The answer, with a \\\"quoted\\\" word and more words. ";
    }
    return head + text + tail;
}

// What the module does per response: reads the body as nginx passes it
// (4 KB buffers) until the id is known, then remembers it in the
// responses zone.  Arg: body bytes, 0 for a stream's first event.
void BM_ResponseLearn(benchmark::State &state)
{
    size_t bytes = static_cast<size_t>(state.range(0));
    std::string id = "resp_3f1c2a9b8e7d4c6b5a4f3e2d1c0b9a87";
    std::string body = bytes
        ? response_body(bytes, id)
        : "event: response.created\ndata: {\"type\":\"response.created\","
          "\"sequence_number\":0,\"response\":{\"id\":\"" + id
          + "\",\"created_at\":1763900000,\"instructions\":\"You are a "
          "helpful assistant.\",\"model\":\"llm\",\"object\":\"response\","
          "\"output\":[],\"status\":\"in_progress\"}}\n\n"
          "event: response.output_text.delta\ndata: {\"type\":"
          "\"response.output_text.delta\",\"delta\":\"The\"}\n\n";
    affinity_response_format_e format = bytes ? AFFINITY_RESPONSE_JSON
                                              : AFFINITY_RESPONSE_EVENTS;
    Fleet fleet(4);
    void *region = std::aligned_alloc(64, 8 << 20);
    affinity_zone_t *responses = nullptr;
    affinity_zone_attach(region, 8 << 20, AFFINITY_ZONE_RESPONSES, 16,
                         &responses, nullptr, 0);
    uint32_t now = 1;

    for (auto _ : state) {
        affinity_response_scan_t scan;
        affinity_response_scan_start(&scan, format);
        affinity_scan_e rc = AFFINITY_SCAN_MORE;
        for (size_t at = 0; at < body.size() && rc == AFFINITY_SCAN_MORE;
             at += 4096)
        {
            rc = affinity_response_scan(&scan, body.data() + at,
                                        std::min<size_t>(4096,
                                                         body.size() - at));
        }
        size_t len;
        affinity_object_e object;
        const char *found = affinity_response_scan_id(&scan, &len, &object);
        uint64_t hash = affinity_zone_key_hash(responses, found, len);
        affinity_responses_learn(responses, hash, fleet.peers[now % 4].id,
                                 uint64_t(now) * 1000, now, 3600);
        now++;
    }

    std::free(region);
    state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(body.size()));
}
BENCHMARK(BM_ResponseLearn)->Arg(0)->Arg(1 << 10)->Arg(16 << 10)
    ->Arg(128 << 10);

// What the module does per reply of a request it routed: reads the usage
// from the whole body as nginx passes it (4 KB buffers), then teaches the
// peer's pace.  A streamed chat reply of Arg chunks, one token each, with
// its usage in the last one (stream_options.include_usage).
void BM_ReplyTimed(benchmark::State &state)
{
    std::string body;
    for (int64_t i = 0; i < state.range(0); i++) {
        body += "data: {\"id\":\"chatcmpl-1\",\"object\":"
                "\"chat.completion.chunk\",\"created\":1763900000,"
                "\"model\":\"llm\",\"choices\":[{\"index\":0,"
                "\"delta\":{\"content\":\" word\"},\"logprobs\":null,"
                "\"finish_reason\":null}]}\n\n";
    }
    body += "data: {\"id\":\"chatcmpl-1\",\"object\":"
            "\"chat.completion.chunk\",\"choices\":[],\"usage\":"
            "{\"prompt_tokens\":812,\"completion_tokens\":96,"
            "\"prompt_tokens_details\":{\"cached_tokens\":512}}}\n\n"
            "data: [DONE]\n\n";
    Fleet fleet(4);
    uint32_t n = 0;

    for (auto _ : state) {
        affinity_usage_scan_t scan;
        affinity_usage_scan_start(&scan);
        for (size_t at = 0; at < body.size(); at += 4096) {
            affinity_usage_scan(&scan, body.data() + at,
                                std::min<size_t>(4096, body.size() - at));
        }
        uint64_t prompt, output, cached, unused;
        affinity_usage_scan_tokens(&scan, &prompt, &output);
        if (!affinity_usage_scan_result(&scan, &cached, &unused)) {
            cached = 0;
        }
        affinity_reply_times_t t{};
        t.first_ms = 80 + n % 7;
        t.total_ms = 2000 + n % 13;
        t.queued = n % 5;
        t.streamed = 1;
        t.prompt_chars = 3300;
        t.prompt_tokens = uint32_t(prompt);
        t.cached_tokens = uint32_t(cached);
        t.output_tokens = uint32_t(output);
        const affinity_peer_t &peer = fleet.peers[n % 4];
        affinity_zone_peer_timed(fleet.zone, peer.slot, peer.id, &t);
        n++;
    }

    state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(body.size()));
}
BENCHMARK(BM_ReplyTimed)->Arg(1)->Arg(100)->Arg(1000);

// The owner of a continued response: the id's hash and the lookup.
void BM_ResponseOwner(benchmark::State &state)
{
    void *region = std::aligned_alloc(64, 8 << 20);
    affinity_zone_t *responses = nullptr;
    affinity_zone_attach(region, 8 << 20, AFFINITY_ZONE_RESPONSES, 16,
                         &responses, nullptr, 0);
    std::vector<std::string> ids;
    for (int i = 0; i < 4096; i++) {
        ids.push_back("resp_" + std::to_string(1000000007ULL * i));
        affinity_responses_learn(responses,
                                 affinity_zone_key_hash(responses,
                                                        ids.back().data(),
                                                        ids.back().size()),
                                 42, 1000, 1, 3600);
    }
    size_t i = 0;

    for (auto _ : state) {
        const std::string &id = ids[i++ % ids.size()];
        uint64_t hash = affinity_zone_key_hash(responses, id.data(),
                                               id.size());
        benchmark::DoNotOptimize(affinity_responses_owner(responses, hash, 2,
                                                          3600));
    }

    std::free(region);
}
BENCHMARK(BM_ResponseOwner);

}  // namespace

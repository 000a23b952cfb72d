// UsageScan: the prompt tokens and cached tokens of a reply's usage, read
// from a JSON body or an event stream split anywhere.
#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "affinity_core.h"

namespace {

struct Usage {
    bool found;
    uint64_t cached;
    uint64_t prompt;
    uint64_t output;
};

// The body fed in pieces of step bytes (0: at once).
Usage scan(const std::string &body, size_t step = 0)
{
    affinity_usage_scan_t s;
    affinity_usage_scan_start(&s);
    if (step == 0) {
        affinity_usage_scan(&s, body.data(), body.size());
    } else {
        for (size_t at = 0; at < body.size(); at += step) {
            affinity_usage_scan(&s, body.data() + at,
                                std::min(step, body.size() - at));
        }
    }
    Usage u{false, 0, 0, 0};
    u.found = affinity_usage_scan_result(&s, &u.cached, &u.prompt) == 1;
    uint64_t prompt = 0;
    affinity_usage_scan_tokens(&s, &prompt, &u.output);
    EXPECT_EQ(prompt, u.found ? u.prompt : prompt);
    return u;
}

const std::string kChat =
    R"({"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,)"
    R"("message":{"role":"assistant","content":"The \"cached_tokens\": 7 )"
    R"(key is in usage"}}],"usage":{"prompt_tokens":1234,)"
    R"("completion_tokens":56,"total_tokens":1290,)"
    R"("prompt_tokens_details":{"cached_tokens":1024}}})";

TEST(UsageScan, ReadsAChatCompletionsUsage)
{
    for (size_t step : {0, 1, 2, 3, 7, 64}) {
        SCOPED_TRACE(step);
        Usage u = scan(kChat, step);
        EXPECT_TRUE(u.found);
        EXPECT_EQ(u.cached, 1024u);
        EXPECT_EQ(u.prompt, 1234u);
    }
}

TEST(UsageScan, ReadsTheLastChunkOfAStream)
{
    std::string stream =
        "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],"
        "\"usage\":null}\n\n"
        "data: {\"choices\":[{\"delta\":{\"content\":\"\\\"cached_tokens"
        "\\\":3\"}}]}\n\n"
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":  900 ,"
        "\"prompt_tokens_details\" : { \"cached_tokens\" :\r\n 512 }}}\n\n"
        "data: [DONE]\n\n";
    for (size_t step : {0, 1, 5}) {
        SCOPED_TRACE(step);
        Usage u = scan(stream, step);
        EXPECT_TRUE(u.found);
        EXPECT_EQ(u.cached, 512u);
        EXPECT_EQ(u.prompt, 900u);
    }

    // Usage in every chunk (continuous usage stats): the last wins.
    Usage u = scan("data: {\"usage\":{\"prompt_tokens\":10,"
                   "\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n"
                   "data: {\"usage\":{\"prompt_tokens\":10,"
                   "\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n");
    EXPECT_EQ(u.cached, 8u);
}

TEST(UsageScan, ACountTheBodyEndsInIsRead)
{
    Usage u = scan(R"({"usage":{"prompt_tokens":64,"cached_tokens":48)", 5);
    EXPECT_TRUE(u.found);
    EXPECT_EQ(u.cached, 48u);
    EXPECT_EQ(u.prompt, 64u);
}

TEST(UsageScan, ReadsTheResponsesApiUsage)
{
    Usage u = scan(R"({"id":"resp_1","object":"response","usage":)"
                   R"({"input_tokens":300,"input_tokens_details":)"
                   R"({"cached_tokens":256},"output_tokens":9}})");
    EXPECT_TRUE(u.found);
    EXPECT_EQ(u.cached, 256u);
    EXPECT_EQ(u.prompt, 300u);
}

TEST(UsageScan, NoCountIsNoUsage)
{
    for (const char *body : {
             R"({"usage":{"prompt_tokens":5,"prompt_tokens_details":null}})",
             R"({"usage":{"prompt_tokens":5}})",
             R"({"cached_tokens":-3})",
             R"({"cached_tokens":"12"})",
             R"({"cached_tokens":1.5})",
             R"({"cached_tokens":2e3})",
             R"({"cached_tokens":1234567890123456789})",
             R"({"x":"cached_tokens":4})",
             R"("cached_tokens)" "\n" R"(":4)",
             R"({"cached_tokens\u0022:4})",
             "",
             "\"\"\"\\"}) {
        SCOPED_TRACE(body);
        Usage u = scan(body);
        // A string value followed by a colon is not JSON, but it is read
        // as a key: nothing of the kind comes from an engine.
        if (std::string(body) == R"({"x":"cached_tokens":4})") {
            continue;
        }
        EXPECT_FALSE(u.found);
    }
}

TEST(UsageScan, ALongerKeyOrAnEscapeIsAnotherKey)
{
    Usage u = scan(R"({"cached_tokens_x":4,"xcached_tokens":5,)"
                   R"("cached\u005ftokens":6,"prompt_tokens_details":7})");
    EXPECT_FALSE(u.found);
    EXPECT_EQ(u.prompt, 0u);
}

TEST(UsageScan, TheReplysOwnTokens)
{
    EXPECT_EQ(scan(kChat).output, 56u);
    EXPECT_EQ(scan(kChat, 3).output, 56u);
    EXPECT_EQ(scan(R"({"usage":{"input_tokens":9,"output_tokens":41}})")
                  .output,
              41u);

    // Without cached_tokens the prompt and output counts are still read.
    affinity_usage_scan_t s;
    const std::string body = R"({"usage":{"prompt_tokens":7,)"
                             R"("completion_tokens":3}})";
    affinity_usage_scan_start(&s);
    affinity_usage_scan(&s, body.data(), body.size());
    uint64_t prompt = 0, output = 0;
    affinity_usage_scan_tokens(&s, &prompt, &output);
    EXPECT_EQ(prompt, 7u);
    EXPECT_EQ(output, 3u);

    EXPECT_EQ(scan(R"({"completion_tokens_details":{"x":1}})").output, 0u);
    EXPECT_EQ(scan(R"({"completion_tokens":-1})").output, 0u);
}

}  // namespace

// Prompt prefixes: the canonical prompt text of chat completions,
// completions and Responses API bodies (prompt_walk.cpp), and the levels
// cut from it (level_hasher.cpp): the schedule, counted in code points, the
// message ends, through affinity_level_schedule() and affinity_json_prompt().
//
// The canonical text (prompt_walk.h), with US = 0x1f, RS = 0x1e and
// GS = 0x1d:
//   "model" US model RS
//   "tool" US compact-json RS            for each element of "tools"
//   role US text RS                      for each message (text: the string
//                                        content or the parts in order,
//                                        non-text parts as
//                                        GS type ":" hex-hash GS)
//   "prompt" US text RS                  completions
//   "instructions" US text RS, then "input" as a user message or as items
//                                        (items without a role: type US
//                                        compact-json RS)
// A level of length L is XXH3 with the fixed seed "prefix01" of the first L
// code points.  Tests that compare two bodies compare their levels of equal
// length; the golden tests rebuild the canonical text and hash it.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "affinity_core.h"
#include "test_support.h"

using namespace affinity_test;

namespace {

constexpr uint64_t kPrefixSeed = 0x7072656669783031ULL;   // "prefix01"

const std::string US = "\x1f";
const std::string RS = "\x1e";
const std::string GS = "\x1d";

// Raw UTF-8 of a few characters and their JSON escapes.
const std::string kEAcute = "\xc3\xa9";             // é, 2 bytes
const std::string kEuro = "\xe2\x82\xac";           // €, 3 bytes
const std::string kGrin = "\xf0\x9f\x98\x80";       // 😀, 4 bytes

// ---- helpers ------------------------------------------------------------

// A JSON string literal of UTF-8 text (quotes, backslashes and control
// characters escaped, everything else raw).
std::string js(const std::string &text)
{
    std::string out = "\"";
    for (unsigned char c : text) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += char(c);
        } else if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            out += buf;
        } else {
            out += char(c);
        }
    }
    return out + "\"";
}

struct Msg {
    std::string role;
    std::string content;
};

// A compact chat completions body; no model when model is empty.
std::string chat(const std::vector<Msg> &messages,
                 const std::string &model = "m")
{
    std::string body = "{";
    if (!model.empty()) {
        body += "\"model\":" + js(model) + ",";
    }
    body += "\"messages\":[";
    for (size_t i = 0; i < messages.size(); i++) {
        body += (i ? "," : "");
        body += "{\"role\":" + js(messages[i].role)
                + ",\"content\":" + js(messages[i].content) + "}";
    }
    return body + "]}";
}

std::string user_chat(const std::string &text, const std::string &model = "m")
{
    return chat({{"user", text}}, model);
}

// The canonical text of user_chat(text, model).
std::string user_canonical(const std::string &text,
                           const std::string &model = "m")
{
    std::string c;
    if (!model.empty()) {
        c += "model" + US + model + RS;
    }
    return c + "user" + US + text + RS;
}

size_t code_points(const std::string &utf8)
{
    size_t n = 0;
    for (unsigned char c : utf8) {
        n += (c & 0xc0) != 0x80;
    }
    return n;
}

// The first n code points of UTF-8 text.
std::string cp_prefix(const std::string &utf8, size_t n)
{
    size_t seen = 0, i = 0;
    for (; i < utf8.size(); i++) {
        if ((static_cast<unsigned char>(utf8[i]) & 0xc0) != 0x80) {
            if (seen == n) {
                break;
            }
            seen++;
        }
    }
    return utf8.substr(0, i);
}

uint64_t level_hash(const std::string &canonical, size_t length)
{
    std::string p = cp_prefix(canonical, length);
    return affinity_hash(p.data(), p.size(), kPrefixSeed);
}

std::vector<uint32_t> schedule_of(std::vector<uint32_t> lengths,
                                  uint32_t step = 0, uint32_t growth = 0,
                                  uint32_t max = 0, size_t cap = 128)
{
    std::vector<uint32_t> out(cap + 4, 0xabababab);
    size_t n = affinity_level_schedule(lengths.data(), lengths.size(), step,
                                       growth, max, out.data(), cap);
    EXPECT_LE(n, cap);
    for (size_t i = cap; i < out.size(); i++) {
        EXPECT_EQ(out[i], 0xababababu) << "wrote past out_cap at " << i;
    }
    out.resize(std::min(n, cap));
    return out;
}

// Levels every `step` code points from step to max.
std::vector<uint32_t> every(uint32_t step, uint32_t max)
{
    return schedule_of({step}, step, 0, max);
}

// The levels of a body that must have a prompt.
std::vector<affinity_level_t> ok_levels(const std::string &body,
                                        const std::vector<uint32_t> &schedule)
{
    Prompt p = prompt_levels(body, schedule);
    EXPECT_EQ(p.rc, AFFINITY_PROMPT_OK) << body.substr(0, 200);
    return p.levels;
}

std::vector<uint32_t> lengths_of(const std::vector<affinity_level_t> &levels)
{
    std::vector<uint32_t> out;
    for (const affinity_level_t &l : levels) {
        out.push_back(l.length);
    }
    return out;
}

// Checks that the levels are those of the canonical text: one per
// scheduled length it reaches (or one of its own length when it is shorter
// than the first), each the hash of that many code points.
void expect_canonical(const std::vector<affinity_level_t> &levels,
                      const std::string &canonical,
                      const std::vector<uint32_t> &schedule)
{
    size_t total = code_points(canonical);
    std::vector<uint32_t> expected;
    for (uint32_t l : schedule) {
        if (l <= total) {
            expected.push_back(l);
        }
    }
    if (expected.empty() && total > 0) {
        expected.push_back(uint32_t(total));
    }

    ASSERT_EQ(lengths_of(levels), expected) << "canonical length " << total;
    for (const affinity_level_t &l : levels) {
        EXPECT_EQ(l.hash, level_hash(canonical, l.length))
            << "level " << l.length;
    }
}

// Levels of a and b at equal lengths: whether each pair is equal.
struct Comparison {
    size_t common = 0;      // lengths present in both
    size_t equal = 0;
    std::vector<uint32_t> differing;
};

Comparison compare(const std::vector<affinity_level_t> &a,
                   const std::vector<affinity_level_t> &b)
{
    Comparison c;
    for (const affinity_level_t &x : a) {
        for (const affinity_level_t &y : b) {
            if (x.length == y.length) {
                c.common++;
                if (x.hash == y.hash) {
                    c.equal++;
                } else {
                    c.differing.push_back(x.length);
                }
            }
        }
    }
    return c;
}

// Both bodies have a prompt and the same levels.
void expect_same(const std::string &a, const std::string &b,
                 const std::vector<uint32_t> &schedule = every(7, 700))
{
    std::vector<affinity_level_t> la = ok_levels(a, schedule);
    std::vector<affinity_level_t> lb = ok_levels(b, schedule);

    ASSERT_FALSE(la.empty());
    ASSERT_EQ(lengths_of(la), lengths_of(lb)) << a << "\n" << b;
    for (size_t i = 0; i < la.size(); i++) {
        EXPECT_EQ(la[i].hash, lb[i].hash)
            << "level " << la[i].length << "\n" << a << "\n" << b;
    }
}

// Both bodies have a prompt and their longest common level differs (by
// default the only level is the whole canonical text).
void expect_differ(const std::string &a, const std::string &b,
                   const std::vector<uint32_t> &schedule = {1u << 30})
{
    std::vector<affinity_level_t> la = ok_levels(a, schedule);
    std::vector<affinity_level_t> lb = ok_levels(b, schedule);

    ASSERT_FALSE(la.empty());
    ASSERT_FALSE(lb.empty());
    size_t n = std::min(la.size(), lb.size());
    EXPECT_NE(la[n - 1].hash, lb[n - 1].hash)
        << "level " << la[n - 1].length << "/" << lb[n - 1].length << "\n"
        << a << "\n" << b;
}

// ---- the schedule -------------------------------------------------------

TEST(LevelSchedule, GivenLengthsAreSortedWithoutDuplicates)
{
    EXPECT_EQ(schedule_of({500, 100, 1000, 100, 500, 1000}),
              (std::vector<uint32_t>{100, 500, 1000}));
    EXPECT_EQ(schedule_of({3, 2, 1}), (std::vector<uint32_t>{1, 2, 3}));
    EXPECT_EQ(schedule_of({7, 7, 7}), (std::vector<uint32_t>{7}));
}

TEST(LevelSchedule, ZerosAreDropped)
{
    EXPECT_EQ(schedule_of({0, 300, 0, 200}),
              (std::vector<uint32_t>{200, 300}));
    EXPECT_TRUE(schedule_of({0}).empty());
    EXPECT_TRUE(schedule_of({}).empty());
    EXPECT_EQ(affinity_level_schedule(nullptr, 0, 0, 6, 1000, nullptr, 0),
              0u);
}

TEST(LevelSchedule, StepZeroAddsNothing)
{
    EXPECT_EQ(schedule_of({100, 500, 1000}, 0, 6, 128 * 1024),
              (std::vector<uint32_t>{100, 500, 1000}));
    EXPECT_EQ(schedule_of({1000, 100}, 0, 50, 1u << 30),
              (std::vector<uint32_t>{100, 1000}));
}

TEST(LevelSchedule, ExtendsByStepUpToMaxInclusive)
{
    EXPECT_EQ(schedule_of({100}, 100, 0, 500),
              (std::vector<uint32_t>{100, 200, 300, 400, 500}));
    EXPECT_EQ(schedule_of({100}, 100, 0, 499),
              (std::vector<uint32_t>{100, 200, 300, 400}));
    // A step past max adds nothing; the given lengths stay.
    EXPECT_EQ(schedule_of({100, 2000}, 100, 0, 1000),
              (std::vector<uint32_t>{100, 2000}));
}

TEST(LevelSchedule, ExtendsByGrowthWhenItPassesTheStep)
{
    // gap = max(10, previous * 50 / 100), in integers:
    // 100 +50 150 +75 225 +112 337 +168 505 +252 757 (+378 = 1135 > 1000)
    EXPECT_EQ(schedule_of({100}, 10, 50, 1000),
              (std::vector<uint32_t>{100, 150, 225, 337, 505, 757}));

    // The step wins while the growth is smaller: 256 until 6% passes it.
    std::vector<uint32_t> s = schedule_of({1000}, 256, 6, 10000);
    ASSERT_GE(s.size(), 3u);
    EXPECT_EQ(s[0], 1000u);
    EXPECT_EQ(s[1], 1256u);
    EXPECT_EQ(s[2], 1512u);

    // Every gap is exactly max(step, previous * growth / 100), and the
    // next one would pass max.
    for (uint32_t growth : {0u, 1u, 6u, 25u, 100u}) {
        for (uint32_t step : {1u, 7u, 256u}) {
            SCOPED_TRACE(testing::Message() << "growth " << growth << " step "
                                            << step);
            const uint32_t max = 50000;
            std::vector<uint32_t> t = schedule_of({100}, step, growth, max);
            ASSERT_FALSE(t.empty());
            EXPECT_EQ(t[0], 100u);
            for (size_t i = 1; i < t.size(); i++) {
                uint64_t gap = std::max<uint64_t>(
                    step, uint64_t(t[i - 1]) * growth / 100);
                ASSERT_EQ(uint64_t(t[i]), t[i - 1] + gap) << "at " << i;
            }
            uint64_t last = t.back();
            uint64_t gap = std::max<uint64_t>(step, last * growth / 100);
            if (t.size() < 128) {
                EXPECT_GT(last + gap, max);
            }
            EXPECT_LE(last, max);
        }
    }
}

TEST(LevelSchedule, RespectsOutCap)
{
    std::vector<uint32_t> full = default_schedule();
    ASSERT_GT(full.size(), 10u);

    for (size_t cap : {0u, 1u, 2u, 3u, 4u, 10u}) {
        std::vector<uint32_t> part = schedule_of({100, 500, 1000}, 256, 6,
                                                 128 * 1024, cap);
        EXPECT_EQ(part, std::vector<uint32_t>(full.begin(),
                                              full.begin() + long(cap)))
            << "out_cap " << cap;
    }

    // A step of 1 up to a large max stops at out_cap.
    std::vector<uint32_t> ones = schedule_of({1}, 1, 0, 1u << 30, 128);
    ASSERT_EQ(ones.size(), 128u);
    EXPECT_EQ(ones.back(), 128u);
}

TEST(LevelSchedule, OutCapKeepsTheShortestGivenLengths)
{
    // With fewer slots than given lengths, the schedule is still the
    // shortest ones in order (the prefix of the full schedule): the first
    // level is the one most prompts reach.
    EXPECT_EQ(schedule_of({100, 500, 1000}, 0, 0, 0, 2),
              (std::vector<uint32_t>{100, 500}));
    EXPECT_EQ(schedule_of({1000, 500, 100}, 0, 0, 0, 2),
              (std::vector<uint32_t>{100, 500}));
    EXPECT_EQ(schedule_of({1000, 100}, 256, 6, 5000, 1),
              (std::vector<uint32_t>{100}));
}

TEST(LevelSchedule, LargeValuesDoNotWrap)
{
    std::vector<uint32_t> s =
        schedule_of({4000000000u}, 1000000000u, 100, UINT32_MAX);
    EXPECT_EQ(s, (std::vector<uint32_t>{4000000000u}));

    s = schedule_of({1u << 31}, 1u << 30, 0, UINT32_MAX);
    EXPECT_EQ(s, (std::vector<uint32_t>{1u << 31, (1u << 31) + (1u << 30)}));

    s = schedule_of({UINT32_MAX - 1}, 1, 0, UINT32_MAX);
    EXPECT_EQ(s, (std::vector<uint32_t>{UINT32_MAX - 1, UINT32_MAX}));
}

TEST(LevelSchedule, ModuleDefaults)
{
    std::vector<uint32_t> s = default_schedule();

    ASSERT_GE(s.size(), 4u);
    EXPECT_LE(s.size(), size_t(AFFINITY_MAX_LEVELS));
    EXPECT_EQ(s[0], 100u);
    EXPECT_EQ(s[1], 500u);
    EXPECT_EQ(s[2], 1000u);
    EXPECT_EQ(s[3], 1256u);
    EXPECT_LE(s.back(), 32u * 1024);
    EXPECT_GT(s.back() + std::max<uint32_t>(256, s.back() * 6 / 100),
              32u * 1024);

    uint32_t previous_gap = 0;
    for (size_t i = 1; i < s.size(); i++) {
        ASSERT_GT(s[i], s[i - 1]) << "at " << i;
        if (s[i - 1] >= 1000) {
            uint32_t gap = s[i] - s[i - 1];
            EXPECT_GE(gap, 256u) << "after " << s[i - 1];
            EXPECT_GE(gap, previous_gap) << "after " << s[i - 1];
            previous_gap = gap;
        }
    }
}

// ---- the canonical text ---------------------------------------------------

TEST(PromptCanonical, LevelsAreTheHashesOfTheCanonicalText)
{
    std::string tools_pretty =
        "[ {\n  \"type\" : \"function\",\n  \"function\" : {\n"
        "    \"name\" : \"get_weather\",\n"
        "    \"description\" : \"Weather in a city, in \\u00b0C\",\n"
        "    \"parameters\" : { \"type\" : \"object\", \"properties\" : {\n"
        "      \"days\" : { \"type\" : \"integer\", \"minimum\" : 1,"
        " \"maximum\" : 14 } } } } } ]";
    // The compact JSON is written from the parsed value: the escape
    // \u00b0 becomes the character it stands for.
    std::string tools_compact =
        "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"description\":\"Weather in a city, in \xc2\xb0" "C\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{"
        "\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":14}}}}}";
    std::string system = "You are a weather bot. Answer in " + kEuro
                         + " and " + kGrin + ".";
    std::string user = "Caf" + kEAcute + " in Paris? " + std::string(600, 'x');

    std::string body = "{\"model\":\"gpt-x\",\"tools\":" + tools_pretty
                       + ",\"messages\":[{\"role\":\"system\",\"content\":"
                       + js(system) + "},{\"role\":\"user\",\"content\":"
                       + js(user) + "}],\"temperature\":0.2}";
    std::string canonical = "model" + US + "gpt-x" + RS + "tool" + US
                            + tools_compact + RS + "system" + US + system
                            + RS + "user" + US + user + RS;

    for (const std::vector<uint32_t> &schedule :
         {every(3, 384), every(7, 700), every(50, 5000), default_schedule(),
          std::vector<uint32_t>{100000}}) {
        SCOPED_TRACE(testing::Message() << schedule.size() << " levels");
        expect_canonical(ok_levels(body, schedule), canonical, schedule);
    }
}

TEST(PromptCanonical, UnicodeEscapesEqualRawUtf8)
{
    // js() keeps UTF-8 raw; escaped bodies are written by hand.
    const std::string cafe = "{\"model\":\"m\",\"messages\":[{\"role\":"
                             "\"user\",\"content\":\"caf\\u00e9\"}]}";
    expect_same(cafe, user_chat("caf" + kEAcute), every(1, 40));
    std::string raw = user_chat("caf" + kEAcute + " " + kEuro + " \xc2\xb5");
    std::string escaped = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\","
                          "\"content\":\"caf\\u00e9 \\u20AC \\u00b5\"}]}";
    expect_same(raw, escaped);

    // Escapes in the model name and in a text part too.
    expect_same("{\"model\":\"mod\\u00e8le\",\"messages\":[{\"role\":"
                "\"user\",\"content\":[{\"type\":\"text\",\"text\":"
                "\"\\u00e9t\\u00e9\"}]}]}",
                "{\"model\":\"mod\xc3\xa8le\",\"messages\":[{\"role\":"
                "\"user\",\"content\":[{\"type\":\"text\",\"text\":"
                "\"" + kEAcute + "t" + kEAcute + "\"}]}]}");

    // Other escapes of the same characters.
    expect_same(user_chat("a/b \"q\" \\ \n\t"),
                "{\"model\":\"m\",\"messages\":[{\"role\":\"user\","
                "\"content\":\"a\\/b \\u0022q\\\" \\u005c \\n\\u0009\"}]}");

    // The escaped text hashes as its code points.
    expect_canonical(ok_levels(cafe, every(1, 40)),
                     user_canonical("caf" + kEAcute), every(1, 40));
}

TEST(PromptCanonical, SurrogatePairsEqualRawUtf8)
{
    std::string escaped = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\","
                          "\"content\":\"smile \\ud83d\\ude00!\"}]}";
    std::string upper = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\","
                        "\"content\":\"smile \\uD83D\\uDE00!\"}]}";
    std::string raw = user_chat("smile " + kGrin + "!");

    expect_same(escaped, raw, every(1, 30));
    expect_same(upper, raw, every(1, 30));
    // The pair is one code point: the canonical text is 22 long.
    expect_canonical(ok_levels(escaped, every(1, 30)),
                     user_canonical("smile " + kGrin + "!"), every(1, 30));
}

TEST(PromptCanonical, KeyOrderDoesNotMatter)
{
    std::string tools = "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]";
    std::string msgs = "[{\"role\":\"system\",\"content\":\"be brief\"},"
                       "{\"role\":\"user\",\"content\":\"hello there\"}]";
    std::string a = "{\"model\":\"m\",\"tools\":" + tools
                    + ",\"messages\":" + msgs + "}";

    expect_same(a, "{\"messages\":" + msgs + ",\"tools\":" + tools
                       + ",\"model\":\"m\"}");
    expect_same(a, "{\"tools\":" + tools + ",\"messages\":" + msgs
                       + ",\"model\":\"m\"}");
    expect_same(a, "{\"model\":\"m\",\"tools\":" + tools
                       + ",\"messages\":[{\"content\":\"be brief\","
                         "\"role\":\"system\"},{\"content\":\"hello there\","
                         "\"role\":\"user\"}]}");

    // Inside content parts.
    expect_same(
        "{\"messages\":[{\"role\":\"user\",\"content\":["
        "{\"type\":\"text\",\"text\":\"look\"},"
        "{\"type\":\"image_url\",\"image_url\":{\"url\":\"https://x/1.png\","
        "\"detail\":\"high\"}}]}]}",
        "{\"messages\":[{\"content\":["
        "{\"text\":\"look\",\"type\":\"text\"},"
        "{\"image_url\":{\"detail\":\"high\",\"url\":\"https://x/1.png\"},"
        "\"type\":\"image_url\"}],\"role\":\"user\"}]}");

    // Responses API: instructions and input in either order.
    expect_same("{\"model\":\"m\",\"instructions\":\"be nice\","
                "\"input\":\"hi\"}",
                "{\"input\":\"hi\",\"model\":\"m\","
                "\"instructions\":\"be nice\"}");
}

TEST(PromptCanonical, WhitespaceBetweenTokensDoesNotMatter)
{
    std::string compact = chat({{"system", "sys"}, {"user", "a b  c"}});
    std::string pretty =
        " \n{\n\t\"model\" :  \"m\" ,\r\n  \"messages\" : [\n    {\n"
        "      \"role\" : \"system\" , \"content\" : \"sys\"\n    } ,\n"
        "    { \"role\":\"user\",\n\"content\"\t:\t\"a b  c\" }\n  ]\n}\n ";
    expect_same(compact, pretty);

    // Whitespace inside a string is text.
    expect_differ(compact, chat({{"system", "sys"}, {"user", "a b c"}}));
}

TEST(PromptCanonical, ExtraFieldsAreIgnored)
{
    std::string base = chat({{"user", "what is 2+2?"}});
    expect_same(base,
                "{\"temperature\":0.7,\"model\":\"m\",\"stream\":true,"
                "\"user\":\"alice\",\"n\":2,\"max_tokens\":100,"
                "\"metadata\":{\"session_id\":\"s1\",\"messages\":[1]},"
                "\"messages\":[{\"role\":\"user\",\"content\":\"what is "
                "2+2?\",\"name\":\"bob\"}],\"stream_options\":"
                "{\"include_usage\":true},\"response_format\":null}");
}

TEST(PromptCanonical, StringContentEqualsTextParts)
{
    std::string text = "The quick brown fox jumps over the lazy dog. "
                        + kEAcute + kGrin + " " + std::string(200, 'z');
    std::string as_string = user_chat(text);
    auto parts = [](const std::vector<std::string> &texts,
                    const char *type = "text") {
        std::string body = "{\"model\":\"m\",\"messages\":[{\"role\":"
                           "\"user\",\"content\":[";
        for (size_t i = 0; i < texts.size(); i++) {
            body += std::string(i ? "," : "") + "{\"type\":\"" + type
                    + "\",\"text\":" + js(texts[i]) + "}";
        }
        return body + "]}]}";
    };

    expect_same(as_string, parts({text}));
    expect_same(as_string, parts({text.substr(0, 10), text.substr(10, 35),
                                  text.substr(45)}));
    expect_same(as_string, parts({"", text, ""}));
    expect_same(as_string, parts({text}, "input_text"));
    expect_same(as_string, parts({text.substr(0, 20), text.substr(20)},
                                 "input_text"));
}

TEST(PromptCanonical, ToolsAreCompacted)
{
    std::string msgs = ",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    std::string compact =
        "{\"model\":\"m\",\"tools\":[{\"type\":\"function\",\"function\":"
        "{\"name\":\"f\",\"description\":\"Does  f.\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"number\","
        "\"minimum\":-1.5e3,\"maximum\":10,\"enum\":[1,2.5,3]}}}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"g\"}}]" + msgs;
    std::string spaced =
        "{\"model\":\"m\",\"tools\":[\n  {\n    \"type\": \"function\",\n"
        "    \"function\": {\n      \"name\": \"f\",\n"
        "      \"description\": \"Does  f.\",\n      \"parameters\": {\n"
        "        \"type\": \"object\", \"properties\": { \"n\": {\n"
        "          \"type\" : \"number\" , \"minimum\" : -1.5e3 ,\n"
        "          \"maximum\" : 10 , \"enum\" : [ 1 , 2.5 , 3 ] } } } } },\n"
        "  { \"type\": \"function\", \"function\": { \"name\": \"g\" } }\n"
        "]" + msgs;

    expect_same(compact, spaced);

    // Written from the parsed values: escapes and number spellings do not
    // matter, only the values do.
    std::string respelled = compact;
    respelled.replace(respelled.find("-1.5e3"), 6, "-1500.0");
    respelled.replace(respelled.find("\"Does  f.\""), 10,
                      "\"\\u0044oes  f\\u002e\"");
    expect_same(compact, respelled);

    // The text inside strings is kept, and tools are part of the prompt.
    std::string other = compact;
    other.replace(other.find("Does  f."), 8, "Does f. ");
    expect_differ(compact, other);
    expect_differ(compact, "{\"model\":\"m\"" + msgs);
}

TEST(PromptCanonical, DifferentModelDiffersAtEveryLevel)
{
    std::string text(3000, 'q');
    // The names differ from their first character, code point 6 of the
    // canonical text ("model" US name ...): every level from 7 on differs.
    for (const std::vector<uint32_t> &schedule :
         {default_schedule(), every(7, 1000)}) {
        Comparison c = compare(ok_levels(user_chat(text, "a-model"), schedule),
                               ok_levels(user_chat(text, "b-model"), schedule));
        EXPECT_GT(c.common, 3u);
        EXPECT_EQ(c.equal, 0u);
    }
    // A model against none.
    Comparison c = compare(ok_levels(user_chat(text, "m"), default_schedule()),
                           ok_levels(user_chat(text, ""), default_schedule()));
    EXPECT_GT(c.common, 3u);
    EXPECT_EQ(c.equal, 0u);
}

TEST(PromptCanonical, CacheSaltScopesThePrompt)
{
    std::string text(3000, 'q');
    auto salted = [&](const std::string &salt) {
        return "{\"model\":\"m\",\"cache_salt\":" + js(salt)
               + ",\"messages\":[{\"role\":\"user\",\"content\":"
               + js(text) + "}]}";
    };

    // Different salts, or a salt and none, share no level.
    Comparison other = compare(ok_levels(salted("tenant-a"), default_schedule()),
                               ok_levels(salted("tenant-b"), default_schedule()));
    EXPECT_GT(other.common, 3u);
    EXPECT_EQ(other.equal, 0u);
    Comparison none = compare(ok_levels(salted("tenant-a"), default_schedule()),
                              ok_levels(user_chat(text, "m"),
                                        default_schedule()));
    EXPECT_GT(none.common, 3u);
    EXPECT_EQ(none.equal, 0u);

    // The same salt hashes alike, and sits after the model.
    Comparison same = compare(ok_levels(salted("tenant-a"), default_schedule()),
                              ok_levels(salted("tenant-a"), default_schedule()));
    EXPECT_EQ(same.equal, same.common);
    expect_canonical(ok_levels(salted("t"), every(50, 5000)),
                     "model" + US + "m" + RS + "salt" + US + "t" + RS + "user"
                         + US + text + RS,
                     every(50, 5000));

    // A salt that is not a string is not one.
    std::string odd = "{\"model\":\"m\",\"cache_salt\":7,\"messages\":"
                      "[{\"role\":\"user\",\"content\":" + js(text) + "}]}";
    Comparison ignored = compare(ok_levels(odd, default_schedule()),
                                 ok_levels(user_chat(text, "m"),
                                           default_schedule()));
    EXPECT_EQ(ignored.equal, ignored.common);
}

TEST(PromptCanonical, DifferentRoleDiffers)
{
    std::string text(600, 'r');
    for (const char *role : {"system", "assistant", "developer", "tool"}) {
        Comparison c = compare(ok_levels(chat({{"user", text}}), every(10, 700)),
                               ok_levels(chat({{role, text}}), every(10, 700)));
        EXPECT_GT(c.common, 50u) << role;
        EXPECT_EQ(c.equal, 0u) << role;
    }
}

TEST(PromptCanonical, TextDifferingAtCodePointKDiffersFromLevelK)
{
    // The canonical text is "model" US "m" RS "user" US text RS: code point
    // k of the text is code point 13 + k.  A level of length L covers code
    // points [0, L): it is equal while L <= 13 + k.
    const std::vector<uint32_t> schedule = every(1, 128);

    for (const std::string &unit : {std::string("a"), kEAcute, kGrin}) {
        std::string text;
        for (int i = 0; i < 100; i++) {
            text += unit;
        }
        std::vector<affinity_level_t> base = ok_levels(user_chat(text),
                                                       schedule);
        ASSERT_EQ(base.size(), 114u);     // 13 + 100 + RS

        for (size_t k : {0u, 1u, 37u, 98u, 99u}) {
            SCOPED_TRACE(testing::Message() << "unit " << unit.size()
                                            << " bytes, k = " << k);
            std::string changed = cp_prefix(text, k) + "#"
                                  + text.substr(cp_prefix(text, k + 1).size());
            ASSERT_EQ(code_points(changed), 100u);
            std::vector<affinity_level_t> other =
                ok_levels(user_chat(changed), schedule);
            ASSERT_EQ(other.size(), base.size());

            for (size_t i = 0; i < base.size(); i++) {
                ASSERT_EQ(base[i].length, other[i].length);
                if (base[i].length <= 13 + k) {
                    EXPECT_EQ(base[i].hash, other[i].hash)
                        << "level " << base[i].length;
                } else {
                    EXPECT_NE(base[i].hash, other[i].hash)
                        << "level " << base[i].length;
                }
            }
        }
    }
}

std::string image_body(const std::string &text, const std::string &url,
                       const std::string &detail = "auto")
{
    std::string body = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\","
                       "\"content\":[{\"type\":\"text\",\"text\":"
                       + js(text) + "}";
    if (!url.empty()) {
        body += ",{\"type\":\"image_url\",\"image_url\":{\"url\":" + js(url)
                + ",\"detail\":" + js(detail) + "}}";
    }
    return body + ",{\"type\":\"text\",\"text\":\"and after\"}]}]}";
}

TEST(PromptCanonical, ImageParts)
{
    const std::string text = "What is in this picture?";
    const std::string url1 = "https://example.com/cat.png";
    const std::string url2 = "https://example.com/dog.png";
    const std::string data = "data:image/png;base64,"
                             + std::string(100000, 'A');

    // Same URL: equal, whatever the detail.
    expect_same(image_body(text, url1), image_body(text, url1));
    expect_same(image_body(text, url1, "low"), image_body(text, url1, "high"));
    expect_same(image_body(text, data), image_body(text, data));

    // Another URL, or no image: equal before the image (or before the hash
    // of its URL), different from there on.  "model" US "m" RS "user" US
    // text is 13 + 24 code points, the image then starts with GS
    // "image_url:" (11).
    const size_t text_end = 13 + text.size();
    struct {
        std::string url;
        size_t equal_up_to;
    } others[] = {{url2, text_end + 11}, {data, text_end + 11},
                  {std::string(), text_end}};
    for (const auto &other : others) {
        SCOPED_TRACE(other.url.substr(0, 40));
        std::vector<affinity_level_t> a = ok_levels(image_body(text, url1),
                                                    every(1, 128));
        std::vector<affinity_level_t> b = ok_levels(image_body(text, other.url),
                                                    every(1, 128));
        ASSERT_GT(std::min(a.size(), b.size()), other.equal_up_to);
        for (size_t i = 0; i < std::min(a.size(), b.size()); i++) {
            if (a[i].length <= other.equal_up_to) {
                EXPECT_EQ(a[i].hash, b[i].hash) << "level " << a[i].length;
            } else {
                EXPECT_NE(a[i].hash, b[i].hash) << "level " << a[i].length;
            }
        }
    }

    // An image is a few code points, however large: GS type ":" 16 hex GS.
    std::vector<affinity_level_t> big = ok_levels(image_body(text, data),
                                                  std::vector<uint32_t>{100000});
    ASSERT_EQ(big.size(), 1u);
    EXPECT_EQ(big[0].length, 13 + text.size() + 1 + 9 + 1 + 16 + 1
                                 + std::string("and after").size() + 1);
    uint64_t h = affinity_hash(data.data(), data.size(), 0);
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)h);
    expect_canonical(big,
                     user_canonical(text + GS + "image_url:" + hex + GS
                                    + "and after"),
                     {100000});
}

TEST(PromptCanonical, OtherNonTextParts)
{
    // Audio and files: their data or id, wherever it is in the part.
    auto audio = [](const std::string &inner) {
        return "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
               "\"input_audio\",\"input_audio\":" + inner + "}]}]}";
    };
    expect_same(audio("{\"data\":\"AAAA\",\"format\":\"wav\"}"),
                audio("{\"format\":\"wav\",\"data\":\"AAAA\"}"));
    expect_differ(audio("{\"format\":\"wav\",\"data\":\"AAAA\"}"),
                  audio("{\"format\":\"wav\",\"data\":\"BBBB\"}"));

    auto file = [](const std::string &inner) {
        return "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
               "\"file\",\"file\":" + inner + "}]}]}";
    };
    expect_differ(file("{\"filename\":\"a.pdf\",\"file_data\":\"AAAA\"}"),
                  file("{\"filename\":\"a.pdf\",\"file_data\":\"BBBB\"}"));
    expect_differ(file("{\"file_id\":\"file-1\"}"),
                  file("{\"file_id\":\"file-2\"}"));
    // The type is part of it.
    expect_differ(file("{\"file_id\":\"x\"}"),
                  "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
                  "\"image_file\",\"image_file\":{\"file_id\":\"x\"}}]}]}");
}

// Responses API image and file parts carry their reference as a string
// member next to other string members ("detail", "filename").
std::string responses_part(const std::string &members)
{
    return "{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":["
           "{\"type\":\"input_text\",\"text\":\"see\"},{" + members
           + "}]}]}";
}

TEST(PromptCanonical, ResponsesImagePartKeyOrderDoesNotMatter)
{
    expect_same(responses_part("\"type\":\"input_image\","
                               "\"image_url\":\"https://x/1.png\","
                               "\"detail\":\"high\""),
                responses_part("\"type\":\"input_image\",\"detail\":\"high\","
                               "\"image_url\":\"https://x/1.png\""));
}

TEST(PromptCanonical, ResponsesImagesAndFilesAreToldApart)
{
    // Two different images (files) must not make equal prompts, whatever
    // member the client writes first.
    expect_differ(responses_part("\"type\":\"input_image\","
                                 "\"detail\":\"high\","
                                 "\"image_url\":\"https://x/1.png\""),
                  responses_part("\"type\":\"input_image\","
                                 "\"detail\":\"high\","
                                 "\"image_url\":\"https://x/2.png\""));
    expect_differ(responses_part("\"type\":\"input_file\","
                                 "\"filename\":\"report.pdf\","
                                 "\"file_data\":\"data:application/pdf;"
                                 "base64,AAAA\""),
                  responses_part("\"type\":\"input_file\","
                                 "\"filename\":\"report.pdf\","
                                 "\"file_data\":\"data:application/pdf;"
                                 "base64,BBBB\""));
}

// ---- lengths in code points -----------------------------------------------

TEST(PromptCodePoints, LevelsCountCodePointsNotBytes)
{
    // 120 characters of 2, 3 and 4 bytes: 360 bytes, 120 code points.  The
    // canonical text (13 + 120 + 1 = 134 code points) reaches 100 only by
    // counting characters, and not 500 although it has more bytes.
    std::string raw, escaped;
    for (int i = 0; i < 40; i++) {
        raw += kEAcute + kEuro + kGrin;
        escaped += "\\u00e9\\u20ac\\ud83d\\ude00";
    }
    ASSERT_EQ(raw.size(), 360u);
    const std::vector<uint32_t> schedule{100, 500};

    std::string raw_body = user_chat(raw);
    std::string escaped_body = "{\"model\":\"m\",\"messages\":[{\"role\":"
                               "\"user\",\"content\":\"" + escaped + "\"}]}";

    std::vector<affinity_level_t> a = ok_levels(raw_body, schedule);
    std::vector<affinity_level_t> b = ok_levels(escaped_body, schedule);
    ASSERT_EQ(lengths_of(a), (std::vector<uint32_t>{100}));
    ASSERT_EQ(lengths_of(b), (std::vector<uint32_t>{100}));
    EXPECT_EQ(a[0].hash, b[0].hash);
    EXPECT_EQ(a[0].hash, level_hash(user_canonical(raw), 100));

    // Shorter in code points than the first level, longer in bytes: one
    // level of its own length in code points.
    std::string grins;
    for (int i = 0; i < 30; i++) {
        grins += kGrin;
    }
    std::vector<affinity_level_t> c = ok_levels(user_chat(grins), {100});
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].length, 13u + 30 + 1);
    EXPECT_EQ(c[0].hash, level_hash(user_canonical(grins), 44));
}

TEST(PromptCodePoints, LevelsEndOnWholeCharacters)
{
    // Every length from 1 to 128 over mixed widths: each level hashes
    // whole characters.
    std::string text;
    for (int i = 0; i < 40; i++) {
        text += std::string("a") + kEAcute + kEuro + kGrin;
    }
    expect_canonical(ok_levels(user_chat(text), every(1, 128)),
                     user_canonical(text), every(1, 128));
    expect_canonical(ok_levels(user_chat(text), every(3, 200)),
                     user_canonical(text), every(3, 200));
}

// ---- which levels ---------------------------------------------------------

// A body whose canonical text is exactly n code points (n >= 14).
std::string body_of_length(size_t n)
{
    return user_chat(std::string(n - 14, 'w'));
}

TEST(PromptLevels, ShorterThanTheFirstLevelGivesOneLevelOfItsLength)
{
    const std::vector<uint32_t> schedule{100, 500, 1000};

    expect_canonical(ok_levels(user_chat("hi"), schedule),
                     user_canonical("hi"), schedule);
    EXPECT_EQ(lengths_of(ok_levels(user_chat("hi"), schedule)),
              (std::vector<uint32_t>{16}));
    EXPECT_EQ(lengths_of(ok_levels(user_chat("hi", ""), schedule)),
              (std::vector<uint32_t>{8}));
    EXPECT_EQ(lengths_of(ok_levels(body_of_length(99), schedule)),
              (std::vector<uint32_t>{99}));
}

TEST(PromptLevels, LevelsUpToTheLastOneReached)
{
    const std::vector<uint32_t> schedule{100, 500, 1000};
    struct {
        size_t length;
        std::vector<uint32_t> levels;
    } cases[] = {
        {100, {100}},
        {101, {100}},
        {499, {100}},
        {500, {100, 500}},
        {700, {100, 500}},
        {999, {100, 500}},
        {1000, {100, 500, 1000}},
        {5000, {100, 500, 1000}},
    };

    for (const auto &c : cases) {
        std::vector<affinity_level_t> l = ok_levels(body_of_length(c.length),
                                                    schedule);
        EXPECT_EQ(lengths_of(l), c.levels) << "length " << c.length;
        expect_canonical(l, user_canonical(std::string(c.length - 14, 'w')),
                         schedule);
    }
}

TEST(PromptLevels, ParsingStopsAtTheLastLevel)
{
    // Once the longest level is hashed, the rest of the messages is not
    // walked: messages after it that the walk would refuse do not matter.
    // The body itself is always validated whole: malformed JSON anywhere
    // is INVALID (PromptEndpoint.MalformedJsonAnywhereIsInvalid).
    const std::vector<uint32_t> schedule{100, 500, 1000};
    std::string first = "{\"role\":\"user\",\"content\":\""
                        + std::string(2000, 'a') + "\"}";
    std::string valid = "{\"model\":\"m\",\"messages\":[" + first
                        + ",{\"role\":\"user\",\"content\":\"b\"}]}";
    std::vector<affinity_level_t> expected = ok_levels(valid, schedule);
    ASSERT_EQ(expected.size(), 3u);

    for (const char *tail :
         {",{\"role\":5}", ",{\"role\":[\"user\"]}",
          ",{\"role\":\"user\",\"content\":[{\"type\":7}]}",
          ",{\"role\":\"user\",\"content\":[{\"type\":\"text\","
          "\"text\":{}}]}"}) {
        std::string body = "{\"model\":\"m\",\"messages\":[" + first + tail
                           + "]}";
        Prompt p = prompt_levels(body, schedule);
        EXPECT_EQ(p.rc, AFFINITY_PROMPT_OK) << tail;
        ASSERT_EQ(p.levels.size(), expected.size()) << tail;
        for (size_t i = 0; i < expected.size(); i++) {
            EXPECT_EQ(p.levels[i].hash, expected[i].hash) << tail;
        }
    }

    // The same malformed message before the last level is reached.
    std::string short_first = "{\"role\":\"user\",\"content\":\"a\"}";
    EXPECT_EQ(prompt_levels("{\"model\":\"m\",\"messages\":[" + short_first
                                + ",{\"role\":5}]}",
                            schedule).rc,
              AFFINITY_PROMPT_INVALID);
}

TEST(PromptLevels, ModelAndToolsReachingTheLastLevelAreStillAPrompt)
{
    // The model and tools come first in the canonical text: with large tool
    // definitions (or a short schedule) they alone reach the longest level.
    // The body still has a prompt, and its levels are those of its
    // canonical text, all inside the tools.
    std::string tool = "{\"type\":\"function\",\"function\":{\"name\":\"f\","
                       "\"description\":\"" + std::string(300, 'd') + "\"}}";
    std::string head = "{\"model\":\"m\",\"tools\":[" + tool + "],";
    std::string canonical = "model" + US + "m" + RS + "tool" + US + tool + RS;

    for (const std::string &prompt :
         {std::string("\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"),
          std::string("\"prompt\":\"hi\""), std::string("\"input\":\"hi\"")}) {
        for (const std::vector<uint32_t> &schedule :
             {std::vector<uint32_t>{100}, std::vector<uint32_t>{100, 200},
              every(2, 256)}) {
            SCOPED_TRACE(testing::Message() << prompt << ", "
                                            << schedule.size() << " levels");
            Prompt p = prompt_levels(head + prompt + "}", schedule);
            EXPECT_EQ(p.rc, AFFINITY_PROMPT_OK);
            expect_canonical(p.levels, canonical, schedule);
        }
    }

    // Without any prompt field it is none, however long the tools.
    EXPECT_EQ(prompt_levels("{\"model\":\"m\",\"tools\":[" + tool + "]}",
                            {100}).rc,
              AFFINITY_PROMPT_NONE);
}

TEST(PromptLevels, OutCapLimitsTheLevelsWritten)
{
    std::string body = body_of_length(2000);
    const std::vector<uint32_t> schedule{100, 200, 300, 400, 500};
    std::vector<affinity_level_t> all = ok_levels(body, schedule);
    ASSERT_EQ(all.size(), 5u);

    std::vector<char> buf(body.size() + AFFINITY_JSON_PADDING, 0);
    std::memcpy(buf.data(), body.data(), body.size());

    for (size_t cap : {0u, 1u, 2u}) {
        affinity_level_t out[8];
        std::memset(out, 0x5a, sizeof(out));
        size_t n = 99;
        LoadedBody loaded(body);
        affinity_prompt_e rc = affinity_json_prompt(
            loaded.json(), schedule.data(), schedule.size(), 0, out, cap,
            &n);
        EXPECT_EQ(n, cap);
        if (cap > 0) {
            EXPECT_EQ(rc, AFFINITY_PROMPT_OK);
        }
        for (size_t i = 0; i < n; i++) {
            EXPECT_EQ(out[i].length, all[i].length);
            EXPECT_EQ(out[i].hash, all[i].hash);
        }
        for (size_t i = cap; i < 8; i++) {
            EXPECT_EQ(out[i].hash, 0x5a5a5a5a5a5a5a5aULL) << "cap " << cap;
        }
    }
}

TEST(PromptLevels, EmptyScheduleGivesNoLevels)
{
    Prompt p = prompt_levels(user_chat("hello"), {});
    EXPECT_NE(p.rc, AFFINITY_PROMPT_OK);
    EXPECT_TRUE(p.levels.empty());
}

TEST(PromptLevels, BytesPastTheBodyAreNotRead)
{
    // The padding must be readable but is not part of the body.
    for (std::string body : {user_chat("hello " + std::string(300, 'p')),
                             std::string("{\"prompt\":\"x\"}"),
                             std::string("{\"prompt\":[1,2,3]}")}) {
        std::vector<affinity_level_t> expected = ok_levels(body,
                                                           every(10, 400));
        for (char fill : {'}', ']', '"', 'a', ' ', '\\', '\xff'}) {
            Prompt p = prompt_levels(body, every(10, 400), fill);
            EXPECT_EQ(p.rc, AFFINITY_PROMPT_OK) << int(fill);
            ASSERT_EQ(p.levels.size(), expected.size()) << int(fill);
            for (size_t i = 0; i < expected.size(); i++) {
                EXPECT_EQ(p.levels[i].hash, expected[i].hash) << int(fill);
            }
        }
        // A body cut short is not completed by what follows it.
        EXPECT_EQ(prompt_levels(body.substr(0, body.size() - 1),
                                every(10, 400), '}').rc,
                  AFFINITY_PROMPT_INVALID);
    }
}

TEST(PromptLevels, SameLevelsOnEveryCallAndThread)
{
    // Per-thread buffers are reused: results do not depend on earlier
    // calls or on the thread.
    std::string tools = "{\"model\":\"m\",\"tools\":[{\"type\":\"function\","
                        "\"function\":{\"name\":\"" + std::string(5000, 'f')
                        + "\"}}],\"messages\":[{\"role\":\"user\","
                        "\"content\":\"x\"}]}";
    std::string small = "{\"model\":\"m\",\"tools\":[{\"type\":\"function\"}],"
                        "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}";
    std::vector<affinity_level_t> big1 = ok_levels(tools, default_schedule());
    std::vector<affinity_level_t> small1 = ok_levels(small, default_schedule());
    std::vector<affinity_level_t> big2 = ok_levels(tools, default_schedule());
    std::vector<affinity_level_t> small2 = ok_levels(small,
                                                     default_schedule());
    ASSERT_EQ(big1.size(), big2.size());
    EXPECT_EQ(big1.back().hash, big2.back().hash);
    ASSERT_EQ(small1.size(), 1u);
    ASSERT_EQ(small2.size(), 1u);
    EXPECT_EQ(small1[0].hash, small2[0].hash);

    std::vector<affinity_level_t> other;
    std::thread t([&]() { other = ok_levels(tools, default_schedule()); });
    t.join();
    ASSERT_EQ(other.size(), big1.size());
    for (size_t i = 0; i < other.size(); i++) {
        EXPECT_EQ(other[i].hash, big1[i].hash);
    }
}

// ---- endpoints --------------------------------------------------------------

TEST(PromptEndpoint, ChatCompletions)
{
    std::string body =
        "{\"model\":\"m\",\"messages\":["
        "{\"role\":\"system\",\"content\":\"You help.\"},"
        "{\"role\":\"user\",\"content\":\"Weather?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[ {"
        " \"id\" : \"c1\", \"type\" : \"function\", \"function\" : {"
        " \"name\" : \"w\", \"arguments\" : \"{}\" } } ]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"sunny\"}]}";
    std::string canonical =
        "model" + US + "m" + RS + "system" + US + "You help." + RS + "user"
        + US + "Weather?" + RS + "assistant" + US + "tool_calls" + US
        + "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":"
          "\"w\",\"arguments\":\"{}\"}}]" + RS + RS + "tool" + US + "sunny"
        + RS;
    expect_canonical(ok_levels(body, every(3, 300)), canonical, every(3, 300));
}

TEST(PromptEndpoint, CompletionsPromptString)
{
    std::string text = "Once upon a time " + kEAcute;
    std::string canonical = "model" + US + "m" + RS + "prompt" + US + text + RS;
    expect_canonical(ok_levels("{\"model\":\"m\",\"prompt\":" + js(text)
                                   + ",\"max_tokens\":5}",
                               every(2, 100)),
                     canonical, every(2, 100));
}

TEST(PromptEndpoint, CompletionsPromptListUsesTheFirstElement)
{
    std::string text = "Once upon a time";
    std::string single = "{\"model\":\"m\",\"prompt\":" + js(text) + "}";
    expect_same(single, "{\"model\":\"m\",\"prompt\":[" + js(text) + "]}");
    expect_same(single, "{\"model\":\"m\",\"prompt\":[" + js(text)
                            + ",\"something else\"]}");
    expect_same("{\"prompt\":[\"a1\",\"b\"]}", "{\"prompt\":[\"a1\",\"c\"]}");
    expect_differ("{\"prompt\":[\"a1\",\"b\"]}", "{\"prompt\":[\"a2\",\"b\"]}");
}

TEST(PromptEndpoint, CompletionsPromptTokenIds)
{
    std::string canonical = "model" + US + "m" + RS + "prompt" + US
                            + "[1,2,3,50256]" + RS;
    expect_canonical(ok_levels("{\"model\":\"m\",\"prompt\":[1, 2,\n3, 50256]}",
                               every(1, 64)),
                     canonical, every(1, 64));
    // A list of token id lists: the first one.
    expect_canonical(ok_levels("{\"model\":\"m\",\"prompt\":[[1,2,3,50256],"
                               "[7,8]]}",
                               every(1, 64)),
                     canonical, every(1, 64));
    expect_differ("{\"prompt\":[1,2,3]}", "{\"prompt\":[1,2,4]}");
}

TEST(PromptEndpoint, ResponsesInstructionsAndInputString)
{
    std::string canonical = "model" + US + "m" + RS + "instructions" + US
                            + "Be terse." + RS + "user" + US + "Hello " + kGrin
                            + RS;
    std::string body = "{\"model\":\"m\",\"instructions\":\"Be terse.\","
                       "\"input\":\"Hello \\ud83d\\ude00\",\"store\":false}";
    expect_canonical(ok_levels(body, every(1, 64)), canonical, every(1, 64));

    // Without instructions.
    expect_canonical(ok_levels("{\"input\":\"Hi\"}", every(1, 64)),
                     "user" + US + "Hi" + RS, every(1, 64));
}

TEST(PromptEndpoint, ResponsesInputItems)
{
    std::string as_string = "{\"model\":\"m\",\"instructions\":\"I\","
                            "\"input\":\"Describe it.\"}";
    // A user message item with string content or content parts is the same
    // prompt as the input string.
    expect_same(as_string,
                "{\"model\":\"m\",\"instructions\":\"I\",\"input\":[{\"role\":"
                "\"user\",\"content\":\"Describe it.\"}]}");
    expect_same(as_string,
                "{\"model\":\"m\",\"instructions\":\"I\",\"input\":[{\"type\":"
                "\"message\",\"role\":\"user\",\"content\":[{\"type\":"
                "\"input_text\",\"text\":\"Describe \"},{\"type\":"
                "\"input_text\",\"text\":\"it.\"}]}]}");

    // Items in order, with their roles; output_text of earlier turns.
    std::string body =
        "{\"model\":\"m\",\"input\":["
        "{\"role\":\"developer\",\"content\":\"D\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"input_text\","
        "\"text\":\"Q1\"}]},"
        "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":"
        "\"output_text\",\"text\":\"A1\"}]},"
        "{\"role\":\"user\",\"content\":\"Q2\"}]}";
    std::string canonical = "model" + US + "m" + RS + "developer" + US + "D"
                            + RS + "user" + US + "Q1" + RS + "assistant" + US
                            + "A1" + RS + "user" + US + "Q2" + RS;
    expect_canonical(ok_levels(body, every(1, 64)), canonical, every(1, 64));
}

TEST(PromptEndpoint, ResponsesItemsWithoutARoleAreIncluded)
{
    std::string call = "{\"type\":\"function_call\",\"call_id\":\"c1\","
                       "\"name\":\"f\",\"arguments\":\"{}\"}";
    std::string output = "{\"type\":\"function_call_output\",\"call_id\":"
                         "\"c1\",\"output\":\"42\"}";
    std::string body = "{\"model\":\"m\",\"input\":[{\"role\":\"user\","
                       "\"content\":\"Q\"}, " + call + " ,\n " + output
                       + "]}";
    std::string canonical = "model" + US + "m" + RS + "user" + US + "Q" + RS
                            + "function_call" + US + call + RS
                            + "function_call_output" + US + output + RS;
    expect_canonical(ok_levels(body, every(1, 128)), canonical, every(1, 128));

    // A different output is a different prompt.
    std::string other = body;
    other.replace(other.find("\"42\""), 4, "\"43\"");
    expect_differ(body, other);

    // Only such items: still a prompt.
    EXPECT_EQ(prompt_levels("{\"input\":[" + output + "]}", every(1, 128)).rc,
              AFFINITY_PROMPT_OK);
}

TEST(PromptEndpoint, BodiesWithoutAPromptAreNone)
{
    for (const char *body :
         {"{}", "{\"model\":\"m\"}", "{\"messages\":[]}",
          "{\"model\":\"m\",\"messages\":[]}", "{\"input\":[]}",
          "{\"messages\":null}", "{\"messages\":\"text\"}",
          "{\"messages\":[1,\"a\",null,[]]}", "{\"prompt\":null}",
          "{\"prompt\":42}", "{\"user\":\"u\",\"stream\":true}",
          "  {\"model\":\"m\"}  \n"}) {
        Prompt p = prompt_levels(body, default_schedule());
        EXPECT_EQ(p.rc, AFFINITY_PROMPT_NONE) << body;
        EXPECT_TRUE(p.levels.empty()) << body;
    }
}

TEST(PromptEndpoint, NotAnObjectOrMalformedIsInvalid)
{
    for (const char *body :
         {"", " ", "\n", "[]", "[1]", "\"text\"", "42", "null", "true", "{",
          "}", "{]", "{\"model\"}", "{\"model\":}", "{\"model\":\"m\",}",
          "{\"model\":\"m\"}x",
          "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]]",
          "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]} trailing",
          "{\"messages\":[{\"role\":\"user\",\"content\":\"hi}]}",
          "{\"messages\":[{\"role\":\"user\",\"content\":\"\\q\"}]}",
          "{\"messages\":[{\"role\":\"user\",\"content\":\"\\ud83d\"}]}",
          "{'messages':[]}"}) {
        Prompt p = prompt_levels(body, default_schedule());
        EXPECT_EQ(p.rc, AFFINITY_PROMPT_INVALID) << body;
        EXPECT_TRUE(p.levels.empty()) << body;
    }
}

TEST(PromptEndpoint, TruncatedBodiesAreInvalid)
{
    std::vector<std::string> bodies = {
        chat({{"system", "You help."}, {"user", "Weather " + kGrin + "?"}}),
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\""
            + std::string(1200, 'a') + "\"},{\"role\":\"user\","
            "\"content\":\"b\"}]}",
        "{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\","
        "\"output\":\"42\"}],\"instructions\":\"be\"}",
        "{\"prompt\":[\"" + std::string(1200, 'a') + "\",\"x\"],"
        "\"model\":\"m\"}",
    };

    for (const std::string &body : bodies) {
        ASSERT_EQ(prompt_levels(body, {100, 500, 1000}).rc,
                  AFFINITY_PROMPT_OK);
        for (size_t len = 0; len < body.size(); len++) {
            Prompt p = prompt_levels(body.substr(0, len), {100, 500, 1000});
            ASSERT_EQ(p.rc, AFFINITY_PROMPT_INVALID)
                << "cut at " << len << " of " << body.substr(0, 80);
        }
    }
}

TEST(PromptEndpoint, MalformedJsonAnywhereIsInvalid)
{
    // The body is validated whole before the walk: a syntax error before,
    // inside or after the prompt, past the last level or in a member the
    // walk never reads, makes it INVALID, and nothing of it is used.
    std::string long_first = "{\"role\":\"user\",\"content\":\""
                             + std::string(2000, 'a') + "\"}";
    for (const char *tail :
         {",{\"role\":\"user\",\"content\":tru}",
          ",{\"role\":\"user\",\"content\":\"\\x\"}", ",{\"a\" \"b\"}",
          ",,, ::", ",{\"role\":\"user\"]", ",[}", ",{\"n\":01}",
          ",{\"n\":1e999}", ",{\"n\":123456789012345678901234567890}"}) {
        for (const std::string &first : {long_first, std::string("{}")}) {
            std::string body = "{\"model\":\"m\",\"messages\":[" + first
                               + tail + "]}";
            EXPECT_EQ(prompt_levels(body, {100, 500, 1000}).rc,
                      AFFINITY_PROMPT_INVALID)
                << tail;
        }
    }

    // Brackets that do not match, around bytes that are not JSON: the body
    // that crashed workers when the walk went on after simdjson lost track.
    for (const std::string &body :
         {std::string("{\"tools\":[{\0]}}", 15),
          std::string("{\"tools\":[{]}}"),
          std::string("{\"messages\":[{\"role\":\"user\"]}]}"),
          std::string("{\"model\":\"m\",\"tools\":[{\"a\":[}]]}"),
          std::string("{\"input\":[{\"type\":\"x\"]]}")}) {
        EXPECT_EQ(prompt_levels(body, {100, 500, 1000}).rc,
                  AFFINITY_PROMPT_INVALID);
    }
}

TEST(PromptEndpoint, InvalidUtf8IsInvalid)
{
    for (const char *bytes :
         {"\xff", "\xfe", "\xc3", "\xc3(", "\xc0\xaf", "\xe2\x82",
          "\xed\xa0\x80", "\xf4\x90\x80\x80", "\x80", "\xf0\x9f\x98"}) {
        std::string body = "{\"messages\":[{\"role\":\"user\",\"content\":\"a"
                           + std::string(bytes) + "b\"}]}";
        EXPECT_EQ(prompt_levels(body, default_schedule()).rc,
                  AFFINITY_PROMPT_INVALID)
            << "bytes of length " << std::strlen(bytes);
    }

    // Also past the last level, and outside the prompt.
    std::string late = "{\"messages\":[{\"role\":\"user\",\"content\":\""
                       + std::string(2000, 'a') + "\"}],\"user\":\"\xff\"}";
    EXPECT_EQ(prompt_levels(late, {100, 500, 1000}).rc,
              AFFINITY_PROMPT_INVALID);
}

TEST(PromptEndpoint, MalformedObjectInAContentPartIsInvalid)
{
    // The members of a non-text part's object (image_url, input_audio,
    // file) are searched for its reference: a syntax error there is found
    // before the last level and makes the body invalid.
    for (const char *inner :
         {"{\"x\" \"u\"}", "{:\"https://x/1.png\"}",
          "{\"url\"5:\"https://x/1.png\",\"detail\":\"auto\"}",
          "{\"https://x/1.png\",\"detail\":\"auto\"}",
          "{e\"url\":\"https://x/1.png\"}"}) {
        for (const char *type : {"image_url", "input_audio", "file"}) {
            std::string body =
                std::string("{\"model\":\"m\",\"messages\":[{\"role\":"
                            "\"user\",\"content\":[{\"type\":\"text\","
                            "\"text\":\"look\"},{\"type\":\"") + type
                + "\",\"" + type + "\":" + inner
                + "},{\"type\":\"text\",\"text\":\"and after\"}]}]}";
            EXPECT_EQ(prompt_levels(body, default_schedule()).rc,
                      AFFINITY_PROMPT_INVALID)
                << body;
        }
    }
}

bool valid_result(const Prompt &p)
{
    return p.rc == AFFINITY_PROMPT_OK || p.rc == AFFINITY_PROMPT_NONE
           || p.rc == AFFINITY_PROMPT_INVALID;
}

TEST(PromptEndpoint, DeepNestingNeverCrashes)
{
    const std::string open(10000, '['), close(10000, ']');
    std::string objects, objects_close;
    for (int i = 0; i < 10000; i++) {
        objects += "{\"a\":";
        objects_close += "}";
    }
    std::string deep_object = objects + "1" + objects_close;

    EXPECT_EQ(prompt_levels(open, default_schedule()).rc,
              AFFINITY_PROMPT_INVALID);
    EXPECT_EQ(prompt_levels(open + close, default_schedule()).rc,
              AFFINITY_PROMPT_INVALID);

    for (const std::string &body :
         {"{\"messages\":" + open,
          "{\"messages\":" + open + close + "}",
          "{\"messages\":[" + open + close
              + ",{\"role\":\"user\",\"content\":\"x\"}]}",
          "{\"messages\":[{\"role\":\"user\",\"content\":" + open + close
              + "}]}",
          "{\"prompt\":" + open + close + "}",
          "{\"tools\":[" + deep_object + "],\"prompt\":\"p\"}",
          "{\"input\":[" + deep_object + "]}",
          deep_object,
          "{\"metadata\":" + deep_object
              + ",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
          "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
          "\"metadata\":" + deep_object + "}"}) {
        Prompt p = prompt_levels(body, default_schedule());
        EXPECT_TRUE(valid_result(p)) << int(p.rc);
        if (p.rc == AFFINITY_PROMPT_OK) {
            EXPECT_FALSE(p.levels.empty());
        }
    }
}

TEST(PromptEndpoint, OneMegabytePromptGivesEveryLevel)
{
    const std::vector<uint32_t> schedule = default_schedule();

    std::string ascii(1 << 20, 'x');
    for (size_t i = 0; i < ascii.size(); i += 61) {
        ascii[i] = ' ';
    }
    std::string wide;
    while (wide.size() < (1 << 20)) {
        wide += kEAcute + kEuro + kGrin + "z";
    }

    for (const std::string *text : {&ascii, &wide}) {
        std::string body = user_chat(*text);
        std::vector<affinity_level_t> l = ok_levels(body, schedule);
        EXPECT_EQ(lengths_of(l), schedule);
        ASSERT_FALSE(l.empty());
        EXPECT_EQ(l.back().hash,
                  level_hash(user_canonical(*text), schedule.back()));
    }

    // The same prompt as a completions prompt and as Responses input.
    EXPECT_EQ(lengths_of(ok_levels("{\"prompt\":" + js(ascii) + "}",
                                   schedule)),
              schedule);
    EXPECT_EQ(lengths_of(ok_levels("{\"input\":" + js(ascii) + "}",
                                   schedule)),
              schedule);
}

TEST(PromptEndpoint, RandomMutationsNeverCrash)
{
    std::vector<std::string> seeds = {
        chat({{"system", "You help."}, {"user", "Weather " + kGrin + "?"}}),
        image_body("look", "https://x/1.png"),
        "{\"model\":\"m\",\"instructions\":\"I\",\"input\":[{\"role\":"
        "\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"Q\"}]},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":"
        "\"4\"}]}",
        "{\"model\":\"m\",\"prompt\":[[1,2,3],[4]]}",
        "{\"model\":\"m\",\"tools\":[{\"type\":\"function\",\"function\":"
        "{\"name\":\"f\"}}],\"messages\":[{\"role\":\"user\",\"content\":"
        "\"caf\\u00e9 \\ud83d\\ude00\"}]}",
    };
    const char alphabet[] = "{}[]\":,\\ u0123456789abcdefnulltrue\x1f\xc3\xa9\xff";

    uint32_t x = 12345;
    auto next = [&]() {
        x = x * 1103515245u + 12345u;
        return x >> 8;
    };

    for (int round = 0; round < 3000; round++) {
        std::string body = seeds[next() % seeds.size()];
        int edits = 1 + int(next() % 4);
        for (int e = 0; e < edits && !body.empty(); e++) {
            size_t at = next() % body.size();
            char c = alphabet[next() % (sizeof(alphabet) - 1)];
            switch (next() % 4) {
            case 0: body[at] = c; break;
            case 1: body.insert(body.begin() + long(at), c); break;
            case 2: body.erase(at, 1 + next() % 8); break;
            default: body.resize(at); break;
            }
        }
        Prompt p = prompt_levels(body, every(5, 200));
        ASSERT_TRUE(valid_result(p)) << body;
        if (p.rc == AFFINITY_PROMPT_OK) {
            ASSERT_FALSE(p.levels.empty()) << body;
        }
    }
}

}  // namespace

// ---- turn levels ----------------------------------------------------------

namespace {

constexpr size_t kTurns = 8;    // prefix_affinity's default turns=

// The canonical text of chat(messages, model).
std::string chat_canonical(const std::vector<Msg> &messages,
                           const std::string &model = "m")
{
    std::string c = "model" + US + model + RS;
    for (const Msg &m : messages) {
        c += m.role + US + m.content + RS;
    }
    return c;
}

// Lengths, in code points, of the canonical text at each message's end.
std::vector<uint32_t> message_ends(const std::vector<Msg> &messages,
                                   const std::string &model = "m")
{
    std::vector<uint32_t> ends;
    size_t length = code_points("model" + US + model + RS);
    for (const Msg &m : messages) {
        length += code_points(m.role + US + m.content + RS);
        ends.push_back(uint32_t(length));
    }
    return ends;
}

std::vector<uint32_t> turn_lengths(const std::vector<affinity_level_t> &levels)
{
    std::vector<uint32_t> out;
    for (const affinity_level_t &l : levels) {
        if (l.turn) {
            out.push_back(l.length);
        }
    }
    return out;
}

std::vector<uint32_t> scheduled_lengths(
    const std::vector<affinity_level_t> &levels)
{
    std::vector<uint32_t> out;
    for (const affinity_level_t &l : levels) {
        if (!l.turn) {
            out.push_back(l.length);
        }
    }
    return out;
}

std::vector<uint32_t> default_levels()
{
    return schedule_of({100, 500, 1000}, 256, 6, 32 * 1024);
}

}  // namespace

// Behind a long shared system prompt, a conversation's next turn extends
// the previous one by less than the spacing of the scheduled levels there:
// without turn levels it finds only the shared part.  The level at the
// previous prompt's end (its last message's) is one of the next turn's
// levels, the hash of the same text.
TEST(TurnLevels, NextTurnFindsThePreviousTurnWhole)
{
    const std::string system(24000, 's');
    std::vector<Msg> first = {{"system", system}, {"user", "list the files"}};
    std::vector<Msg> next = first;
    next.push_back({"assistant", "a.txt b.txt"});
    next.push_back({"user", "open a.txt"});

    const std::string canonical = chat_canonical(first);
    const uint32_t whole = uint32_t(code_points(canonical));

    Prompt p1 = prompt_levels(chat(first), default_levels(), '\0', kTurns);
    ASSERT_EQ(p1.rc, AFFINITY_PROMPT_OK);
    ASSERT_EQ(p1.levels.back().length, whole);
    EXPECT_EQ(p1.levels.back().turn, 1u);
    EXPECT_EQ(p1.levels.back().hash, level_hash(canonical, whole));

    Prompt p2 = prompt_levels(chat(next), default_levels(), '\0', kTurns);
    ASSERT_EQ(p2.rc, AFFINITY_PROMPT_OK);
    bool found = false;
    for (const affinity_level_t &l : p2.levels) {
        found |= l.length == whole && l.hash == p1.levels.back().hash;
    }
    EXPECT_TRUE(found) << "the next turn has the previous one's whole prompt";

    // Without turn levels, the longest level the two share is a scheduled
    // one, short of the previous prompt by up to one spacing.
    Prompt plain = prompt_levels(chat(next), default_levels(), '\0', 0);
    EXPECT_TRUE(turn_lengths(plain.levels).empty());
    for (const affinity_level_t &l : plain.levels) {
        EXPECT_NE(l.length, whole);
    }
    EXPECT_EQ(scheduled_lengths(p2.levels), lengths_of(plain.levels))
        << "turn levels leave the scheduled ones as they are";
}

// Levels are in order of length, the scheduled ones all there; the turn
// levels are those of the last `turns` messages that end from the first
// scheduled length on and before the last, each the hash of the text up
// to there.
TEST(TurnLevels, LastMessagesEndsAreKeptInOrder)
{
    std::vector<Msg> messages;
    for (int i = 0; i < 12; i++) {
        messages.push_back({i % 2 ? "assistant" : "user",
                            std::string(size_t(40 + 7 * i), char('a' + i))});
    }
    const std::string canonical = chat_canonical(messages);
    const std::vector<uint32_t> ends = message_ends(messages);
    const std::vector<uint32_t> schedule = every(100, 5000);

    for (size_t turns : {size_t(1), size_t(3), kTurns, size_t(16)}) {
        SCOPED_TRACE(testing::Message() << "turns " << turns);
        Prompt p = prompt_levels(chat(messages), schedule, '\0', turns);
        ASSERT_EQ(p.rc, AFFINITY_PROMPT_OK);

        std::vector<uint32_t> expected;
        for (uint32_t end : ends) {
            if (end > 100 && end % 100 != 0) {  // not a scheduled length
                expected.push_back(end);
            }
        }
        expected.erase(expected.begin(),
                       expected.end() - long(std::min(turns,
                                                      expected.size())));
        EXPECT_EQ(turn_lengths(p.levels), expected);

        std::vector<uint32_t> scheduled;
        for (uint32_t l : schedule) {
            if (l <= ends.back()) {
                scheduled.push_back(l);
            }
        }
        EXPECT_EQ(scheduled_lengths(p.levels), scheduled);

        for (size_t i = 0; i < p.levels.size(); i++) {
            EXPECT_TRUE(i == 0
                        || p.levels[i].length > p.levels[i - 1].length);
            EXPECT_EQ(p.levels[i].hash,
                      level_hash(canonical, p.levels[i].length))
                << "length " << p.levels[i].length;
        }
    }

    // No turn levels asked for: none.
    Prompt none = prompt_levels(chat(messages), schedule, '\0', 0);
    EXPECT_TRUE(turn_lengths(none.levels).empty());

    // More than AFFINITY_TURNS_MAX asked for: the ends of that many
    // messages at most, the most recent.
    std::vector<Msg> many(AFFINITY_TURNS_MAX + 4, Msg{"user", "ok"});
    const std::vector<uint32_t> many_ends = message_ends(many);
    Prompt capped = prompt_levels(chat(many), {20, 5000}, '\0',
                                  AFFINITY_TURNS_MAX + 4);
    ASSERT_EQ(capped.rc, AFFINITY_PROMPT_OK);
    ASSERT_GT(many_ends[many_ends.size() - AFFINITY_TURNS_MAX], 20u);
    EXPECT_EQ(turn_lengths(capped.levels),
              std::vector<uint32_t>(many_ends.end() - AFFINITY_TURNS_MAX,
                                    many_ends.end()));
    EXPECT_EQ(scheduled_lengths(capped.levels), std::vector<uint32_t>{20});
}

// Hashing stops at the last scheduled length (max=): a message that ends
// at or after it has no turn level, and one that ends exactly at a
// scheduled length has only the scheduled level.
TEST(TurnLevels, NoneAtOrPastTheLastScheduledLevel)
{
    // "model" US "m" RS is 8 code points; each message here is
    // "user" US text RS: 6 + its text.
    std::vector<Msg> messages = {{"user", std::string(36, 'x')},   // 50
                                 {"user", std::string(24, 'y')},   // 80
                                 {"user", std::string(14, 'z')},   // 100
                                 {"user", std::string(40, 'w')}};  // 146
    ASSERT_EQ(message_ends(messages),
              (std::vector<uint32_t>{50, 80, 100, 146}));

    Prompt p = prompt_levels(chat(messages), {50, 120}, '\0', kTurns);
    ASSERT_EQ(p.rc, AFFINITY_PROMPT_OK);
    EXPECT_EQ(lengths_of(p.levels), (std::vector<uint32_t>{50, 80, 100, 120}));
    EXPECT_EQ(turn_lengths(p.levels), (std::vector<uint32_t>{80, 100}));
}

// No turn level is shorter than the first scheduled length: a prefix
// that short is not worth following (a system prompt of a few words that
// every conversation shares).  A text shorter than it is one level of its
// own length, as without turn levels.
TEST(TurnLevels, NoneShorterThanTheFirstScheduledLevel)
{
    std::vector<Msg> messages = {{"system", "be brief"},       // 24
                                 {"user", std::string(71, 'q')},   // 101
                                 {"user", std::string(20, 'r')}};  // 127
    ASSERT_EQ(message_ends(messages), (std::vector<uint32_t>{24, 101, 127}));

    Prompt p = prompt_levels(chat(messages), {100, 1000}, '\0', kTurns);
    ASSERT_EQ(p.rc, AFFINITY_PROMPT_OK);
    EXPECT_EQ(lengths_of(p.levels), (std::vector<uint32_t>{100, 101, 127}));
    EXPECT_EQ(turn_lengths(p.levels), (std::vector<uint32_t>{101, 127}));

    messages.resize(1);
    Prompt short_text = prompt_levels(chat(messages), {100, 1000}, '\0',
                                      kTurns);
    ASSERT_EQ(short_text.rc, AFFINITY_PROMPT_OK);
    ASSERT_EQ(short_text.levels.size(), 1u);
    EXPECT_EQ(short_text.levels[0].length, 24u);
    EXPECT_EQ(short_text.levels[0].turn, 0u);
}

// With less room than levels, the scheduled levels come first, then the
// most recent turn levels.
TEST(TurnLevels, ScheduledLevelsFirstThenTheMostRecentTurns)
{
    std::vector<Msg> messages = {{"user", std::string(36, 'x')},   // 50
                                 {"user", std::string(24, 'y')},   // 80
                                 {"user", std::string(20, 'z')}};  // 106
    const uint32_t schedule[] = {30, 60, 1000};
    affinity_level_t out[4];
    size_t n = 0;

    for (size_t cap : {size_t(2), size_t(3), size_t(4)}) {
        SCOPED_TRACE(testing::Message() << "cap " << cap);
        LoadedBody loaded(chat(messages));
        std::memset(out, 0x5a, sizeof(out));
        ASSERT_EQ(affinity_json_prompt(loaded.json(), schedule, 3, kTurns,
                                       out, cap, &n),
                  AFFINITY_PROMPT_OK);
        std::vector<uint32_t> lengths;
        for (size_t i = 0; i < n; i++) {
            lengths.push_back(out[i].length);
        }
        // Room for none, the most recent, and two of the three.
        std::vector<uint32_t> expected =
            cap == 2   ? std::vector<uint32_t>{30, 60}
            : cap == 3 ? std::vector<uint32_t>{30, 60, 106}
                       : std::vector<uint32_t>{30, 60, 80, 106};
        EXPECT_EQ(lengths, expected);
        for (size_t i = n; i < 4; i++) {
            EXPECT_EQ(out[i].hash, 0x5a5a5a5a5a5a5a5aULL) << "past out_cap";
        }
    }
}

// Responses API instructions and input items end turns as chat messages
// do, items without a role too; a completions prompt is one text, with no
// turn levels.
TEST(TurnLevels, ResponsesItemsEndTurnsAndCompletionsHaveNone)
{
    const std::string responses =
        "{\"model\":\"m\",\"instructions\":\"be brief\",\"input\":["
        "{\"role\":\"user\",\"content\":\"run ls\"},"
        "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"ls\","
        "\"arguments\":\"{}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c1\","
        "\"output\":\"a.txt\"}]}";
    const std::string call =
        "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"ls\","
        "\"arguments\":\"{}\"}";
    const std::string output =
        "{\"type\":\"function_call_output\",\"call_id\":\"c1\","
        "\"output\":\"a.txt\"}";
    std::vector<std::string> ends_at = {
        "model" + US + "m" + RS + "instructions" + US + "be brief" + RS};
    ends_at.push_back(ends_at.back() + "user" + US + "run ls" + RS);
    ends_at.push_back(ends_at.back() + "function_call" + US + call + RS);
    ends_at.push_back(ends_at.back() + "function_call_output" + US + output
                      + RS);
    ASSERT_EQ(responses.find(call) != std::string::npos, true);
    ASSERT_EQ(responses.find(output) != std::string::npos, true);

    Prompt p = prompt_levels(responses, {10, 10000}, '\0', kTurns);
    ASSERT_EQ(p.rc, AFFINITY_PROMPT_OK);
    std::vector<uint32_t> expected;
    for (const std::string &c : ends_at) {
        expected.push_back(uint32_t(code_points(c)));
    }
    EXPECT_EQ(turn_lengths(p.levels), expected)
        << "at the instructions' end and each item's";
    for (const affinity_level_t &l : p.levels) {
        EXPECT_EQ(l.hash, level_hash(ends_at.back(), l.length));
    }

    // "input" as a string is one message: its end is the text's.
    Prompt one = prompt_levels(
        "{\"model\":\"m\",\"input\":\"" + std::string(50, 'i') + "\"}",
        {10, 10000}, '\0', kTurns);
    ASSERT_EQ(one.rc, AFFINITY_PROMPT_OK);
    EXPECT_TRUE(turn_lengths(one.levels).empty());

    Prompt c = prompt_levels("{\"model\":\"m\",\"prompt\":\"" +
                                 std::string(300, 'p') + "\"}",
                             every(100, 1000), '\0', kTurns);
    ASSERT_EQ(c.rc, AFFINITY_PROMPT_OK);
    EXPECT_TRUE(turn_lengths(c.levels).empty());
}

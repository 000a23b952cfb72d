// Extraction of a session key field from a JSON request body.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "affinity_core.h"
#include "test_support.h"

using namespace affinity_test;

namespace {

struct Field {
    affinity_field_e rc;
    std::string value;
};

// Loads body (see LoadedBody) and calls affinity_json_field().
Field field(const std::string &body, const std::string &path,
            size_t out_cap = 256, char fill = '\0')
{
    LoadedBody loaded(body, fill);
    std::vector<char> out(out_cap + 16, '#');
    size_t out_len = 12345;

    affinity_field_e rc =
        affinity_json_field(loaded.json(), path.data(), path.size(),
                            out.data(), out_cap, &out_len);

    Field f{rc, {}};
    if (rc == AFFINITY_FIELD_FOUND) {
        EXPECT_LE(out_len, out_cap);
        f.value.assign(out.data(), std::min(out_len, out_cap));
        for (size_t i = out_cap; i < out.size(); i++) {
            EXPECT_EQ(out[i], '#') << "wrote past out_cap";
        }
    }
    return f;
}

void expect_found(const std::string &body, const std::string &path,
                  const std::string &value)
{
    Field f = field(body, path);
    EXPECT_EQ(f.rc, AFFINITY_FIELD_FOUND) << body << " @ " << path;
    EXPECT_EQ(f.value, value) << body << " @ " << path;
}

void expect_rc(const std::string &body, const std::string &path,
               affinity_field_e rc)
{
    EXPECT_EQ(field(body, path).rc, rc) << body << " @ " << path;
}

void expect_not_found(const std::string &body, const std::string &path)
{
    Field f = field(body, path);
    EXPECT_NE(f.rc, AFFINITY_FIELD_FOUND)
        << body << " @ " << path << " gave \"" << f.value << "\"";
    EXPECT_TRUE(f.rc == AFFINITY_FIELD_MISSING
                || f.rc == AFFINITY_FIELD_INVALID)
        << "unexpected result " << int(f.rc);
}

TEST(JsonField, TopLevelString)
{
    expect_found(R"({"user": "alice"})", "user", "alice");
    expect_found(R"({"model": "m", "user": "u-1", "stream": true})", "user",
                 "u-1");
    expect_found(R"({"user":"x"})", "user", "x");
}

TEST(JsonField, DottedPath)
{
    std::string body =
        R"({"model": "gpt", "metadata": {"session_id": "s-77", "n": 1}})";
    expect_found(body, "metadata.session_id", "s-77");
    expect_found(body, "metadata.n", "1");
    expect_found(body, "model", "gpt");

    expect_found(R"({"a": {"b": {"c": {"d": "deep"}}}})", "a.b.c.d", "deep");
}

TEST(JsonField, TopLevelFieldIsNotConfusedWithANestedOne)
{
    expect_found(R"({"meta": {"user": "inner"}, "user": "outer"})", "user",
                 "outer");
    expect_rc(R"({"meta": {"user": "inner"}})", "user",
              AFFINITY_FIELD_MISSING);
    expect_found(R"({"user": "outer", "meta": {"user": "inner"}})",
                 "meta.user", "inner");
}

TEST(JsonField, NumbersInTheirShortestForm)
{
    // One key per value, however the client spelled it.
    expect_found(R"({"user": 42})", "user", "42");
    expect_found(R"({"user": 42 })", "user", "42");
    expect_found("{\"user\": 42\n}", "user", "42");
    expect_found("{\"user\":42,\"x\":1}", "user", "42");
    expect_found(R"({"user": 42.0})", "user", "42");
    expect_found(R"({"user": 4.2e1})", "user", "42");
    expect_found(R"({"user": -1.5e3})", "user", "-1500");
    expect_found(R"({"user": 0.25})", "user", "0.25");
    expect_found(R"({"user": 0})", "user", "0");
    expect_found(R"({"user": -0})", "user", "0");
    expect_found(R"({"user": 18446744073709551615})", "user",
                 "18446744073709551615");
    expect_found(R"({"user": -9223372036854775808})", "user",
                 "-9223372036854775808");
    expect_found(R"({"m": {"id": 7}})", "m.id", "7");

    // Past 64 bits, the parser refuses the body: no key, no prompt.
    expect_rc(R"({"user": 12345678901234567890123})", "user",
              AFFINITY_FIELD_INVALID);
}

TEST(JsonField, EscapedStringsAreUnescaped)
{
    expect_found(R"({"user": "\u00e9"})", "user", "\xc3\xa9");
    expect_found(R"({"user": "caf\u00e9"})", "user", "caf\xc3\xa9");
    expect_found(R"({"user": "a\"b"})", "user", "a\"b");
    expect_found(R"({"user": "a\\b"})", "user", "a\\b");
    expect_found(R"({"user": "a\/b"})", "user", "a/b");
    expect_found(R"({"user": "line\nnext"})", "user", "line\nnext");
    expect_found(R"({"user": "\ud83d\ude00"})", "user", "\xf0\x9f\x98\x80");

    // The escaped and the raw form are the same key.
    Field escaped = field(R"({"user": "\u00e9t\u00e9"})", "user");
    Field raw = field("{\"user\": \"\xc3\xa9t\xc3\xa9\"}", "user");
    EXPECT_EQ(escaped.rc, AFFINITY_FIELD_FOUND);
    EXPECT_EQ(raw.rc, AFFINITY_FIELD_FOUND);
    EXPECT_EQ(escaped.value, raw.value);
}

TEST(JsonField, KeyOrderAndWhitespaceDoNotMatter)
{
    expect_found(R"({"a": 1, "b": [1, 2], "user": "u"})", "user", "u");
    expect_found(R"({"user": "u", "a": 1, "b": [1, 2]})", "user", "u");
    expect_found("  \n\t{ \"user\"\n:\t\"u\" \r\n}  \n", "user", "u");
    expect_found("{\n  \"metadata\" : {\n    \"session_id\" :   \"s\"\n  }\n}",
                 "metadata.session_id", "s");
    expect_found(R"({"metadata": {"x": {"y": 1}, "session_id": "s"}, "z": 2})",
                 "metadata.session_id", "s");
}

TEST(JsonField, MissingField)
{
    expect_rc(R"({})", "user", AFFINITY_FIELD_MISSING);
    expect_rc(R"({"users": "x"})", "user", AFFINITY_FIELD_MISSING);
    expect_rc(R"({"use": "x"})", "user", AFFINITY_FIELD_MISSING);
    expect_rc(R"({"User": "x"})", "user", AFFINITY_FIELD_MISSING);
    expect_rc(R"({"metadata": {}})", "metadata.session_id",
              AFFINITY_FIELD_MISSING);
    expect_rc(R"({"metadata": {"other": "x"}})", "metadata.session_id",
              AFFINITY_FIELD_MISSING);
    expect_rc(R"({"session_id": "x"})", "metadata.session_id",
              AFFINITY_FIELD_MISSING);
}

TEST(JsonField, NonScalarValuesAreMissing)
{
    expect_rc(R"({"user": {"id": "x"}})", "user", AFFINITY_FIELD_MISSING);
    expect_rc(R"({"user": {}})", "user", AFFINITY_FIELD_MISSING);
    expect_rc(R"({"user": ["x"]})", "user", AFFINITY_FIELD_MISSING);
    expect_rc(R"({"user": []})", "user", AFFINITY_FIELD_MISSING);
    expect_rc(R"({"user": null})", "user", AFFINITY_FIELD_MISSING);
    expect_rc(R"({"user": true})", "user", AFFINITY_FIELD_MISSING);
    expect_rc(R"({"user": false})", "user", AFFINITY_FIELD_MISSING);
    expect_rc(R"({"m": {"user": null}})", "m.user", AFFINITY_FIELD_MISSING);
}

TEST(JsonField, PathThroughANonObjectIsMissing)
{
    expect_rc(R"({"metadata": "text"})", "metadata.session_id",
              AFFINITY_FIELD_MISSING);
    expect_rc(R"({"metadata": 12})", "metadata.session_id",
              AFFINITY_FIELD_MISSING);
    expect_rc(R"({"metadata": null})", "metadata.session_id",
              AFFINITY_FIELD_MISSING);
    expect_rc(R"({"metadata": true})", "metadata.session_id",
              AFFINITY_FIELD_MISSING);
    expect_rc(R"({"metadata": ["session_id"]})", "metadata.session_id",
              AFFINITY_FIELD_MISSING);
    expect_rc(R"({"metadata": [{"session_id": "s"}]})",
              "metadata.session_id", AFFINITY_FIELD_MISSING);
}

TEST(JsonField, ArrayElementsAreNotFields)
{
    // A dotted path names object members; "items.0" is no member of an
    // array, whatever the array holds.
    expect_rc(R"({"items": ["first", "second"]})", "items.0",
              AFFINITY_FIELD_MISSING);
    expect_rc(R"({"items": [7]})", "items.0", AFFINITY_FIELD_MISSING);
}

TEST(JsonField, BodiesThatAreNotWholeObjects)
{
    for (const char *body :
         {"[]", R"(["user", "x"])", R"([{"user": "x"}])", R"("user")",
          "42", "true", "null", "garbage", "user=alice", "<xml/>", "",
          "   ", "\n", "{", "}", "{\"user\"", "{\"user\":",
          "{\"user\": \"ab", "{\"user\": \"ab\\", "{\"user\": \"ab\\u00",
          "{\"user\": 4", "{\"user\": \"abc\"", "{\"user\": \"abc\",",
          "{\"m\": {\"user\": 1}",
          "{user: \"x\"}", "{'user': 'x'}", "\xef\xbb\xbf", "\x01\x02"}) {
        expect_not_found(body, "user");
    }
}

TEST(JsonField, MalformedObjectsNeverGiveGarbage)
{
    // Whatever the parser makes of these, a value it returns must be the
    // field's value, never bytes of something else.
    const char *bodies[] = {
        R"({"user" "x"})",
        R"({"user": })",
        R"({"user": ,})",
        R"({"user": "x",})",
        R"({"user": "x" "y"})",
        R"({"a": [1, 2}, "user": "x"})",
        R"({"a": {"b": 1, "user": "x"})",
        R"({"user": x})",
        R"({"user": "x)",
        R"({"user": 'x'})",
        R"({"user": "x"}})",
        R"({"user": "x"} trailing)",
        R"({"user": "x"}{"user": "y"})",
    };

    for (const char *body : bodies) {
        Field f = field(body, "user");
        EXPECT_TRUE(f.rc == AFFINITY_FIELD_FOUND
                    || f.rc == AFFINITY_FIELD_MISSING
                    || f.rc == AFFINITY_FIELD_INVALID)
            << body;
        if (f.rc == AFFINITY_FIELD_FOUND) {
            EXPECT_EQ(f.value, "x") << body;
        }
    }
}

TEST(JsonField, BadBytesInStrings)
{
    // Invalid UTF-8 makes the body invalid.
    expect_not_found("{\"user\": \"\xff\xfe\"}", "user");
    expect_not_found("{\"user\": \"\xc3\"}", "user");

    // A raw control character: if accepted at all, the value is returned
    // as it is (whether it may be echoed is checked separately).
    Field f = field("{\"user\": \"a\x01" "b\"}", "user");
    if (f.rc == AFFINITY_FIELD_FOUND) {
        EXPECT_EQ(f.value, std::string("a\x01" "b"));
    }
}

TEST(JsonField, MalformedNumbersAreNotValues)
{
    // Tokens that start like a number but are not JSON numbers.
    for (const char *body :
         {R"({"user": 42abc})", R"({"user": -})", R"({"user": 1.2.3})",
          R"({"user": 0x1F})", R"({"user": 1e})", R"({"user": --1})",
          R"({"user": 01})", R"({"user": 1.})", R"({"user": -abc})"}) {
        expect_not_found(body, "user");
    }
}

TEST(JsonField, ValueLongerThanTheOutputIsMissing)
{
    std::string value(100, 'v');
    std::string body = "{\"user\": \"" + value + "\"}";

    Field fits = field(body, "user", 100);
    EXPECT_EQ(fits.rc, AFFINITY_FIELD_FOUND);
    EXPECT_EQ(fits.value, value);

    EXPECT_EQ(field(body, "user", 99).rc, AFFINITY_FIELD_MISSING);
    EXPECT_EQ(field(body, "user", 1).rc, AFFINITY_FIELD_MISSING);

    // Unescaped length counts: 6 escaped bytes are 2 output bytes.
    Field esc = field(R"({"user": "\u00e9"})", "user", 2);
    EXPECT_EQ(esc.rc, AFFINITY_FIELD_FOUND);
    EXPECT_EQ(esc.value, "\xc3\xa9");
    EXPECT_EQ(field(R"({"user": "\u00e9"})", "user", 1).rc,
              AFFINITY_FIELD_MISSING);

    // Numbers too.
    EXPECT_EQ(field(R"({"user": 123456})", "user", 6).rc,
              AFFINITY_FIELD_FOUND);
    EXPECT_EQ(field(R"({"user": 123456})", "user", 5).rc,
              AFFINITY_FIELD_MISSING);
}

TEST(JsonField, LargeBodyWithTheFieldAtTheEnd)
{
    std::string body = "{\"messages\": [";
    size_t n = 0;
    while (body.size() < (1u << 20)) {
        if (n++) {
            body += ",";
        }
        body += R"({"role": "user", "content": "lorem ipsum dolor sit amet, )"
                R"(\"quoted\" user: \"decoy\", {\"user\": \"no\"}"})";
    }
    body += "], \"user\": \"at-the-end\"}";
    ASSERT_GT(body.size(), 1u << 20);

    expect_found(body, "user", "at-the-end");

    // And a nested one after the big array.
    std::string nested = body;
    nested.insert(nested.size() - 1, R"(, "metadata": {"session_id": "deep"})");
    expect_found(nested, "metadata.session_id", "deep");
}

TEST(JsonField, PaddingContentDoesNotMatter)
{
    std::string body = R"({"user": "u", "n": 5})";
    for (char fill : {'\0', ' ', '"', '}', '{', '1', '\\', '\xff'}) {
        Field f = field(body, "user", 256, fill);
        EXPECT_EQ(f.rc, AFFINITY_FIELD_FOUND) << int(fill);
        EXPECT_EQ(f.value, "u");
        Field n = field(body, "n", 256, fill);
        EXPECT_EQ(n.rc, AFFINITY_FIELD_FOUND) << int(fill);
        EXPECT_EQ(n.value, "5") << int(fill);
    }

    // A number that ends the body right before the padding.
    for (char fill : {'\0', '5', 'e', '.'}) {
        Field f = field(R"({"user": 42})", "user", 256, fill);
        EXPECT_EQ(f.rc, AFFINITY_FIELD_FOUND);
        EXPECT_EQ(f.value, "42") << "padding '" << fill << "'";
    }

    // A truncated body followed by padding that would complete it.
    for (char fill : {'"', '}'}) {
        Field f = field(R"({"user": "ab)", "user", 256, fill);
        EXPECT_NE(f.rc, AFFINITY_FIELD_FOUND) << "padding '" << fill << "'";
    }
}

TEST(JsonField, RepeatedCallsAreIndependent)
{
    // The parser is reused between calls; an earlier document must not
    // leak into a later one.
    for (int i = 0; i < 100; i++) {
        std::string v = "v" + std::to_string(i);
        expect_found("{\"user\": \"" + v + "\"}", "user", v);
        expect_not_found("[1, 2", "user");
        expect_rc("{\"other\": 1}", "user", AFFINITY_FIELD_MISSING);
    }
}

TEST(JsonField, FieldNamesWithSpecialCharacters)
{
    expect_found(R"({"a/b": "slash"})", "a/b", "slash");
    expect_found(R"({"a~b": "tilde"})", "a~b", "tilde");
    expect_found(R"({"a~1b": "literal"})", "a~1b", "literal");
    expect_found(R"({"": "empty"})", "", "empty");
}

TEST(JsonField, DuplicateKeysDoNotCrash)
{
    Field f = field(R"({"user": "first", "user": "second"})", "user");
    EXPECT_EQ(f.rc, AFFINITY_FIELD_FOUND);
    EXPECT_TRUE(f.value == "first" || f.value == "second") << f.value;
}

TEST(JsonField, DeepNestingDoesNotCrash)
{
    std::string body;
    for (int i = 0; i < 5000; i++) {
        body += "{\"a\":";
    }
    body += "1";
    for (int i = 0; i < 5000; i++) {
        body += "}";
    }
    Field f = field(body, "user");
    EXPECT_NE(f.rc, AFFINITY_FIELD_FOUND);

    std::string arrays = "{\"x\": " + std::string(5000, '[')
                         + std::string(5000, ']') + ", \"user\": \"u\"}";
    f = field(arrays, "user");
    EXPECT_TRUE(f.rc != AFFINITY_FIELD_FOUND || f.value == "u");
}

}  // namespace

namespace {

// One parse of a body serves every read of it: several fields and the
// prompt, in any order, each as if read alone.
TEST(JsonBody, OneLoadServesEveryRead)
{
    const std::string body =
        R"({"user":"u-1","messages":[{"role":"user","content":"hello"}],)"
        R"("metadata":{"session_id":"s-9"},"prompt_cache_key":7})";
    const std::vector<uint32_t> schedule{3, 10};

    Prompt alone = prompt_levels(body, schedule);
    ASSERT_EQ(alone.rc, AFFINITY_PROMPT_OK);

    LoadedBody loaded(body);
    ASSERT_TRUE(loaded.loaded());

    char out[64];
    size_t len = 0;
    for (int round = 0; round < 2; round++) {
        for (const auto &[path, value] :
             std::vector<std::pair<std::string, std::string>>{
                 {"user", "u-1"}, {"metadata.session_id", "s-9"},
                 {"prompt_cache_key", "7"}}) {
            ASSERT_EQ(affinity_json_field(loaded.json(), path.data(),
                                          path.size(), out, sizeof(out),
                                          &len),
                      AFFINITY_FIELD_FOUND)
                << path;
            EXPECT_EQ(std::string(out, len), value);
        }

        affinity_level_t levels[4];
        size_t n = 0;
        ASSERT_EQ(affinity_json_prompt(loaded.json(), schedule.data(),
                                       schedule.size(), 0, levels, 4, &n),
                  AFFINITY_PROMPT_OK);
        ASSERT_EQ(n, alone.levels.size());
        for (size_t i = 0; i < n; i++) {
            EXPECT_EQ(levels[i].hash, alone.levels[i].hash);
        }
    }
}

// Nothing is read from a body that did not parse, and a reader with no
// body loaded answers INVALID.
TEST(JsonBody, NothingIsReadFromABodyThatDidNotParse)
{
    LoadedBody loaded("{\"user\":\"x\",\"messages\":[}");
    EXPECT_FALSE(loaded.loaded());

    char out[16];
    size_t len = 0;
    EXPECT_EQ(affinity_json_field(loaded.json(), "user", 4, out, sizeof(out),
                                  &len),
              AFFINITY_FIELD_INVALID);

    affinity_level_t levels[2];
    size_t n = 5;
    const uint32_t schedule[] = {10};
    EXPECT_EQ(affinity_json_prompt(loaded.json(), schedule, 1, 1, levels, 2,
                                   &n),
              AFFINITY_PROMPT_INVALID);
    EXPECT_EQ(n, 0u);
}

// Buffers grown for a body larger than the reader's retain size are freed
// by a shrink; up to that size they are kept.
TEST(JsonBody, ShrinkFreesWhatLargeBodiesGrew)
{
    affinity_json_t *json = affinity_json_create(64 * 1024);
    ASSERT_NE(json, nullptr);

    auto load_unload = [&](size_t size) {
        std::string body = "{\"messages\":[{\"role\":\"user\",\"content\":\""
                           + std::string(size, 'a') + "\"}]}";
        body.append(AFFINITY_JSON_PADDING, '\0');
        EXPECT_EQ(affinity_json_load(json, body.data(),
                                     body.size() - AFFINITY_JSON_PADDING),
                  0);
        affinity_json_unload(json);
        return affinity_json_shrink(json);
    };

    EXPECT_EQ(load_unload(1000), 0);
    EXPECT_EQ(load_unload(1000), 0);
    EXPECT_EQ(load_unload(1 << 20), 1) << "grew past retain: freed";
    EXPECT_EQ(affinity_json_shrink(json), 0) << "nothing left to free";
    EXPECT_EQ(load_unload(1000), 0);

    affinity_json_destroy(json);
}

}  // namespace

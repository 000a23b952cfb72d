// Reading the id of a Responses API object from a response body as it
// streams by (affinity_response_scan*): JSON bodies and event streams, in
// one piece and split at every byte, ids at the limit, and junk.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "affinity_core.h"

namespace {

struct Scan {
    affinity_scan_e status;
    affinity_scan_reason_e reason;
    std::string id;
    affinity_object_e object;
    size_t fed;             // bytes fed before the scan was over
};

// Feeds body in pieces cut at the given offsets (ascending), then ends it
// unless the scan is over; stops feeding once it is.
Scan scan_pieces(affinity_response_format_e format, const std::string &body,
                 const std::vector<size_t> &cuts, bool end = true)
{
    affinity_response_scan_t state;
    affinity_response_scan_start(&state, format);

    Scan out{AFFINITY_SCAN_MORE, AFFINITY_SCAN_OK, "", AFFINITY_OBJECT_NONE,
             0};
    size_t from = 0;
    std::vector<size_t> bounds = cuts;
    bounds.push_back(body.size());

    for (size_t to : bounds) {
        // Each piece in a buffer of its own size: a read past it is
        // caught by AddressSanitizer.
        std::vector<char> piece(body.begin() + from, body.begin() + to);
        out.status = affinity_response_scan(&state, piece.data(),
                                            piece.size());
        out.fed = to;
        from = to;
        if (out.status != AFFINITY_SCAN_MORE) {
            break;
        }
    }

    if (out.status == AFFINITY_SCAN_MORE && end) {
        out.status = affinity_response_scan_end(&state);
    }

    out.reason = affinity_response_scan_reason(&state);
    size_t len = 0;
    const char *id = affinity_response_scan_id(&state, &len, &out.object);
    if (id) {
        out.id.assign(id, len);
    }
    return out;
}

Scan scan(affinity_response_format_e format, const std::string &body)
{
    return scan_pieces(format, body, {});
}

Scan scan_json(const std::string &body)
{
    return scan(AFFINITY_RESPONSE_JSON, body);
}

Scan scan_events(const std::string &body)
{
    return scan(AFFINITY_RESPONSE_EVENTS, body);
}

// The same result whatever the body is cut into: in two pieces at every
// offset, and byte by byte.
void expect_split_invariant(affinity_response_format_e format,
                            const std::string &body)
{
    Scan whole = scan(format, body);

    for (size_t cut = 0; cut <= body.size(); cut++) {
        Scan split = scan_pieces(format, body, {cut});
        ASSERT_EQ(split.status, whole.status) << "cut at " << cut;
        ASSERT_EQ(split.reason, whole.reason) << "cut at " << cut;
        ASSERT_EQ(split.id, whole.id) << "cut at " << cut;
        ASSERT_EQ(split.object, whole.object) << "cut at " << cut;
    }

    std::vector<size_t> every;
    for (size_t i = 1; i < body.size(); i++) {
        every.push_back(i);
    }
    Scan bytes = scan_pieces(format, body, every);
    EXPECT_EQ(bytes.status, whole.status);
    EXPECT_EQ(bytes.reason, whole.reason);
    EXPECT_EQ(bytes.id, whole.id);
}

// A response object in vLLM's field order: id first, "object" after the
// instructions, then the output.
std::string response_json(const std::string &id,
                          const std::string &instructions = "Be brief.",
                          const std::string &object = "response")
{
    return "{\"id\":\"" + id + "\",\"created_at\":1763900000,"
           "\"incomplete_details\":null,\"instructions\":\"" + instructions
           + "\",\"metadata\":{\"id\":\"not-this\"},\"model\":\"m\","
           "\"object\":\"" + object + "\",\"output\":[{\"type\":\"message\","
           "\"id\":\"msg_1\",\"content\":[{\"type\":\"output_text\","
           "\"text\":\"Hi {there} [\\\"x\\\"]\"}]}],\"status\":\"completed\","
           "\"usage\":{\"input_tokens\":3,\"output_tokens\":2}}";
}

std::string created_event(const std::string &id,
                          const std::string &newline = "\n")
{
    return "event: response.created" + newline
           + "data: {\"type\":\"response.created\",\"sequence_number\":0,"
             "\"response\":{\"id\":\"" + id + "\",\"object\":\"response\","
             "\"status\":\"in_progress\",\"output\":[]}}" + newline + newline
           + "event: response.output_text.delta" + newline
           + "data: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\""
             ",\"item_id\":\"msg_x\"}" + newline + newline;
}

TEST(ResponseScan, JsonResponseId)
{
    Scan s = scan_json(response_json("resp_0123abcd"));
    EXPECT_EQ(s.status, AFFINITY_SCAN_FOUND);
    EXPECT_EQ(s.reason, AFFINITY_SCAN_OK);
    EXPECT_EQ(s.id, "resp_0123abcd");
    EXPECT_EQ(s.object, AFFINITY_OBJECT_RESPONSE);
}

TEST(ResponseScan, JsonIsLearnedOnlyWhenTheObjectCloses)
{
    std::string body = response_json("resp_1");
    Scan open = scan_pieces(AFFINITY_RESPONSE_JSON,
                            body.substr(0, body.size() - 1), {}, false);
    EXPECT_EQ(open.status, AFFINITY_SCAN_MORE);
    EXPECT_EQ(open.id, "");

    Scan truncated = scan_json(body.substr(0, body.size() - 1));
    EXPECT_EQ(truncated.status, AFFINITY_SCAN_NONE);
    EXPECT_EQ(truncated.reason, AFFINITY_SCAN_TRUNCATED);

    // Trailing white space is not read at all.
    Scan whole = scan_json(body + "\n");
    EXPECT_EQ(whole.status, AFFINITY_SCAN_FOUND);
    EXPECT_EQ(whole.fed, body.size() + 1);
}

TEST(ResponseScan, JsonConversationId)
{
    Scan s = scan_json("{\"id\": \"conv_77\", \"object\": \"conversation\","
                       " \"created_at\": 1, \"metadata\": {}}");
    EXPECT_EQ(s.status, AFFINITY_SCAN_FOUND);
    EXPECT_EQ(s.id, "conv_77");
    EXPECT_EQ(s.object, AFFINITY_OBJECT_CONVERSATION);
}

TEST(ResponseScan, JsonOfOtherObjectsTeachesNothing)
{
    const char *bodies[] = {
        "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"choices\":[]}",
        "{\"id\":\"resp_1\"}",
        "{\"object\":\"response\"}",
        "{\"error\":{\"message\":\"Response with id 'resp_1' not found.\","
        "\"type\":\"invalid_request_error\",\"id\":\"resp_1\","
        "\"object\":\"response\"}}",
        "{\"object\":\"list\",\"data\":[{\"id\":\"resp_1\","
        "\"object\":\"response\"}]}",
        "{\"id\":7,\"object\":\"response\"}",
        "{\"id\":\"\",\"object\":\"response\"}",
        "{\"ID\":\"resp_1\",\"object\":\"Response\"}",
    };

    for (const char *body : bodies) {
        Scan s = scan_json(body);
        EXPECT_EQ(s.status, AFFINITY_SCAN_NONE) << body;
        EXPECT_EQ(s.reason, AFFINITY_SCAN_NO_ID) << body;
        EXPECT_EQ(s.id, "") << body;
    }
}

TEST(ResponseScan, OtherObjectsAreNotReadPastTheirType)
{
    std::string body = "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\","
                       "\"choices\":[{\"message\":{\"content\":\""
                       + std::string(100000, 'x') + "\"}}]}";
    Scan s = scan_json(body);
    EXPECT_EQ(s.status, AFFINITY_SCAN_NONE);
    EXPECT_EQ(s.reason, AFFINITY_SCAN_NO_ID);
    std::vector<size_t> cut = {60};
    Scan split = scan_pieces(AFFINITY_RESPONSE_JSON, body, cut);
    EXPECT_EQ(split.fed, 60u);
}

TEST(ResponseScan, JsonKeyOrderAndWhitespaceDoNotMatter)
{
    Scan s = scan_json(" \r\n{ \"object\" :\t\"response\" ,\n"
                       "  \"output\" : [ 1, -2.5e3, true, null, { } , [ ] ],"
                       "  \"id\" : \"resp_x\" }");
    EXPECT_EQ(s.status, AFFINITY_SCAN_FOUND);
    EXPECT_EQ(s.id, "resp_x");
}

TEST(ResponseScan, SimpleEscapesInTheIdAreDecoded)
{
    Scan s = scan_json("{\"id\":\"resp\\/a\\\\b\\\"c\",\"object\":\"response\"}");
    EXPECT_EQ(s.status, AFFINITY_SCAN_FOUND);
    EXPECT_EQ(s.id, "resp/a\\b\"c");

    // Any other escape in the id: the request could spell it otherwise.
    Scan u = scan_json("{\"id\":\"resp_\\u0041\",\"object\":\"response\"}");
    EXPECT_EQ(u.status, AFFINITY_SCAN_NONE);
    EXPECT_EQ(u.reason, AFFINITY_SCAN_ID_ESCAPED);

    // Escaped keys are not taken for "id".
    Scan k = scan_json("{\"\\u0069d\":\"resp_1\",\"object\":\"response\"}");
    EXPECT_EQ(k.reason, AFFINITY_SCAN_NO_ID);

    // Escapes elsewhere are skipped.
    Scan e = scan_json("{\"instructions\":\"a\\u00e9\\n\\\"}\",\"id\":"
                       "\"resp_2\",\"object\":\"response\"}");
    EXPECT_EQ(e.id, "resp_2");
}

TEST(ResponseScan, IdsAtTheLimit)
{
    std::string at(AFFINITY_RESPONSE_ID_MAX, 'a');
    Scan s = scan_json(response_json(at));
    EXPECT_EQ(s.status, AFFINITY_SCAN_FOUND);
    EXPECT_EQ(s.id, at);

    Scan over = scan_json(response_json(at + "b"));
    EXPECT_EQ(over.status, AFFINITY_SCAN_NONE);
    EXPECT_EQ(over.reason, AFFINITY_SCAN_ID_TOO_LONG);
    EXPECT_EQ(over.id, "");

    Scan events = scan_events(created_event(at + "b"));
    EXPECT_EQ(events.reason, AFFINITY_SCAN_ID_TOO_LONG);
}

TEST(ResponseScan, JsonSplitAnywhere)
{
    expect_split_invariant(AFFINITY_RESPONSE_JSON,
                           response_json("resp_split", "x\\\"y\\u00e9z"));
    expect_split_invariant(AFFINITY_RESPONSE_JSON,
                           "{\"id\":\"resp\\/1\",\"object\":\"response\"}");
}

TEST(ResponseScan, LongBodiesAreReadThrough)
{
    std::string instructions(200000, 'w');
    Scan s = scan_json(response_json("resp_long", instructions));
    EXPECT_EQ(s.status, AFFINITY_SCAN_FOUND);
    EXPECT_EQ(s.id, "resp_long");
}

TEST(ResponseScan, EventStreamFirstEvent)
{
    std::string body = created_event("resp_stream");
    Scan s = scan_events(body);
    EXPECT_EQ(s.status, AFFINITY_SCAN_FOUND);
    EXPECT_EQ(s.id, "resp_stream");
    EXPECT_EQ(s.object, AFFINITY_OBJECT_RESPONSE);

    // Known as soon as the event's object closes: nothing after it needed.
    size_t end = body.find("}}") + 2;
    Scan early = scan_events(body.substr(0, end));
    EXPECT_EQ(early.status, AFFINITY_SCAN_FOUND);
    EXPECT_EQ(early.fed, end);
}

TEST(ResponseScan, EventStreamLineEndings)
{
    for (const char *nl : {"\n", "\r\n", "\r"}) {
        Scan s = scan_events(": ping" + std::string(nl) + "retry: 100" + nl
                             + nl + created_event("resp_nl", nl));
        EXPECT_EQ(s.status, AFFINITY_SCAN_FOUND) << int(nl[0]);
        EXPECT_EQ(s.id, "resp_nl");
    }
}

TEST(ResponseScan, EventStreamDataOverSeveralLines)
{
    Scan s = scan_events("data:{\"type\":\"response.created\",\n"
                         "data:  \"response\":{\"id\":\"resp_ml\",\n"
                         "data: \"object\":\"response\"}}\n\n");
    EXPECT_EQ(s.status, AFFINITY_SCAN_FOUND);
    EXPECT_EQ(s.id, "resp_ml");
}

TEST(ResponseScan, EventStreamSplitAnywhere)
{
    expect_split_invariant(AFFINITY_RESPONSE_EVENTS,
                           created_event("resp_split"));
    expect_split_invariant(AFFINITY_RESPONSE_EVENTS,
                           ":\r\n\r\n" + created_event("resp_crlf", "\r\n"));
    expect_split_invariant(AFFINITY_RESPONSE_EVENTS,
                           "data: [DONE]\n\n");
}

TEST(ResponseScan, EventStreamWithoutAnIdTeachesNothing)
{
    struct Case {
        const char *body;
        affinity_scan_reason_e reason;
    };
    const Case cases[] = {
        // a chat completion stream
        {"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\"}"
         "\n\n", AFFINITY_SCAN_NO_ID},
        // the top-level id of an event is not the response's
        {"data: {\"id\":\"resp_1\",\"object\":\"response\"}\n\n",
         AFFINITY_SCAN_NO_ID},
        {"data: {\"type\":\"error\",\"code\":\"x\"}\n\n", AFFINITY_SCAN_NO_ID},
        {"data: [DONE]\n\n", AFFINITY_SCAN_NO_ID},
        {"data: hello\n\n", AFFINITY_SCAN_MALFORMED},
        {"data:\n\n", AFFINITY_SCAN_MALFORMED},
        // the event ends before its object does
        {"data: {\"response\":{\"id\":\"resp_1\"\n\n", AFFINITY_SCAN_TRUNCATED},
        // no data at all
        {": ping\n\nevent: x\n\n", AFFINITY_SCAN_NO_EVENT},
        {"", AFFINITY_SCAN_NO_EVENT},
        // "data" must be the whole field name
        {"datum: {\"response\":{\"id\":\"r\",\"object\":\"response\"}}\n\n",
         AFFINITY_SCAN_NO_EVENT},
    };

    for (const Case &c : cases) {
        Scan s = scan_events(c.body);
        EXPECT_EQ(s.status, AFFINITY_SCAN_NONE) << c.body;
        EXPECT_EQ(s.reason, c.reason) << c.body;
        EXPECT_EQ(s.id, "") << c.body;
    }
}

TEST(ResponseScan, EventStreamGivesUpAfterAMegabyteOfPings)
{
    std::string pings;
    while (pings.size() <= (1u << 20)) {
        pings += ": keep-alive\n\n";
    }

    Scan s = scan_events(pings + created_event("resp_late"));
    EXPECT_EQ(s.status, AFFINITY_SCAN_NONE);
    EXPECT_EQ(s.reason, AFFINITY_SCAN_NO_EVENT);
}

TEST(ResponseScan, JunkTeachesNothing)
{
    const char *bodies[] = {
        "",
        "   ",
        "not json",
        "[{\"id\":\"resp_1\",\"object\":\"response\"}]",
        "\"resp_1\"",
        "{\"id\":\"resp_1\",\"object\":\"response\"",
        "{\"id\":\"resp_1\" \"object\":\"response\"}",
        "{\"id\":\"resp_1\",,\"object\":\"response\"}",
        "{\"id\" \"resp_1\",\"object\":\"response\"}",
        "{\"id\":\"resp_1\",\"object\":\"response\"]",
        "{\"id\":\"re\nsp\",\"object\":\"response\"}",
        "{\"id\":\"resp\\q\",\"object\":\"response\"}",
        "{\"id\":\"resp\\u12G4\",\"object\":\"response\"}",
        "{\"id\":\"resp_1\",\"object\":\"response\",\"x\":@}",
        "{{}}",
        "{\"a\":}",
    };

    for (const char *body : bodies) {
        Scan s = scan_json(body);
        EXPECT_EQ(s.status, AFFINITY_SCAN_NONE) << body;
        EXPECT_NE(s.reason, AFFINITY_SCAN_OK) << body;
        EXPECT_EQ(s.id, "") << body;
        expect_split_invariant(AFFINITY_RESPONSE_JSON, body);
    }
}

TEST(ResponseScan, DeepNesting)
{
    // A JSON schema in "text.format" may nest deeply: read through.
    std::string deep = "{\"id\":\"resp_1\",\"text\":";
    for (int i = 0; i < 500; i++) {
        deep += i % 2 ? "[" : "{\"a\":";
    }
    for (int i = 500; i-- > 0;) {
        deep += i % 2 ? "]" : "}";
    }
    deep += ",\"object\":\"response\"}";
    Scan s = scan_json(deep);
    EXPECT_EQ(s.status, AFFINITY_SCAN_FOUND);
    EXPECT_EQ(s.id, "resp_1");

    // Past 1024 levels, as simdjson, it is refused.
    std::string deeper = "{\"id\":\"resp_1\",\"x\":";
    for (int i = 0; i < 1100; i++) {
        deeper += "[";
    }
    Scan r = scan_json(deeper);
    EXPECT_EQ(r.status, AFFINITY_SCAN_NONE);
    EXPECT_EQ(r.reason, AFFINITY_SCAN_MALFORMED);
}

TEST(ResponseScan, ResponsesNotStoredAreNotLearned)
{
    Scan s = scan_json("{\"id\":\"resp_1\",\"object\":\"response\","
                       "\"store\":false}");
    EXPECT_EQ(s.status, AFFINITY_SCAN_NONE);
    EXPECT_EQ(s.reason, AFFINITY_SCAN_NOT_STORED);

    Scan stored = scan_json("{\"id\":\"resp_1\",\"store\":true,"
                            "\"object\":\"response\"}");
    EXPECT_EQ(stored.status, AFFINITY_SCAN_FOUND);

    Scan events = scan_events("data: {\"type\":\"response.created\","
                              "\"response\":{\"id\":\"resp_2\",\"store\":"
                              "false,\"object\":\"response\"}}\n\n");
    EXPECT_EQ(events.reason, AFFINITY_SCAN_NOT_STORED);

    // Only the object's own "store" counts.
    Scan nested = scan_json("{\"id\":\"resp_3\",\"metadata\":{\"store\":"
                            "false},\"object\":\"response\"}");
    EXPECT_EQ(nested.status, AFFINITY_SCAN_FOUND);
}

TEST(ResponseScan, EmptyBodiesAndArraysAreNotMalformed)
{
    EXPECT_EQ(scan_json("").reason, AFFINITY_SCAN_NO_ID);
    EXPECT_EQ(scan_json(" \n").reason, AFFINITY_SCAN_NO_ID);
    EXPECT_EQ(scan_json("[{\"id\":\"resp_1\",\"object\":\"response\"}]")
                  .reason,
              AFFINITY_SCAN_NO_ID);
}

TEST(ResponseScan, FeedingAfterTheEndChangesNothing)
{
    affinity_response_scan_t state;
    affinity_response_scan_start(&state, AFFINITY_RESPONSE_JSON);
    std::string body = "{\"id\":\"resp_a\",\"object\":\"response\"}";
    ASSERT_EQ(affinity_response_scan(&state, body.data(), body.size()),
              AFFINITY_SCAN_FOUND);
    std::string more = "{\"id\":\"resp_b\",\"object\":\"response\"}";
    EXPECT_EQ(affinity_response_scan(&state, more.data(), more.size()),
              AFFINITY_SCAN_FOUND);
    EXPECT_EQ(affinity_response_scan_end(&state), AFFINITY_SCAN_FOUND);

    size_t len = 0;
    affinity_object_e object;
    const char *id = affinity_response_scan_id(&state, &len, &object);
    ASSERT_NE(id, nullptr);
    EXPECT_EQ(std::string(id, len), "resp_a");
}

TEST(ResponseScan, UnknownFormatTeachesNothing)
{
    affinity_response_scan_t state;
    affinity_response_scan_start(&state, affinity_response_format_e(7));
    EXPECT_EQ(affinity_response_scan(&state, "{}", 2), AFFINITY_SCAN_NONE);
}

}  // namespace

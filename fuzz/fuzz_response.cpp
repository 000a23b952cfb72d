// fuzz_response: the id of a response read from its body as it streams by
// (affinity_response_scan*), and the usage (affinity_usage_scan*): the
// parsers of what upstreams send back.
//
// The input is "HEADER BODY": byte 0 chooses the format (bit 0: event
// stream, else JSON) and how many cuts split the body (bits 1-3); then two
// bytes per cut give its offset (modulo the body's length + 1).  The body
// is scanned once whole and once in the pieces the cuts make, each piece
// in a heap block of its exact size, so that AddressSanitizer reports any
// read past a buffer.  Checked:
//
//   - both scans end alike: status, reason, id and object;
//   - FOUND has an id of 1..AFFINITY_RESPONSE_ID_MAX bytes without
//     control characters, an object, and reason OK; NONE has a reason;
//   - MORE becomes FOUND or NONE at the end of the body;
//   - feeding more after the end changes nothing;
//   - the usage read whole and in pieces is the same, and its counts have
//     at most 15 digits.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <algorithm>

#include "affinity_core.h"

namespace {

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond)) {                                                      \
            __builtin_printf("fuzz_response: check failed: %s (line %d)\n", \
                             #cond, __LINE__);                              \
            __builtin_trap();                                               \
        }                                                                   \
    } while (0)

struct Result {
    affinity_scan_e status;
    affinity_scan_reason_e reason;
    std::string id;
    affinity_object_e object;
};

affinity_scan_e feed(affinity_response_scan_t *scan, const uint8_t *data,
                     size_t len)
{
    // A copy of its own size: nothing past it is readable.
    char *piece = static_cast<char *>(std::malloc(len ? len : 1));
    CHECK(piece != nullptr);
    if (len) {
        std::memcpy(piece, data, len);
    }
    affinity_scan_e rc = affinity_response_scan(scan, piece, len);
    std::free(piece);
    return rc;
}

Result scan(affinity_response_format_e format, const uint8_t *body,
            size_t len, const std::vector<size_t> &cuts)
{
    affinity_response_scan_t state;
    affinity_response_scan_start(&state, format);

    affinity_scan_e rc = AFFINITY_SCAN_MORE;
    size_t from = 0;

    for (size_t to : cuts) {
        rc = feed(&state, body + from, to - from);
        from = to;
    }
    rc = feed(&state, body + from, len - from);

    if (rc == AFFINITY_SCAN_MORE) {
        rc = affinity_response_scan_end(&state);
    }
    CHECK(rc == AFFINITY_SCAN_FOUND || rc == AFFINITY_SCAN_NONE);

    Result r{rc, affinity_response_scan_reason(&state), "",
             AFFINITY_OBJECT_NONE};
    size_t id_len = 12345;
    const char *id = affinity_response_scan_id(&state, &id_len, &r.object);

    if (rc == AFFINITY_SCAN_FOUND) {
        CHECK(id != nullptr);
        CHECK(id_len >= 1 && id_len <= AFFINITY_RESPONSE_ID_MAX);
        CHECK(r.object == AFFINITY_OBJECT_RESPONSE
              || r.object == AFFINITY_OBJECT_CONVERSATION);
        CHECK(r.reason == AFFINITY_SCAN_OK);
        r.id.assign(id, id_len);
        for (unsigned char c : r.id) {
            CHECK(c >= 0x20);
        }
    } else {
        CHECK(id == nullptr && id_len == 0);
        CHECK(r.object == AFFINITY_OBJECT_NONE);
        CHECK(r.reason != AFFINITY_SCAN_OK);
    }

    // Over is over.
    CHECK(feed(&state, body, len) == rc);
    CHECK(affinity_response_scan_end(&state) == rc);
    CHECK(affinity_response_scan_reason(&state) == r.reason);

    return r;
}

struct Usage {
    int found;
    uint64_t cached;
    uint64_t prompt;

    bool operator==(const Usage &o) const
    {
        return found == o.found && cached == o.cached && prompt == o.prompt;
    }
};

Usage usage(const uint8_t *body, size_t len, const std::vector<size_t> &cuts)
{
    affinity_usage_scan_t state;
    affinity_usage_scan_start(&state);

    size_t from = 0;
    for (size_t to : cuts) {
        char *piece = static_cast<char *>(std::malloc(to - from + 1));
        CHECK(piece != nullptr);
        std::memcpy(piece, body + from, to - from);
        affinity_usage_scan(&state, piece, to - from);
        std::free(piece);
        from = to;
    }
    char *rest = static_cast<char *>(std::malloc(len - from + 1));
    CHECK(rest != nullptr);
    std::memcpy(rest, body + from, len - from);
    affinity_usage_scan(&state, rest, len - from);
    std::free(rest);

    Usage u{0, 0, 0};
    u.found = affinity_usage_scan_result(&state, &u.cached, &u.prompt);
    CHECK(u.found == 0 || u.found == 1);
    CHECK(u.cached < 1000000000000000ULL && u.prompt < 1000000000000000ULL);
    if (!u.found) {
        CHECK(u.cached == 0 && u.prompt == 0);
    }
    uint64_t prompt = 0, output = 0;
    affinity_usage_scan_tokens(&state, &prompt, &output);
    CHECK(prompt < 1000000000000000ULL && output < 1000000000000000ULL);
    CHECK(!u.found || prompt == u.prompt);
    return u;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) {
        return 0;
    }

    affinity_response_format_e format = (data[0] & 1)
                                        ? AFFINITY_RESPONSE_EVENTS
                                        : AFFINITY_RESPONSE_JSON;
    size_t ncuts = (data[0] >> 1) & 7;

    if (size < 1 + 2 * ncuts) {
        return 0;
    }

    const uint8_t *body = data + 1 + 2 * ncuts;
    size_t len = size - 1 - 2 * ncuts;

    std::vector<size_t> cuts;
    for (size_t i = 0; i < ncuts; i++) {
        size_t at = size_t(data[1 + 2 * i]) << 8 | data[2 + 2 * i];
        cuts.push_back(at % (len + 1));
    }
    std::sort(cuts.begin(), cuts.end());

    Result whole = scan(format, body, len, {});
    Result split = scan(format, body, len, cuts);

    CHECK(whole.status == split.status);
    CHECK(whole.reason == split.reason);
    CHECK(whole.id == split.id);
    CHECK(whole.object == split.object);

    CHECK(usage(body, len, {}) == usage(body, len, cuts));

    return 0;
}

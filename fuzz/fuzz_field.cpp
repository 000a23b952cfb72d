// fuzz_field: a session key field read from a request body.
//
// The input is "PATH\nBODY": a dotted path (as in "key field=PATH") and a
// body.  Paths the configuration parser refuses are skipped: empty, with an
// empty segment (a leading, trailing or doubled dot), or with a byte
// outside 0x21..0x7e.  The path and the body are each copied into a heap
// block of their exact size (the body with AFFINITY_JSON_PADDING zeroed
// bytes after it), so that AddressSanitizer reports any read past them.
//
// The field is read into heap blocks of exactly 1024 bytes (the module's
// buffer) and of 7 bytes.  Checked:
//
//   - a load that failed makes both reads INVALID; one that succeeded
//     makes neither INVALID;
//   - FOUND has 1 <= out_len <= out_cap (a write past out_cap is caught by
//     AddressSanitizer);
//   - the two capacities agree: a value found in 1024 bytes is found in 7
//     exactly when it is at most 7 bytes long, with the same bytes; a value
//     found in 7 bytes is found in 1024; MISSING in 1024 is MISSING in 7;
//   - a read does not change the body: reading again gives the same;
//   - after unload the read is INVALID, and after affinity_json_shrink()
//     too (called for half the bodies, so the others reuse the buffers);
//     a second shrink frees nothing.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "affinity_core.h"

namespace {

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond)) {                                                      \
            __builtin_printf("fuzz_field: check failed: %s (line %d)\n",    \
                             #cond, __LINE__);                              \
            __builtin_trap();                                               \
        }                                                                   \
    } while (0)

constexpr size_t kBigCap = 1024;
constexpr size_t kSmallCap = 7;

affinity_json_t *reader;
char *big;      // kBigCap bytes on the heap
char *small;    // kSmallCap bytes on the heap

// As the configuration parser checks "field=PATH".
bool valid_path(const uint8_t *p, size_t len)
{
    if (len == 0) {
        return false;
    }

    for (size_t i = 0; i < len; i++) {
        if (p[i] <= ' ' || p[i] >= 0x7f) {
            return false;
        }
        if (p[i] == '.' && (i == 0 || i == len - 1 || p[i - 1] == '.')) {
            return false;
        }
    }

    return true;
}

struct Read {
    affinity_field_e rc;
    size_t len;
};

Read read(const char *path, size_t path_len, char *out, size_t cap)
{
    Read r{AFFINITY_FIELD_INVALID, 12345};

    r.rc = affinity_json_field(reader, path, path_len, out, cap, &r.len);
    CHECK(r.rc == AFFINITY_FIELD_FOUND || r.rc == AFFINITY_FIELD_MISSING
          || r.rc == AFFINITY_FIELD_INVALID);
    if (r.rc == AFFINITY_FIELD_FOUND) {
        CHECK(r.len >= 1 && r.len <= cap);
    }
    return r;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***)
{
    reader = affinity_json_create(4096);
    big = static_cast<char *>(std::malloc(kBigCap));
    small = static_cast<char *>(std::malloc(kSmallCap));
    CHECK(reader != nullptr && big != nullptr && small != nullptr);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nl = static_cast<const uint8_t *>(
        std::memchr(data, '\n', size));

    if (nl == nullptr) {
        return 0;
    }

    size_t path_len = static_cast<size_t>(nl - data);
    size_t body_len = size - path_len - 1;

    if (!valid_path(data, path_len)) {
        return 0;
    }

    char *path = static_cast<char *>(std::malloc(path_len));
    char *body = static_cast<char *>(
        std::malloc(body_len + AFFINITY_JSON_PADDING));
    CHECK(path != nullptr && body != nullptr);
    std::memcpy(path, data, path_len);
    std::memset(body, 0, body_len + AFFINITY_JSON_PADDING);
    if (body_len) {
        std::memcpy(body, nl + 1, body_len);
    }

    bool loaded = affinity_json_load(reader, body, body_len) == 0;

    Read b = read(path, path_len, big, kBigCap);
    Read s = read(path, path_len, small, kSmallCap);

    if (!loaded) {
        CHECK(b.rc == AFFINITY_FIELD_INVALID);
        CHECK(s.rc == AFFINITY_FIELD_INVALID);

    } else {
        CHECK(b.rc != AFFINITY_FIELD_INVALID);
        CHECK(s.rc != AFFINITY_FIELD_INVALID);

        if (b.rc == AFFINITY_FIELD_FOUND && b.len <= kSmallCap) {
            CHECK(s.rc == AFFINITY_FIELD_FOUND);
            CHECK(s.len == b.len);
            CHECK(std::memcmp(small, big, b.len) == 0);
        } else {
            CHECK(s.rc == AFFINITY_FIELD_MISSING);
        }

        // Reading again gives the same value.
        char again[kBigCap];
        size_t again_len = 0;
        affinity_field_e rc = affinity_json_field(reader, path, path_len,
                                                  again, kBigCap, &again_len);
        CHECK(rc == b.rc);
        if (rc == AFFINITY_FIELD_FOUND) {
            CHECK(again_len == b.len);
            CHECK(std::memcmp(again, big, b.len) == 0);
        }
    }

    affinity_json_unload(reader);
    CHECK(read(path, path_len, big, kBigCap).rc == AFFINITY_FIELD_INVALID);

    // The buffers kept for the next body, or freed: either way no read.
    if (body_len & 1) {
        affinity_json_shrink(reader);
        CHECK(affinity_json_shrink(reader) == 0);
        CHECK(read(path, path_len, big, kBigCap).rc
              == AFFINITY_FIELD_INVALID);
    }

    std::free(path);
    std::free(body);
    return 0;
}

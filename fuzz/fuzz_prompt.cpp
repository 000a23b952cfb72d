// fuzz_prompt: the input is a request body, read as the module reads it.
//
// The body is copied into a heap buffer of exactly len +
// AFFINITY_JSON_PADDING bytes, the padding zeroed (as the shim does), so
// that AddressSanitizer reports any read past the padding.  One reader,
// created once with a small retain, serves every input: bodies larger than
// the retain take the path that frees the parser's buffers on unload.
//
// One load serves many reads, as in a request: the prompt levels under
// three schedules, and the session key fields.  Checked:
//
//   - a load that failed makes every read INVALID (and nout 0);
//   - a load that succeeded makes no field read INVALID;
//   - prompt: nout <= out_cap; OK implies nout >= 1, anything else nout 0;
//     the levels are the schedule's first nout lengths, in order (so
//     strictly increasing), except that a text shorter than the first
//     scheduled length gives one level of its own length (1 ..
//     schedule[0] - 1); reserved is 0;
//   - an output array too small for every level gets the first levels,
//     and the same result code;
//   - two schedules that share a length give that length the same hash
//     (the hash of a prefix does not depend on the other lengths);
//   - a field FOUND has 1 <= out_len <= out_cap (the output buffer is a
//     heap block of exactly out_cap bytes: a longer write is reported);
//   - after unload every read is INVALID;
//   - the same body loaded again, from another buffer at another
//     alignment, gives the same results and the same levels.
//
// A violation aborts through __builtin_trap(), which libFuzzer reports as
// a crash with the input saved.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "affinity_core.h"

namespace {

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond)) {                                                      \
            __builtin_printf("fuzz_prompt: check failed: %s (line %d)\n",   \
                             #cond, __LINE__);                              \
            __builtin_trap();                                               \
        }                                                                   \
    } while (0)

struct Schedule {
    uint32_t lengths[AFFINITY_MAX_LEVELS];
    size_t n;
};

affinity_json_t *reader;

Schedule coarse;    // 100, 500, 1000
Schedule dense;     // every 7 code points up to 700
Schedule module;    // the module's default levels

const char *const kFields[] = {"user", "metadata.session_id",
                               "prompt_cache_key"};
constexpr size_t kNumFields = sizeof(kFields) / sizeof(kFields[0]);
constexpr size_t kFieldCap = 1024;  // the module's field buffer

char *field_out;    // kFieldCap bytes on the heap

struct Result {
    affinity_prompt_e rc[3];
    size_t nout[3];
    affinity_level_t levels[3][AFFINITY_MAX_LEVELS];
    affinity_field_e field[kNumFields];
    size_t field_len[kNumFields];
    char field_value[kNumFields][kFieldCap];
};

void check_levels(const Schedule &s, affinity_prompt_e rc,
                  const affinity_level_t *levels, size_t nout, size_t cap)
{
    CHECK(nout <= cap);

    if (rc != AFFINITY_PROMPT_OK) {
        CHECK(nout == 0);
        return;
    }

    CHECK(nout >= 1);

    if (nout == 1 && levels[0].length != s.lengths[0]) {
        // A text shorter than the first level: one level of its length.
        CHECK(levels[0].length >= 1 && levels[0].length < s.lengths[0]);
        CHECK(levels[0].reserved == 0);
        return;
    }

    for (size_t i = 0; i < nout; i++) {
        CHECK(levels[i].length == s.lengths[i]);
        CHECK(levels[i].reserved == 0);
        CHECK(i == 0 || levels[i].length > levels[i - 1].length);
    }
}

// The prompt under one schedule, in a full output array and in one of
// two levels (to be filled as the first two of the full one).
affinity_prompt_e prompt(const Schedule &s, affinity_level_t *out,
                         size_t *nout)
{
    affinity_level_t small[2];
    size_t nsmall = 12345;

    *nout = 12345;      // must be overwritten
    affinity_prompt_e rc = affinity_json_prompt(reader, s.lengths, s.n, out,
                                                AFFINITY_MAX_LEVELS, nout);
    CHECK(rc == AFFINITY_PROMPT_OK || rc == AFFINITY_PROMPT_NONE
          || rc == AFFINITY_PROMPT_INVALID);
    check_levels(s, rc, out, *nout, AFFINITY_MAX_LEVELS);

    affinity_prompt_e rc2 = affinity_json_prompt(reader, s.lengths, s.n,
                                                 small, 2, &nsmall);
    CHECK(rc2 == rc);
    check_levels(s, rc2, small, nsmall, 2);
    CHECK(nsmall == (*nout < 2 ? *nout : 2));
    for (size_t i = 0; i < nsmall; i++) {
        CHECK(small[i].length == out[i].length);
        CHECK(small[i].hash == out[i].hash);
    }

    return rc;
}

// Levels of equal length under two schedules hash alike.
void check_shared(const affinity_level_t *a, size_t na,
                  const affinity_level_t *b, size_t nb)
{
    for (size_t i = 0; i < na; i++) {
        for (size_t k = 0; k < nb; k++) {
            if (a[i].length == b[k].length) {
                CHECK(a[i].hash == b[k].hash);
            }
        }
    }
}

void read_all(bool loaded, Result &r)
{
    const Schedule *schedules[3] = {&coarse, &dense, &module};

    for (size_t i = 0; i < 3; i++) {
        r.rc[i] = prompt(*schedules[i], r.levels[i], &r.nout[i]);
        if (!loaded) {
            CHECK(r.rc[i] == AFFINITY_PROMPT_INVALID);
        }
    }

    if (r.rc[0] == AFFINITY_PROMPT_OK && r.rc[2] == AFFINITY_PROMPT_OK) {
        check_shared(r.levels[0], r.nout[0], r.levels[2], r.nout[2]);
    }
    if (r.rc[0] == AFFINITY_PROMPT_OK && r.rc[1] == AFFINITY_PROMPT_OK) {
        check_shared(r.levels[0], r.nout[0], r.levels[1], r.nout[1]);
    }

    for (size_t i = 0; i < kNumFields; i++) {
        size_t len = 12345;

        r.field[i] = affinity_json_field(reader, kFields[i],
                                         std::strlen(kFields[i]), field_out,
                                         kFieldCap, &len);
        r.field_len[i] = 0;

        if (!loaded) {
            CHECK(r.field[i] == AFFINITY_FIELD_INVALID);
            continue;
        }

        CHECK(r.field[i] == AFFINITY_FIELD_FOUND
              || r.field[i] == AFFINITY_FIELD_MISSING);

        if (r.field[i] == AFFINITY_FIELD_FOUND) {
            CHECK(len >= 1 && len <= kFieldCap);
            r.field_len[i] = len;
            std::memcpy(r.field_value[i], field_out, len);
        }
    }
}

void check_unloaded()
{
    affinity_level_t out[AFFINITY_MAX_LEVELS];
    size_t nout = 12345;
    size_t len;

    CHECK(affinity_json_prompt(reader, module.lengths, module.n, out,
                               AFFINITY_MAX_LEVELS, &nout)
          == AFFINITY_PROMPT_INVALID);
    CHECK(nout == 0);
    CHECK(affinity_json_field(reader, "user", 4, field_out, kFieldCap, &len)
          == AFFINITY_FIELD_INVALID);
}

// The body in a heap block of exactly len + padding bytes, the body at
// offset `shift` of a block that many bytes larger (another alignment).
char *copy_body(const uint8_t *data, size_t len, size_t shift, char **block)
{
    *block = static_cast<char *>(
        std::malloc(shift + len + AFFINITY_JSON_PADDING));
    CHECK(*block != nullptr);
    std::memset(*block, 0, shift + len + AFFINITY_JSON_PADDING);
    if (len) {
        std::memcpy(*block + shift, data, len);
    }
    return *block + shift;
}

Result first, second;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***)
{
    static const uint32_t given[] = {100, 500, 1000};

    reader = affinity_json_create(4096);
    CHECK(reader != nullptr);

    field_out = static_cast<char *>(std::malloc(kFieldCap));
    CHECK(field_out != nullptr);

    coarse.n = affinity_level_schedule(given, 3, 0, 0, 0, coarse.lengths,
                                       AFFINITY_MAX_LEVELS);
    CHECK(coarse.n == 3);

    dense.n = 0;
    for (uint32_t l = 7; l <= 700; l += 7) {
        dense.lengths[dense.n++] = l;
    }

    // The module's default: prefix_levels 100 500 1000, step 256,
    // growth 6 (percent), max 32768.
    module.n = affinity_level_schedule(given, 3, 256, 6, 32768,
                                       module.lengths, AFFINITY_MAX_LEVELS);
    CHECK(module.n > 3 && module.n <= AFFINITY_MAX_LEVELS);
    for (size_t i = 1; i < module.n; i++) {
        CHECK(module.lengths[i] > module.lengths[i - 1]);
    }
    CHECK(module.lengths[module.n - 1] <= 32768);

    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *block;
    char *body = copy_body(data, size, 0, &block);

    bool loaded = affinity_json_load(reader, body, size) == 0;
    read_all(loaded, first);
    affinity_json_unload(reader);
    check_unloaded();
    std::free(block);

    // Again, from a copy at an odd address.
    body = copy_body(data, size, 1, &block);

    bool again = affinity_json_load(reader, body, size) == 0;
    CHECK(again == loaded);
    read_all(again, second);
    affinity_json_unload(reader);
    std::free(block);

    for (size_t i = 0; i < 3; i++) {
        CHECK(first.rc[i] == second.rc[i]);
        CHECK(first.nout[i] == second.nout[i]);
        for (size_t k = 0; k < first.nout[i]; k++) {
            CHECK(first.levels[i][k].length == second.levels[i][k].length);
            CHECK(first.levels[i][k].hash == second.levels[i][k].hash);
        }
    }

    for (size_t i = 0; i < kNumFields; i++) {
        CHECK(first.field[i] == second.field[i]);
        CHECK(first.field_len[i] == second.field_len[i]);
        CHECK(std::memcmp(first.field_value[i], second.field_value[i],
                          first.field_len[i]) == 0);
    }

    return 0;
}

// fuzz_prompt: the input is a request body, read as the module reads it.
//
// The body is copied into a heap buffer of exactly len +
// AFFINITY_JSON_PADDING bytes, the padding zeroed (as the shim does), so
// that AddressSanitizer reports any read past the padding.  One reader,
// created once with a small retain (4096), serves every input: the buffers
// one body grew are reused by the next load, then freed by
// affinity_json_shrink() when they grew past the retain.
//
// One load serves many reads, as in a request: the prompt levels under
// three schedules, and the session key fields.  Checked:
//
//   - a load that failed makes every read INVALID (and nout 0);
//   - a load that succeeded makes no field read INVALID;
//   - prompt: nout <= out_cap; OK implies nout >= 1, anything else nout 0;
//     the levels are in order of length (strictly increasing); the
//     scheduled ones (turn 0) are the schedule's first lengths, except
//     that a text shorter than the first scheduled length gives one level
//     of its own length (1 .. schedule[0] - 1), the longest; turn levels
//     (turn 1, at messages' ends: the schedules ask for 8, 16 and 8) are
//     no more than asked for, and each is shorter than the next scheduled
//     length (none at or past the last);
//   - an output array of two gets the full array's first scheduled
//     levels, then its most recent turn levels (same length, hash and
//     kind), in order of length, and the same result code;
//   - two schedules that share a length give that length the same hash
//     (the hash of a prefix does not depend on the other lengths);
//   - a field FOUND has 1 <= out_len <= out_cap (the output buffer is a
//     heap block of exactly out_cap bytes: a longer write is reported);
//   - after unload every read is INVALID;
//   - affinity_json_shrink() after a body longer than the retain frees
//     something (returns 1); a second shrink has nothing left to free;
//   - the same body loaded again, from another buffer at another
//     alignment, gives the same results and the same levels;
//   - a body that loads, written again in another JSON encoding of the
//     same value (whitespace after every structural character, string
//     characters escaped at random: \u00XX, \/, \uXXXX and surrogate
//     pairs for non-ASCII), loads too and gives the same results and the
//     same levels: the canonical prompt text does not depend on the
//     client's escapes and whitespace (prompt_walk.h, README).
//
// A violation aborts through __builtin_trap(), which libFuzzer reports as
// a crash with the input saved.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

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
    size_t turns;       // turn levels asked for
};

constexpr size_t kRetain = 4096;
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

    size_t scheduled = 0;
    size_t turns = 0;

    for (size_t i = 0; i < nout; i++) {
        const affinity_level_t &l = levels[i];

        CHECK(l.length >= 1);
        CHECK(i == 0 || l.length > levels[i - 1].length);
        CHECK(l.turn <= 1);

        if (l.turn) {
            // Before the next scheduled length: the text had not reached
            // it (a scheduled level is never cut off while turn levels
            // are kept).
            CHECK(scheduled < s.n && l.length < s.lengths[scheduled]);
            turns++;
            continue;
        }

        if (l.length != s.lengths[scheduled]) {
            // A text shorter than the first level: one level of its
            // length, the longest.
            CHECK(scheduled == 0 && l.length < s.lengths[0]);
            CHECK(i == nout - 1);
        }
        scheduled++;
    }

    CHECK(scheduled >= 1);
    CHECK(turns <= s.turns);
}

// The prompt under one schedule, in a full output array and in one of
// two levels (to be filled as the first two of the full one).
affinity_prompt_e prompt(const Schedule &s, affinity_level_t *out,
                         size_t *nout)
{
    affinity_level_t small[2];
    size_t nsmall = 12345;

    *nout = 12345;      // must be overwritten
    affinity_prompt_e rc = affinity_json_prompt(reader, s.lengths, s.n,
                                                s.turns, out,
                                                AFFINITY_MAX_LEVELS, nout);
    CHECK(rc == AFFINITY_PROMPT_OK || rc == AFFINITY_PROMPT_NONE
          || rc == AFFINITY_PROMPT_INVALID);
    check_levels(s, rc, out, *nout, AFFINITY_MAX_LEVELS);

    affinity_prompt_e rc2 = affinity_json_prompt(reader, s.lengths, s.n,
                                                 s.turns, small, 2, &nsmall);
    CHECK(rc2 == rc);
    check_levels(s, rc2, small, nsmall, 2);
    CHECK(nsmall == (*nout < 2 ? *nout : 2));
    if (rc == AFFINITY_PROMPT_OK) {
        // What the small array should hold: the full array's first
        // scheduled levels, then its most recent turn levels, in order.
        affinity_level_t expect[2];
        size_t nexpect = 0;

        for (size_t k = 0; k < *nout && nexpect < 2; k++) {
            if (!out[k].turn) {
                expect[nexpect++] = out[k];
            }
        }
        for (size_t k = *nout; k-- > 0 && nexpect < 2;) {
            if (out[k].turn) {
                expect[nexpect++] = out[k];
            }
        }
        if (nexpect == 2 && expect[0].length > expect[1].length) {
            affinity_level_t t = expect[0];
            expect[0] = expect[1];
            expect[1] = t;
        }

        CHECK(nexpect == nsmall);
        for (size_t i = 0; i < nsmall; i++) {
            CHECK(small[i].length == expect[i].length);
            CHECK(small[i].hash == expect[i].hash);
            CHECK(small[i].turn == expect[i].turn);
        }
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

    CHECK(affinity_json_prompt(reader, module.lengths, module.n,
                               module.turns, out, AFFINITY_MAX_LEVELS, &nout)
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

// A small deterministic generator: the choices of a re-encoding depend on
// the input only, so that a failure reproduces.
struct Choices {
    uint64_t state;

    unsigned next(unsigned range)
    {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        return static_cast<unsigned>(state % range);
    }
};

void put_hex4(std::string &out, unsigned v, Choices &c)
{
    static const char lower[] = "0123456789abcdef";
    static const char upper[] = "0123456789ABCDEF";

    out += "\\u";
    for (int shift = 12; shift >= 0; shift -= 4) {
        out += (c.next(2) ? upper : lower)[(v >> shift) & 0xf];
    }
}

// The same JSON value as p[0..n) (which the parser accepted, so it is
// valid JSON and UTF-8) in another encoding.
std::string reencode(const uint8_t *p, size_t n)
{
    static const char spaces[] = " \t\n\r";
    Choices c{0x9e3779b97f4a7c15ULL ^ n};
    std::string out;
    bool in_string = false;

    for (size_t i = 0; i < n; i++) {
        c.state += p[i];
    }
    if (c.state == 0) {
        c.state = 1;
    }

    for (size_t i = 0; i < n; i++) {
        uint8_t b = p[i];

        if (!in_string) {
            out += static_cast<char>(b);
            if (b == '"') {
                in_string = true;
            } else if (b == '{' || b == '}' || b == '[' || b == ']'
                       || b == ',' || b == ':')
            {
                out += spaces[c.next(4)];
            }
            continue;
        }

        if (b == '"') {
            out += '"';
            in_string = false;

        } else if (b == '\\') {
            // An escape of the client's: kept as it is (\uXXXX whole).
            size_t len = (i + 1 < n && p[i + 1] == 'u') ? 6 : 2;
            out.append(reinterpret_cast<const char *>(p + i),
                       i + len <= n ? len : n - i);
            i += len - 1;

        } else if (b < 0x80) {
            unsigned how = c.next(4);
            if (how == 0) {
                put_hex4(out, b, c);
            } else if (how == 1 && b == '/') {
                out += "\\/";
            } else {
                out += static_cast<char>(b);
            }

        } else {
            // A UTF-8 sequence: kept, or escaped (a surrogate pair past
            // the BMP).
            size_t len = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : 2;
            if (i + len > n || c.next(2)) {
                out.append(reinterpret_cast<const char *>(p + i),
                           i + len <= n ? len : n - i);
                i += len - 1;
                continue;
            }
            unsigned cp = b & (len == 2 ? 0x1f : len == 3 ? 0x0f : 0x07);
            for (size_t k = 1; k < len; k++) {
                cp = (cp << 6) | (p[i + k] & 0x3f);
            }
            if (cp >= 0x10000) {
                cp -= 0x10000;
                put_hex4(out, 0xd800 + (cp >> 10), c);
                put_hex4(out, 0xdc00 + (cp & 0x3ff), c);
            } else {
                put_hex4(out, cp, c);
            }
            i += len - 1;
        }
    }

    return out;
}

void check_same(const Result &a, const Result &b)
{
    for (size_t i = 0; i < 3; i++) {
        CHECK(a.rc[i] == b.rc[i]);
        CHECK(a.nout[i] == b.nout[i]);
        for (size_t k = 0; k < a.nout[i]; k++) {
            CHECK(a.levels[i][k].length == b.levels[i][k].length);
            CHECK(a.levels[i][k].hash == b.levels[i][k].hash);
        }
    }

    for (size_t i = 0; i < kNumFields; i++) {
        CHECK(a.field[i] == b.field[i]);
        CHECK(a.field_len[i] == b.field_len[i]);
        CHECK(std::memcmp(a.field_value[i], b.field_value[i],
                          a.field_len[i]) == 0);
    }
}

Result first, second, third;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***)
{
    static const uint32_t given[] = {100, 500, 1000};

    reader = affinity_json_create(kRetain);
    CHECK(reader != nullptr);

    field_out = static_cast<char *>(std::malloc(kFieldCap));
    CHECK(field_out != nullptr);

    coarse.n = affinity_level_schedule(given, 3, 0, 0, 0, coarse.lengths,
                                       AFFINITY_MAX_LEVELS);
    CHECK(coarse.n == 3);
    coarse.turns = 8;

    dense.n = 0;
    for (uint32_t l = 7; l <= 700; l += 7) {
        dense.lengths[dense.n++] = l;
    }
    dense.turns = AFFINITY_TURNS_MAX;     // the ring wraps

    // The module's default: lengths=100,500,1000, step 256,
    // growth 6 (percent), max 32768.
    module.n = affinity_level_schedule(given, 3, 256, 6, 32768,
                                       module.lengths, AFFINITY_MAX_LEVELS);
    CHECK(module.n > 3 && module.n <= AFFINITY_MAX_LEVELS);
    for (size_t i = 1; i < module.n; i++) {
        CHECK(module.lengths[i] > module.lengths[i - 1]);
    }
    CHECK(module.lengths[module.n - 1] <= 32768);
    module.turns = 8;       // and turns=8

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

    // Again, from a copy at an odd address, in the buffers the first load
    // grew; then they are freed if they grew past the retain.
    body = copy_body(data, size, 1, &block);

    bool again = affinity_json_load(reader, body, size) == 0;
    CHECK(again == loaded);
    read_all(again, second);
    affinity_json_unload(reader);
    std::free(block);

    int freed = affinity_json_shrink(reader);
    CHECK(freed == 0 || freed == 1);
    if (size > kRetain) {
        CHECK(freed == 1);
    }
    CHECK(affinity_json_shrink(reader) == 0);
    check_unloaded();

    check_same(first, second);

    if (!loaded) {
        return 0;
    }

    // The same value in another encoding.
    std::string other = reencode(data, size);
    body = copy_body(reinterpret_cast<const uint8_t *>(other.data()),
                     other.size(), 0, &block);

    bool reloaded = affinity_json_load(reader, body, other.size()) == 0;
    if (!reloaded) {
        __builtin_printf("fuzz_prompt: re-encoded body refused: %.*s\n",
                         static_cast<int>(other.size() < 2000
                                          ? other.size() : 2000),
                         other.data());
    }
    CHECK(reloaded);
    read_all(true, third);
    affinity_json_unload(reader);
    std::free(block);
    affinity_json_shrink(reader);

    check_same(first, third);

    return 0;
}

#include "level_hasher.h"

#include <algorithm>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace affinity {

namespace {

// Fixed: a prefix hashes alike in every nginx instance, so that several
// instances place a cold prompt on the same peer.
constexpr uint64_t kPrefixSeed = 0x70726566'69783031ULL;    // "prefix01"

constexpr char kUnitSep = '\x1f';
constexpr char kRecordSep = '\x1e';
constexpr char kGroupSep = '\x1d';

// Code points in UTF-8 text: one starts at every byte but the continuation
// bytes (10xxxxxx, -128..-65 as signed chars).  Prompts are long, so both
// scans below take 32 bytes at a time with AVX2 when the build has it, 8
// with a word trick otherwise: a mask of the bytes that start a code point.

inline bool starts_code_point(char c) noexcept
{
    return static_cast<signed char>(c) > -65;
}

// Bits 7 of the bytes of w that start a code point.
inline uint64_t start_bits(uint64_t w) noexcept
{
    return ~(w & ~(w << 1)) & 0x8080808080808080ULL;
}

#if defined(__AVX2__)
inline uint32_t start_mask32(const char *p) noexcept
{
    __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p));
    __m256i starts = _mm256_cmpgt_epi8(bytes, _mm256_set1_epi8(-65));
    return static_cast<uint32_t>(_mm256_movemask_epi8(starts));
}
#endif

size_t count_code_points(const char *p, size_t n) noexcept
{
    size_t count = 0;
    size_t i = 0;

#if defined(__AVX2__)
    for (; i + 32 <= n; i += 32) {
        count += static_cast<size_t>(__builtin_popcount(start_mask32(p + i)));
    }
#endif

    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        std::memcpy(&w, p + i, sizeof(w));
        count += static_cast<size_t>(__builtin_popcountll(start_bits(w)));
    }

    for (; i < n; i++) {
        count += starts_code_point(p[i]);
    }

    return count;
}

// The byte offset where the first `need` code points of p[0..n) end: the
// start of code point need + 1 (p holds more than need code points).
size_t code_point_offset(const char *p, size_t n, uint64_t need) noexcept
{
    uint64_t seen = 0;
    size_t i = 0;

#if defined(__AVX2__)
    for (; i + 32 <= n; i += 32) {
        uint32_t mask = start_mask32(p + i);
        uint64_t c = static_cast<uint64_t>(__builtin_popcount(mask));

        if (seen + c > need) {
            // Skip the `need - seen` starts before the one we look for.
            for (uint64_t k = need - seen; k > 0; k--) {
                mask &= mask - 1;
            }
            return i + static_cast<size_t>(__builtin_ctz(mask));
        }
        seen += c;
    }
#endif

    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        std::memcpy(&w, p + i, sizeof(w));
        uint64_t c = static_cast<uint64_t>(__builtin_popcountll(start_bits(w)));

        if (seen + c > need) {
            break;
        }
        seen += c;
    }

    for (; i < n; i++) {
        if (starts_code_point(p[i])) {
            if (seen == need) {
                break;
            }
            seen++;
        }
    }

    return i;
}

}  // namespace

LevelHasher::LevelHasher(const uint32_t *schedule, size_t nschedule,
                         affinity_level_t *out, size_t out_cap) noexcept
    : schedule_(schedule), nschedule_(nschedule), out_(out), out_cap_(out_cap)
{
    XXH3_INITSTATE(&state_);
    XXH3_64bits_reset_withSeed(&state_, kPrefixSeed);
}

void LevelHasher::emit(uint32_t length) noexcept
{
    if (nout_ < out_cap_) {
        out_[nout_++] = {length, 0, XXH3_64bits_digest(&state_)};
    }
}

bool LevelHasher::append(std::string_view text) noexcept
{
    const char *p = text.data();
    size_t n = text.size();
    uint64_t count = n ? count_code_points(p, n) : 0;

    while (n > 0 && !done()) {
        uint64_t need = schedule_[next_] - code_points_;

        if (count < need) {
            XXH3_64bits_update(&state_, p, n);
            code_points_ += count;
            return true;
        }

        // A level ends inside this text; in ASCII, after `need` bytes.
        size_t end = count == n ? need : code_point_offset(p, n, need);

        XXH3_64bits_update(&state_, p, end);
        code_points_ += need;
        emit(schedule_[next_]);
        next_++;

        p += end;
        n -= end;
        count -= need;
    }

    return !done();
}

size_t LevelHasher::finish() noexcept
{
    if (nout_ == 0 && code_points_ > 0) {
        emit(static_cast<uint32_t>(
            std::min<uint64_t>(code_points_, UINT32_MAX)));
    }

    return nout_;
}


size_t level_schedule(const uint32_t *lengths, size_t nlengths, uint32_t step,
                      uint32_t growth_percent, uint32_t max, uint32_t *out,
                      size_t out_cap) noexcept
{
    size_t n = 0;
    uint32_t last = 0;

    // The given lengths, sorted and without duplicates (insertion: a few).
    for (size_t i = 0; i < nlengths; i++) {
        uint32_t length = lengths[i];
        if (length == 0) {
            continue;
        }
        size_t at = 0;
        while (at < n && out[at] < length) {
            at++;
        }
        if ((at < n && out[at] == length) || at == out_cap) {
            continue;
        }
        if (n == out_cap) {
            n--;        // full: the longest given length makes room
        }
        for (size_t k = n; k > at; k--) {
            out[k] = out[k - 1];
        }
        out[at] = length;
        n++;
    }

    if (n > 0) {
        last = out[n - 1];
    }

    if (step == 0) {
        return n;
    }

    while (n < out_cap) {
        uint64_t gap = std::max<uint64_t>(
            step, uint64_t{last} * growth_percent / 100);
        uint64_t next = uint64_t{last} + gap;

        if (next > max) {
            break;
        }

        last = static_cast<uint32_t>(next);
        out[n++] = last;
    }

    return n;
}

}  // namespace affinity

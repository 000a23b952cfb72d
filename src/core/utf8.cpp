#include "utf8.h"

#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace affinity {

namespace {

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

}  // namespace

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

}  // namespace affinity

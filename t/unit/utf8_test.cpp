// Code point counting (src/core/utf8.h) against a byte-at-a-time
// reference, over texts whose lengths and alignments reach every path:
// 32-byte blocks (AVX2 builds), 8-byte words and the tail.

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "utf8.h"

namespace {

using affinity::code_point_offset;
using affinity::count_code_points;

bool starts_code_point(unsigned char c)
{
    return (c & 0xc0) != 0x80;
}

size_t reference_count(const char *p, size_t n)
{
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        count += starts_code_point(static_cast<unsigned char>(p[i]));
    }
    return count;
}

size_t reference_offset(const char *p, size_t n, uint64_t need)
{
    uint64_t seen = 0;
    for (size_t i = 0; i < n; i++) {
        if (starts_code_point(static_cast<unsigned char>(p[i]))) {
            if (seen == need) {
                return i;
            }
            seen++;
        }
    }
    return n;
}

// Valid UTF-8 of 1- to 4-byte code points, drawn at random.
std::string random_utf8(std::mt19937 &rng, size_t code_points)
{
    static const char *const kSamples[] = {
        "a", "Z", " ", "\n", "\xc3\xa9", "\xd0\x96", "\xe2\x82\xac",
        "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "\xf0\x90\x8d\x88",
    };
    std::uniform_int_distribution<size_t> pick(0, std::size(kSamples) - 1);
    std::string s;
    for (size_t i = 0; i < code_points; i++) {
        s += kSamples[pick(rng)];
    }
    return s;
}

TEST(Utf8, CountsAsTheReferenceAtEveryLengthAndAlignment)
{
    std::mt19937 rng(7);

    for (size_t points = 0; points < 160; points++) {
        std::string text = random_utf8(rng, points);
        for (size_t shift = 0; shift < 8; shift++) {
            std::string buf = std::string(shift, 'x') + text;
            const char *p = buf.data() + shift;
            ASSERT_EQ(count_code_points(p, text.size()), points)
                << "points " << points << " shift " << shift;
            ASSERT_EQ(count_code_points(p, text.size()),
                      reference_count(p, text.size()));
        }
    }
}

TEST(Utf8, CountsCutTextAsTheReference)
{
    // A text cut inside a code point: continuation bytes count nothing.
    std::mt19937 rng(11);
    std::string text = random_utf8(rng, 300);

    for (size_t n = 0; n <= text.size(); n++) {
        ASSERT_EQ(count_code_points(text.data(), n),
                  reference_count(text.data(), n))
            << "n " << n;
    }
}

TEST(Utf8, OffsetEndsTheFirstCodePoints)
{
    std::mt19937 rng(13);
    std::string text = random_utf8(rng, 200);
    size_t total = count_code_points(text.data(), text.size());

    for (uint64_t need = 0; need < total; need++) {
        size_t off = code_point_offset(text.data(), text.size(), need);
        ASSERT_EQ(off, reference_offset(text.data(), text.size(), need))
            << "need " << need;
        ASSERT_EQ(count_code_points(text.data(), off), need);
        ASSERT_TRUE(starts_code_point(static_cast<unsigned char>(text[off])));
    }
}

TEST(Utf8, AsciiIsOneCodePointPerByte)
{
    std::string text(1000, 'q');
    EXPECT_EQ(count_code_points(text.data(), text.size()), 1000u);
    EXPECT_EQ(code_point_offset(text.data(), text.size(), 999), 999u);
}

}  // namespace

// Session keys: which keys may be echoed, and generated UUIDs.
#include <cctype>
#include <cstring>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "affinity_core.h"

namespace {

bool echoable(const std::string &s)
{
    return affinity_key_echoable(s.data(), s.size()) != 0;
}

TEST(KeyEchoable, AcceptsOrdinaryKeys)
{
    EXPECT_TRUE(echoable("123e4567-e89b-42d3-a456-426614174000"));
    EXPECT_TRUE(echoable("abc-123_X.y"));
    EXPECT_TRUE(echoable("a"));
    EXPECT_TRUE(echoable("user:42/conv=7"));
    EXPECT_TRUE(echoable("~!@#$%^&*()+={}[]|:<>?"));
}

TEST(KeyEchoable, AcceptsEveryCookieOctet)
{
    // RFC 6265 cookie-octet: printable ASCII but '"', ',', ';' and '\\'.
    for (int c = 0x21; c < 0x7f; c++) {
        std::string key = "k" + std::string(1, char(c)) + "k";
        bool expected = c != ';' && c != ',' && c != '"' && c != '\\';
        EXPECT_EQ(echoable(key), expected) << "character 0x" << std::hex << c;
    }
}

TEST(KeyEchoable, RejectsEmptyAndTooLong)
{
    EXPECT_FALSE(echoable(""));
    EXPECT_EQ(affinity_key_echoable(nullptr, 0), 0);

    EXPECT_TRUE(echoable(std::string(AFFINITY_KEY_MAX_ECHO, 'a')));
    EXPECT_TRUE(echoable(std::string(256, 'z')));
    EXPECT_FALSE(echoable(std::string(257, 'a')));
    EXPECT_FALSE(echoable(std::string(10000, 'a')));
}

TEST(KeyEchoable, RejectsSeparatorsAndWhitespace)
{
    EXPECT_FALSE(echoable("abc def"));
    EXPECT_FALSE(echoable(" abc"));
    EXPECT_FALSE(echoable("abc "));
    EXPECT_FALSE(echoable("abc;def"));
    EXPECT_FALSE(echoable("abc,def"));
    EXPECT_FALSE(echoable(";"));
    EXPECT_FALSE(echoable(","));
    EXPECT_FALSE(echoable("a\tb"));
}

TEST(KeyEchoable, RejectsControlCharacters)
{
    for (int c = 0; c < 0x20; c++) {
        std::string key = "ab";
        key.insert(key.begin() + 1, char(c));
        EXPECT_FALSE(echoable(key)) << "control 0x" << std::hex << c;
    }
    EXPECT_FALSE(echoable("abc\r\nSet-Cookie: x=y"));
    EXPECT_FALSE(echoable(std::string("a\0b", 3)));
}

TEST(KeyEchoable, RejectsDelAndNonAscii)
{
    for (int c = 0x7f; c <= 0xff; c++) {
        std::string key = "ab";
        key.insert(key.begin() + 1, char(c));
        EXPECT_FALSE(echoable(key)) << "byte 0x" << std::hex << c;
    }
    EXPECT_FALSE(echoable("caf\xc3\xa9"));
}

TEST(KeyEchoable, NeverQuotesOrBackslashes)
{
    // A quote or backslash would end or escape a quoted cookie value.
    EXPECT_FALSE(echoable("a\"b"));
    EXPECT_FALSE(echoable("\"quoted\""));
    EXPECT_FALSE(echoable("a\\b"));
    EXPECT_FALSE(echoable("x=1\\\"; Secure"));
}

bool exposable(const std::string &s)
{
    return affinity_key_exposable(s.data(), s.size()) != 0;
}

TEST(KeyExposable, AcceptsAnythingButControlCharacters)
{
    EXPECT_TRUE(exposable("abc def; x=1, \"q\" \\"));
    EXPECT_TRUE(exposable("caf\xc3\xa9"));
    EXPECT_TRUE(exposable(std::string(10000, 'a')));
    for (int c = 0x20; c <= 0xff; c++) {
        EXPECT_EQ(exposable("a" + std::string(1, char(c)) + "b"), c != 0x7f)
            << "byte 0x" << std::hex << c;
    }
}

TEST(KeyExposable, RejectsControlCharactersAnywhere)
{
    EXPECT_FALSE(exposable(""));
    EXPECT_EQ(affinity_key_exposable(nullptr, 0), 0);
    for (int c = 0; c < 0x20; c++) {
        for (size_t at : {size_t{0}, size_t{2}, size_t{4}}) {
            std::string key = "abcd";
            key.insert(key.begin() + at, char(c));
            EXPECT_FALSE(exposable(key)) << "control 0x" << std::hex << c;
        }
    }
    EXPECT_FALSE(exposable("a\r\nSet-Cookie: x=1"));
    EXPECT_FALSE(exposable(std::string("a\0b", 3)));
}

TEST(KeyEchoable, OneBadByteAnywhereRejects)
{
    std::string good(256, 'x');
    ASSERT_TRUE(echoable(good));
    for (size_t i : {size_t{0}, size_t{1}, size_t{128}, size_t{255}}) {
        std::string bad = good;
        bad[i] = ';';
        EXPECT_FALSE(echoable(bad)) << i;
    }
}

TEST(KeyEchoable, LooksOnlyAtTheGivenLength)
{
    const char text[] = "abc;def";
    EXPECT_TRUE(affinity_key_echoable(text, 3));
    EXPECT_FALSE(affinity_key_echoable(text, 4));
}

std::string uuid()
{
    char out[AFFINITY_UUID_LEN + 8];
    std::memset(out, '#', sizeof(out));
    EXPECT_EQ(affinity_uuid_v4(out), 0);
    // Exactly 36 characters written, nothing past them.
    for (size_t i = AFFINITY_UUID_LEN; i < sizeof(out); i++) {
        EXPECT_EQ(out[i], '#') << "wrote byte " << i;
    }
    return std::string(out, AFFINITY_UUID_LEN);
}

TEST(UuidV4, HasTheCanonicalForm)
{
    for (int n = 0; n < 200; n++) {
        std::string u = uuid();
        ASSERT_EQ(u.size(), 36u);

        for (size_t i = 0; i < u.size(); i++) {
            if (i == 8 || i == 13 || i == 18 || i == 23) {
                EXPECT_EQ(u[i], '-') << u;
            } else {
                EXPECT_TRUE(std::isxdigit(static_cast<unsigned char>(u[i])))
                    << u;
                EXPECT_FALSE(std::isupper(static_cast<unsigned char>(u[i])))
                    << u;
            }
        }

        // Version 4, RFC 4122 variant.
        EXPECT_EQ(u[14], '4') << u;
        EXPECT_NE(std::string("89ab").find(u[19]), std::string::npos) << u;

        // A generated key can be echoed.
        EXPECT_TRUE(echoable(u)) << u;
    }
}

TEST(UuidV4, AreDistinct)
{
    std::set<std::string> seen;
    for (int n = 0; n < 1000; n++) {
        seen.insert(uuid());
    }
    EXPECT_EQ(seen.size(), 1000u);
}

TEST(UuidV4, RandomBitsAreUsed)
{
    // Every hex position outside the fixed version nibble takes several
    // values over many UUIDs (the variant position takes exactly 4).
    std::set<char> values[36];
    for (int n = 0; n < 500; n++) {
        std::string u = uuid();
        for (size_t i = 0; i < 36; i++) {
            values[i].insert(u[i]);
        }
    }
    for (size_t i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23 || i == 14) {
            EXPECT_EQ(values[i].size(), 1u) << i;
        } else if (i == 19) {
            EXPECT_EQ(values[i].size(), 4u);
        } else {
            EXPECT_GT(values[i].size(), 8u) << i;
        }
    }
}

}  // namespace

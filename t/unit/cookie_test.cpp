// Cookie header lines: finding a named cookie (RFC 6265, section 4.2).
#include <string>

#include <gtest/gtest.h>

#include "affinity_core.h"

namespace {

// The value of cookie name in line, or "<none>".
std::string cookie(const std::string &line, const std::string &name)
{
    const char *value = nullptr;
    size_t len = 0;

    if (!affinity_cookie_find(line.data(), line.size(), name.data(),
                              name.size(), &value, &len))
    {
        return "<none>";
    }

    EXPECT_GE(value, line.data());
    EXPECT_LE(value + len, line.data() + line.size());
    return std::string(value, len);
}

TEST(Cookie, FindsANamedCookie)
{
    EXPECT_EQ(cookie("sid=abc", "sid"), "abc");
    EXPECT_EQ(cookie("a=1; sid=abc; b=2", "sid"), "abc");
    EXPECT_EQ(cookie("a=1;sid=abc", "sid"), "abc");
    EXPECT_EQ(cookie("  sid = abc  ;x=y", "sid"), "abc");
    EXPECT_EQ(cookie("a=1;\tsid=abc\t", "sid"), "abc");
}

TEST(Cookie, FirstOfSeveralWins)
{
    EXPECT_EQ(cookie("sid=one; sid=two", "sid"), "one");
}

TEST(Cookie, NamesMatchExactly)
{
    EXPECT_EQ(cookie("xsid=1; sidx=2", "sid"), "<none>");
    EXPECT_EQ(cookie("SID=1", "sid"), "<none>");
    EXPECT_EQ(cookie("a=sid=1", "sid"), "<none>");
    EXPECT_EQ(cookie("sid", "sid"), "<none>");
    EXPECT_EQ(cookie("sid; sid=2", "sid"), "2");
}

TEST(Cookie, ValuesAsSent)
{
    EXPECT_EQ(cookie("sid=", "sid"), "");
    EXPECT_EQ(cookie("sid=\"quoted\"", "sid"), "\"quoted\"");
    EXPECT_EQ(cookie("sid=a=b", "sid"), "a=b");
    EXPECT_EQ(cookie("sid=a,b", "sid"), "a,b");
}

TEST(Cookie, EmptyInputs)
{
    EXPECT_EQ(cookie("", "sid"), "<none>");
    EXPECT_EQ(cookie(";;;", "sid"), "<none>");
    EXPECT_EQ(cookie("=1", ""), "<none>");
    EXPECT_EQ(affinity_cookie_find(nullptr, 0, "a", 1, nullptr, nullptr), 0);
}

}  // namespace

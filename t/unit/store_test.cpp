// What instances share through a store: messages (affinity_store_encode /
// decode) and applying them to a zone (affinity_sessions_pin,
// affinity_prefixes_record, affinity_prefixes_filled,
// affinity_responses_learn).
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_support.h"

using namespace affinity_test;

namespace {

std::string chat_body(const std::string &content)
{
    return "{\"model\":\"m\",\"messages\":[{\"role\":\"user\","
           "\"content\":\"" + content + "\"}]}";
}

std::vector<uint8_t> encode(const affinity_store_message_t &m)
{
    std::vector<uint8_t> out(AFFINITY_STORE_MESSAGE_MAX);
    size_t n = affinity_store_encode(&m, out.data(), out.size());
    out.resize(n);
    return out;
}

// A message of this kind, with no body yet, from a peer and an instance.
affinity_store_message_t from_peer(uint32_t kind)
{
    affinity_store_message_t m{};
    m.kind = kind;
    m.time = 1763900000;
    m.instance = 7;
    m.peer = 0xfedcba9876543210ULL;
    return m;
}

// bytes decoded, with m's header.
affinity_store_message_t decoded(const std::vector<uint8_t> &bytes,
                                 const affinity_store_message_t &m)
{
    affinity_store_message_t d;
    EXPECT_EQ(affinity_store_decode(bytes.data(), bytes.size(), &d, nullptr,
                                    0),
              0);
    EXPECT_EQ(d.kind, m.kind);
    EXPECT_EQ(d.time, m.time);
    EXPECT_EQ(d.instance, m.instance);
    EXPECT_EQ(d.peer, m.peer);
    return d;
}

TEST(StoreMessage, KeyedMessagesRoundTrip)
{
    for (uint32_t kind : {AFFINITY_STORE_PIN, AFFINITY_STORE_RESPONSE}) {
        std::string key = "resp_0123\x01\xff key";
        affinity_store_message_t m = from_peer(kind);
        m.instance = 0x0102030405060708ULL;
        m.key = key.data();
        m.key_len = key.size();

        std::vector<uint8_t> bytes = encode(m);
        ASSERT_EQ(bytes.size(), 24 + key.size());

        affinity_store_message_t d = decoded(bytes, m);
        EXPECT_EQ(std::string(d.key, d.key_len), key);
    }
}

TEST(StoreMessage, LevelsRoundTrip)
{
    std::vector<uint64_t> hashes;
    for (uint64_t i = 0; i < AFFINITY_MAX_LEVELS; i++) {
        hashes.push_back(i * 0x9e3779b97f4a7c15ULL);
    }
    affinity_store_message_t m{};
    m.kind = AFFINITY_STORE_LEVELS;
    m.peer = 7;
    m.levels = hashes.data();
    m.nlevels = hashes.size();

    std::vector<uint8_t> bytes = encode(m);
    ASSERT_EQ(bytes.size(), size_t(AFFINITY_STORE_MESSAGE_MAX));

    uint64_t levels[AFFINITY_MAX_LEVELS];
    affinity_store_message_t d;
    ASSERT_EQ(affinity_store_decode(bytes.data(), bytes.size(), &d, levels,
                                    AFFINITY_MAX_LEVELS),
              0);
    ASSERT_EQ(d.nlevels, hashes.size());
    EXPECT_EQ(std::vector<uint64_t>(d.levels, d.levels + d.nlevels), hashes);

    // A caller array too small for them refuses the message.
    EXPECT_EQ(affinity_store_decode(bytes.data(), bytes.size(), &d, levels,
                                    3),
              -1);
}

// A request sent, or ended: the header and the milliseconds past its
// second, below 1000, in 2 bytes and no other length.
TEST(StoreMessage, SentAndDoneRoundTripWithTheirMilliseconds)
{
    for (uint32_t news : {AFFINITY_STORE_SENT, AFFINITY_STORE_DONE}) {
        SCOPED_TRACE(news);
        affinity_store_message_t m = from_peer(news);
        m.msec = 999;
        std::vector<uint8_t> bytes = encode(m);
        ASSERT_EQ(bytes.size(), 26u);

        affinity_store_message_t d = decoded(bytes, m);
        EXPECT_EQ(d.msec, 999u);
        EXPECT_EQ(d.key_len, 0u);
        EXPECT_EQ(d.nlevels, 0u);

        m.msec = 1000;
        EXPECT_TRUE(encode(m).empty()) << "not a millisecond of a second";
        std::vector<uint8_t> late = bytes;
        late[24] = 1000 & 0xff;
        late[25] = 1000 >> 8;
        EXPECT_EQ(affinity_store_decode(late.data(), late.size(), &d, nullptr,
                                        0),
                  -1);

        // No body, or a longer one: not a message of this version.
        std::vector<uint8_t> none(bytes.begin(), bytes.begin() + 24);
        none[2] = 0;
        EXPECT_EQ(affinity_store_decode(none.data(), none.size(), &d, nullptr,
                                        0),
                  -1);
        std::vector<uint8_t> longer = bytes;
        longer.push_back(0);
        longer[2] = 3;
        EXPECT_EQ(affinity_store_decode(longer.data(), longer.size(), &d,
                                        nullptr, 0),
                  -1);
    }

    // No kind is without a body.
    for (uint32_t kind : {AFFINITY_STORE_PIN, AFFINITY_STORE_RESPONSE,
                          AFFINITY_STORE_LEVELS, AFFINITY_STORE_FILLED,
                          AFFINITY_STORE_SENT, AFFINITY_STORE_DONE})
    {
        std::vector<uint8_t> empty = encode(from_peer(AFFINITY_STORE_SENT));
        empty.resize(24);
        empty[1] = uint8_t(kind);
        empty[2] = 0;
        affinity_store_message_t d;
        EXPECT_EQ(affinity_store_decode(empty.data(), empty.size(), &d,
                                        nullptr, 0),
                  -1)
            << kind;
    }
}

// How far a prompt filled a peer's modelled cache: 4 bytes of characters,
// never 0, and no other length.
TEST(StoreMessage, FilledRoundTripsWithItsCharacters)
{
    affinity_store_message_t m = from_peer(AFFINITY_STORE_FILLED);
    m.chars = 0xfffffff0u;
    std::vector<uint8_t> bytes = encode(m);
    ASSERT_EQ(bytes.size(), 28u);

    affinity_store_message_t d = decoded(bytes, m);
    EXPECT_EQ(d.chars, m.chars);
    EXPECT_EQ(d.key_len, 0u);
    EXPECT_EQ(d.nlevels, 0u);

    m.chars = 0;
    EXPECT_TRUE(encode(m).empty()) << "nothing filled";

    std::vector<uint8_t> zero = bytes;
    std::memset(zero.data() + 24, 0, 4);
    EXPECT_EQ(affinity_store_decode(zero.data(), zero.size(), &d, nullptr, 0),
              -1);

    // Every other body length, declared and given.
    for (size_t body : {0, 1, 3, 5, 8}) {
        std::vector<uint8_t> other(bytes.begin(), bytes.begin() + 24);
        other.resize(24 + body, 0x11);
        other[2] = uint8_t(body);
        EXPECT_EQ(affinity_store_decode(other.data(), other.size(), &d,
                                        nullptr, 0),
                  -1)
            << body;
    }
}

TEST(StoreMessage, InvalidMessagesAreNotWritten)
{
    std::string key(AFFINITY_STORE_KEY_MAX + 1, 'k');
    affinity_store_message_t m{};
    m.kind = AFFINITY_STORE_PIN;
    m.peer = 1;
    m.key = key.data();
    m.key_len = key.size();
    EXPECT_TRUE(encode(m).empty()) << "key too long";

    m.key_len = 0;
    EXPECT_TRUE(encode(m).empty()) << "no key";

    m.key_len = 4;
    m.peer = 0;
    EXPECT_TRUE(encode(m).empty()) << "no peer";

    m.peer = 1;
    m.kind = 9;
    EXPECT_TRUE(encode(m).empty()) << "unknown kind";

    m.kind = AFFINITY_STORE_PIN;
    uint8_t small[10];
    EXPECT_EQ(affinity_store_encode(&m, small, sizeof(small)), 0u);
}

TEST(StoreMessage, DamagedMessagesAreRefused)
{
    std::string key = "session-1";
    affinity_store_message_t m{};
    m.kind = AFFINITY_STORE_PIN;
    m.peer = 42;
    m.key = key.data();
    m.key_len = key.size();
    std::vector<uint8_t> good = encode(m);
    affinity_store_message_t d;

    // Every truncation, and one byte more.
    for (size_t n = 0; n < good.size(); n++) {
        EXPECT_EQ(affinity_store_decode(good.data(), n, &d, nullptr, 0), -1)
            << n;
    }
    std::vector<uint8_t> longer = good;
    longer.push_back(0);
    EXPECT_EQ(affinity_store_decode(longer.data(), longer.size(), &d,
                                    nullptr, 0),
              -1);

    std::vector<uint8_t> version = good;
    version[0] = 2;
    EXPECT_EQ(affinity_store_decode(version.data(), version.size(), &d,
                                    nullptr, 0),
              -1);

    std::vector<uint8_t> kind = good;
    kind[1] = 0;
    EXPECT_EQ(affinity_store_decode(kind.data(), kind.size(), &d, nullptr,
                                    0),
              -1);

    // Levels whose length is not a multiple of 8.
    std::vector<uint8_t> levels = good;
    levels[1] = AFFINITY_STORE_LEVELS;
    uint64_t out[AFFINITY_MAX_LEVELS];
    EXPECT_EQ(affinity_store_decode(levels.data(), levels.size(), &d, out,
                                    AFFINITY_MAX_LEVELS),
              -1);
}

TEST(StoreApply, SessionPinsAndResponseIds)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);

    // Another instance pinned this session to peer 3: this one follows.
    std::string key = "shared-session";
    uint64_t hash = affinity_zone_key_hash(z.get(), key.data(), key.size());
    affinity_sessions_pin(z.get(), hash, up.peer(3).id, router.now, 3600);
    Routed r = router.route_key_released(key);
    EXPECT_EQ(r.decision.peer, 3);
    EXPECT_EQ(r.decision.route, uint32_t(AFFINITY_ROUTE_SESSION_HIT));

    // And moves it when told so.
    affinity_sessions_pin(z.get(), hash, up.peer(1).id, router.now, 3600);
    EXPECT_EQ(router.route_key_released(key).decision.peer, 1);
    EXPECT_EQ(up.total_pins(), 1);

    TestZone responses(1 << 20, AFFINITY_ZONE_RESPONSES);
    uint64_t id = affinity_zone_key_hash(responses.get(), "resp_1", 6);
    affinity_responses_learn(responses.get(), id, up.peer(2).id, 10, 60);
    EXPECT_EQ(affinity_responses_owner(responses.get(), id, 11, 60),
              up.peer(2).id);
}

TEST(StoreApply, PrefixLevelsRouteLikeLocalOnes)
{
    TestZone z;
    TestZone prefixes(1 << 20, AFFINITY_ZONE_PREFIXES);
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);

    std::vector<affinity_level_t> levels =
        prompt_levels(chat_body(std::string(3000, 'p')), default_schedule())
            .levels;
    ASSERT_GT(levels.size(), 3u);

    // Where this instance would place the prompt on its own.
    TestZone scratch(1 << 20, AFFINITY_ZONE_PREFIXES);
    int own = router.route_prompt_released(scratch.get(), levels)
                  .decision.peer;
    int other = (own + 1) % 4;

    std::vector<uint64_t> hashes;
    for (const affinity_level_t &l : levels) {
        hashes.push_back(l.hash);
    }
    affinity_prefixes_record(prefixes.get(), hashes.data(), hashes.size(),
                             up.peer(size_t(other)).id, router.now, 600, 0);

    Routed r = router.route_prompt_released(prefixes.get(), levels);
    EXPECT_EQ(r.decision.peer, other);
    EXPECT_EQ(r.decision.route, uint32_t(AFFINITY_ROUTE_PREFIX_HIT));
    EXPECT_EQ(r.decision.prefix_len, levels.back().length);
}

// With a modelled cache, a routed prompt tells how far it filled its
// peer's cache: all of a new prompt, none of one sent again whole.
// Without a model, nothing.
TEST(StoreApply, RoutedPromptsTellHowFarTheyFilledTheCache)
{
    TestZone z;
    TestZone prefixes(1 << 20, AFFINITY_ZONE_PREFIXES);
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);
    std::vector<affinity_level_t> levels = prompt_levels(
        chat_body(std::string(3000, 'q')), default_schedule()).levels;

    router.prefix_capacity = 1000;
    Routed first = router.route_prompt_released(prefixes.get(), levels);
    EXPECT_EQ(first.decision.cache_chars, levels.back().length);
    Routed again = router.route_prompt_released(prefixes.get(), levels);
    EXPECT_EQ(again.decision.route, uint32_t(AFFINITY_ROUTE_PREFIX_HIT));
    EXPECT_EQ(again.decision.cache_chars, 0u);

    TestZone unmodelled(1 << 20, AFFINITY_ZONE_PREFIXES);
    router.prefix_capacity = AFFINITY_CAPACITY_OFF;
    EXPECT_EQ(router.route_prompt_released(unmodelled.get(), levels)
                  .decision.cache_chars,
              0u);
}

// What the other instances sent a peer ages the prefixes this one presumes
// it holds, as its own prompts would: a prefix stays followed until the
// peer has been sent, by anyone, more than its cache holds.
TEST(StoreApply, OthersFillsAgePrefixesLikeOwnPrompts)
{
    const uint64_t tokens = 1000;                 // 5,000 characters
    TestZone z;
    TestZone prefixes(1 << 20, AFFINITY_ZONE_PREFIXES);
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);
    router.prefix_capacity = tokens;
    std::vector<affinity_level_t> levels = prompt_levels(
        chat_body(std::string(2000, 'r')), default_schedule()).levels;

    Routed placed = router.route_prompt_released(prefixes.get(), levels);
    ASSERT_GE(placed.decision.peer, 0);
    uint64_t holder = up.peer(size_t(placed.decision.peer)).id;

    // Filled on another peer: nothing changes here.
    uint64_t other = up.peer(size_t((placed.decision.peer + 1) % 4)).id;
    affinity_prefixes_filled(prefixes.get(), other, 100000, router.now,
                             tokens);

    // 3,000 characters on the holder: it holds the prompt still.  Sent it
    // again, the prompt is the most recent there once more.
    affinity_prefixes_filled(prefixes.get(), holder, 3000, router.now,
                             tokens);
    Routed kept = router.route_prompt_released(prefixes.get(), levels);
    EXPECT_EQ(kept.decision.peer, placed.decision.peer);
    EXPECT_EQ(kept.decision.route, uint32_t(AFFINITY_ROUTE_PREFIX_HIT));

    // 3,000 and 3,000 more: past 5,000, it is presumed evicted.
    affinity_prefixes_filled(prefixes.get(), holder, 3000, router.now,
                             tokens);
    affinity_prefixes_filled(prefixes.get(), holder, 3000, router.now,
                             tokens);
    Routed lost = router.route_prompt_released(prefixes.get(), levels);
    EXPECT_EQ(lost.decision.route, uint32_t(AFFINITY_ROUTE_PREFIX_NEW));

    // Placed anew where it was, or elsewhere: the prompt is fresh there.
    // No peer, or no characters, changes nothing.
    uint64_t now_holder = up.peer(size_t(lost.decision.peer)).id;
    affinity_prefixes_filled(prefixes.get(), 0, 100000, router.now, tokens);
    affinity_prefixes_filled(prefixes.get(), now_holder, 0, router.now,
                             tokens);
    Routed fresh = router.route_prompt_released(prefixes.get(), levels);
    EXPECT_EQ(fresh.decision.peer, lost.decision.peer);
    EXPECT_EQ(fresh.decision.route, uint32_t(AFFINITY_ROUTE_PREFIX_HIT));
}

}  // namespace

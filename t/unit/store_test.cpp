// What instances share through a store: messages (affinity_store_encode /
// decode, authenticated with the instances' secret; ids as digests) and
// applying them to a zone (affinity_sessions_learn, affinity_prefixes_record,
// affinity_prefixes_filled, affinity_responses_learn).
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_support.h"

using namespace affinity_test;

namespace {

const std::string kStream = "nginx:affinity:llm";
const std::string kSecret = "a secret of at least sixteen bytes";

struct KeysDeleter {
    void operator()(affinity_store_keys_t *k) const noexcept
    {
        affinity_store_keys_free(k);
    }
};

using Keys = std::unique_ptr<affinity_store_keys_t, KeysDeleter>;

Keys keys_of(const std::string &secret)
{
    Keys k(affinity_store_keys_create(secret.data(), secret.size()));
    EXPECT_NE(k.get(), nullptr);
    return k;
}

std::string chat_body(const std::string &content)
{
    return "{\"model\":\"m\",\"messages\":[{\"role\":\"user\","
           "\"content\":\"" + content + "\"}]}";
}

std::vector<uint8_t> encode(affinity_store_keys_t *keys,
                            const affinity_store_message_t &m,
                            const std::string &stream = kStream)
{
    std::vector<uint8_t> out(AFFINITY_STORE_MESSAGE_MAX);
    size_t n = affinity_store_encode(keys, stream.data(), stream.size(), &m,
                                     out.data(), out.size());
    out.resize(n);
    return out;
}

int decode(affinity_store_keys_t *keys, const std::vector<uint8_t> &bytes,
           affinity_store_message_t *d, uint64_t *levels = nullptr,
           size_t cap = 0, const std::string &stream = kStream)
{
    return affinity_store_decode(keys, stream.data(), stream.size(),
                                 bytes.data(), bytes.size(), d, levels, cap);
}

// A message of this kind, with no body yet, from a peer and an instance.
affinity_store_message_t from_peer(uint32_t kind)
{
    affinity_store_message_t m{};
    m.kind = kind;
    m.ms = 1763900000123ULL;
    m.instance = 0x0102030405060708ULL;
    m.peer = 0xfedcba9876543210ULL;
    m.sender = 0x51525354;
    m.seq = 0x0a0b0c0d0e0f1011ULL;
    return m;
}

// bytes decoded, with m's header.
affinity_store_message_t decoded(affinity_store_keys_t *keys,
                                 const std::vector<uint8_t> &bytes,
                                 const affinity_store_message_t &m)
{
    affinity_store_message_t d;
    EXPECT_EQ(decode(keys, bytes, &d), AFFINITY_STORE_OK);
    EXPECT_EQ(d.kind, m.kind);
    EXPECT_EQ(d.ms, m.ms);
    EXPECT_EQ(d.instance, m.instance);
    EXPECT_EQ(d.peer, m.peer);
    EXPECT_EQ(d.sender, m.sender);
    EXPECT_EQ(d.seq, m.seq);
    return d;
}

// A session key or response id crosses the store as a digest: the same
// for every instance with the secret, another with another secret or for
// another kind, and nothing of the id in clear.
TEST(StoreMessage, IdsCrossAsKeyedDigests)
{
    Keys keys = keys_of(kSecret), same = keys_of(kSecret);
    Keys other = keys_of("another secret, sixteen bytes or more");
    Keys none(affinity_store_keys_create(nullptr, 0));
    ASSERT_NE(none.get(), nullptr);

    std::string id = "user-42-session";
    uint8_t a[AFFINITY_STORE_DIGEST], b[AFFINITY_STORE_DIGEST];
    uint8_t c[AFFINITY_STORE_DIGEST], d[AFFINITY_STORE_DIGEST];
    uint8_t e[AFFINITY_STORE_DIGEST];

    affinity_store_digest(keys.get(), AFFINITY_STORE_PIN, id.data(),
                          id.size(), a);
    affinity_store_digest(same.get(), AFFINITY_STORE_PIN, id.data(),
                          id.size(), b);
    affinity_store_digest(other.get(), AFFINITY_STORE_PIN, id.data(),
                          id.size(), c);
    affinity_store_digest(keys.get(), AFFINITY_STORE_RESPONSE, id.data(),
                          id.size(), d);
    affinity_store_digest(none.get(), AFFINITY_STORE_PIN, id.data(),
                          id.size(), e);

    EXPECT_EQ(0, std::memcmp(a, b, sizeof(a)));
    EXPECT_NE(0, std::memcmp(a, c, sizeof(a)));
    EXPECT_NE(0, std::memcmp(a, d, sizeof(a)));
    EXPECT_NE(0, std::memcmp(a, e, sizeof(a)));

    affinity_store_message_t m = from_peer(AFFINITY_STORE_PIN);
    m.digest = a;
    std::vector<uint8_t> bytes = encode(keys.get(), m);
    ASSERT_EQ(bytes.size(), 40u + AFFINITY_STORE_DIGEST + AFFINITY_STORE_MAC);
    std::string text(bytes.begin(), bytes.end());
    EXPECT_EQ(text.find("user"), std::string::npos);

    affinity_store_message_t got = decoded(keys.get(), bytes, m);
    EXPECT_EQ(0, std::memcmp(got.digest, a, sizeof(a)));
}

// Only an instance with the secret writes messages the others take: any
// other key, another stream's name, or a byte changed anywhere is a
// forgery.  A reader without a secret takes only messages without one.
TEST(StoreMessage, OnlyTheSecretsHoldersAreBelieved)
{
    Keys keys = keys_of(kSecret);
    Keys other = keys_of("another secret, sixteen bytes or more");
    Keys none(affinity_store_keys_create(nullptr, 0));
    uint8_t digest[AFFINITY_STORE_DIGEST] = {1, 2, 3};
    affinity_store_message_t m = from_peer(AFFINITY_STORE_RESPONSE);
    m.digest = digest;
    std::vector<uint8_t> good = encode(keys.get(), m);
    affinity_store_message_t d;

    ASSERT_EQ(decode(keys.get(), good, &d), AFFINITY_STORE_OK);
    EXPECT_EQ(decode(other.get(), good, &d), AFFINITY_STORE_FORGED);
    EXPECT_EQ(decode(none.get(), good, &d), AFFINITY_STORE_FORGED);
    EXPECT_EQ(decode(keys.get(), encode(none.get(), m), &d),
              AFFINITY_STORE_FORGED);
    EXPECT_EQ(decode(none.get(), encode(none.get(), m), &d),
              AFFINITY_STORE_OK);
    EXPECT_EQ(decode(keys.get(), good, &d, nullptr, 0,
                     "nginx:affinity:other"),
              AFFINITY_STORE_FORGED);

    for (size_t i = 40; i < good.size(); i++) {
        std::vector<uint8_t> altered = good;
        altered[i] ^= 0x40;
        EXPECT_EQ(decode(keys.get(), altered, &d), AFFINITY_STORE_FORGED)
            << i;
    }

    // The header too: its fields are checked before the authenticator
    // where they are wrong for any message, after it where a forger could
    // have chosen them.
    for (size_t i : {4, 5, 6, 7}) {
        std::vector<uint8_t> altered = good;
        altered[i] ^= 0x01;
        EXPECT_EQ(decode(keys.get(), altered, &d), AFFINITY_STORE_FORGED)
            << i;
    }
    for (size_t i = 8; i < 40; i++) {
        std::vector<uint8_t> altered = good;
        altered[i] ^= 0x01;
        EXPECT_EQ(decode(keys.get(), altered, &d), AFFINITY_STORE_FORGED)
            << i;
    }
}

TEST(StoreMessage, LevelsRoundTrip)
{
    Keys keys = keys_of(kSecret);
    std::vector<uint64_t> hashes;
    for (uint64_t i = 0; i < AFFINITY_MAX_LEVELS; i++) {
        hashes.push_back(i * 0x9e3779b97f4a7c15ULL);
    }
    affinity_store_message_t m = from_peer(AFFINITY_STORE_LEVELS);
    m.levels = hashes.data();
    m.nlevels = hashes.size();

    std::vector<uint8_t> bytes = encode(keys.get(), m);
    ASSERT_EQ(bytes.size(), size_t(AFFINITY_STORE_MESSAGE_MAX));

    uint64_t levels[AFFINITY_MAX_LEVELS];
    affinity_store_message_t d;
    ASSERT_EQ(decode(keys.get(), bytes, &d, levels, AFFINITY_MAX_LEVELS),
              AFFINITY_STORE_OK);
    ASSERT_EQ(d.nlevels, hashes.size());
    EXPECT_EQ(std::vector<uint64_t>(d.levels, d.levels + d.nlevels), hashes);

    // A caller array too small for them refuses the message.
    EXPECT_EQ(decode(keys.get(), bytes, &d, levels, 3),
              AFFINITY_STORE_MALFORMED);

    // More levels than a prompt has are not written.
    std::vector<uint64_t> many(AFFINITY_MAX_LEVELS + 1, 5);
    m.levels = many.data();
    m.nlevels = many.size();
    EXPECT_TRUE(encode(keys.get(), m).empty());
}

// A request sent, with its sender's ticket and watch number, or ended:
// the header alone, its time to the millisecond.
TEST(StoreMessage, SentAndDoneRoundTripWithTheirMilliseconds)
{
    Keys keys = keys_of(kSecret);

    affinity_store_message_t m = from_peer(AFFINITY_STORE_SENT);
    m.ticket = 0x1122334455667788ULL;
    m.watch = 77;
    std::vector<uint8_t> bytes = encode(keys.get(), m);
    ASSERT_EQ(bytes.size(), 52u + AFFINITY_STORE_MAC);
    affinity_store_message_t d = decoded(keys.get(), bytes, m);
    EXPECT_EQ(d.ticket, m.ticket);
    EXPECT_EQ(d.watch, 77u);

    m = from_peer(AFFINITY_STORE_DONE);
    bytes = encode(keys.get(), m);
    ASSERT_EQ(bytes.size(), 40u + AFFINITY_STORE_MAC);
    d = decoded(keys.get(), bytes, m);
    EXPECT_EQ(d.nlevels, 0u);
    EXPECT_EQ(d.digest, nullptr);
}

// How far a prompt filled a peer's modelled cache: 4 bytes of characters,
// never 0, and no other length.
TEST(StoreMessage, FilledRoundTripsWithItsCharacters)
{
    Keys keys = keys_of(kSecret);
    affinity_store_message_t m = from_peer(AFFINITY_STORE_FILLED);
    m.chars = 0xfffffff0u;
    std::vector<uint8_t> bytes = encode(keys.get(), m);
    ASSERT_EQ(bytes.size(), 44u + AFFINITY_STORE_MAC);

    affinity_store_message_t d = decoded(keys.get(), bytes, m);
    EXPECT_EQ(d.chars, m.chars);

    m.chars = 0;
    EXPECT_TRUE(encode(keys.get(), m).empty()) << "nothing filled";
}

TEST(StoreMessage, InvalidMessagesAreNotWritten)
{
    Keys keys = keys_of(kSecret);
    uint8_t digest[AFFINITY_STORE_DIGEST] = {};
    affinity_store_message_t m = from_peer(AFFINITY_STORE_PIN);
    EXPECT_TRUE(encode(keys.get(), m).empty()) << "no digest";

    m.digest = digest;
    m.peer = 0;
    EXPECT_TRUE(encode(keys.get(), m).empty()) << "no peer";

    m.peer = 1;
    m.kind = 9;
    EXPECT_TRUE(encode(keys.get(), m).empty()) << "unknown kind";

    m.kind = AFFINITY_STORE_LEVELS;
    EXPECT_TRUE(encode(keys.get(), m).empty()) << "no levels";

    m.kind = AFFINITY_STORE_PIN;
    uint8_t small[40];
    EXPECT_EQ(affinity_store_encode(keys.get(), kStream.data(),
                                    kStream.size(), &m, small,
                                    sizeof(small)),
              0u);
}

// Whatever the bytes, a layout no message has is refused before its
// authenticator is even computed: every truncation, a byte more, another
// version, kind or body length.
TEST(StoreMessage, DamagedMessagesAreRefused)
{
    Keys keys = keys_of(kSecret);
    uint8_t digest[AFFINITY_STORE_DIGEST] = {9};
    affinity_store_message_t m = from_peer(AFFINITY_STORE_PIN);
    m.digest = digest;
    std::vector<uint8_t> good = encode(keys.get(), m);
    affinity_store_message_t d;

    for (size_t n = 0; n < good.size(); n++) {
        std::vector<uint8_t> cut(good.begin(), good.begin() + n);
        EXPECT_EQ(decode(keys.get(), cut, &d), AFFINITY_STORE_MALFORMED)
            << n;
    }
    std::vector<uint8_t> longer = good;
    longer.push_back(0);
    EXPECT_EQ(decode(keys.get(), longer, &d), AFFINITY_STORE_MALFORMED);

    for (size_t i : {0, 1, 2}) {
        std::vector<uint8_t> altered = good;
        altered[i] ^= 0x40;
        EXPECT_EQ(decode(keys.get(), altered, &d), AFFINITY_STORE_MALFORMED)
            << i;
    }

    // A body of the wrong length for its kind, declared and given.
    std::vector<uint8_t> levels = good;
    levels[1] = AFFINITY_STORE_LEVELS;
    levels[2] = 12;
    levels.resize(40 + 12 + AFFINITY_STORE_MAC);
    EXPECT_EQ(decode(keys.get(), levels, &d), AFFINITY_STORE_MALFORMED);
}

// Each writer's message is taken once: the same count again (the entry
// written into the stream a second time) or a lower one is refused, per
// writer, per instance and per stream.
TEST(StoreSenders, AdmitEachCountOnce)
{
    affinity_store_senders_t table{};

    EXPECT_TRUE(affinity_store_senders_admit(&table, 7, 100, 1, 10, 1));
    EXPECT_FALSE(affinity_store_senders_admit(&table, 7, 100, 1, 10, 1));
    EXPECT_FALSE(affinity_store_senders_admit(&table, 7, 100, 1, 9, 1));
    EXPECT_TRUE(affinity_store_senders_admit(&table, 7, 100, 1, 12, 2));

    // another writer, instance or stream counts on its own
    EXPECT_TRUE(affinity_store_senders_admit(&table, 7, 100, 2, 10, 2));
    EXPECT_TRUE(affinity_store_senders_admit(&table, 7, 101, 1, 10, 2));
    EXPECT_TRUE(affinity_store_senders_admit(&table, 8, 100, 1, 10, 2));
    EXPECT_FALSE(affinity_store_senders_admit(&table, 7, 100, 1, 12, 3));
    EXPECT_FALSE(affinity_store_senders_admit(nullptr, 7, 100, 1, 13, 3));
}

// With every slot taken, the writer heard from least recently gives way;
// the others keep their counts.
TEST(StoreSenders, TheLeastRecentlyHeardGivesWay)
{
    affinity_store_senders_t table{};

    for (uint32_t w = 0; w < AFFINITY_STORE_SENDERS; w++) {
        ASSERT_TRUE(affinity_store_senders_admit(&table, 7, 100, w, 5,
                                                 w == 3 ? 1 : 10 + w));
    }

    // a new writer takes writer 3's slot, writer 3 back writer 0's
    EXPECT_TRUE(affinity_store_senders_admit(&table, 7, 100, 9999, 5, 500));
    EXPECT_TRUE(affinity_store_senders_admit(&table, 7, 100, 3, 5, 501));

    for (uint32_t w = 0; w < AFFINITY_STORE_SENDERS; w++) {
        if (w != 3 && w != 0) {
            EXPECT_FALSE(affinity_store_senders_admit(&table, 7, 100, w, 5,
                                                      502))
                << w;
        }
    }
}

// Another instance's pins apply over older ones only, so that the stream
// read again (a reload, a worker's death) or late (a backlog sent after an
// outage) never puts back a pin that moved since; a tie goes to the higher
// peer id on every instance.
TEST(StoreApply, PinsApplyOverOlderOnesOnly)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);
    router.now = 100000;
    const uint64_t t = uint64_t(router.now) * 1000;

    std::string key = "shared-session";
    uint64_t hash = affinity_zone_key_hash(z.get(), key.data(), key.size());
    EXPECT_EQ(affinity_sessions_learn(z.get(), hash, up.peer(3).id, t - 500,
                                      router.now, 3600),
              AFFINITY_LEARNED);
    Routed r = router.route_key_released(key);
    EXPECT_EQ(r.decision.peer, 3);
    EXPECT_EQ(r.decision.route, uint32_t(AFFINITY_ROUTE_SESSION_HIT));

    // Moved later: followed.  The older pin read again: not.
    EXPECT_EQ(affinity_sessions_learn(z.get(), hash, up.peer(1).id, t - 100,
                                      router.now, 3600),
              AFFINITY_LEARNED);
    EXPECT_EQ(affinity_sessions_learn(z.get(), hash, up.peer(3).id, t - 500,
                                      router.now, 3600),
              AFFINITY_LEARNED_STALE);
    EXPECT_EQ(router.route_key_released(key).decision.peer, 1);
    EXPECT_EQ(up.total_pins(), 1);

    // Equal times: the higher peer id, whichever is read first.
    std::string tie = "tie";
    uint64_t a = affinity_zone_key_hash(z.get(), tie.data(), tie.size());
    uint64_t low = std::min(up.peer(0).id, up.peer(2).id);
    uint64_t high = std::max(up.peer(0).id, up.peer(2).id);
    affinity_sessions_learn(z.get(), a, high, t, router.now, 3600);
    EXPECT_EQ(affinity_sessions_learn(z.get(), a, low, t, router.now, 3600),
              AFFINITY_LEARNED_STALE);

    // A pin made here later than a message is not undone by it.
    std::string local = "moved-here";
    Routed placed = router.route_key_released(local);
    uint64_t l = affinity_zone_key_hash(z.get(), local.data(), local.size());
    uint64_t elsewhere = up.peer(size_t((placed.decision.peer + 1) % 4)).id;
    EXPECT_EQ(affinity_sessions_learn(z.get(), l, elsewhere, t - 1000,
                                      router.now, 3600),
              AFFINITY_LEARNED_STALE);
    EXPECT_EQ(router.route_key_released(local).decision.peer,
              placed.decision.peer);

    // Already expired when read: not learned.
    EXPECT_EQ(affinity_sessions_learn(z.get(), hash + 1, up.peer(2).id,
                                      t - 3601 * 1000ULL, router.now, 3600),
              AFFINITY_LEARNED_STALE);
}

// A pin read again is not made more recent: it expires when it would
// have, and is evicted before entries used since.
TEST(StoreApply, PinsReadAgainAreNotRefreshed)
{
    TestZone z;
    Upstream up(z.get(), {1, 1});
    const uint32_t now = 10000;
    uint64_t hash = 12345;

    ASSERT_EQ(affinity_sessions_learn(z.get(), hash, up.peer(0).id,
                                      uint64_t(now - 50) * 1000, now, 60),
              AFFINITY_LEARNED);
    // Read again 20 s later: its last use stays 50 s back.
    EXPECT_EQ(affinity_sessions_learn(z.get(), hash, up.peer(0).id,
                                      uint64_t(now - 50) * 1000, now + 20,
                                      60),
              AFFINITY_LEARNED_STALE);
    affinity_zone_info_t info = z.info();
    EXPECT_EQ(info.used, 1u);

    // 61 s after its use it is gone, however often it was read.
    EXPECT_EQ(affinity_responses_owner(z.get(), hash, now + 11, 60), 0u);
}

// A pin's millisecond beyond what an entry keeps (a stamp from centuries
// ahead, which the module refuses before; the core holds on its own) is
// read again as the same pin, not as a newer one each time.
TEST(StoreApply, APinFromFarAheadIsTakenOnce)
{
    TestZone z;
    Upstream up(z.get(), {1, 1});
    const uint64_t far = 242554005872763ULL;
    const uint32_t now = uint32_t(far / 1000);
    uint64_t hash = 777;

    ASSERT_EQ(affinity_sessions_learn(z.get(), hash, up.peer(0).id, far,
                                      now, 3600),
              AFFINITY_LEARNED);
    EXPECT_EQ(affinity_sessions_learn(z.get(), hash, up.peer(0).id, far,
                                      now, 3600),
              AFFINITY_LEARNED_STALE);
    EXPECT_EQ(affinity_sessions_learn(z.get(), hash, up.peer(0).id, far + 1,
                                      now, 3600),
              AFFINITY_LEARNED_STALE);
}

// Response ids: the first peer to produce one keeps it while it lives,
// here or at another instance; another's claim is refused and counted.
TEST(StoreApply, AResponseIdKeepsItsFirstOwner)
{
    TestZone responses(1 << 20, AFFINITY_ZONE_RESPONSES);
    Upstream up(responses.get(), {1, 1, 1});
    uint64_t id = affinity_zone_key_hash(responses.get(), "resp_1", 6);
    const uint64_t t = 10ULL * 1000;

    EXPECT_EQ(affinity_responses_learn(responses.get(), id, up.peer(2).id,
                                       t, 10, 60),
              AFFINITY_LEARNED);
    EXPECT_EQ(affinity_responses_learn(responses.get(), id, up.peer(0).id,
                                       t + 5, 11, 60),
              AFFINITY_LEARNED_TAKEN);
    EXPECT_EQ(affinity_responses_owner(responses.get(), id, 12, 60),
              up.peer(2).id);
    EXPECT_EQ(responses.info().conflicts, 1u);

    // Its own peer again: kept, and alive longer.
    EXPECT_EQ(affinity_responses_learn(responses.get(), id, up.peer(2).id,
                                       50 * 1000, 50, 60),
              AFFINITY_LEARNED);
    EXPECT_EQ(affinity_responses_owner(responses.get(), id, 100, 60),
              up.peer(2).id);

    // Once expired, the id may be another's.
    EXPECT_EQ(affinity_responses_learn(responses.get(), id, up.peer(1).id,
                                       200 * 1000, 200, 60),
              AFFINITY_LEARNED);
    EXPECT_EQ(affinity_responses_owner(responses.get(), id, 201, 60),
              up.peer(1).id);
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

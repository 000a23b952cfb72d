// fuzz_store_message: a message read from the shared store
// (affinity_store_decode), which any client of the store can write, and
// applying it to this instance's zones.
//
// The input is decoded twice, each time from a heap block of its exact
// size so that AddressSanitizer reports any read past it: as it is (a
// forger's entry: nothing is read past a wrong authenticator), and sealed
// with the instances' key (affinity_store_seal), as if an instance had
// written it, so that every layout reaches the parser.  Checked:
//
//   - only a sealed input decodes; a message decoded is written back
//     (affinity_store_encode) byte for byte: the decoder accepts nothing
//     the encoder would not write;
//   - its digest lies inside the input, its levels fit the caller's array;
//   - its writer's count is admitted once (affinity_store_senders_admit);
//   - applying it to a sessions, a prefixes and a responses zone (as the
//     module does) keeps their counts consistent: entries never exceed the
//     capacity; a pin or response id read twice changes nothing the
//     second time; a request sent elsewhere or ended there, and
//     characters filled into a peer's modelled cache, are taken for any
//     peer id and count (a slot claimed in the prefixes zone, or none
//     left).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "affinity_core.h"

namespace {

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond)) {                                                      \
            __builtin_printf("fuzz_store_message: check failed: %s "        \
                             "(line %d)\n", #cond, __LINE__);               \
            __builtin_trap();                                               \
        }                                                                   \
    } while (0)

struct Zones {
    void *memory[3];
    affinity_zone_t *zone[3];
};

Zones zones;

void check_zone(affinity_zone_t *zone)
{
    affinity_zone_info_t info;
    affinity_zone_info(zone, &info);
    CHECK(info.used <= info.capacity);
}

// How long an ask of an engine waits for its answer (affinity_metrics
// timeout=, in milliseconds): every ask here is answered before the next.
constexpr uint64_t kAnswerWithin = 1000;

// A request's start or end on its peer, as the reader counts it: the peer's
// engine asked at a moment the message itself picks (before, at or after
// its stamp; a wall clock's, never 0), the news read either before the
// answer or after it.  One message moves the count by one at most, and
// only if stamped after the ask.
void apply_request_news(affinity_zone_t *zone,
                        const affinity_store_message_t &m)
{
    uint64_t at = m.ms;
    uint32_t now = uint32_t(m.ms / 1000);
    uint64_t asked_ms = std::max<uint64_t>(at + m.peer % 3, 2) - 1;
    bool while_answering = (m.peer >> 8) & 1;
    uint32_t slot = affinity_zone_peer_slot(zone, m.peer, now);

    if (slot == AFFINITY_NO_SLOT) {
        return;
    }

    affinity_engine_load_t load{};
    load.running = 1;
    load.found = AFFINITY_ENGINE_RUNNING;
    affinity_engine_asked_t asked;
    CHECK(affinity_engine_ask(zone, slot, asked_ms, kAnswerWithin,
                              &asked) == 1);

    if (!while_answering) {
        affinity_engine_answer(zone, slot, &load, now | 1, &asked);
    }

    if (m.kind == AFFINITY_STORE_SENT) {
        affinity_zone_peer_sent_elsewhere(zone, m.peer, at);
    } else {
        affinity_zone_peer_ended_elsewhere(zone, m.peer, at);
    }

    if (while_answering) {
        affinity_engine_answer(zone, slot, &load, now | 1, &asked);
    }

    affinity_peer_stats_t stats;
    affinity_zone_peer_stats(zone, slot, &stats);
    int64_t moved = at >= asked_ms ? (m.kind == AFFINITY_STORE_SENT ? 1 : -1)
                                   : 0;
    CHECK(stats.engine_elsewhere == moved);
}

const char kStream[] = "nginx:affinity:fuzz";
const char kSecret[] = "the fuzzer's secret, sixteen bytes or more";

affinity_store_keys_t *keys;

// A learned message applied twice: the second time, nothing changes.
void apply(const affinity_store_message_t &m)
{
    uint32_t now = uint32_t(m.ms / 1000);
    uint64_t hash;

    switch (m.kind) {
    case AFFINITY_STORE_PIN:
        hash = affinity_zone_key_hash(zones.zone[0], m.digest,
                                      AFFINITY_STORE_DIGEST);
        affinity_sessions_learn(zones.zone[0], hash, m.peer, m.ms, now,
                                3600);
        CHECK(affinity_sessions_learn(zones.zone[0], hash, m.peer, m.ms,
                                      now, 3600)
              != AFFINITY_LEARNED);
        check_zone(zones.zone[0]);
        break;
    case AFFINITY_STORE_LEVELS:
        // With a cache capacity: the holder's clock is looked up.
        affinity_prefixes_record(zones.zone[1], m.levels, m.nlevels, m.peer,
                                 now, 600, 100000);
        check_zone(zones.zone[1]);
        break;
    case AFFINITY_STORE_RESPONSE:
        hash = affinity_zone_key_hash(zones.zone[2], m.digest,
                                      AFFINITY_STORE_DIGEST);
        if (affinity_responses_learn(zones.zone[2], hash, m.peer, m.ms, now,
                                     3600)
            == AFFINITY_LEARNED)
        {
            CHECK(affinity_responses_owner(zones.zone[2], hash, now, 3600)
                  == m.peer);
        }
        check_zone(zones.zone[2]);
        break;
    case AFFINITY_STORE_SENT:
    case AFFINITY_STORE_DONE:
        apply_request_news(zones.zone[0], m);
        break;
    case AFFINITY_STORE_FILLED:
        affinity_prefixes_filled(zones.zone[1], m.peer, m.chars, now, 100000);
        check_zone(zones.zone[1]);
        break;
    default:
        CHECK(false);
    }
}

// Decodes size bytes of a heap copy; the message, if it is one.
bool decode(const uint8_t *data, size_t size, uint8_t *copy,
            affinity_store_message_t &m, uint64_t *levels)
{
    if (size) {
        std::memcpy(copy, data, size);
    }

    int rc = affinity_store_decode(keys, kStream, sizeof(kStream) - 1, copy,
                                   size, &m, levels, AFFINITY_MAX_LEVELS);
    CHECK(rc == AFFINITY_STORE_OK || rc == AFFINITY_STORE_MALFORMED
          || rc == AFFINITY_STORE_FORGED);
    return rc == AFFINITY_STORE_OK;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***)
{
    const affinity_zone_kind_e kinds[] = {AFFINITY_ZONE_SESSIONS,
                                          AFFINITY_ZONE_PREFIXES,
                                          AFFINITY_ZONE_RESPONSES};
    for (int i = 0; i < 3; i++) {
        zones.memory[i] = std::aligned_alloc(64, AFFINITY_ZONE_MIN_SIZE);
        CHECK(zones.memory[i] != nullptr);
        CHECK(affinity_zone_attach(zones.memory[i], AFFINITY_ZONE_MIN_SIZE,
                                   kinds[i], 4, &zones.zone[i], nullptr, 0)
              == AFFINITY_ATTACH_CREATED);
    }
    keys = affinity_store_keys_create(kSecret, sizeof(kSecret) - 1);
    CHECK(keys != nullptr);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t levels[AFFINITY_MAX_LEVELS];
    affinity_store_message_t m;

    // As written to the store by someone without the secret.
    std::vector<uint8_t> raw(size ? size : 1);
    (void) decode(data, size, raw.data(), m, levels);

    // Sealed with it: every layout reaches the parser.
    std::vector<uint8_t> sealed(size + AFFINITY_STORE_MAC);
    if (size) {
        std::memcpy(sealed.data(), data, size);
    }
    size_t len = affinity_store_seal(keys, kStream, sizeof(kStream) - 1,
                                     sealed.data(), size, sealed.size());
    CHECK(len == size + AFFINITY_STORE_MAC);

    uint8_t *copy = static_cast<uint8_t *>(std::malloc(len));
    CHECK(copy != nullptr);

    if (decode(sealed.data(), len, copy, m, levels)) {
        CHECK(m.peer != 0);

        if (m.kind == AFFINITY_STORE_LEVELS) {
            CHECK(m.levels == levels);
            CHECK(m.nlevels >= 1 && m.nlevels <= AFFINITY_MAX_LEVELS);
        } else if (m.kind == AFFINITY_STORE_PIN
                   || m.kind == AFFINITY_STORE_RESPONSE)
        {
            CHECK(m.digest >= copy);
            CHECK(m.digest + AFFINITY_STORE_DIGEST <= copy + len);
        } else {
            CHECK(m.digest == nullptr && m.nlevels == 0);
        }

        std::vector<uint8_t> again(AFFINITY_STORE_MESSAGE_MAX + 1024);
        size_t n = affinity_store_encode(keys, kStream, sizeof(kStream) - 1,
                                         &m, again.data(), again.size());
        CHECK(n == len);
        CHECK(std::memcmp(again.data(), copy, len) == 0);

        // its writer's count is taken once, whatever the count
        static affinity_store_senders_t senders;
        if (affinity_store_senders_admit(&senders, 1, m.instance, m.sender,
                                         m.seq, 0))
        {
            CHECK(!affinity_store_senders_admit(&senders, 1, m.instance,
                                                m.sender, m.seq, 0));
        }

        apply(m);
    }

    std::free(copy);
    return 0;
}

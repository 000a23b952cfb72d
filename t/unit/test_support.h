// Shared fixtures of the unit tests: a zone in an aligned buffer, a set of
// upstream peers with their ring and counter slots, a router that sends
// keyed, unkeyed or prompt-level requests through affinity_route(), and the
// prompt levels of a request body.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "affinity_core.h"

namespace affinity_test {

// The ring density the nginx module uses.
constexpr uint32_t kPointsPerWeight = 160;

// Worker rows of the zones tests make.
constexpr uint32_t kTestRows = 16;

struct FreeDeleter {
    void operator()(void *p) const noexcept { std::free(p); }
};

// A 64-byte aligned buffer, filled with a non-zero pattern so that tests see
// whether the zone initializes everything it uses.
class AlignedBuffer {
public:
    explicit AlignedBuffer(size_t size, unsigned char fill = 0xa5)
        : size_(size),
          data_(std::aligned_alloc(64, round_up(size)))
    {
        if (data_) {
            std::memset(data_.get(), fill, round_up(size));
        }
    }

    void *get() const noexcept { return data_.get(); }
    size_t size() const noexcept { return size_; }

private:
    static size_t round_up(size_t n) { return (n + 63) / 64 * 64; }

    size_t size_;
    std::unique_ptr<void, FreeDeleter> data_;
};

// A zone created in a fresh buffer.
class TestZone {
public:
    explicit TestZone(size_t size = 1 << 20,
                      affinity_zone_kind_e kind = AFFINITY_ZONE_SESSIONS)
        : buffer_(size)
    {
        char err[256] = "";
        affinity_attach_e rc =
            affinity_zone_attach(buffer_.get(), buffer_.size(), kind,
                                 kTestRows, &zone_, err, sizeof(err));
        EXPECT_EQ(rc, AFFINITY_ATTACH_CREATED) << err;
    }

    affinity_zone_t *get() const noexcept { return zone_; }
    void *region() const noexcept { return buffer_.get(); }

    affinity_zone_info_t info() const
    {
        affinity_zone_info_t i{};
        affinity_zone_info(zone_, &i);
        return i;
    }

private:
    AlignedBuffer buffer_;
    affinity_zone_t *zone_ = nullptr;
};

inline std::string peer_name(size_t i)
{
    return "10.0." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1)
           + ":8000";
}

inline uint64_t peer_id_of(const std::string &name)
{
    return affinity_peer_id(name.data(), name.size());
}

// A ring in memory of its own, as the module keeps one in its peer view.
// get() is NULL when the ring could not be built.
class RingPtr {
public:
    RingPtr() = default;

    RingPtr(const std::vector<affinity_peer_t> &peers, uint32_t points)
        : mem_(affinity_ring_size(peers.data(), peers.size(), points) / 8 + 1)
    {
        ring_ = affinity_ring_build(mem_.data(), mem_.size() * 8,
                                    peers.data(), peers.size(), points);
    }

    affinity_ring_t *get() const noexcept { return ring_; }

private:
    std::vector<uint64_t> mem_;     // moves keep its data where it is
    affinity_ring_t *ring_ = nullptr;
};

inline RingPtr make_ring(const std::vector<affinity_peer_t> &peers,
                         uint32_t points = kPointsPerWeight)
{
    return RingPtr(peers, points);
}

// The ring density the nginx module picks for an upstream: 65536 points
// over the total weight, 160..1024 per unit of weight.
inline uint32_t module_ring_points(uint32_t total_weight)
{
    uint32_t points = 65536 / (total_weight ? total_weight : 1);
    return points < 160 ? 160 : points > 1024 ? 1024 : points;
}

// An upstream: peers with ids, weights, zone counter slots and a ring.
class Upstream {
public:
    Upstream(affinity_zone_t *zone, const std::vector<uint32_t> &weights,
             uint32_t points_per_weight = kPointsPerWeight)
        : zone_(zone)
    {
        for (size_t i = 0; i < weights.size(); i++) {
            affinity_peer_t p{};
            p.id = peer_id_of(peer_name(i));
            p.weight = weights[i];
            p.slot = affinity_zone_peer_slot(zone, p.id, 0);
            EXPECT_NE(p.slot, AFFINITY_NO_SLOT);
            peers_.push_back(p);
            states_.push_back(AFFINITY_PEER_USABLE);
        }

        ring_ = make_ring(peers_, points_per_weight);
        EXPECT_NE(ring_.get(), nullptr);
    }

    size_t size() const noexcept { return peers_.size(); }
    affinity_peer_t &peer(size_t i) { return peers_[i]; }
    const std::vector<affinity_peer_t> &peers() const { return peers_; }
    const affinity_ring_t *ring() const { return ring_.get(); }

    void set_state(size_t i, affinity_peer_state_e s)
    {
        states_[i] = uint8_t(s);
    }

    const std::vector<uint8_t> &states() const { return states_; }

    affinity_peer_stats_t stats(size_t i) const
    {
        affinity_peer_stats_t s{};
        affinity_zone_peer_stats(zone_, peers_[i].slot, &s);
        return s;
    }

    int64_t inflight(size_t i) const { return stats(i).inflight; }

    int64_t total_inflight() const
    {
        int64_t total = 0;
        for (size_t i = 0; i < size(); i++) {
            total += inflight(i);
        }
        return total;
    }

    int64_t total_pins() const
    {
        int64_t total = 0;
        for (size_t i = 0; i < size(); i++) {
            total += stats(i).pins;
        }
        return total;
    }

    void release(size_t i)
    {
        affinity_zone_peer_release(zone_, row, peers_[i].slot);
    }

    void acquire(size_t i)
    {
        affinity_zone_peer_acquire(zone_, row, peers_[i].id, peers_[i].slot,
                                   0);
    }

    // The worker row requests are counted in, as a worker's.
    uint32_t row = AFFINITY_NO_ROW;

    void release_all()
    {
        for (size_t i = 0; i < size(); i++) {
            while (inflight(i) > 0) {
                release(i);
            }
        }
    }

    int index_of_id(uint64_t id) const
    {
        for (size_t i = 0; i < size(); i++) {
            if (peers_[i].id == id) {
                return static_cast<int>(i);
            }
        }
        return -1;
    }

private:
    affinity_zone_t *zone_;
    std::vector<affinity_peer_t> peers_;
    std::vector<uint8_t> states_;
    RingPtr ring_;
};

struct Routed {
    int rc;
    affinity_decision_t decision;
};

// The load bound of affinity_balance (selection.h) with its defaults, as
// the README documents it, to check the core against.
constexpr double kFactor = 1.25;
constexpr double kSlack = 2.0;

inline double bound_for(double share)
{
    return std::max(kFactor * share, share + kSlack);
}

// Whether peer i would take one more request (the documented bound), from
// the counters as they are now.
inline bool would_accept(const Upstream &up, size_t i)
{
    int64_t total = 0;
    uint64_t weights = 0;
    for (size_t j = 0; j < up.size(); j++) {
        if (up.states()[j] != AFFINITY_PEER_FAILED) {
            total += up.inflight(j);
            weights += up.peers()[j].weight;
        }
    }
    double share = double(total + 1) * up.peers()[i].weight / double(weights);
    return double(up.inflight(i) + 1) <= bound_for(share) + 1e-9;
}

// How long an ask of an engine waits for its answer before another may be
// made (affinity_metrics timeout=, in milliseconds).
constexpr uint64_t kAnswerWithin = 1000;

// The engine of the peer of slot reported load at now (seconds), asked at
// the start of that second with the requests in flight here as they are:
// the other instances' news stamped later counts beside it
// (affinity_zone_peer_sent_elsewhere()).
inline void engine_reported(affinity_zone_t *zone, uint32_t slot,
                            const affinity_engine_load_t &load, uint32_t now)
{
    affinity_engine_asked_t asked;
    affinity_engine_ask(zone, slot, uint64_t(now) * 1000, kAnswerWithin,
                        &asked);
    affinity_engine_answer(zone, slot, &load, now, &asked);
}

inline void expect_within_bound(const Upstream &up, const char *when)
{
    int64_t total = up.total_inflight();
    double mean = double(total) / double(up.size());
    double bound = bound_for(mean);

    for (size_t i = 0; i < up.size(); i++) {
        EXPECT_LE(double(up.inflight(i)), bound + 1e-9)
            << when << ": peer " << i << " has " << up.inflight(i)
            << " in flight, total " << total;
    }
}

// Sends requests through affinity_route() with a clock and a timeout.
class Router {
public:
    Router(affinity_zone_t *zone, Upstream &upstream,
           affinity_balance_t balance = {1.25, 2.0, 0, 0})
        : zone_(zone), upstream_(upstream), balance_(balance) {}

    uint32_t now = 1000;
    uint32_t timeout = 3600;
    uint32_t rotate = 0;
    uint32_t prefix_timeout = 600;
    // Each peer's KV cache in tokens (0: no model), and the size the next
    // prompts declare (0: their longest level's).
    uint64_t prefix_capacity = 0;
    uint64_t prompt_size = 0;
    // Where the keys of the requests sent come from (affinity_key_e).
    uint32_t key_origin = AFFINITY_KEY_CLIENT;

    Routed route_key(const std::string &key)
    {
        affinity_request_t r{};
        r.key_hash = affinity_zone_key_hash(zone_, key.data(), key.size());
        r.ring_hash = affinity_ring_hash(key.data(), key.size());
        r.has_key = 1;
        r.now = now;
        r.timeout = timeout;
        r.rotate = rotate++;
        return send(r);
    }

    Routed route_nokey()
    {
        affinity_request_t r{};
        r.has_key = 0;
        r.now = now;
        r.timeout = timeout;
        r.rotate = rotate++;
        return send(r);
    }

    // Routes and ends the request at once.
    Routed route_key_released(const std::string &key)
    {
        Routed r = route_key(key);
        if (r.rc == 0 && r.decision.peer >= 0) {
            upstream_.release(static_cast<size_t>(r.decision.peer));
        }
        return r;
    }

    Routed route_nokey_released()
    {
        Routed r = route_nokey();
        if (r.rc == 0 && r.decision.peer >= 0) {
            upstream_.release(static_cast<size_t>(r.decision.peer));
        }
        return r;
    }

    // A request with prompt levels (affinity_json_prompt()) indexed in
    // the prefix zone prefixes; with a session key unless key is empty.
    Routed route_prompt(affinity_zone_t *prefixes,
                        const std::vector<affinity_level_t> &levels,
                        const std::string &key = std::string())
    {
        affinity_request_t r = request(key);
        r.prefixes = prefixes;
        r.levels = levels.empty() ? nullptr : levels.data();
        r.nlevels = static_cast<uint32_t>(levels.size());
        r.prefix_timeout = prefix_timeout;
        r.prefix_capacity = prefix_capacity;
        r.prompt_size = prompt_size;
        return send(r);
    }

    Routed route_prompt_released(affinity_zone_t *prefixes,
                                 const std::vector<affinity_level_t> &levels,
                                 const std::string &key = std::string())
    {
        Routed r = route_prompt(prefixes, levels, key);
        if (r.rc == 0 && r.decision.peer >= 0) {
            upstream_.release(static_cast<size_t>(r.decision.peer));
        }
        return r;
    }

    // A request continuing a stored response whose owner is owner_id (0:
    // unknown), with a session key unless key is empty.
    Routed route_continuation(uint64_t owner_id,
                              const std::string &key = std::string())
    {
        affinity_request_t r = request(key);
        r.continues = 1;
        r.owner = owner_id;
        return send(r);
    }

private:
    // A request at the router's clock, with a session key unless key is
    // empty.
    affinity_request_t request(const std::string &key)
    {
        affinity_request_t r{};
        if (!key.empty()) {
            r.key_hash = affinity_zone_key_hash(zone_, key.data(), key.size());
            r.ring_hash = affinity_ring_hash(key.data(), key.size());
            r.has_key = key_origin;
        }
        r.now = now;
        r.timeout = timeout;
        r.rotate = rotate++;
        return r;
    }

    Routed send(const affinity_request_t &r)
    {
        Routed out{};
        out.decision.peer = 12345;     // must be overwritten
        out.decision.route = 12345;
        affinity_request_t request = r;
        request.row = upstream_.row;
        out.rc = affinity_route(zone_, upstream_.ring(),
                                upstream_.peers().data(),
                                upstream_.states().data(), upstream_.size(),
                                &balance_, &request, &out.decision);

        // Requests end by peer (release()): keep the slot this one counts in.
        if (out.rc == 0) {
            upstream_.peer(size_t(out.decision.peer)).slot = out.decision.slot;
        }
        return out;
    }

    affinity_zone_t *zone_;
    Upstream &upstream_;
    affinity_balance_t balance_;
};

inline const char *route_name(uint32_t route)
{
    switch (route) {
    case AFFINITY_ROUTE_NONE: return "NONE";
    case AFFINITY_ROUTE_SESSION_HIT: return "SESSION_HIT";
    case AFFINITY_ROUTE_SESSION_NEW: return "SESSION_NEW";
    case AFFINITY_ROUTE_SESSION_MOVED: return "SESSION_MOVED";
    case AFFINITY_ROUTE_SESSION_SPILL: return "SESSION_SPILL";
    case AFFINITY_ROUTE_FALLBACK: return "FALLBACK";
    case AFFINITY_ROUTE_PREFIX_HIT: return "PREFIX_HIT";
    case AFFINITY_ROUTE_PREFIX_NEW: return "PREFIX_NEW";
    case AFFINITY_ROUTE_RESPONSE_HIT: return "RESPONSE_HIT";
    case AFFINITY_ROUTE_RESPONSE_LOST: return "RESPONSE_LOST";
    default: return "?";
    }
}

inline std::string key_name(size_t i)
{
    return "session-" + std::to_string(i);
}

// The n-th session key whose ring peer, among four equal peers, is 0.
inline std::string key_on_peer0(int n)
{
    TestZone scratch;
    Upstream other(scratch.get(), {1, 1, 1, 1});
    Router r(scratch.get(), other);
    for (int i = 0;; i++) {
        std::string k = key_name(size_t(i));
        if (r.route_key_released(k).decision.peer == 0 && n-- == 0) {
            return k;
        }
    }
}

// ---- prompt prefixes ---------------------------------------------------

// The level schedule of the nginx module's defaults: 100, 500 and 1000
// code points, then steps of max(256, 6%) up to 32k.
inline std::vector<uint32_t> default_schedule()
{
    const uint32_t lengths[] = {100, 500, 1000};
    std::vector<uint32_t> out(AFFINITY_MAX_LEVELS);
    size_t n = affinity_level_schedule(lengths, 3, 256, 6, 32 * 1024,
                                       out.data(), out.size());
    out.resize(n);
    return out;
}

struct Prompt {
    affinity_prompt_e rc;
    std::vector<affinity_level_t> levels;
};

// The body reader of this test thread, as a worker has one.  A small
// retain size, so that tests also go through freeing the parser's buffers.
inline affinity_json_t *json_reader()
{
    struct Reader {
        Reader() : json(affinity_json_create(4096)) {}
        ~Reader() { affinity_json_destroy(json); }
        affinity_json_t *json;
    };
    thread_local Reader reader;
    return reader.json;
}

// A body in a buffer of exactly its length + AFFINITY_JSON_PADDING bytes
// (AddressSanitizer catches reads past the padding), the padding filled
// with fill, loaded into json_reader() for as long as it lives.
class LoadedBody {
public:
    explicit LoadedBody(const std::string &body, char fill = '\0')
        : buf_(new char[body.size() + AFFINITY_JSON_PADDING])
    {
        std::memcpy(buf_.get(), body.data(), body.size());
        std::memset(buf_.get() + body.size(), fill, AFFINITY_JSON_PADDING);
        loaded_ = affinity_json_load(json_reader(), buf_.get(), body.size())
                  == 0;
    }

    ~LoadedBody() { affinity_json_unload(json_reader()); }

    LoadedBody(const LoadedBody &) = delete;
    LoadedBody &operator=(const LoadedBody &) = delete;

    bool loaded() const { return loaded_; }
    affinity_json_t *json() const { return json_reader(); }

private:
    std::unique_ptr<char[]> buf_;
    bool loaded_;
};

// Loads body (see LoadedBody) and calls affinity_json_prompt(); out holds
// one level per scheduled length and turn level, as in the module.
inline Prompt prompt_levels(const std::string &body,
                            const std::vector<uint32_t> &schedule,
                            char fill = '\0', size_t turns = 0)
{
    LoadedBody loaded(body, fill);

    const affinity_level_t canary{0xdeadbeef, 0xdeadbeef, 0xdeadbeef};
    size_t cap = schedule.size() + turns;
    std::vector<affinity_level_t> out(cap + 4, canary);
    size_t n = 12345;

    affinity_prompt_e rc = affinity_json_prompt(
        loaded.json(), schedule.data(), schedule.size(), turns, out.data(),
        cap, &n);

    if (!loaded.loaded()) {
        EXPECT_EQ(rc, AFFINITY_PROMPT_INVALID) << "read a body not loaded";
    }

    EXPECT_LE(n, cap);
    for (size_t i = cap; i < out.size(); i++) {
        EXPECT_EQ(out[i].hash, canary.hash) << "wrote past out_cap";
    }
    if (rc != AFFINITY_PROMPT_OK) {
        EXPECT_EQ(n, 0u) << "levels without a prompt";
    }

    out.resize(std::min(n, cap));
    return {rc, out};
}

}  // namespace affinity_test

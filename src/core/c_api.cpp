// The C API of affinity_core.h: noexcept wrappers that translate between
// the POD structs and the C++ pieces, and keep exceptions inside.
#include "affinity_core.h"

#include <algorithm>
#include <new>
#include <type_traits>

#include "engine_metrics.h"
#include "engine_poll.h"
#include "hashing.h"
#include "json_body.h"
#include "level_hasher.h"
#include "ring.h"
#include "selection.h"
#include "session_key.h"
#include "process.h"
#include "response_scan.h"
#include "session_table.h"
#include "cache_model.h"
#include "prefix_table.h"
#include "unheard_watch.h"
#include "usage_scan.h"
#include "worker_rows.h"
#include "zone.h"

using namespace affinity;

struct affinity_json_s {
    explicit affinity_json_s(size_t retain) noexcept : body(retain) {}

    JsonBody body;
};

namespace {

Zone zone_of(affinity_zone_t *zone) noexcept
{
    return Zone(zone);
}

Zone zone_of(const affinity_zone_t *zone) noexcept
{
    return Zone(const_cast<affinity_zone_t *>(zone));
}

}  // namespace

extern "C" {

uint64_t affinity_hash(const void *data, size_t len, uint64_t seed) noexcept
{
    return hash64(data, len, seed);
}

uint64_t affinity_peer_id(const char *name, size_t len) noexcept
{
    return peer_id(name, len);
}

uint64_t affinity_ring_hash(const void *key, size_t len) noexcept
{
    return ring_key_hash(key, len);
}

size_t affinity_ring_size(const affinity_peer_t *peers, size_t npeers,
                          uint32_t points_per_weight) noexcept
{
    return Ring::size(peers, npeers, points_per_weight);
}

affinity_ring_t *affinity_ring_build(void *mem, size_t size,
                                     const affinity_peer_t *peers,
                                     size_t npeers,
                                     uint32_t points_per_weight) noexcept
{
    return Ring::build(mem, size, peers, npeers, points_per_weight)
           ? static_cast<affinity_ring_t *>(mem) : nullptr;
}

size_t affinity_ring_points(const affinity_ring_t *ring) noexcept
{
    return ring ? Ring(ring).points() : 0;
}

size_t affinity_ring_walk(const affinity_ring_t *ring, uint64_t hash,
                          uint32_t *out, size_t max) noexcept
{
    size_t n = 0;

    if (ring == nullptr || max == 0) {
        return 0;
    }

    Ring(ring).walk(hash, [&](uint32_t peer) {
        out[n++] = peer;
        return n == max;
    });

    return n;
}

affinity_attach_e affinity_zone_attach(void *region, size_t size,
                                       affinity_zone_kind_e kind,
                                       uint32_t rows, affinity_zone_t **zone,
                                       char *err, size_t err_len) noexcept
{
    affinity_attach_e rc = Zone::attach(region, size, kind, rows, err,
                                        err_len);

    *zone = (rc == AFFINITY_ATTACH_CREATED || rc == AFFINITY_ATTACH_REUSED)
            ? static_cast<affinity_zone_t *>(region) : nullptr;

    return rc;
}

void affinity_zone_info(const affinity_zone_t *zone,
                        affinity_zone_info_t *info) noexcept
{
    const ZoneHeader &h = zone_of(zone).header();

    info->kind = h.kind;
    info->layout_version = h.layout_version;
    info->seed = h.seed;
    info->capacity = h.buckets * h.ways;
    info->used = h.used;
    info->inserts = h.inserts;
    info->evictions = h.evictions;
    info->expiries = h.expiries;
    info->peer_slots = kPeerSlots;
    info->peer_slots_used = h.peer_slots_used;
    info->peer_slots_reclaimed = h.peer_slots_reclaimed;
    info->peer_slots_missing = h.peer_slots_missing;
    info->rows = h.rows;
    info->rows_used = h.rows_used;
    info->rows_missing = h.rows_missing;
    info->rows_reaped = h.rows_reaped;
    info->inflight_recovered = h.inflight_recovered;
    info->instance = h.instance;
    info->conflicts = h.conflicts;

    for (size_t i = 0; i < AFFINITY_FALLBACKS; i++) {
        info->fallbacks[i] = atomic_load(&h.fallbacks[i]);
    }
}

uint64_t affinity_zone_key_hash(const affinity_zone_t *zone, const void *key,
                                size_t len) noexcept
{
    return zone_of(zone).key_hash(key, len);
}

uint32_t affinity_zone_peer_slot(affinity_zone_t *zone, uint64_t peer_id,
                                 uint32_t now) noexcept
{
    return zone_of(zone).claim_slot(peer_id, now);
}

uint32_t affinity_zone_peer_find(const affinity_zone_t *zone,
                                 uint64_t peer_id) noexcept
{
    return zone_of(zone).find_slot(peer_id);
}

void affinity_zone_peer_stats(const affinity_zone_t *zone, uint32_t slot,
                              affinity_peer_stats_t *stats) noexcept
{
    *stats = affinity_peer_stats_t{};

    if (slot >= kPeerSlots) {
        return;
    }

    const PeerSlot &s = zone_of(zone).peer_slots()[slot];

    stats->id = atomic_load(&s.id);
    stats->inflight = atomic_load(&s.inflight);
    stats->requests = atomic_load(&s.requests);
    stats->failures = atomic_load(&s.failures);
    stats->pins = atomic_load(&s.pins);

    static_assert(AFFINITY_ROUTES == kRoutes, "one counter per outcome");
    for (size_t i = 0; i < kRoutes; i++) {
        stats->routes[i] = atomic_load(&s.routes[i]);
    }

    uint64_t reported = atomic_load(&s.engine_time);
    stats->engine_time = uint32_t(reported);
    stats->engine_load = reported ? atomic_load(&s.engine_load) : -1;
    stats->engine_elsewhere = reported ? atomic_load(&s.engine_others) : 0;
    uint64_t usage = atomic_load(&s.cache_usage);
    stats->cache_usage = reported && usage != UINT64_MAX
                         ? double(usage) / 1e6 : -1.0;
    stats->cache_tokens = atomic_load(&s.cache_tokens);
    // Written under the zone lock, a word at a time: a reader may see the
    // figure before or after a reply changed it.
    stats->learned_tokens = atomic_load(&s.learned)
                            / AFFINITY_CHARS_PER_TOKEN;
    stats->unheard = unheard_count(atomic_load(&s.unheard));
}

int affinity_engine_metrics(const char *text, size_t len,
                            affinity_engine_load_t *load) noexcept
{
    return parse_engine_metrics(text, len, *load) ? 0 : -1;
}

int affinity_engine_awaiting(const affinity_zone_t *zone, uint32_t slot,
                             uint64_t ms, uint64_t answer_within) noexcept
{
    return engine_awaiting(zone_of(zone), slot, ms, answer_within) ? 1 : 0;
}

int affinity_engine_ask(affinity_zone_t *zone, uint32_t slot, uint64_t ms,
                        uint64_t answer_within,
                        affinity_engine_asked_t *asked) noexcept
{
    return engine_ask(zone_of(zone), slot, ms, answer_within, *asked) ? 1 : 0;
}

void affinity_engine_give_up(affinity_zone_t *zone, uint32_t slot,
                             const affinity_engine_asked_t *asked) noexcept
{
    engine_give_up(zone_of(zone), slot, *asked);
}

int affinity_engine_answer(affinity_zone_t *zone, uint32_t slot,
                           const affinity_engine_load_t *load, uint32_t now,
                           const affinity_engine_asked_t *asked) noexcept
{
    return engine_answer(zone_of(zone), slot, *load, now, *asked) ? 1 : 0;
}

void affinity_zone_peer_sent_elsewhere(affinity_zone_t *zone,
                                       uint64_t peer_id,
                                       uint64_t at_ms) noexcept
{
    count_elsewhere(zone_of(zone), peer_id, 1, at_ms);
}

void affinity_zone_peer_ended_elsewhere(affinity_zone_t *zone,
                                        uint64_t peer_id,
                                        uint64_t at_ms) noexcept
{
    count_elsewhere(zone_of(zone), peer_id, -1, at_ms);
}

uintptr_t affinity_zone_peer_announced(affinity_zone_t *zone,
                                       uint32_t slot) noexcept
{
    return zone_of(zone).announce_unheard(slot);
}

void affinity_zone_peer_heard(affinity_zone_t *zone, uintptr_t ticket)
    noexcept
{
    zone_of(zone).hear_unheard(ticket);
}

void affinity_zone_unheard_met(affinity_zone_t *zone, uint32_t unheard,
                               uint32_t others) noexcept
{
    zone_of(zone).learn_unheard(unheard, others);
}

double affinity_zone_unheard_beside(const affinity_zone_t *zone) noexcept
{
    return zone ? zone_of(zone).unheard_beside() : 0.0;
}

double affinity_zone_unheard_presumed(const affinity_zone_t *zone,
                                      uint32_t now, uint32_t *unheard,
                                      uint32_t *met) noexcept
{
    Zone z = zone_of(zone);

    return z.unheard_presumed(z.instances(now), unheard, met);
}

uint32_t affinity_watch_announced(affinity_unheard_watch_t *watch,
                                  uint64_t peer_id, int64_t unheard) noexcept
{
    return UnheardWatch(*watch).announced(peer_id, unheard);
}

void affinity_watch_sent_elsewhere(affinity_unheard_watch_t *watch,
                                   uint64_t peer_id) noexcept
{
    UnheardWatch(*watch).sent_elsewhere(peer_id);
}

int affinity_watch_read_back(affinity_unheard_watch_t *watch,
                             uint32_t number, uint32_t *unheard,
                             uint32_t *others) noexcept
{
    return UnheardWatch(*watch).read_back(number, *unheard, *others) ? 1 : 0;
}

void affinity_zone_instance_seen(affinity_zone_t *zone, uint64_t instance,
                                 uint32_t now) noexcept
{
    zone_of(zone).instance_seen(instance, now);
}

uint32_t affinity_zone_instances(const affinity_zone_t *zone,
                                 uint32_t now) noexcept
{
    return zone_of(zone).instances(now);
}

int affinity_engine_claim_poll(affinity_zone_t *zone, uint64_t now_ms,
                               uint32_t interval_ms) noexcept
{
    return engine_claim_poll(zone_of(zone), now_ms, interval_ms) ? 1 : 0;
}

void affinity_zone_peer_timed(affinity_zone_t *zone, uint32_t slot,
                              uint64_t peer_id,
                              const affinity_reply_times_t *times) noexcept
{
    if (zone == nullptr || times == nullptr || slot >= kPeerSlots) {
        return;
    }

    PeerSlot &s = zone_of(zone).peer_slots()[slot];

    if (atomic_load(&s.id) == peer_id) {
        pace_learn(s.pace, *times);
    }
}

void affinity_zone_peer_pace(const affinity_zone_t *zone, uint32_t slot,
                             affinity_peer_pace_t *pace) noexcept
{
    *pace = affinity_peer_pace_t{};

    if (zone == nullptr || slot >= kPeerSlots) {
        for (int64_t &w : pace->wait_us) {
            w = -1;
        }
        return;
    }

    const PeerSlot &s = zone_of(zone).peer_slots()[slot];
    const PeerPace &p = s.pace;

    pace->replies = atomic_load(&p.replies);
    pace->prefill_ns = atomic_load(&p.prefill_ns);
    pace->decode_us = atomic_load(&p.decode_us);
    pace->chars_per_token = atomic_load(&p.chars_per_token);

    for (uint32_t q = 0; q < kPaceQueues; q++) {
        pace->wait_us[q] = pace_wait(p, q);
    }

    pace->backlog_chars = backlog_ahead(s);
}

void affinity_zone_peers_wait(const affinity_zone_t *zone,
                              const uint32_t *slots, size_t n,
                              uint32_t engine_ttl, uint64_t now,
                              int64_t *wait_us) noexcept
{
    const PeerPace *paces[kMaxPeers] = {};

    if (wait_us == nullptr) {
        return;
    }

    for (size_t i = 0; i < n; i++) {
        wait_us[i] = -1;
    }

    if (zone == nullptr || slots == nullptr) {
        return;
    }

    n = std::min(n, kMaxPeers);

    const PeerSlot *base = zone_of(zone).peer_slots();

    for (size_t i = 0; i < n; i++) {
        paces[i] = slots[i] < kPeerSlots ? &base[slots[i]].pace : nullptr;
    }

    QueueShape shape = pace_shape(paces, n);

    for (size_t i = 0; i < n; i++) {
        if (paces[i] == nullptr) {
            continue;
        }

        const PeerSlot &s = base[slots[i]];
        int64_t inflight = counted_inflight(s, engine_ttl, now);

        wait_us[i] = pace_estimate(*paces[i], shape,
                                   uint32_t(std::min<int64_t>(inflight,
                                                              UINT32_MAX)),
                                   backlog_ahead(s));
    }
}

void affinity_zone_peer_started(affinity_zone_t *zone, uint32_t slot,
                                uint32_t backlog_chars) noexcept
{
    if (zone != nullptr) {
        zone_of(zone).started(slot, backlog_chars);
    }
}

void affinity_zone_peer_release(affinity_zone_t *zone, uint32_t row,
                                uint32_t slot) noexcept
{
    zone_of(zone).release(row, slot);
}

int affinity_zone_peer_acquire(affinity_zone_t *zone, uint32_t row,
                               uint64_t peer_id, uint32_t slot,
                               uint32_t now) noexcept
{
    Zone z = zone_of(zone);

    if (!z.owns(slot, peer_id)) {
        return -1;
    }

    z.acquire(row, slot, AFFINITY_ROUTE_FALLBACK, now);
    return 0;
}

void affinity_zone_count_fallback(affinity_zone_t *zone,
                                  uint32_t reason) noexcept
{
    if (reason < AFFINITY_FALLBACKS) {
        atomic_add<uint64_t>(&zone_of(zone).header().fallbacks[reason], 1);
    }
}

void affinity_zone_peer_failed(affinity_zone_t *zone, uint32_t slot) noexcept
{
    if (slot < kPeerSlots) {
        atomic_add<uint64_t>(&zone_of(zone).peer_slots()[slot].failures, 1);
    }
}

uint32_t affinity_zone_worker_claim(affinity_zone_t *zone, uint64_t pid,
                                    uint64_t start, uint32_t now) noexcept
{
    return claim_row(zone_of(zone), pid, start, now);
}

void affinity_zone_worker_release(affinity_zone_t *zone, uint32_t row,
                                  uint64_t pid) noexcept
{
    release_row(zone_of(zone), row, pid);
}

int affinity_zone_reap_due(affinity_zone_t *zone, uint32_t now,
                           uint32_t interval) noexcept
{
    return reap_due(zone_of(zone), now, interval) ? 1 : 0;
}

size_t affinity_zone_workers(const affinity_zone_t *zone,
                             affinity_worker_t *out, size_t cap) noexcept
{
    return rows_in_use(zone_of(zone), out, cap);
}

int affinity_zone_worker_reap(affinity_zone_t *zone,
                              const affinity_worker_t *worker,
                              uint64_t *recovered) noexcept
{
    return reap_row(zone_of(zone), *worker, *recovered) ? 1 : 0;
}

uint64_t affinity_process_start(uint64_t pid) noexcept
{
    return process_start(pid);
}

int affinity_process_alive(uint64_t pid, uint64_t start) noexcept
{
    return process_alive(pid, start) ? 1 : 0;
}

int affinity_route(affinity_zone_t *zone, const affinity_ring_t *ring,
                   const affinity_peer_t *peers, const uint8_t *states,
                   size_t npeers, const affinity_balance_t *balance,
                   const affinity_request_t *request,
                   affinity_decision_t *decision) noexcept
{
    if (ring == nullptr) {
        return route(zone_of(zone), nullptr, peers, states, npeers,
                     *balance, *request, *decision);
    }

    Ring view(ring);
    return route(zone_of(zone), &view, peers, states, npeers, *balance,
                 *request, *decision);
}

int affinity_key_echoable(const char *key, size_t len) noexcept
{
    return key_echoable(key, len) ? 1 : 0;
}

int affinity_key_exposable(const char *key, size_t len) noexcept
{
    return key != nullptr && key_exposable(key, len) ? 1 : 0;
}

int affinity_uuid_v4(char out[AFFINITY_UUID_LEN]) noexcept
{
    return uuid_v4(out) ? 0 : -1;
}

affinity_json_t *affinity_json_create(size_t retain) noexcept
{
    return new (std::nothrow) affinity_json_s(retain);
}

void affinity_json_destroy(affinity_json_t *json) noexcept
{
    delete json;
}

int affinity_json_load(affinity_json_t *json, const char *body,
                       size_t len) noexcept
{
    try {
        return json->body.load(body, len) ? 0 : -1;

    } catch (...) {
        json->body.unload();
        return -1;
    }
}

void affinity_json_unload(affinity_json_t *json) noexcept
{
    json->body.unload();
}

int affinity_json_shrink(affinity_json_t *json) noexcept
{
    return json->body.shrink() ? 1 : 0;
}

affinity_field_e affinity_json_field(affinity_json_t *json, const char *path,
                                     size_t path_len, char *out,
                                     size_t out_cap, size_t *out_len) noexcept
{
    try {
        return json->body.field(std::string_view(path, path_len), out,
                                out_cap, out_len);

    } catch (...) {
        return AFFINITY_FIELD_INVALID;
    }
}

size_t affinity_level_schedule(const uint32_t *lengths, size_t nlengths,
                               uint32_t step, uint32_t growth_percent,
                               uint32_t max, uint32_t *out,
                               size_t out_cap) noexcept
{
    return level_schedule(lengths, nlengths, step, growth_percent, max, out,
                          out_cap);
}

affinity_prompt_e affinity_json_prompt(affinity_json_t *json,
                                       const uint32_t *schedule,
                                       size_t nschedule, size_t turns,
                                       affinity_level_t *out, size_t out_cap,
                                       size_t *nout) noexcept
{
    try {
        return json->body.prompt(schedule, nschedule, turns, out, out_cap,
                                 nout);

    } catch (...) {
        *nout = 0;
        return AFFINITY_PROMPT_INVALID;
    }
}

// Response ids are kept as sessions are: an id is a key pinned to the peer
// that produced it.  The per-peer pin counts of a responses zone are thus
// the ids each peer holds.
uint64_t affinity_responses_owner(affinity_zone_t *zone, uint64_t key_hash,
                                  uint32_t now, uint32_t timeout) noexcept
{
    SessionTable table(zone_of(zone), now, timeout);
    SessionEntry *entry = table.find(key_hash);

    return entry ? entry->peer : 0;
}

int affinity_responses_learn(affinity_zone_t *zone, uint64_t key_hash,
                             uint64_t peer_id, uint64_t version_ms,
                             uint32_t now, uint32_t timeout) noexcept
{
    Learned learned = SessionTable(zone_of(zone), now, timeout)
                          .claim(key_hash, peer_id, version_ms);

    if (learned == Learned::Taken) {
        zone_of(zone).header().conflicts++;
        return AFFINITY_LEARNED_TAKEN;
    }

    return learned == Learned::Applied ? AFFINITY_LEARNED
                                       : AFFINITY_LEARNED_STALE;
}

int affinity_sessions_learn(affinity_zone_t *zone, uint64_t key_hash,
                            uint64_t peer_id, uint64_t version_ms,
                            uint32_t now, uint32_t timeout) noexcept
{
    Learned learned = SessionTable(zone_of(zone), now, timeout)
                          .learn(key_hash, peer_id, version_ms);

    return learned == Learned::Applied ? AFFINITY_LEARNED
                                       : AFFINITY_LEARNED_STALE;
}

void affinity_prefixes_polled(affinity_zone_t *zone, uint64_t peer_id,
                              const affinity_engine_load_t *load,
                              uint64_t capacity) noexcept
{
    if (peer_id == 0 || load == nullptr
        || (load->found & AFFINITY_ENGINE_COMPUTED) == 0)
    {
        return;
    }

    CacheModel::engine_computed(zone_of(zone), peer_id,
                                load->queried_tokens - load->hit_tokens,
                                capacity);
}

void affinity_prefixes_replied(affinity_zone_t *zone, uint64_t peer_id,
                               uint32_t probe_age, uint32_t probe_length,
                               uint64_t prompt_chars, uint64_t cached_tokens,
                               uint64_t prompt_tokens) noexcept
{
    CacheModel::replied_usage(zone_of(zone), peer_id, probe_age,
                              probe_length, prompt_chars, cached_tokens,
                              prompt_tokens);
}

void affinity_prefixes_record(affinity_zone_t *zone,
                              const uint64_t *level_hashes, size_t nlevels,
                              uint64_t peer_id, uint32_t now,
                              uint32_t timeout, uint64_t capacity) noexcept
{
    if (peer_id == 0 || level_hashes == nullptr) {
        return;
    }

    PrefixTable table(zone_of(zone), now, timeout);
    affinity_peer_t peer = {peer_id, 1, kNoSlot};
    CacheModel cache(zone_of(zone), &peer, 1, capacity, nullptr, now);
    uint8_t stamp = cache.stamp(0);

    for (size_t i = 0; i < nlevels && i < AFFINITY_MAX_LEVELS; i++) {
        table.record(table.key(level_hashes[i]), peer_id, stamp);
    }
}

void affinity_prefixes_filled(affinity_zone_t *zone, uint64_t peer_id,
                              uint32_t chars, uint32_t now,
                              uint64_t capacity) noexcept
{
    if (peer_id == 0 || chars == 0) {
        return;
    }

    affinity_peer_t peer = {peer_id, 1, kNoSlot};
    CacheModel cache(zone_of(zone), &peer, 1, capacity, nullptr, now);

    cache.add(0, chars);
}

static_assert(sizeof(ResponseScan) <= sizeof(affinity_response_scan_t),
              "the scan fits the caller's memory");
static_assert(alignof(ResponseScan) <= alignof(affinity_response_scan_t),
              "and its alignment");
static_assert(std::is_trivially_copyable<ResponseScan>::value,
              "the scan is plain data in the request's pool");

void affinity_response_scan_start(affinity_response_scan_t *scan,
                                  affinity_response_format_e format) noexcept
{
    new (scan) ResponseScan();
    reinterpret_cast<ResponseScan *>(scan)->start(format);
}

affinity_scan_e affinity_response_scan(affinity_response_scan_t *scan,
                                       const char *data, size_t len) noexcept
{
    return reinterpret_cast<ResponseScan *>(scan)->feed(data, len);
}

affinity_scan_e affinity_response_scan_end(
    affinity_response_scan_t *scan) noexcept
{
    return reinterpret_cast<ResponseScan *>(scan)->finish();
}

affinity_scan_reason_e affinity_response_scan_reason(
    const affinity_response_scan_t *scan) noexcept
{
    return reinterpret_cast<const ResponseScan *>(scan)->reason();
}

const char *affinity_response_scan_id(const affinity_response_scan_t *scan,
                                      size_t *len,
                                      affinity_object_e *object) noexcept
{
    const ResponseScan *s = reinterpret_cast<const ResponseScan *>(scan);

    if (s->status() != AFFINITY_SCAN_FOUND) {
        *len = 0;
        *object = AFFINITY_OBJECT_NONE;
        return nullptr;
    }

    *len = s->id_len();
    *object = s->object();
    return s->id();
}

static_assert(sizeof(UsageScan) <= sizeof(affinity_usage_scan_t),
              "the usage scan fits the caller's memory");
static_assert(alignof(UsageScan) <= alignof(affinity_usage_scan_t),
              "and its alignment");
static_assert(std::is_trivially_copyable<UsageScan>::value,
              "the usage scan is plain data in the request's pool");

void affinity_usage_scan_start(affinity_usage_scan_t *scan) noexcept
{
    new (scan) UsageScan();
}

void affinity_usage_scan(affinity_usage_scan_t *scan, const char *data,
                         size_t len) noexcept
{
    reinterpret_cast<UsageScan *>(scan)->feed(data, len);
}

int affinity_usage_scan_result(affinity_usage_scan_t *scan,
                               uint64_t *cached_tokens,
                               uint64_t *prompt_tokens) noexcept
{
    UsageScan *s = reinterpret_cast<UsageScan *>(scan);

    s->finish();

    if (!s->found()) {
        return 0;
    }

    *cached_tokens = s->cached();
    *prompt_tokens = s->prompt();
    return 1;
}

void affinity_usage_scan_tokens(affinity_usage_scan_t *scan,
                                uint64_t *prompt_tokens,
                                uint64_t *output_tokens) noexcept
{
    UsageScan *s = reinterpret_cast<UsageScan *>(scan);

    s->finish();
    *prompt_tokens = s->prompt();
    *output_tokens = s->output();
}

}  // extern "C"

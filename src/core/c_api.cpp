// The C API of affinity_core.h: thin noexcept wrappers that translate
// between the POD structs and the C++ pieces, and keep exceptions inside.
#include "affinity_core.h"

#include <algorithm>
#include <new>
#include <type_traits>

#include "engine_metrics.h"
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

namespace {

// One ask at a time: the news since an ask is kept for its answer, and a
// second ask would start that count again, from later.  An ask older than
// its answer could be is abandoned (its worker is gone), as is one the
// clock went back from by as much; a little earlier is another worker's
// clock, read a moment before this one's.
bool awaits_answer(const PeerSlot &s, uint64_t ms,
                   uint64_t answer_within) noexcept
{
    uint64_t waiting = s.engine_asking;

    return waiting != 0
           && (ms >= waiting ? ms - waiting : waiting - ms) < answer_within;
}

}  // namespace

int affinity_zone_peer_awaits(const affinity_zone_t *zone, uint32_t slot,
                              uint64_t ms, uint64_t answer_within) noexcept
{
    return slot < kPeerSlots
           && awaits_answer(zone_of(zone).peer_slots()[slot], ms,
                            answer_within);
}

int affinity_zone_peer_asked(affinity_zone_t *zone, uint32_t slot,
                             uint64_t ms, uint64_t answer_within,
                             affinity_engine_asked_t *asked) noexcept
{
    asked->ms = ms;
    asked->inflight = 0;

    if (slot >= kPeerSlots) {
        return 1;
    }

    PeerSlot &s = zone_of(zone).peer_slots()[slot];

    if (awaits_answer(s, ms, answer_within)) {
        asked->ms = 0;
        return 0;
    }

    asked->inflight = std::max<int64_t>(atomic_load(&s.inflight), 0);

    // The others' news from now on is what its answer will not show.
    s.engine_asking = ms;
    s.others_since_asking = 0;
    return 1;
}

void affinity_zone_peer_unanswered(affinity_zone_t *zone, uint32_t slot,
                                   const affinity_engine_asked_t *asked)
    noexcept
{
    if (slot >= kPeerSlots || asked->ms == 0) {
        return;
    }

    PeerSlot &s = zone_of(zone).peer_slots()[slot];

    if (s.engine_asking == asked->ms) {
        s.engine_asking = 0;
        s.others_since_asking = 0;
    }
}

int affinity_zone_peer_polled(affinity_zone_t *zone, uint32_t slot,
                              const affinity_engine_load_t *load,
                              uint32_t now,
                              const affinity_engine_asked_t *asked) noexcept
{
    if (slot >= kPeerSlots || now == 0) {
        return 0;
    }

    PeerSlot &s = zone_of(zone).peer_slots()[slot];

    // Only the answer the slot waits for: not one to an ask refused or
    // abandoned, nor one to the slot's previous peer.
    if (asked->ms == 0 || s.engine_asking != asked->ms) {
        return 0;
    }

    double total = load->running + load->waiting;

    atomic_store<int64_t>(&s.engine_load,
                          total < kMaxRequests ? int64_t(total + 0.5)
                                               : int64_t(kMaxRequests));

    // What it counts of this instance's requests, and of the others': a
    // request that ended while it answered is not counted again.
    atomic_store<int64_t>(&s.engine_base, asked->inflight);
    atomic_store<uint64_t>(&s.cache_usage,
                           (load->found & AFFINITY_ENGINE_CACHE)
                               ? uint64_t(load->cache_usage * 1e6)
                               : UINT64_MAX);
    // What the others said since it was asked, read while it answered,
    // is not in it.
    int64_t others = s.others_since_asking;
    s.engine_asking = 0;
    s.others_since_asking = 0;

    atomic_store<uint64_t>(&s.engine_asked, asked->ms);
    atomic_store<int64_t>(&s.engine_others, others);
    clear_unheard(&s.unheard);
    if ((load->found & AFFINITY_ENGINE_CAPACITY)
        && load->cache_tokens >= 1 && load->cache_tokens <= kMaxCacheTokens)
    {
        atomic_store<uint64_t>(&s.cache_tokens, uint64_t(load->cache_tokens));
    }
    atomic_store<uint64_t>(&s.engine_time, now);
    return 1;
}

namespace {

// Requests another instance said started (+1) or ended (-1) on peer_id
// at at_ms, counted with its engine's figure until the engine reports
// again.
void count_elsewhere(affinity_zone_t *zone, uint64_t peer_id,
                     int64_t requests, uint64_t at_ms) noexcept
{
    Zone z = zone_of(zone);
    uint32_t slot = z.find_slot(peer_id);

    if (slot == kNoSlot) {
        return;
    }

    PeerSlot &s = z.peer_slots()[slot];

    // Only a figure to add to: without one, this instance cannot know when
    // those requests end, nor count the ends of those it holds.  And only
    // what came after the figure was asked for: a request that started
    // before is in it, one that ended before is not; the news of either,
    // read late, would count it twice or take off another.
    if (atomic_load(&s.engine_time) != 0
        && at_ms >= atomic_load(&s.engine_asked))
    {
        atomic_add<int64_t>(&s.engine_others, requests);
    }

    // And what the answer to an ask under way will not show.
    if (s.engine_asking != 0 && at_ms >= s.engine_asking) {
        s.others_since_asking += requests;
    }
}

}  // namespace

void affinity_zone_peer_sent_elsewhere(affinity_zone_t *zone,
                                       uint64_t peer_id,
                                       uint64_t at_ms) noexcept
{
    count_elsewhere(zone, peer_id, 1, at_ms);
}

void affinity_zone_peer_ended_elsewhere(affinity_zone_t *zone,
                                        uint64_t peer_id,
                                        uint64_t at_ms) noexcept
{
    count_elsewhere(zone, peer_id, -1, at_ms);
}

namespace {

// A ticket names a slot and the epoch of the count a request was added to
// (PeerSlot::unheard), in a pointer-sized integer the caller hands back
// when the request is heard (it travels in the announcement, and with the
// shim's record of a refused or lost one): the slot + 1 in its low
// bits, so that 0 names none, the epoch's low bits that fit above.  An
// epoch comes round again in the same bits after 2^23 clears at the
// least, long after any announcement is read.
constexpr unsigned kTicketSlotBits = 9;
constexpr uintptr_t kTicketSlots = (uintptr_t{1} << kTicketSlotBits) - 1;
static_assert(kPeerSlots < kTicketSlots, "a slot + 1 fits a ticket");

uintptr_t ticket_of(uint32_t slot, uint64_t word) noexcept
{
    return (uintptr_t(word / kUnheardEpoch) << kTicketSlotBits)
           | uintptr_t(slot + 1);
}

}  // namespace

uintptr_t affinity_zone_peer_announced(affinity_zone_t *zone,
                                       uint32_t slot) noexcept
{
    if (slot >= kPeerSlots) {
        return 0;
    }

    // A count that reached 2^32 (never) would carry into a new epoch: one
    // clear more.
    uint64_t *unheard = &zone_of(zone).peer_slots()[slot].unheard;
    uint64_t word = __atomic_fetch_add(unheard, 1, __ATOMIC_RELAXED);

    return ticket_of(slot, word);
}

void affinity_zone_peer_heard(affinity_zone_t *zone, uintptr_t ticket)
    noexcept
{
    // Ticket 0 (none) names slot UINT32_MAX.
    uint32_t slot = uint32_t(ticket & kTicketSlots) - 1;

    if (slot >= kPeerSlots) {
        return;
    }

    // Only in the epoch it was counted in: an engine's report (or the
    // slot's hand-over to another peer) may have cleared the count while
    // the announcement was on its way, and requests counted since are
    // still unheard.  Never below zero.
    uint64_t *unheard = &zone_of(zone).peer_slots()[slot].unheard;
    uint64_t word = atomic_load(unheard);

    while (ticket_of(slot, word) == ticket && unheard_count(word) > 0
           && !__atomic_compare_exchange_n(unheard, &word, word - 1, true,
                                           __ATOMIC_RELAXED,
                                           __ATOMIC_RELAXED))
    {
    }
}

void affinity_zone_unheard_met(affinity_zone_t *zone, uint32_t unheard,
                               uint32_t others) noexcept
{
    zone_of(zone).learn_unheard(unheard, others);
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
    ZoneHeader &h = zone_of(zone).header();

    if (instance == 0 || instance == h.instance) {
        return;
    }

    // Its own entry, else a free one or the one heard from longest ago.
    InstanceSeen *slot = &h.instances[0];

    for (InstanceSeen &seen : h.instances) {
        if (seen.id == instance) {
            slot = &seen;
            break;
        }

        if (slot->id != 0 && (seen.id == 0 || seen.seen < slot->seen)) {
            slot = &seen;
        }
    }

    slot->id = instance;
    slot->seen = now;
}

uint32_t affinity_zone_instances(const affinity_zone_t *zone,
                                 uint32_t now) noexcept
{
    return zone_of(zone).instances(now);
}

int affinity_zone_poll_due(affinity_zone_t *zone, uint64_t now_ms,
                           uint32_t interval_ms) noexcept
{
    uint64_t *last = &zone_of(zone).header().last_poll;
    uint64_t seen = atomic_load(last);

    if (now_ms < seen + interval_ms) {
        return 0;
    }

    return __atomic_compare_exchange_n(last, &seen, now_ms, false,
                                       __ATOMIC_RELAXED, __ATOMIC_RELAXED)
           ? 1 : 0;
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

    const PeerPace &p = zone_of(zone).peer_slots()[slot].pace;

    pace->replies = atomic_load(&p.replies);
    pace->prefill_ns = atomic_load(&p.prefill_ns);
    pace->decode_us = atomic_load(&p.decode_us);
    pace->chars_per_token = atomic_load(&p.chars_per_token);

    for (uint32_t q = 0; q < kPaceQueues; q++) {
        pace->wait_us[q] = pace_wait(p, q);
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
    // Figures beyond any prompt are junk.
    constexpr uint64_t kMaxTokens = uint64_t{1} << 40;

    if (peer_id == 0 || probe_length == 0 || cached_tokens > kMaxTokens
        || prompt_tokens > kMaxTokens || prompt_chars > kMaxTokens
        || (prompt_tokens != 0 && cached_tokens > prompt_tokens))
    {
        return;
    }

    // Characters cached, at the prompt's own characters per token when
    // both are known: at least half the probe's prefix counts as held.
    // The prompt's size may be its body's (past the last level), escapes
    // and all: no more than twice the usual characters a token.
    double per_token = prompt_chars != 0 && prompt_tokens != 0
                       ? std::clamp(double(prompt_chars)
                                        / double(prompt_tokens),
                                    1.0, 2.0 * AFFINITY_CHARS_PER_TOKEN)
                       : double(AFFINITY_CHARS_PER_TOKEN);
    bool held = double(cached_tokens) * per_token * 2
                >= double(probe_length);

    CacheModel::replied(zone_of(zone), peer_id, probe_age, probe_length,
                        held);
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

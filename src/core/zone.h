// Layout of an affinity zone in shared memory, and a view over it.
//
// A zone is one contiguous region holding, at fixed offsets:
//   header       magic, layout version, kind, parameters, table counters
//   peer slots   per-peer counters (in-flight, requests, pins), open
//                addressing by peer id; counters are updated atomically
//   worker rows  which process owns each row, and per row and peer slot the
//                requests that process has in flight: when a worker dies,
//                its row says what to give back (worker_rows.h)
//   buckets      a set-associative table: each bucket is a few cache lines
//                of entries, with LRU and idle expiry inside the bucket
//
// Only plain data addressed by offsets lives here: every nginx process maps
// the region at its own address, and a reload hands the same region to the
// next configuration cycle.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "affinity_core.h"
#include "peer_pace.h"

namespace affinity {

constexpr uint64_t kZoneMagic = 0x41464e5a4f4e4531ULL;    // "AFNZONE1"
constexpr uint32_t kLayoutVersion = 13;
constexpr uint32_t kPeerSlots = AFFINITY_PEER_SLOTS;
constexpr uint32_t kNoSlot = AFFINITY_NO_SLOT;
constexpr uint32_t kMaxWorkerRows = AFFINITY_MAX_WORKER_ROWS;
constexpr uint32_t kMinWorkerRows = 4;
constexpr uint32_t kNoRow = AFFINITY_NO_ROW;

// Seconds a peer's slot must have seen no request before another peer may
// take it (with nothing in flight): a configured peer that is merely idle
// keeps its counters, one that left frees its slot within this time.
constexpr uint64_t kSlotReclaimIdle = 60;

// Other nginx instances this one has heard from through the store
// (affinity_store): those that may be sending a peer requests it cannot
// count yet (LoadBound in selection.h).  As many as one upstream's
// instances are likely to be, each for kInstanceMemory seconds after its
// last message.
constexpr size_t kInstanceSlots = 16;
constexpr uint64_t kInstanceMemory = 10;

struct InstanceSeen {
    uint64_t id;                // the instance's id; 0: free
    uint64_t seen;              // seconds, its last message read
};

// A peer by the low 32 bits of its id, where entries keep a few peers
// (prefix_table.h) or a second one (session_table.h): a collision between
// two peers of one upstream has odds of about n^2/2^33.
inline uint32_t short_peer_id(uint64_t id) noexcept
{
    uint32_t s = static_cast<uint32_t>(id);
    return s != 0 ? s : 1;
}

// A slot per peer an upstream may have.
static_assert(kPeerSlots >= AFFINITY_MAX_PEERS, "a slot for every peer");

enum class ZoneKind : uint32_t {
    Sessions = AFFINITY_ZONE_SESSIONS,
    Prefixes = AFFINITY_ZONE_PREFIXES,
    Responses = AFFINITY_ZONE_RESPONSES
};

struct alignas(64) ZoneHeader {
    uint64_t magic;
    uint32_t layout_version;
    uint32_t kind;
    uint64_t region_size;
    uint64_t seed;
    uint64_t peers_offset;
    uint64_t probes_offset;     // CapacityProbe[kCapacityProbes]
    uint64_t rows_offset;       // WorkerRow[rows]
    uint64_t counts_offset;     // int32_t[rows][kPeerSlots]
    uint64_t buckets_offset;
    uint64_t buckets;
    uint32_t ways;
    uint32_t entry_size;
    uint32_t rows;
    uint32_t rows_used;         // zone lock
    // Table counters: changed only under the zone lock.
    uint64_t used;
    uint64_t inserts;
    uint64_t evictions;
    uint64_t expiries;
    uint32_t peer_slots_used;
    uint32_t peer_slots_reclaimed;  // slots handed to another peer
    uint64_t peer_slots_missing;    // claims that found no slot
    uint64_t rows_reaped;           // rows of dead workers freed
    uint64_t inflight_recovered;    // their requests given back
    uint64_t rows_missing;          // workers that found no row
    uint64_t last_reap;             // atomic: seconds, last look for dead
    uint64_t last_poll;             // atomic: ms, last poll of the engines
    uint64_t fallbacks[AFFINITY_FALLBACKS]; // atomic: by affinity_fallback_e
    // Under the zone lock (routing and the status hold it to read).
    InstanceSeen instances[kInstanceSlots];
    // What this instance's unheard requests met (affinity_zone_unheard_met):
    // the other instances' requests in the high 32 bits, the unheard ones
    // in the low.  Written under the zone lock, read lock-free.
    uint64_t unheard_met;
    // The instance's id in the store's messages: a one-way function of the
    // seed, which it must not reveal (the seed places keys in buckets).
    uint64_t instance;
    uint64_t conflicts;         // response ids refused to another peer
    // How many of this instance's requests were unheard as it routed one,
    // in the recent mean, in 1/kBesideUnit (Zone::learn_beside()).  Under
    // the zone lock.
    uint64_t unheard_beside;
};

static_assert(sizeof(ZoneHeader) % 64 == 0, "the header fills lines");

// The unheard requests' lessons (ZoneHeader::unheard_met): trusted once
// kUnheardTrusted unheard requests are learned from, halved, the others'
// they met with them, at kUnheardKept, so that the later ones weigh as
// much as all before.
constexpr uint32_t kUnheardTrusted = 64;
constexpr uint32_t kUnheardKept = 1024;

// Below this many of the others' requests per other instance beside each
// unheard one, in the lessons' mean, the front is taken to keep each
// session on one instance, and the mean is presumed; above, one per other
// instance, as before anything is learned.  A front that keeps sessions
// meets next to none; requests spread one by one meet far more, and there
// the mean understates the bursts (docs/routing.md, "Several instances").
constexpr double kKeptFrontBelow = 0.05;

// ZoneHeader::unheard_beside: a mean in fixed point, each routing decision
// weighing 1/kBesideDecay of it, so that it follows the traffic within a
// few dozen requests.
constexpr uint64_t kBesideUnit = 1024;
constexpr uint64_t kBesideDecay = 32;

constexpr size_t kRoutes = AFFINITY_ROUTES;

// A prompt sent a peer, watched until a later prompt that extends it goes
// there again: the peer's reply then tells whether it still held it, and
// how far its cache's clock had run since (cache_model.h).  A zone keeps a
// pool of them for all its peers.
struct CapacityProbe {
    uint32_t key;               // the prompt's longest level (its key's
                                // low half, odd); 0: free
    uint32_t length;            // characters of that level
    uint64_t fill;              // the peer's clock after it
    uint32_t since;             // seconds
    uint32_t slot;              // the peer's slot
};

constexpr size_t kCapacityProbes = 128;

struct alignas(64) PeerSlot {
    uint64_t id;                // 0 = free
    int64_t inflight;           // atomic
    uint64_t requests;          // atomic
    int64_t pins;               // entries pinned to this peer (zone lock)
    uint64_t failures;          // atomic: tries that failed
    uint64_t last_used;         // atomic: seconds, last claim or request
    uint64_t routes[kRoutes];   // atomic: requests by routing outcome
    // The engine's own load, as it last reported it (affinity_metrics),
    // and the in-flight count here when it was asked.  Atomic, one by one:
    // a reader may see a figure with the previous one's base, off by the
    // requests sent in between, for one routing decision.
    int64_t engine_load;        // running + waiting
    int64_t engine_base;        // inflight when it was asked
    uint64_t engine_time;       // seconds; 0: never reported
    uint64_t engine_asked;      // ms of the wall clock it was asked at
    // The ask whose answer has not come yet (0: none), and the others'
    // news since it: what the figure it answers will not show (zone lock).
    uint64_t engine_asking;
    int64_t others_since_asking;
    uint64_t cache_usage;       // per million
    // Requests other nginx instances said (affinity_store) they sent the
    // peer since its engine was last asked, less those they said ended
    // since: its figure does not show them yet.  Below zero when more
    // ended.
    int64_t engine_others;      // atomic
    // Requests this instance sent the peer whose news (a SENT message) it
    // has not yet read back from the store: the other instances may not
    // have read it either, and cannot count them yet.
    // One atomic word: the count in the low 32 bits, in the high ones how
    // many times it was cleared (unheard_count(), clear_unheard()).
    // Cleared when the engine reports, so that a worker that died before
    // its news was read leaves nothing behind for long; the news of a
    // request counted before a clear takes nothing off after it
    // (affinity_zone_peer_heard()).
    uint64_t unheard;
    // Characters of prompts sent the peer that its cache was not presumed
    // to hold (cache_model.h): the clock of its cache's modelled LRU.  In
    // the prefix zone, under its lock.
    uint64_t cache_fill;
    // The tokens its KV cache holds, as its engine last reported them; 0:
    // never.  Atomic.  Copied into the prefix zone's slot by the cache
    // model, for what other instances record there (affinity_store).
    uint64_t cache_tokens;
    // The engine's own count of prompt tokens computed, as of its last
    // report (low 32 bits, modulo 2^32), and where the clock would be had
    // it counted only those (high 32 bits, in characters, modulo 2^32):
    // cache_model.h.  0: no report yet.  In the prefix zone, under its
    // lock.
    uint64_t engine_mark;
    // What the peer's replies told of its cache, when neither the
    // configuration nor its engine gives its size (cache_model.h).  In the
    // prefix zone, under its lock.
    uint64_t stamp_base;        // its clock when the unit was set, and
    uint8_t stamp_offset;       // its stamp then: the stamps recorded
                                // before keep their ages
    uint8_t probes;             // in the zone's pool
    uint32_t learned;           // characters of its clock a prefix lasts;
                                // 0: no eviction seen yet
    uint32_t held_age;          // the oldest prefix found held
    uint32_t learned_unit;      // characters of its clock per stamp; 0:
                                // not modelled yet
    // Characters of prompts sent the peer, not presumed held, whose first
    // byte has not come yet: the prefill a request sent now waits behind.
    // Atomic, in the counter zone; read as 0 while the peer is idle, as a
    // worker that died with tries open leaves them counted.
    int64_t backlog;
    // What its replies taught of its speed (peer_pace.h), on a line of
    // its own: written at each reply's end, read at each decision.
    alignas(64) PeerPace pace;
};

static_assert(sizeof(PeerSlot) == 320, "a peer slot is five cache lines");

// The owner of a worker row: a process, known by its pid and its start
// time (so that a pid the system gave to another process is not taken for
// the dead worker).  pid 0: the row is free.
struct WorkerRow {
    uint64_t pid;               // atomic
    uint64_t start;             // process start time, 0 if unknown
    uint64_t claimed;           // seconds
    uint64_t reserved;
};

// Atomic helpers for counters in shared memory.  The values are plain
// integers in the region (POD), updated with the compiler's builtins.
template <typename T>
inline T atomic_load(const T *v) noexcept
{
    return __atomic_load_n(v, __ATOMIC_RELAXED);
}

template <typename T>
inline void atomic_store(T *v, T value) noexcept
{
    __atomic_store_n(v, value, __ATOMIC_RELAXED);
}

template <typename T>
inline void atomic_add(T *v, T delta) noexcept
{
    __atomic_fetch_add(v, delta, __ATOMIC_RELAXED);
}

// PeerSlot::backlog as routing, the status and the estimates read it:
// none while the peer has nothing in flight, never below zero.
inline uint64_t backlog_ahead(const PeerSlot &s) noexcept
{
    return atomic_load(&s.inflight) > 0
           ? uint64_t(std::max<int64_t>(atomic_load(&s.backlog), 0)) : 0;
}

// Whether a peer's engine figure is fresh: reported within engine_ttl
// seconds of now (0: none is polled).
inline bool engine_fresh(const PeerSlot &s, uint32_t engine_ttl,
                         uint64_t now) noexcept
{
    uint64_t reported = atomic_load(&s.engine_time);

    return engine_ttl && reported && now <= reported + engine_ttl;
}

// The requests in flight on a peer as routing counts them: those counted
// here, or, while its engine's figure is fresh, that figure moved by the
// requests that started and ended here since and by those the other
// instances said started and ended there (affinity_store).  Never below
// the count here, nor below zero (a worker killed while counting,
// worker_rows.h).
inline int64_t counted_inflight(const PeerSlot &s, uint32_t engine_ttl,
                                uint64_t now) noexcept
{
    int64_t n = std::max<int64_t>(atomic_load(&s.inflight), 0);

    if (engine_fresh(s, engine_ttl, now)) {
        int64_t here = n - atomic_load(&s.engine_base);
        int64_t others = atomic_load(&s.engine_others);

        n = std::max<int64_t>(n, atomic_load(&s.engine_load) + here + others);
    }

    return n;
}

// PeerSlot::unheard: the count, and one clear (the count's epoch).
constexpr uint64_t kUnheardCount = 0xffffffffu;
constexpr uint64_t kUnheardEpoch = kUnheardCount + 1;

inline int64_t unheard_count(uint64_t word) noexcept
{
    return int64_t(word & kUnheardCount);
}

// Sets the count to zero in a new epoch.
inline void clear_unheard(uint64_t *word) noexcept
{
    uint64_t w = atomic_load(word);

    while (!__atomic_compare_exchange_n(word, &w,
                                        (w & ~kUnheardCount) + kUnheardEpoch,
                                        true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
    {
    }
}

class Zone {
public:
    explicit Zone(void *region) noexcept
        : header_(static_cast<ZoneHeader *>(region)) {}

    // Implements affinity_zone_attach(): lays a new zone out in a region
    // (rows: worker rows wanted, fewer if the region is small), or checks
    // the one an earlier cycle left there.
    static affinity_attach_e attach(void *region, size_t size, uint32_t kind,
                                    uint32_t rows, char *err,
                                    size_t err_len) noexcept;

    ZoneHeader &header() const noexcept { return *header_; }

    PeerSlot *peer_slots() const noexcept
    {
        return at<PeerSlot>(header_->peers_offset);
    }

    CapacityProbe *probes() const noexcept
    {
        return at<CapacityProbe>(header_->probes_offset);
    }

    WorkerRow *rows() const noexcept
    {
        return at<WorkerRow>(header_->rows_offset);
    }

    // The in-flight counts of worker row `row`, one per peer slot.
    int32_t *counts(uint32_t row) const noexcept
    {
        return at<int32_t>(header_->counts_offset) + size_t(row) * kPeerSlots;
    }

    template <typename Bucket>
    Bucket *buckets() const noexcept
    {
        return at<Bucket>(header_->buckets_offset);
    }

    // The bucket of a key: multiply-shift maps the 64-bit hash onto
    // [0, buckets) without a division.
    template <typename Bucket>
    Bucket &bucket_of(uint64_t key) const noexcept
    {
        uint64_t index = static_cast<uint64_t>(
            (static_cast<unsigned __int128>(key) * header_->buckets) >> 64);
        return buckets<Bucket>()[index];
    }

    // Finds or claims the counter slot of a peer (caller holds the zone
    // lock).  With every slot taken, the one unused longest, with nothing
    // in flight and no request for kSlotReclaimIdle seconds, is given to
    // the new peer: peers that come and go (servers with "resolve") must
    // not use up the table.  kNoSlot if none can be had (counted).
    uint32_t claim_slot(uint64_t peer_id, uint64_t now) noexcept;

    // Slot of a peer id, or kNoSlot.  Caller holds the zone lock.
    uint32_t find_slot(uint64_t peer_id) const noexcept;

    // Whether slot is the counter slot of peer_id (lock-free).
    bool owns(uint32_t slot, uint64_t peer_id) const noexcept
    {
        return slot < kPeerSlots
               && atomic_load(&peer_slots()[slot].id) == peer_id;
    }

    // One request more or less in flight on a slot, counted in the row of
    // the worker that holds it too (lock-free).  row may be kNoRow.
    void acquire(uint32_t row, uint32_t slot, uint32_t route,
                 uint64_t now, uint32_t backlog = 0) noexcept;

    // A request's first token came, or it ended without one: its backlog
    // characters leave the slot's (lock-free).
    void started(uint32_t slot, uint32_t backlog) noexcept;
    void release(uint32_t row, uint32_t slot) noexcept;

    void add_pins(uint64_t peer_id, int64_t delta) noexcept;

    // The nginx instances routing to this zone's peers as of now (seconds):
    // this one and those heard from in the last kInstanceMemory seconds,
    // through the store of any upstream that counts in the zone.
    uint32_t instances(uint64_t now) const noexcept;

    // A message of another instance was read at now (seconds): remembered
    // among the instances heard from (caller holds the zone lock).
    void instance_seen(uint64_t instance, uint32_t now) noexcept;

    // One more of this instance's requests on slot that the store has not
    // yet carried to the others (PeerSlot::unheard), lock-free: a ticket
    // to hand back to hear_unheard() once, when it is read back or lost
    // (0: nothing counted).
    uintptr_t announce_unheard(uint32_t slot) noexcept;
    void hear_unheard(uintptr_t ticket) noexcept;

    // The other instances' requests presumed beside each of this one's
    // unheard requests on a peer, with instances routing: what they were
    // found to meet, from kUnheardTrusted of them, when that is next to
    // nothing (kKeptFrontBelow), else one per other instance, as until
    // then (affinity_zone_unheard_presumed()).
    void learn_unheard(uint32_t unheard, uint32_t others) noexcept;
    double unheard_presumed(uint32_t instances, uint32_t *unheard = nullptr,
                            uint32_t *met = nullptr) const noexcept;

    // This instance routes a request with own of its requests unheard
    // (none but its own count): returns the recent mean of that count,
    // this one in it (caller holds the zone lock).
    double learn_beside(int64_t own) noexcept;
    double unheard_beside() const noexcept
    {
        return double(header_->unheard_beside) / double(kBesideUnit);
    }

    void hand_over(PeerSlot &slot, uint64_t peer_id, uint64_t now) noexcept;

    uint64_t key_hash(const void *key, size_t len) const noexcept;

private:
    static affinity_attach_e initialize(void *region, size_t size,
                                        uint32_t kind, uint32_t rows,
                                        uint64_t seed, char *err,
                                        size_t err_len) noexcept;
    static affinity_attach_e validate(const void *region, size_t size,
                                      uint32_t kind, char *err,
                                      size_t err_len) noexcept;

    template <typename T>
    T *at(uint64_t offset) const noexcept
    {
        return reinterpret_cast<T *>(reinterpret_cast<char *>(header_)
                                     + offset);
    }

    ZoneHeader *header_;
};

}  // namespace affinity

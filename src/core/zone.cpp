#include "zone.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <openssl/rand.h>
#include <openssl/sha.h>

#include "hashing.h"
#include "prefix_table.h"
#include "session_table.h"
#include "trace.h"

namespace affinity {

namespace {

// Both tables share one geometry: 8 ways of 32-byte entries.
static_assert(sizeof(SessionBucket) == sizeof(PrefixBucket)
                  && kSessionWays == kPrefixWays,
              "session and prefix zones share their geometry");

constexpr size_t kRowBytes = sizeof(WorkerRow) + kPeerSlots * sizeof(int32_t);

// The instance's id, from the seed: what the store's readers may see.
uint64_t instance_of(uint64_t seed) noexcept
{
    static const char label[] = "nginx affinity instance";
    unsigned char in[sizeof(label) + sizeof(seed)];
    unsigned char digest[SHA256_DIGEST_LENGTH];
    uint64_t id;

    std::memcpy(in, label, sizeof(label));
    std::memcpy(in + sizeof(label), &seed, sizeof(seed));
    SHA256(in, sizeof(in), digest);
    std::memcpy(&id, digest, sizeof(id));

    return id ? id : 1;
}

size_t align64(size_t n) noexcept
{
    return (n + 63) & ~size_t{63};
}

void set_error(char *err, size_t err_len, const char *what) noexcept
{
    if (err && err_len) {
        std::snprintf(err, err_len, "%s", what);
    }
}

struct Layout {
    uint32_t rows;
    uint64_t rows_offset;
    uint64_t counts_offset;
    uint64_t buckets_offset;
    uint64_t buckets;
};

// The peer slots follow the header, and the pool of capacity probes the
// slots.
constexpr size_t kProbesOffset = sizeof(ZoneHeader)
                                 + kPeerSlots * sizeof(PeerSlot);

// Where everything goes in a region of size bytes.  The worker rows take at
// most a quarter of the space after the peer slots; the table, the rest.
Layout layout_for(size_t size, uint32_t rows) noexcept
{
    Layout l{};
    size_t fixed = align64(kProbesOffset
                           + kCapacityProbes * sizeof(CapacityProbe));
    size_t room = size > fixed ? size - fixed : 0;

    rows = std::clamp(rows, kMinWorkerRows, kMaxWorkerRows);
    rows = std::min<size_t>(rows, std::max<size_t>(room / 4 / kRowBytes,
                                                   kMinWorkerRows));

    l.rows = rows;
    l.rows_offset = fixed;
    l.counts_offset = align64(l.rows_offset + rows * sizeof(WorkerRow));
    l.buckets_offset = align64(l.counts_offset
                               + size_t(rows) * kPeerSlots * sizeof(int32_t));
    l.buckets = size > l.buckets_offset
                ? (size - l.buckets_offset) / sizeof(SessionBucket) : 0;

    return l;
}

}  // namespace

affinity_attach_e Zone::attach(void *region, size_t size, uint32_t kind,
                                 uint32_t rows, char *err,
                                 size_t err_len) noexcept
{
    if (region == nullptr || reinterpret_cast<uintptr_t>(region) % 64 != 0
        || size < AFFINITY_ZONE_MIN_SIZE)
    {
        set_error(err, err_len, "the zone is too small or misaligned");
        return AFFINITY_ATTACH_TOO_SMALL;
    }

    const ZoneHeader *h = static_cast<const ZoneHeader *>(region);

    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == kZoneMagic) {
        return validate(region, size, kind, err, err_len);
    }

    uint64_t seed;

    if (RAND_bytes(reinterpret_cast<unsigned char *>(&seed), sizeof(seed))
        != 1)
    {
        // Any seed works for correctness; a random one only makes the
        // bucket of a key unpredictable to clients.
        seed = reinterpret_cast<uintptr_t>(region) ^ kZoneMagic;
    }

    return initialize(region, size, kind, rows, seed, err, err_len);
}

affinity_attach_e Zone::initialize(void *region, size_t size, uint32_t kind,
                                   uint32_t rows, uint64_t seed, char *err,
                                   size_t err_len) noexcept
{
    Layout l = layout_for(size, rows);

    if (l.buckets == 0) {
        set_error(err, err_len, "the zone is too small for a table");
        return AFFINITY_ATTACH_TOO_SMALL;
    }

    std::memset(region, 0,
                l.buckets_offset + l.buckets * sizeof(SessionBucket));

    ZoneHeader *h = static_cast<ZoneHeader *>(region);
    h->layout_version = kLayoutVersion;
    h->kind = kind;
    h->region_size = size;
    h->seed = seed;
    h->instance = instance_of(seed);
    h->peers_offset = sizeof(ZoneHeader);
    h->probes_offset = kProbesOffset;
    h->rows_offset = l.rows_offset;
    h->counts_offset = l.counts_offset;
    h->buckets_offset = l.buckets_offset;
    h->buckets = l.buckets;
    h->ways = kSessionWays;
    h->entry_size = sizeof(SessionEntry);
    h->rows = l.rows;

    // The magic goes last: a region holds a zone only once it is complete.
    __atomic_store_n(&h->magic, kZoneMagic, __ATOMIC_RELEASE);

    return AFFINITY_ATTACH_CREATED;
}

affinity_attach_e Zone::validate(const void *region, size_t size,
                                 uint32_t kind, char *err,
                                 size_t err_len) noexcept
{
    const ZoneHeader &h = *static_cast<const ZoneHeader *>(region);
    char reason[160];

    if (h.layout_version != kLayoutVersion) {
        std::snprintf(reason, sizeof(reason),
                      "the zone has layout version %u, this module uses %u",
                      h.layout_version, kLayoutVersion);

    } else if (h.kind != kind) {
        std::snprintf(reason, sizeof(reason),
                      "the zone holds a table of another kind");

    } else if (h.region_size != size || h.ways != kSessionWays
               || h.entry_size != sizeof(SessionEntry)
               || h.peers_offset != sizeof(ZoneHeader)
               || h.probes_offset != kProbesOffset
               || h.rows < kMinWorkerRows || h.rows > kMaxWorkerRows
               || h.buckets_offset
                      != layout_for(size, h.rows).buckets_offset)
    {
        std::snprintf(reason, sizeof(reason),
                      "the zone's table geometry differs from this module's");

    } else {
        return AFFINITY_ATTACH_REUSED;
    }

    set_error(err, err_len, reason);
    return AFFINITY_ATTACH_INCOMPATIBLE;
}

uint32_t Zone::claim_slot(uint64_t peer_id, uint64_t now) noexcept
{
    PeerSlot *slots = peer_slots();
    uint32_t start = static_cast<uint32_t>(peer_id % kPeerSlots);
    uint32_t idlest = kNoSlot;

    // Slots are never emptied (a reclaimed one changes hands), so a probe
    // for a peer may stop at the first empty slot, as find_slot() does.
    for (uint32_t i = 0; i < kPeerSlots; i++) {
        uint32_t n = (start + i) % kPeerSlots;
        PeerSlot &slot = slots[n];

        if (slot.id == peer_id) {
            atomic_store(&slot.last_used, now);
            return n;
        }

        if (slot.id == 0) {
            hand_over(slot, peer_id, now);
            header_->peer_slots_used++;
            return n;
        }

        uint64_t used = atomic_load(&slot.last_used);

        if (atomic_load(&slot.inflight) <= 0 && used + kSlotReclaimIdle <= now
            && (idlest == kNoSlot || used < slots[idlest].last_used))
        {
            idlest = n;
        }
    }

    if (idlest == kNoSlot) {
        header_->peer_slots_missing++;
        return kNoSlot;
    }

    // The sessions pinned to the old peer keep its id and move when next
    // seen; its counters go with the slot.
    hand_over(slots[idlest], peer_id, now);
    header_->peer_slots_reclaimed++;

    return idlest;
}

// Gives a slot to a peer, its counters restarted.  Other workers update
// counters without the lock: every field is stored atomically, and the
// in-flight count is moved to zero by an add, not overwritten, so that a
// request a worker counts on the old owner at this very moment (it looked
// the slot up just before) is not lost, and is given back to the same
// slot when it ends.
void Zone::hand_over(PeerSlot &slot, uint64_t peer_id, uint64_t now) noexcept
{
    int64_t inflight = atomic_load(&slot.inflight);

    if (inflight != 0) {
        atomic_add<int64_t>(&slot.inflight, -inflight);
    }

    atomic_store<uint64_t>(&slot.requests, 0);
    atomic_store<uint64_t>(&slot.failures, 0);
    atomic_store<uint64_t>(&slot.last_used, now);
    slot.pins = 0;

    for (uint64_t &count : slot.routes) {
        atomic_store<uint64_t>(&count, 0);
    }

    // The engine's figures, and the count of prompt text sent, were the
    // old peer's.
    atomic_store<uint64_t>(&slot.engine_time, 0);
    atomic_store<uint64_t>(&slot.engine_asked, 0);
    slot.engine_asking = 0;
    slot.others_since_asking = 0;
    atomic_store<int64_t>(&slot.engine_others, 0);
    clear_unheard(&slot.unheard);
    atomic_store<uint64_t>(&slot.cache_fill, 0);
    atomic_store<uint64_t>(&slot.cache_tokens, 0);
    slot.engine_mark = 0;

    // Its probes in the pool were the old peer's prompts.
    uint32_t n = static_cast<uint32_t>(&slot - peer_slots());

    for (size_t i = 0; i < kCapacityProbes; i++) {
        CapacityProbe &probe = probes()[i];

        if (probe.key != 0 && probe.slot == n) {
            probe = CapacityProbe{};
        }
    }

    slot.probes = 0;
    atomic_store<uint32_t>(&slot.learned, 0);
    slot.held_age = 0;
    slot.learned_unit = 0;
    slot.stamp_base = 0;
    slot.stamp_offset = 0;

    // So was its pace.
    uint32_t *pace = reinterpret_cast<uint32_t *>(&slot.pace);

    for (size_t i = 0; i < sizeof(PeerPace) / sizeof(uint32_t); i++) {
        atomic_store<uint32_t>(&pace[i], 0);
    }

    atomic_store(&slot.id, peer_id);
}

uint32_t Zone::find_slot(uint64_t peer_id) const noexcept
{
    const PeerSlot *slots = peer_slots();
    uint32_t start = static_cast<uint32_t>(peer_id % kPeerSlots);

    for (uint32_t i = 0; i < kPeerSlots; i++) {
        const PeerSlot &slot = slots[(start + i) % kPeerSlots];

        if (slot.id == peer_id) {
            return (start + i) % kPeerSlots;
        }

        if (slot.id == 0) {
            break;
        }
    }

    return kNoSlot;
}

// A row has one writer, the worker that owns it (its reaper reads it only
// once that worker is dead): a plain load and store suffice, where the
// slot's counter, shared by all workers, takes an atomic add.
//
// The row is counted first and given back last: a worker that dies between
// the two updates leaves its slot counting one request too few once its
// row is reaped, never one too many.  A count too high would narrow the
// peer's bound for good; one too low is read as zero at worst.
void Zone::acquire(uint32_t row, uint32_t slot, uint32_t route,
                   uint64_t now, uint32_t backlog) noexcept
{
    if (slot >= kPeerSlots) {
        return;
    }

    PeerSlot &s = peer_slots()[slot];

    if (row < header_->rows) {
        int32_t *count = &counts(row)[slot];
        atomic_store(count, atomic_load(count) + 1);

        // the order above, as the instructions run (a kill is a signal)
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
    }

    atomic_store(&s.last_used, now);
    atomic_add<int64_t>(&s.inflight, 1);
    atomic_add<uint64_t>(&s.requests, 1);
    atomic_add<uint64_t>(&s.routes[route % kRoutes], 1);
    atomic_add<int64_t>(&s.backlog, int64_t(backlog));
}

void Zone::started(uint32_t slot, uint32_t backlog) noexcept
{
    if (slot >= kPeerSlots) {
        return;
    }

    // Never below zero: a start whose prompt a clear already took off
    // (release()) must not cancel another's.
    int64_t *word = &peer_slots()[slot].backlog;
    int64_t was = atomic_load(word);

    while (!__atomic_compare_exchange_n(
               word, &was, std::max<int64_t>(was - int64_t(backlog), 0),
               true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    {
    }
}

void Zone::release(uint32_t row, uint32_t slot) noexcept
{
    if (slot >= kPeerSlots) {
        return;
    }

    PeerSlot &s = peer_slots()[slot];

    // The last one out clears the backlog: what a worker that died left
    // there lasts no longer than the peer's next idle moment.  (A count a
    // killed worker left one below the truth reaches zero a request early:
    // the backlog is then low until the next start is counted.)
    if (__atomic_sub_fetch(&s.inflight, 1, __ATOMIC_RELAXED) <= 0) {
        atomic_store<int64_t>(&s.backlog, 0);
    }

    if (row < header_->rows) {
        int32_t *count = &counts(row)[slot];

        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        atomic_store(count, atomic_load(count) - 1);
    }
}

void Zone::add_pins(uint64_t peer_id, int64_t delta) noexcept
{
    uint32_t slot = find_slot(peer_id);

    if (slot != kNoSlot) {
        peer_slots()[slot].pins += delta;
    }
}

void Zone::instance_seen(uint64_t instance, uint32_t now) noexcept
{
    ZoneHeader &h = header();

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

uint32_t Zone::instances(uint64_t now) const noexcept
{
    uint32_t n = 1;

    for (const InstanceSeen &seen : header_->instances) {
        if (seen.id != 0 && now <= seen.seen + kInstanceMemory) {
            n++;
        }
    }

    return n;
}

void Zone::learn_unheard(uint32_t unheard, uint32_t others) noexcept
{
    uint64_t word = atomic_load(&header_->unheard_met);
    uint64_t met = (word >> 32) + others;
    uint64_t lessons = (word & 0xffffffffu) + unheard;

    while (lessons >= kUnheardKept) {
        met /= 2;
        lessons /= 2;
    }

    met = std::min<uint64_t>(met, 0xffffffffu);
    atomic_store(&header_->unheard_met, (met << 32) | lessons);
}

double Zone::learn_beside(int64_t own) noexcept
{
    uint64_t *mean = &header_->unheard_beside;
    uint64_t now = uint64_t(std::max<int64_t>(own, 0)) * kBesideUnit;

    // mean += (now - mean) / kBesideDecay, rounded toward 0: a mean
    // falls to none once its requests are heard in time again.
    if (now >= *mean) {
        *mean += (now - *mean) / kBesideDecay;
    } else {
        *mean -= (*mean - now + kBesideDecay - 1) / kBesideDecay;
    }

    return unheard_beside();
}

double Zone::unheard_presumed(uint32_t instances, uint32_t *unheard,
                              uint32_t *met) const noexcept
{
    uint64_t word = atomic_load(&header_->unheard_met);
    uint32_t n = uint32_t(word & 0xffffffffu);
    double most = double(std::max<uint32_t>(instances, 1) - 1);

    if (unheard != nullptr) {
        *unheard = n;
    }

    if (met != nullptr) {
        *met = uint32_t(word >> 32);
    }

    if (n < kUnheardTrusted) {
        return most;
    }

    double mean = double(word >> 32) / double(n);

    return mean < kKeptFrontBelow * most ? mean : most;
}

uint64_t Zone::key_hash(const void *key, size_t len) const noexcept
{
    uint64_t h = hash64(key, len, header_->seed);
    // 0 marks an empty table entry.
    return h != 0 ? h : 1;
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

uintptr_t Zone::announce_unheard(uint32_t slot) noexcept
{
    if (slot >= kPeerSlots) {
        return 0;
    }

    // A count that reached 2^32 (never) would carry into a new epoch: one
    // clear more.
    uint64_t *unheard = &peer_slots()[slot].unheard;
    uint64_t word = __atomic_fetch_add(unheard, 1, __ATOMIC_RELAXED);

    return ticket_of(slot, word);
}

void Zone::hear_unheard(uintptr_t ticket) noexcept
{
    // Ticket 0 (none) names slot UINT32_MAX.
    uint32_t slot = uint32_t(ticket & kTicketSlots) - 1;

    AFFINITY_TRACE_EVENT("AFH", slot, 0);

    if (slot >= kPeerSlots) {
        return;
    }

    // Only in the epoch it was counted in: an engine's report (or the
    // slot's hand-over to another peer) may have cleared the count while
    // the announcement was on its way, and requests counted since are
    // still unheard.  Never below zero.
    uint64_t *unheard = &peer_slots()[slot].unheard;
    uint64_t word = atomic_load(unheard);

    while (ticket_of(slot, word) == ticket && unheard_count(word) > 0
           && !__atomic_compare_exchange_n(unheard, &word, word - 1, true,
                                           __ATOMIC_RELAXED,
                                           __ATOMIC_RELAXED))
    {
    }
}

}  // namespace affinity

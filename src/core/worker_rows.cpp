#include "worker_rows.h"

namespace affinity {

namespace {

// Gives a row's counts back to the slots and zeroes it.  Returns the
// requests it still counted.
uint64_t drain_row(Zone zone, uint32_t row) noexcept
{
    int32_t *counts = zone.counts(row);
    PeerSlot *slots = zone.peer_slots();
    uint64_t total = 0;

    for (uint32_t slot = 0; slot < kPeerSlots; slot++) {
        int32_t n = atomic_load(&counts[slot]);

        if (n != 0) {
            atomic_add<int64_t>(&slots[slot].inflight, -int64_t(n));
            atomic_store<int32_t>(&counts[slot], 0);
            total += n > 0 ? uint64_t(n) : 0;
        }
    }

    return total;
}

}  // namespace

uint32_t claim_row(Zone zone, uint64_t pid, uint64_t start,
                   uint64_t now) noexcept
{
    ZoneHeader &h = zone.header();
    WorkerRow *rows = zone.rows();
    uint32_t free_row = kNoRow;

    for (uint32_t i = 0; i < h.rows; i++) {
        uint64_t owner = atomic_load(&rows[i].pid);

        if (owner == pid && rows[i].start == start) {
            return i;
        }

        if (owner == 0 && free_row == kNoRow) {
            free_row = i;
        }
    }

    if (free_row == kNoRow) {
        h.rows_missing++;
        return kNoRow;
    }

    // A free row counts nothing: rows are drained when they are freed.
    WorkerRow &row = rows[free_row];
    row.start = start;
    row.claimed = now;
    atomic_store(&row.pid, pid);
    h.rows_used++;

    return free_row;
}

void release_row(Zone zone, uint32_t row, uint64_t pid) noexcept
{
    ZoneHeader &h = zone.header();

    if (row >= h.rows || atomic_load(&zone.rows()[row].pid) != pid) {
        return;
    }

    drain_row(zone, row);
    atomic_store<uint64_t>(&zone.rows()[row].pid, 0);
    h.rows_used--;
}

size_t rows_in_use(Zone zone, affinity_worker_t *out, size_t cap) noexcept
{
    const WorkerRow *rows = zone.rows();
    uint32_t nrows = zone.header().rows;
    size_t n = 0;

    for (uint32_t i = 0; i < nrows && n < cap; i++) {
        uint64_t pid = atomic_load(&rows[i].pid);

        if (pid != 0) {
            out[n++] = {i, 0, pid, atomic_load(&rows[i].start)};
        }
    }

    return n;
}

bool reap_row(Zone zone, const affinity_worker_t &worker,
              uint64_t &recovered) noexcept
{
    ZoneHeader &h = zone.header();

    if (worker.row >= h.rows) {
        return false;
    }

    WorkerRow &row = zone.rows()[worker.row];

    if (atomic_load(&row.pid) != worker.pid || row.start != worker.start) {
        return false;   // freed or claimed again since the caller looked
    }

    recovered = drain_row(zone, worker.row);

    atomic_store<uint64_t>(&row.pid, 0);
    h.rows_used--;
    h.rows_reaped++;
    h.inflight_recovered += recovered;

    return true;
}

bool reap_due(Zone zone, uint64_t now, uint64_t interval) noexcept
{
    uint64_t *last = &zone.header().last_reap;
    uint64_t seen = atomic_load(last);

    if (seen + interval > now) {
        return false;
    }

    return __atomic_compare_exchange_n(last, &seen, now, false,
                                       __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

}  // namespace affinity

// Worker rows: in-flight accounting that survives the death of a worker.
//
// Each worker process claims a row of its zone when it starts.  Every
// request it counts in a peer's slot it also counts in its own row, and it
// gives both back when the request ends.  A worker that dies (a crash, the
// OOM killer, kill -9) gives nothing back: its requests would stay in
// flight forever and narrow the load bound.  Any surviving worker that
// finds the row's owner gone subtracts the row from the slots and frees
// it.  A process is told from another that reused its pid by its start
// time (process.h).
//
// Readers see one counter per peer slot, as before; the rows cost one more
// atomic add per request start and end.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zone.h"

namespace affinity {

// The row of a process (caller holds the zone lock): the one it already
// has, else a free one.  kNoRow when every row is taken (counted).
uint32_t claim_row(Zone zone, uint64_t pid, uint64_t start,
                   uint64_t now) noexcept;

// A worker that exits gives its row back, with whatever it still counts
// (caller holds the zone lock).
void release_row(Zone zone, uint32_t row, uint64_t pid) noexcept;

// The rows in use, as (row, pid, start); lock-free, for a liveness check
// made outside the lock.  Returns how many were written.
size_t rows_in_use(Zone zone, affinity_worker_t *out, size_t cap) noexcept;

// Frees the row of a dead worker if it still belongs to that worker (pid
// and start time), giving its requests back to the slots (caller holds the
// zone lock).  False if the row changed hands since the caller looked;
// recovered is then left alone.
bool reap_row(Zone zone, const affinity_worker_t &worker,
              uint64_t &recovered) noexcept;

// Whether it is the caller's turn to look for dead workers: true for at
// most one caller per interval seconds (lock-free).
bool reap_due(Zone zone, uint64_t now, uint64_t interval) noexcept;

}  // namespace affinity

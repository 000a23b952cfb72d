// Polling the engines' own load, one ask of a peer's engine at a time
// whichever worker makes it, and the other instances' news counted with
// the figure it gave (affinity_engine.h).  Each call but claim_poll with
// the zone lock held.
#pragma once

#include <cstdint>

#include "affinity_core.h"
#include "zone.h"

namespace affinity {

// Whether an ask of the engine of slot waits for its answer at ms.
bool engine_awaiting(Zone zone, uint32_t slot, uint64_t ms,
                     uint64_t answer_within) noexcept;

// The engine of slot is about to be asked at ms: false (asked.ms 0) while
// another ask waits.
bool engine_ask(Zone zone, uint32_t slot, uint64_t ms,
                uint64_t answer_within,
                affinity_engine_asked_t &asked) noexcept;

// The ask gets no answer to take.
void engine_give_up(Zone zone, uint32_t slot,
                    const affinity_engine_asked_t &asked) noexcept;

// The engine answered the ask in asked with load at now (seconds): taken
// only if that ask is the one that waits.
bool engine_answer(Zone zone, uint32_t slot,
                   const affinity_engine_load_t &load, uint32_t now,
                   const affinity_engine_asked_t &asked) noexcept;

// Requests another instance said started (+1) or ended (-1) on peer_id at
// at_ms, counted with its engine's figure until the engine reports again.
void count_elsewhere(Zone zone, uint64_t peer_id, int64_t requests,
                     uint64_t at_ms) noexcept;

// Lock-free: whether it is the caller's turn to poll; true for at most one
// caller per interval.
bool engine_claim_poll(Zone zone, uint64_t now_ms,
                       uint32_t interval_ms) noexcept;

}  // namespace affinity

// Processes, as the worker rows know them: a pid and a start time, so that
// a pid the system reused for another process is not mistaken for the
// worker that had it.
#pragma once

#include <cstdint>

namespace affinity {

// The start time of a process (Linux: clock ticks after boot, from
// /proc/PID/stat), or 0 where the system does not tell.
uint64_t process_start(uint64_t pid) noexcept;

// Whether the process that had pid and started at start (0: unknown) still
// runs.
bool process_alive(uint64_t pid, uint64_t start) noexcept;

}  // namespace affinity

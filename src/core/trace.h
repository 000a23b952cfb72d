// A line on stderr (nginx's error log) for every routing decision and every
// event of the shared state, read by bench/diagnostics/decisions.py.  Only
// in a build made to trace (scripts/build-module.sh --trace, which defines
// AFFINITY_TRACE): elsewhere the calls compile to nothing.
#pragma once

#include <cstdint>

#ifdef AFFINITY_TRACE

namespace affinity {

// "<what> <time> <pid> <slot> <value>": AFP an engine's load was taken,
// AFE another instance's news (+1 sent, -1 ended), AFH an own
// announcement read back.
void trace_event(const char *what, uint32_t slot, int64_t value) noexcept;

}  // namespace affinity

#define AFFINITY_TRACE_EVENT(what, slot, value)                              \
    ::affinity::trace_event(what, slot, value)

#else

#define AFFINITY_TRACE_EVENT(what, slot, value)  ((void) 0)

#endif

#include "trace.h"

#ifdef AFFINITY_TRACE

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>

#include "selection.h"

namespace affinity {

namespace {

// Seconds of the wall clock with microseconds, as the mock replicas write
// them (bench/sim/mock_backend.py), so that both traces interleave.
struct WallTime {
    long long sec;
    long usec;
};

WallTime wall_time() noexcept
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return {static_cast<long long>(ts.tv_sec), ts.tv_nsec / 1000};
}

// One write(2) a line, so that the workers' lines do not mix.
void write_line(char *buf, size_t size, int len) noexcept
{
    if (len < 0) {
        return;
    }

    size_t n = std::min<size_t>(size_t(len), size - 1);
    buf[n++] = '\n';
    (void) !write(2, buf, n);
}

}  // namespace

void trace_event(const char *what, uint32_t slot, int64_t value) noexcept
{
    WallTime t = wall_time();
    char buf[128];
    int len = snprintf(buf, sizeof(buf), "%s %lld.%06ld %d %u %lld", what,
                       t.sec, t.usec, int(getpid()), slot,
                       static_cast<long long>(value));

    write_line(buf, sizeof(buf), len);
}

// "AFX <time> <pid> c=<chosen> r=<route> p=<presumed per unheard>
// sh=<share>", then for each peer "<index>@<slot>:<load>/<unheard>/
// <inflight>/<engine load>/<engine base>/<engine others>/<engine time>".
void LoadBound::trace(Zone zone, size_t chosen, int route) const noexcept
{
    WallTime t = wall_time();
    char buf[1024];
    int len = snprintf(buf, sizeof(buf), "AFX %lld.%06ld %d c=%zu r=%d "
                       "p=%.3f sh=%.3f", t.sec, t.usec, int(getpid()), chosen,
                       route, presumed_, share_per_weight_);

    for (size_t i = 0; i < npeers_ && len > 0 && len < 900; i++) {
        if (slots_[i] == kNoSlot) {
            continue;
        }

        const PeerSlot &s = zone.peer_slots()[slots_[i]];

        len += snprintf(buf + len, sizeof(buf) - size_t(len),
                        " %zu@%u:%lld/%lld/%lld/%lld/%lld/%lld/%llu", i,
                        slots_[i], static_cast<long long>(inflight_[i]),
                        static_cast<long long>(unheard_[i]),
                        static_cast<long long>(atomic_load(&s.inflight)),
                        static_cast<long long>(atomic_load(&s.engine_load)),
                        static_cast<long long>(atomic_load(&s.engine_base)),
                        static_cast<long long>(atomic_load(&s.engine_others)),
                        static_cast<unsigned long long>(
                            atomic_load(&s.engine_time)));
    }

    write_line(buf, sizeof(buf), len);
}

}  // namespace affinity

#endif

// fuzz_engine_metrics: an inference engine's Prometheus text (/metrics),
// which a replica -- or whatever answers on its port -- sends back when
// polled (affinity_engine_metrics).
//
// The input is the text, copied into a heap block of its exact size so
// that AddressSanitizer reports any read past it.  Checked: the figures
// are finite and not negative, the cache usage within 0..1, the cache's
// size and the prefix cache's counters set exactly when their flags are,
// no more hits than queries, and the answer is 0 exactly when running or
// waiting requests were found.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "affinity_core.h"

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond)) {                                                      \
            __builtin_printf("fuzz_engine_metrics: check failed: %s "       \
                             "(line %d)\n", #cond, __LINE__);               \
            __builtin_trap();                                               \
        }                                                                   \
    } while (0)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = static_cast<char *>(std::malloc(size ? size : 1));
    CHECK(text != nullptr);
    if (size) {
        std::memcpy(text, data, size);
    }

    affinity_engine_load_t load;
    int rc = affinity_engine_metrics(text, size, &load);

    CHECK(std::isfinite(load.running) && load.running >= 0);
    CHECK(std::isfinite(load.waiting) && load.waiting >= 0);
    CHECK(load.cache_usage >= 0 && load.cache_usage <= 1);
    CHECK((load.found & ~uint32_t(AFFINITY_ENGINE_RUNNING
                                   | AFFINITY_ENGINE_WAITING
                                   | AFFINITY_ENGINE_CACHE
                                   | AFFINITY_ENGINE_CAPACITY
                                   | AFFINITY_ENGINE_COMPUTED)) == 0);
    CHECK((rc == 0) == ((load.found & 3) != 0));
    if (!(load.found & AFFINITY_ENGINE_RUNNING)) {
        CHECK(load.running == 0);
    }
    if (!(load.found & AFFINITY_ENGINE_CACHE)) {
        CHECK(load.cache_usage == 0);
    }
    CHECK(load.cache_tokens >= 0 && load.cache_tokens <= 1e15);
    CHECK((load.cache_tokens >= 1)
          == ((load.found & AFFINITY_ENGINE_CAPACITY) != 0));
    CHECK(std::isfinite(load.queried_tokens)
          && std::isfinite(load.hit_tokens));
    if (load.found & AFFINITY_ENGINE_COMPUTED) {
        CHECK(load.hit_tokens >= 0 && load.hit_tokens <= load.queried_tokens);
    } else {
        CHECK(load.queried_tokens == 0 && load.hit_tokens == 0);
    }

    std::free(text);
    return 0;
}

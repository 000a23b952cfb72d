#include "engine_metrics.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <string_view>

namespace affinity {

namespace {

enum class Gauge { None, Running, Waiting, Cache };

Gauge gauge_of(std::string_view name) noexcept
{
    struct Name {
        std::string_view name;
        Gauge gauge;
    };
    static constexpr Name kNames[] = {
        {"vllm:num_requests_running", Gauge::Running},
        {"vllm:num_requests_waiting", Gauge::Waiting},
        {"vllm:kv_cache_usage_perc", Gauge::Cache},
        {"vllm:gpu_cache_usage_perc", Gauge::Cache},
        {"sglang:num_running_reqs", Gauge::Running},
        {"sglang:num_queue_reqs", Gauge::Waiting},
        {"sglang:token_usage", Gauge::Cache},
    };

    for (const Name &n : kNames) {
        if (n.name == name) {
            return n.gauge;
        }
    }
    return Gauge::None;
}

// The end of a label set starting after '{': quoted values may hold '}'
// and escaped quotes.  nullptr if the line ends first.
const char *labels_end(const char *p, const char *end) noexcept
{
    bool quoted = false;

    for (; p < end; p++) {
        if (quoted) {
            if (*p == '\\') {
                p++;
            } else if (*p == '"') {
                quoted = false;
            }
        } else if (*p == '"') {
            quoted = true;
        } else if (*p == '}') {
            return p + 1;
        }
    }
    return nullptr;
}

// One sample line: NAME[{labels}] VALUE [TIMESTAMP].
void sample(const char *p, const char *end, affinity_engine_load_t &load)
    noexcept
{
    const char *name = p;

    while (p < end && *p != '{' && *p != ' ' && *p != '\t') {
        p++;
    }

    Gauge gauge = gauge_of(std::string_view(name, size_t(p - name)));

    if (gauge == Gauge::None) {
        return;
    }

    if (p < end && *p == '{') {
        p = labels_end(p + 1, end);
        if (p == nullptr) {
            return;
        }
    }

    while (p < end && (*p == ' ' || *p == '\t')) {
        p++;
    }

    const char *value = p;

    while (p < end && *p != ' ' && *p != '\t') {
        p++;
    }

    double v = 0;
    auto [stop, ec] = std::from_chars(value, p, v);

    if (ec != std::errc() || stop != p || !std::isfinite(v) || v < 0) {
        return;
    }

    switch (gauge) {
    case Gauge::Running:
        load.running += v;
        load.found |= AFFINITY_ENGINE_RUNNING;
        break;
    case Gauge::Waiting:
        load.waiting += v;
        load.found |= AFFINITY_ENGINE_WAITING;
        break;
    case Gauge::Cache:
        load.cache_usage = std::max(load.cache_usage, std::min(v, 1.0));
        load.found |= AFFINITY_ENGINE_CACHE;
        break;
    case Gauge::None:
        break;
    }
}

}  // namespace

bool parse_engine_metrics(const char *text, size_t len,
                          affinity_engine_load_t &load) noexcept
{
    load = affinity_engine_load_t{};

    if (text == nullptr) {
        return false;
    }

    const char *p = text;
    const char *end = text + len;

    while (p < end) {
        const char *eol = static_cast<const char *>(
            std::memchr(p, '\n', size_t(end - p)));
        const char *line_end = eol ? eol : end;
        const char *q = p;

        while (q < line_end && (*q == ' ' || *q == '\t')) {
            q++;
        }

        if (q < line_end && *q != '#') {
            const char *last = line_end;
            if (last > q && last[-1] == '\r') {
                last--;
            }
            sample(q, last, load);
        }

        p = eol ? eol + 1 : end;
    }

    return (load.found & (AFFINITY_ENGINE_RUNNING | AFFINITY_ENGINE_WAITING))
           != 0;
}

}  // namespace affinity

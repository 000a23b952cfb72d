#include "engine_metrics.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <string_view>

namespace affinity {

namespace {

enum class Gauge {
    None,
    Running,
    Waiting,
    Cache,
    Capacity,
    CacheConfig,
    Queried,
    Hit
};

// Far above the tokens any engine computes in its life: a larger count is
// junk.
constexpr double kMaxCountTokens = 1e17;

// Each of the prefix cache's two counters, until both are read.
constexpr uint32_t kQueried = 1u << 16;
constexpr uint32_t kHit = 1u << 17;

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
        {"vllm:cache_config_info", Gauge::CacheConfig},
        {"sglang:max_total_num_tokens", Gauge::Capacity},
        {"vllm:prefix_cache_queries_total", Gauge::Queried},
        {"vllm:prefix_cache_hits_total", Gauge::Hit},
        {"sglang:prompt_tokens_total", Gauge::Queried},
        {"sglang:cached_tokens_total", Gauge::Hit},
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

// The number a label of [p, end) (a label set without its braces) holds:
// NAME="VALUE".  NaN if the set does not have it, or it is not a number.
double label_number(const char *p, const char *end, std::string_view name)
    noexcept
{
    while (p < end) {
        while (p < end && (*p == ' ' || *p == ',')) {
            p++;
        }

        const char *label = p;

        while (p < end && *p != '=') {
            p++;
        }

        std::string_view found(label, size_t(p - label));

        if (p + 1 >= end || p[1] != '"') {
            break;
        }

        const char *value = p + 2;

        for (p = value; p < end && *p != '"'; p++) {
            if (*p == '\\') {
                p++;
            }
        }

        if (p >= end) {
            break;
        }

        if (found == name) {
            double v = 0;
            auto [stop, ec] = std::from_chars(value, p, v);

            return ec == std::errc() && stop == p ? v : std::nan("");
        }

        p++;
    }

    return std::nan("");
}

// The tokens of a KV cache vLLM describes in cache_config_info's labels:
// num_gpu_blocks blocks of block_size tokens.  NaN if not told.
double vllm_cache_tokens(const char *labels, const char *end) noexcept
{
    double blocks = label_number(labels, end, "num_gpu_blocks");
    double block_size = label_number(labels, end, "block_size");

    return blocks > 0 && block_size > 0 ? blocks * block_size : std::nan("");
}

void add_cache_tokens(double tokens, affinity_engine_load_t &load) noexcept
{
    if (std::isfinite(tokens) && tokens >= 1
        && load.cache_tokens + tokens <= kMaxCacheTokens)
    {
        load.cache_tokens += tokens;
        load.found |= AFFINITY_ENGINE_CAPACITY;
    }
}

// One label set's value, added to the sum: a value above most, which no
// engine reaches, is junk and skipped (the sum of a page's worth of them
// stays finite).
void add_count(double v, double most, uint32_t flag, double &sum,
               uint32_t &found) noexcept
{
    if (v <= most) {
        sum += v;
        found |= flag;
    }
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
        const char *labels = p + 1;

        p = labels_end(labels, end);
        if (p == nullptr) {
            return;
        }

        // An info metric: what it says is in its labels.
        if (gauge == Gauge::CacheConfig) {
            add_cache_tokens(vllm_cache_tokens(labels, p - 1), load);
            return;
        }
    }

    if (gauge == Gauge::CacheConfig) {
        return;
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
        add_count(v, kMaxRequests, AFFINITY_ENGINE_RUNNING, load.running,
                  load.found);
        break;
    case Gauge::Waiting:
        add_count(v, kMaxRequests, AFFINITY_ENGINE_WAITING, load.waiting,
                  load.found);
        break;
    case Gauge::Cache:
        load.cache_usage = std::max(load.cache_usage, std::min(v, 1.0));
        load.found |= AFFINITY_ENGINE_CACHE;
        break;
    case Gauge::Capacity:
        add_cache_tokens(v, load);
        break;
    case Gauge::Queried:
        add_count(v, kMaxCountTokens, kQueried, load.queried_tokens,
                  load.found);
        break;
    case Gauge::Hit:
        add_count(v, kMaxCountTokens, kHit, load.hit_tokens, load.found);
        break;
    case Gauge::None:
    case Gauge::CacheConfig:
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

        // Every line ends with a line feed, the last one too: a line
        // without one is a page cut short, its number maybe cut too.
        if (eol == nullptr) {
            break;
        }

        const char *line_end = eol;
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

        p = eol + 1;
    }

    // The tokens computed are the difference of two counters: only with
    // both, and never below zero.
    if ((load.found & (kQueried | kHit)) == (kQueried | kHit)
        && load.hit_tokens <= load.queried_tokens)
    {
        load.found |= AFFINITY_ENGINE_COMPUTED;
    }

    load.found &= ~(kQueried | kHit);

    if ((load.found & AFFINITY_ENGINE_COMPUTED) == 0) {
        load.queried_tokens = 0;
        load.hit_tokens = 0;
    }

    return (load.found & (AFFINITY_ENGINE_RUNNING | AFFINITY_ENGINE_WAITING))
           != 0;
}

}  // namespace affinity

// The load an inference engine reports about itself, read from its
// Prometheus text (/metrics): requests running and waiting, how full its
// KV cache is, and how large.  Several nginx instances each see only their own
// requests; the engine sees everyone's.
//
// Names read (summed over label sets, e.g. one per engine of a
// data-parallel server; the cache usage is the largest):
//   running  vllm:num_requests_running   sglang:num_running_reqs
//   waiting  vllm:num_requests_waiting   sglang:num_queue_reqs
//   cache    vllm:kv_cache_usage_perc    vllm:gpu_cache_usage_perc (older)
//            sglang:token_usage
//   its KV cache's size in tokens (summed)
//            vllm:cache_config_info's labels num_gpu_blocks x block_size
//            sglang:max_total_num_tokens
//   prompt tokens looked up in its prefix cache, and found there
//            vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total
//            sglang:prompt_tokens_total, sglang:cached_tokens_total
// Everything else is skipped, and a last line without its line feed (a page
// cut short).  The text comes from a server over the
// network: the parser reads only inside [text, text + len) and is fuzzed.
#pragma once

#include <cstddef>

#include "affinity_core.h"

namespace affinity {

// Far above any engine's KV cache, in tokens: a larger figure is junk.
constexpr double kMaxCacheTokens = 1e15;

// Far above the requests any engine runs or queues: a larger figure is
// junk.
constexpr double kMaxRequests = 1e9;

bool parse_engine_metrics(const char *text, size_t len,
                          affinity_engine_load_t &load) noexcept;

}  // namespace affinity

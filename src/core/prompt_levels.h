// Prompt prefixes of an OpenAI-style request body, hashed at levels.
//
// The canonical prompt text makes equal prompts hash equally whatever the
// client's JSON encoding (escapes, key order, whitespace, extra fields):
//
//   "model" US model RS
//   "tool" US compact-json RS              for each element of "tools"
//   role US text RS                        for each message; text is the
//                                          string content, or the content
//                                          parts in order: text parts as
//                                          they are, other parts as
//                                          GS type ":" hash-of-url-or-data GS
//   "prompt" US text RS                    completions: "prompt" (a string,
//                                          or the first element of a list)
//   "instructions" US text RS, then the "input" string as a user message or
//                                          its items as messages (items
//                                          without a role: type US json RS)
//
// with US = 0x1f, RS = 0x1e, GS = 0x1d.  Lengths count Unicode code points.
// A level of length L is the XXH3 hash (fixed seed) of the first L code
// points; the text is hashed in one streaming pass and parsing stops once
// the longest level is reached.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "affinity_core.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace affinity {

// Feeds text into a streaming hash, emitting a level at each scheduled
// length (in code points) that the text reaches.
class LevelHasher {
public:
    LevelHasher(const uint32_t *schedule, size_t nschedule,
                affinity_level_t *out, size_t out_cap) noexcept;

    // Appends UTF-8 text (whole code points).  Returns false once the last
    // scheduled level is emitted: nothing more is needed.
    bool append(std::string_view text) noexcept;
    bool append_byte(char c) noexcept { return append({&c, 1}); }

    // Ends the text: a text shorter than the first level becomes one level
    // of its own length.  Returns the number of levels.
    size_t finish() noexcept;

    bool done() const noexcept { return next_ >= nschedule_; }
    uint64_t code_points() const noexcept { return code_points_; }

private:
    void emit(uint32_t length) noexcept;

    XXH3_state_t state_;
    const uint32_t *schedule_;
    size_t nschedule_;
    size_t next_ = 0;
    affinity_level_t *out_;
    size_t out_cap_;
    size_t nout_ = 0;
    uint64_t code_points_ = 0;
};

// Implements affinity_prompt_levels(); see affinity_core.h.
affinity_prompt_e prompt_levels(std::string_view padded_body,
                                const uint32_t *schedule, size_t nschedule,
                                affinity_level_t *out, size_t out_cap,
                                size_t *nout);

// Implements affinity_level_schedule(); see affinity_core.h.
size_t level_schedule(const uint32_t *lengths, size_t nlengths, uint32_t step,
                      uint32_t growth_percent, uint32_t max, uint32_t *out,
                      size_t out_cap) noexcept;

}  // namespace affinity

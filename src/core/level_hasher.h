// Prompt text hashed at levels: the XXH3 hash of the first L code points of
// a text for each scheduled length L, computed in one streaming pass.
//
// A level of length L is the XXH3 hash (fixed seed, the same in every nginx
// instance) of the first L Unicode code points of the canonical prompt text
// (prompt_walk.h).  Lengths count code points, not bytes, so that a prompt
// hashes alike whatever escapes its client used.
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

// Implements affinity_level_schedule(); see affinity_core.h.
size_t level_schedule(const uint32_t *lengths, size_t nlengths, uint32_t step,
                      uint32_t growth_percent, uint32_t max, uint32_t *out,
                      size_t out_cap) noexcept;

}  // namespace affinity

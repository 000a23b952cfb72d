// Prompt text hashed at levels: the XXH3 hash of the first L code points of
// a text for each scheduled length L, and at the ends of its last messages,
// computed in one streaming pass.
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

constexpr size_t kMaxTurnLevels = AFFINITY_TURNS_MAX;

// Feeds text into a streaming hash, emitting a level at each scheduled
// length (in code points) that the text reaches.
//
// Turn levels: scheduled lengths grow by a few percent, so the last part
// of a long prompt (up to one level's spacing: 1,500 characters at 25,000)
// is hashed by no level, and a conversation's next turn finds its
// previous one only as far as the level before.  Where that part is all
// that tells one conversation from another (agent sessions behind a long
// shared system prompt and tool schemas), their turns cannot be told
// apart.  The end of every message is also where the next turn's prompt
// extends this one, whatever follows: a level there matches the previous
// turn's whole prompt.  The last `turns` message ends from the first
// scheduled length on and before the last are kept (a ring: the walk does
// not know which are the last until it ends) and merged with the
// scheduled ones, in order of length, by finish().
class LevelHasher {
public:
    // turns: message ends to keep levels for, at most kMaxTurnLevels.
    LevelHasher(const uint32_t *schedule, size_t nschedule, size_t turns,
                affinity_level_t *out, size_t out_cap) noexcept;

    // Appends UTF-8 text (whole code points).  Returns false once the last
    // scheduled level is emitted: nothing more is needed.
    bool append(std::string_view text) noexcept;
    bool append_byte(char c) noexcept { return append({&c, 1}); }

    // A message ends here: a turn level, if the text has not reached its
    // last scheduled level.
    void end_of_turn() noexcept;

    // Ends the text: a text shorter than the first level becomes one level
    // of its own length; the turn levels kept are merged in, the most
    // recent first while out has room, all marked turn (affinity_level_t).
    // Returns the number of levels.
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
    affinity_level_t turns_[kMaxTurnLevels];
    size_t turns_cap_;
    size_t nturns_ = 0;         // marked in all: the ring's next is
                                // nturns_ % turns_cap_
};

// Implements affinity_level_schedule(); see affinity_core.h.
size_t level_schedule(const uint32_t *lengths, size_t nlengths, uint32_t step,
                      uint32_t growth_percent, uint32_t max, uint32_t *out,
                      size_t out_cap) noexcept;

}  // namespace affinity

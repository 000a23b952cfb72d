// The usage an OpenAI-compatible reply gives, read from its body as it
// streams through the proxy: the prompt's tokens and the part of them the
// engine found in its prefix cache, and the tokens of the reply itself.
//
//   chat and text completions:  "usage": {"prompt_tokens": N,
//                                 "completion_tokens": O,
//                                 "prompt_tokens_details":
//                                     {"cached_tokens": C}}
//   Responses API:              "usage": {"input_tokens": N,
//                                 "output_tokens": O,
//                                 "input_tokens_details":
//                                     {"cached_tokens": C}}
//
// A JSON body carries it at the end; an event stream in its last chunk
// (chat with stream_options.include_usage, response.completed), or in
// every chunk (vLLM's continuous usage stats).  Only these three keys are
// looked for, so a lexer is enough: it knows strings (a key is a string
// followed by a colon; a key's name inside another string is escaped and
// never matches) and numbers, and nothing else of JSON.  The last value of
// each key wins.  A raw line break, which no JSON string holds, ends any
// string: an event stream's lines cannot leave the lexer inside one.
// Nothing is allocated and nothing of the body is kept.
#pragma once

#include <cstddef>
#include <cstdint>

#include "affinity_core.h"

namespace affinity {

// A scan starts value-initialised (UsageScan()): every member's zero is
// where it starts (kOutside, kOther).
class UsageScan {
public:
    // Reads the next bytes of the body.
    void feed(const char *data, size_t len) noexcept;

    // The body ended: a count it ended in is read.
    void finish() noexcept
    {
        if (state_ == kNumber) {
            end_number();
        }
    }

    // Whether a cached token count was read, the prompt's tokens and the
    // reply's own (0 if none was read).
    bool found() const noexcept { return have_cached_; }
    uint64_t cached() const noexcept { return cached_; }
    uint64_t prompt() const noexcept { return prompt_; }
    uint64_t output() const noexcept { return output_; }

private:
    enum State : uint8_t {
        kOutside,       // between tokens
        kString,        // inside a string
        kAfterString,   // a string ended: a colon makes it a key
        kValue,         // after a key of ours and its colon
        kNumber         // inside that key's number
    };

    enum Key : uint8_t { kOther, kCached, kPrompt, kOutput };

    // Digits beyond which a count is junk.
    static constexpr uint8_t kMaxDigits = 15;
    static constexpr size_t kKeyMax = 17;   // "completion_tokens"

    void end_string() noexcept;
    void end_number() noexcept;

    uint64_t cached_;
    uint64_t prompt_;
    uint64_t output_;
    uint64_t number_;
    State state_;
    Key key_;           // the last string read, as a key
    bool have_cached_;
    bool escape_;       // after a backslash in a string
    bool too_long_;     // the string is longer than any key of ours
    uint8_t key_len_;
    uint8_t digits_;
    char key_buf_[kKeyMax];
};

}  // namespace affinity

// A reader of JSON request bodies: one parse of a body serves every read of
// it (session key fields, the prompt), and the parser's memory stays
// bounded whatever bodies come.
//
// simdjson's DOM parser validates the whole body (structure, strings,
// numbers, UTF-8) before anything is read, and the tree it builds is read
// without state: a malformed body is refused as a whole, never half-read.
// (simdjson's On-Demand API, faster when it can stop early, does not check
// that brackets match; a body such as {"tools":[{<NUL>]}} left its iterator
// in a state that crashed the worker on the next read.)
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <simdjson.h>

#include "affinity_core.h"

namespace affinity {

class JsonBody {
public:
    // Buffers grown for a body larger than retain bytes are freed by
    // shrink(); up to that size they are kept for the next body.
    explicit JsonBody(size_t retain) noexcept : retain_(retain) {}

    // Parses a body: data[0..len), with AFFINITY_JSON_PADDING readable bytes
    // after it, left in place until unload().  False when the body is not a
    // JSON object (malformed, truncated, not UTF-8, too deep, a number out
    // of range).
    bool load(const char *data, size_t len) noexcept;

    // The reads may throw std::bad_alloc (compact JSON is written to a
    // buffer that grows); the C API catches it.
    affinity_field_e field(std::string_view dotted_path, char *out,
                           size_t out_cap, size_t *out_len);

    affinity_prompt_e prompt(const uint32_t *schedule, size_t nschedule,
                             size_t turns, affinity_level_t *out,
                             size_t out_cap, size_t *nout);

    // Forgets the body; the buffers stay for the next one.
    void unload() noexcept;

    // Frees the buffers grown past retain bytes.  Returns whether it freed
    // anything.
    bool shrink() noexcept;

private:
    simdjson::dom::parser parser_;
    simdjson::dom::object root_;
    std::string scratch_;
    size_t retain_;
    bool loaded_ = false;
};

}  // namespace affinity

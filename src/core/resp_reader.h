// An incremental reader of RESP2 replies (the Redis protocol) into a
// bounded tree, for a store endpoint that may send anything.
//
// Bytes come in as the socket gives them; a reply is returned once whole.
// What it keeps of a reply is bounded by the caller's limits, whatever the
// reply declares: nodes, string bytes, the longest string kept and the
// nesting depth.  A string longer than kept is read past without being
// buffered (its node says so), an array whose elements found no room is
// read to its end and marked, so a reply far larger than what valid ones
// need costs time, never memory.  Anything that is not RESP2 (a RESP3
// type, a bare line feed, a length out of range, nesting deeper than
// allowed) breaks the reader until it is reset, as the connection must
// then be closed.  hiredis' reader buffers every string whole, and so
// cannot take a hostile endpoint's replies: this one is written for that.
#pragma once

#include <cstddef>
#include <cstdint>

#include "affinity_core.h"

namespace affinity {

constexpr uint32_t kRespNone = AFFINITY_RESP_NONE;
constexpr uint32_t kRespMaxDepth = 16;

// Redis' own bound on a bulk string (proto-max-bulk-len's default).
constexpr uint64_t kRespBulkMax = 512ULL * 1024 * 1024;

// A header line (type, length) longer than this is not RESP.
constexpr size_t kRespHeaderMax = 32;

// A simple string or error line longer than this is not RESP either:
// Redis' own are short, its errors echo at most a few arguments.
constexpr size_t kRespLineMax = 64 * 1024;

class RespReader {
public:
    // nodes and bytes: the caller's memory for one reply's tree.
    RespReader(affinity_resp_node_t *nodes, const affinity_resp_limits_t &lim,
               char *bytes) noexcept;

    enum class Status { More, Reply, Broken };

    // Reads from data (len bytes); *used tells how many were taken.  On
    // Reply, root() is the reply, valid until the next call.  Broken: the
    // input is not RESP2 (error() says how), for this and every later
    // call until reset().
    Status feed(const uint8_t *data, size_t len, size_t *used) noexcept;

    void reset() noexcept;

    // Whether a reply has begun and is not yet whole.
    bool midway() const noexcept { return depth_ > 0 || state_ != State::Type; }

    const affinity_resp_node_t *root() const noexcept;
    const affinity_resp_node_t *node(uint32_t index) const noexcept;
    const char *error() const noexcept { return error_; }

private:
    enum class State {
        Type,           // the type byte of the next element
        Header,         // the digits of a length or integer
        Line,           // a simple string's or error's text
        LineEnd,        // the line feed after a line's carriage return
        Bulk,           // a bulk string's bytes
        BulkEnd,        // the CRLF after them
        BulkEndLf
    };

    struct Frame {
        uint32_t node;      // the array's node, or kRespNone
        uint32_t last;      // its last element kept, or kRespNone
        uint64_t left;      // elements still to come
    };

    enum class Header { Invalid, Whole, Continues };

    Status broken(const char *why) noexcept;
    uint32_t begin(uint32_t type) noexcept;
    Header header_done() noexcept;
    bool finish() noexcept;         // true: the reply is whole
    void keep_byte(uint8_t c) noexcept;

    affinity_resp_node_t *nodes_;
    char *bytes_;
    affinity_resp_limits_t lim_;

    State state_ = State::Type;
    uint32_t type_ = 0;             // of the element being read
    uint32_t current_ = kRespNone;  // its node
    char header_[kRespHeaderMax];
    size_t header_len_ = 0;
    size_t line_len_ = 0;
    uint64_t bulk_left_ = 0;

    Frame stack_[kRespMaxDepth];
    uint32_t depth_ = 0;
    uint32_t root_ = kRespNone;
    uint32_t nodes_used_ = 0;
    uint32_t bytes_used_ = 0;
    bool delivered_ = false;        // root_ was returned: start afresh
    const char *error_ = nullptr;
};

// The command argv as a RESP array of bulk strings, into out: its length,
// or 0 if it does not fit in cap.
size_t resp_command(uint8_t *out, size_t cap, size_t argc,
                    const char *const *argv, const size_t *lens) noexcept;

}  // namespace affinity

// The id of a Responses API object, read from a response body as it
// streams through the proxy.
//
// The body arrives in buffers of any size, split anywhere, and must be
// passed on at once (a streamed reply goes out token by token): nothing may
// be held back or copied.  So instead of a document parser (simdjson needs
// the whole document), a byte-at-a-time JSON tokenizer keeps the few bytes
// of state it needs between buffers -- the nesting, the key being read,
// the id and "object" values seen -- and skips the rest of every string at
// memchr speed.  It reads:
//
//   - a JSON body (application/json): the top-level "id" when the
//     top-level "object" is "response" or "conversation"; learned when the
//     object closes, so a truncated body teaches nothing;
//   - an event stream (text/event-stream): the data of the first event,
//     which for the Responses API is response.created with the response
//     object in its "response" member (its "id", "object": "response").
//
// The tokenizer validates structure (brackets, commas, colons, strings,
// scalar characters), not every JSON rule: it must never take a wrong id
// from a well-formed body, and never crash or loop on a malformed one.
#pragma once

#include <cstddef>
#include <cstdint>

#include "affinity_core.h"

namespace affinity {

class ResponseScan {
public:
    void start(affinity_response_format_e format) noexcept;

    // Reads the next bytes of the body.  MORE until the scan is over;
    // FOUND or NONE (with a reason) after, whatever is fed then.
    affinity_scan_e feed(const char *data, size_t len) noexcept;

    // The body ended: a scan still waiting is over, without an id.
    affinity_scan_e finish() noexcept;

    affinity_scan_e status() const noexcept { return status_; }
    affinity_scan_reason_e reason() const noexcept { return reason_; }
    affinity_object_e object() const noexcept { return found_object_; }
    const char *id() const noexcept { return id_; }
    size_t id_len() const noexcept { return id_len_; }

private:
    // What the tokenizer expects next.
    enum State : uint8_t {
        kValue,         // a value (or ']' of an empty array)
        kKey,           // a key (or '}' of an empty object)
        kColon,
        kAfterValue,    // ',' or the container's end
        kScalar,        // inside a number or literal
        kString,        // inside a string
        kDone           // the top-level value is closed
    };

    // What the event-stream reader is inside of.
    enum Line : uint8_t {
        kLineStart,
        kFieldName,
        kDataSpace,     // after "data:", an optional space
        kData,
        kSkipLine
    };

    // What a key names, at the levels that matter.
    enum Key : uint8_t { kOther, kId, kObject, kResponse, kStore };

    // Where a string value goes.
    enum Capture : uint8_t { kNone, kCaptureId, kCaptureObject };

    static constexpr size_t kKeyMax = 8;       // longest key compared
    static constexpr size_t kObjectMax = 12;   // "conversation"
    // As deep as simdjson's default: real bodies (JSON schemas in a
    // response's "text.format") nest deeper than a few dozen levels.
    static constexpr uint32_t kMaxDepth = 1024;
    // Event-stream bytes read before a first event's data: pings and
    // comments, which a server may send while the request waits.
    static constexpr uint64_t kMaxPreamble = 1 << 20;

    void json(const char *p, const char *end) noexcept;
    const char *string(const char *p, const char *end) noexcept;
    bool string_byte(char c) noexcept;
    void append(char c) noexcept;
    bool structural(char c) noexcept;
    void open_container(bool object) noexcept;
    void end_string() noexcept;
    void close_container() noexcept;
    void events(const char *p, const char *end) noexcept;
    void begin_data() noexcept;
    void stop(affinity_scan_e status, affinity_scan_reason_e reason) noexcept;
    bool in_object() const noexcept
    {
        return depth_ > 0 && (objects_[(depth_ - 1) / 64]
                              >> ((depth_ - 1) % 64) & 1) != 0;
    }
    // The level whose keys and values are read: the body's own members,
    // or those of its "response" member in an event.
    uint32_t level() const noexcept { return format_ == AFFINITY_RESPONSE_JSON
                                             ? 1 : 2; }

    uint64_t objects_[kMaxDepth / 64];  // bit d-1 set: level d is an object
    uint64_t scanned_;      // event-stream bytes before the first data
    affinity_response_format_e format_;
    affinity_scan_e status_;
    affinity_scan_reason_e reason_;
    affinity_object_e found_object_;
    uint32_t depth_;
    State state_;
    Line line_;
    Key top_key_;           // the last key read at level 1
    Key key_;               // the last key read at the level read
    Capture capture_;
    bool key_string_;       // the string being read is a key
    bool escape_;           // after a backslash
    bool unusable_;         // the value captured had an escape we do not
                            // decode, or was too long
    bool in_response_;      // level 2 is the "response" member
    bool after_cr_;         // a line ended with CR: skip one LF
    bool data_seen_;        // the first event has had a data line
    bool have_id_;          // id_ holds the id read
    bool id_too_long_;
    bool id_escaped_;
    bool not_stored_;       // "store": false
    affinity_object_e object_seen_;     // the "object" value read
    uint8_t field_len_;     // bytes of the event field name matched
    uint8_t key_len_;
    uint8_t object_len_;
    uint8_t unicode_;       // hex digits still to come after "\u"
    char key_buf_[kKeyMax];
    char object_buf_[kObjectMax];
    uint16_t id_len_;
    char id_[AFFINITY_RESPONSE_ID_MAX];
};

}  // namespace affinity

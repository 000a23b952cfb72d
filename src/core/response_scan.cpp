#include "response_scan.h"

#include <cstring>

namespace affinity {

namespace {

bool whitespace(char c) noexcept
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// The characters of numbers and of true, false and null.
bool scalar_char(char c) noexcept
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z')
           || (c >= 'A' && c <= 'Z') || c == '-' || c == '+' || c == '.';
}

bool hex_digit(char c) noexcept
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')
           || (c >= 'A' && c <= 'F');
}

bool equals(const char *buf, size_t len, const char *word) noexcept
{
    return len == std::strlen(word) && std::memcmp(buf, word, len) == 0;
}

// The first byte of [p, end) that ends a run of plain string characters: a
// quote, a backslash or a control character.
const char *string_stop(const char *p, const char *end) noexcept
{
    while (p < end) {
        unsigned char c = static_cast<unsigned char>(*p);

        if (c == '"' || c == '\\' || c < 0x20) {
            break;
        }

        p++;
    }

    return p;
}

const char *line_end(const char *p, const char *end) noexcept
{
    while (p < end && *p != '\n' && *p != '\r') {
        p++;
    }

    return p;
}

}  // namespace

void ResponseScan::start(affinity_response_format_e format) noexcept
{
    std::memset(static_cast<void *>(this), 0, sizeof(*this));
    format_ = format;
    status_ = AFFINITY_SCAN_MORE;
    reason_ = AFFINITY_SCAN_OK;
    state_ = kValue;
    line_ = kLineStart;

    if (format != AFFINITY_RESPONSE_JSON && format != AFFINITY_RESPONSE_EVENTS)
    {
        stop(AFFINITY_SCAN_NONE, AFFINITY_SCAN_MALFORMED);
    }
}

void ResponseScan::stop(affinity_scan_e status,
                        affinity_scan_reason_e reason) noexcept
{
    status_ = status;
    reason_ = reason;
}

affinity_scan_e ResponseScan::feed(const char *data, size_t len) noexcept
{
    if (status_ != AFFINITY_SCAN_MORE || len == 0) {
        return status_;
    }

    if (format_ == AFFINITY_RESPONSE_JSON) {
        json(data, data + len);
        return status_;
    }

    events(data, data + len);

    return status_;
}

affinity_scan_e ResponseScan::finish() noexcept
{
    if (status_ == AFFINITY_SCAN_MORE) {
        if (format_ == AFFINITY_RESPONSE_EVENTS && !data_seen_) {
            stop(AFFINITY_SCAN_NONE, AFFINITY_SCAN_NO_EVENT);

        } else if (depth_ == 0 && state_ == kValue) {
            // An empty body: no object at all.
            stop(AFFINITY_SCAN_NONE, AFFINITY_SCAN_NO_ID);

        } else {
            stop(AFFINITY_SCAN_NONE, AFFINITY_SCAN_TRUNCATED);
        }
    }

    return status_;
}

// ---- the JSON tokenizer ------------------------------------------------

void ResponseScan::json(const char *p, const char *end) noexcept
{
    while (p < end && status_ == AFFINITY_SCAN_MORE) {
        if (state_ == kString) {
            p = string(p, end);
            continue;
        }

        char c = *p++;

        if (state_ == kScalar) {
            if (scalar_char(c)) {
                continue;
            }

            state_ = kAfterValue;
        }

        if (whitespace(c)) {
            continue;
        }

        if (!structural(c)) {
            stop(AFFINITY_SCAN_NONE, AFFINITY_SCAN_MALFORMED);
        }
    }
}

bool ResponseScan::structural(char c) noexcept
{
    switch (state_) {

    case kValue:
        if (c == '{' || (c == '[' && depth_ > 0)) {
            if (depth_ == kMaxDepth) {
                return false;
            }

            open_container(c == '{');
            return true;
        }

        if (depth_ == 0) {
            if (c == '[' || c == '"') {
                // JSON, but not an object: nothing to learn.
                stop(AFFINITY_SCAN_NONE, AFFINITY_SCAN_NO_ID);
                return true;
            }
            return false;
        }

        if (c == ']' && !in_object()) {
            close_container();  // an empty array
            return true;
        }

        if (c == '"') {
            key_string_ = false;
            capture_ = kNone;
            unusable_ = false;

            if (depth_ == level() && in_object()
                && (format_ == AFFINITY_RESPONSE_JSON || in_response_))
            {
                if (key_ == kId) {
                    capture_ = kCaptureId;
                    id_len_ = 0;
                    have_id_ = false;
                    id_too_long_ = false;
                    id_escaped_ = false;

                } else if (key_ == kObject) {
                    capture_ = kCaptureObject;
                    object_len_ = 0;
                    object_seen_ = AFFINITY_OBJECT_NONE;
                }
            }

            state_ = kString;
            return true;
        }

        if (scalar_char(c)) {
            if (c == 'f' && depth_ == level() && key_ == kStore
                && (format_ == AFFINITY_RESPONSE_JSON || in_response_))
            {
                not_stored_ = true;
            }

            state_ = kScalar;
            return true;
        }

        return false;

    case kKey:
        if (c == '"') {
            key_string_ = true;
            key_len_ = 0;
            unusable_ = false;
            state_ = kString;
            return true;
        }

        if (c == '}') {
            close_container();  // an empty object
            return true;
        }

        return false;

    case kColon:
        if (c == ':') {
            state_ = kValue;
            return true;
        }

        return false;

    case kAfterValue:
        if (c == ',') {
            state_ = in_object() ? kKey : kValue;
            return true;
        }

        if ((c == '}' && in_object()) || (c == ']' && !in_object())) {
            close_container();
            return true;
        }

        return false;

    default:
        return false;
    }
}

void ResponseScan::open_container(bool object) noexcept
{
    // The "response" member of an event is the level whose fields count.
    if (object && depth_ == 1 && format_ == AFFINITY_RESPONSE_EVENTS
        && top_key_ == kResponse && in_object())
    {
        in_response_ = true;
        key_ = kOther;
    }

    uint64_t bit = uint64_t(1) << (depth_ % 64);
    uint64_t &word = objects_[depth_ / 64];
    word = object ? (word | bit) : (word & ~bit);
    depth_++;
    state_ = object ? kKey : kValue;
}

void ResponseScan::close_container() noexcept
{
    depth_--;

    if (depth_ == 1) {
        in_response_ = false;
    }

    if (depth_ > 0) {
        state_ = kAfterValue;
        return;
    }

    state_ = kDone;

    bool wanted = object_seen_ != AFFINITY_OBJECT_NONE;

    if (wanted && not_stored_) {
        stop(AFFINITY_SCAN_NONE, AFFINITY_SCAN_NOT_STORED);

    } else if (wanted && have_id_) {
        found_object_ = object_seen_;
        stop(AFFINITY_SCAN_FOUND, AFFINITY_SCAN_OK);

    } else if (wanted && id_too_long_) {
        stop(AFFINITY_SCAN_NONE, AFFINITY_SCAN_ID_TOO_LONG);

    } else if (wanted && id_escaped_) {
        stop(AFFINITY_SCAN_NONE, AFFINITY_SCAN_ID_ESCAPED);

    } else {
        stop(AFFINITY_SCAN_NONE, AFFINITY_SCAN_NO_ID);
    }
}

const char *ResponseScan::string(const char *p, const char *end) noexcept
{
    while (p < end) {
        if (!escape_ && unicode_ == 0) {
            const char *stop_at = string_stop(p, end);

            if (capture_ != kNone || key_string_) {
                for (const char *q = p; q < stop_at; q++) {
                    append(*q);
                }
            }

            p = stop_at;

            if (p == end) {
                break;
            }
        }

        if (!string_byte(*p++)) {
            stop(AFFINITY_SCAN_NONE, AFFINITY_SCAN_MALFORMED);
            break;
        }

        if (state_ != kString) {
            break;
        }
    }

    return p;
}

// One byte of a string after a plain run: an escape's, the closing quote,
// a backslash.  False when the string is malformed.
bool ResponseScan::string_byte(char c) noexcept
{
    if (unicode_ > 0) {
        unicode_--;
        return hex_digit(c);
    }

    if (escape_) {
        escape_ = false;

        switch (c) {
        case '"':
        case '\\':
        case '/':
            append(c);
            return true;

        case 'u':
            unicode_ = 4;
            unusable_ = true;
            return true;

        case 'b':
        case 'f':
        case 'n':
        case 'r':
        case 't':
            unusable_ = true;
            return true;

        default:
            return false;
        }
    }

    if (c == '"') {
        end_string();
        return true;
    }

    if (c == '\\') {
        escape_ = true;
        return true;
    }

    return false;       // a control character
}

void ResponseScan::append(char c) noexcept
{
    if (key_string_) {
        if (key_len_ < kKeyMax) {
            key_buf_[key_len_] = c;
        }

        if (key_len_ <= kKeyMax) {
            key_len_++;
        }

    } else if (capture_ == kCaptureId) {
        if (id_len_ < AFFINITY_RESPONSE_ID_MAX) {
            id_[id_len_++] = c;

        } else {
            id_too_long_ = true;
        }

    } else if (capture_ == kCaptureObject) {
        if (object_len_ < kObjectMax) {
            object_buf_[object_len_++] = c;

        } else {
            unusable_ = true;
        }
    }
}

void ResponseScan::end_string() noexcept
{
    if (key_string_) {
        Key key = kOther;

        if (!unusable_ && key_len_ <= kKeyMax) {
            if (equals(key_buf_, key_len_, "id")) {
                key = kId;
            } else if (equals(key_buf_, key_len_, "object")) {
                key = kObject;
            } else if (equals(key_buf_, key_len_, "response")) {
                key = kResponse;
            } else if (equals(key_buf_, key_len_, "store")) {
                key = kStore;
            }
        }

        if (depth_ == 1) {
            top_key_ = key;
        }

        if (depth_ == level()
            && (format_ == AFFINITY_RESPONSE_JSON || in_response_))
        {
            key_ = key;
        }

        key_string_ = false;
        state_ = kColon;
        return;
    }

    if (capture_ == kCaptureId) {
        id_escaped_ = unusable_;
        have_id_ = !unusable_ && !id_too_long_ && id_len_ > 0;

    } else if (capture_ == kCaptureObject) {
        if (unusable_) {
            object_seen_ = AFFINITY_OBJECT_NONE;
        } else if (equals(object_buf_, object_len_, "response")) {
            object_seen_ = AFFINITY_OBJECT_RESPONSE;
        } else if (equals(object_buf_, object_len_, "conversation")
                   && format_ == AFFINITY_RESPONSE_JSON)
        {
            object_seen_ = AFFINITY_OBJECT_CONVERSATION;
        }

        // Another kind of object (a chat completion, a list): the rest of
        // the body, however long, is not read.
        if (object_seen_ == AFFINITY_OBJECT_NONE) {
            stop(AFFINITY_SCAN_NONE, AFFINITY_SCAN_NO_ID);
        }
    }

    capture_ = kNone;
    state_ = kAfterValue;
}

// ---- the event stream --------------------------------------------------

// A data line of the first event begins: lines of one event's data are
// joined by a line feed, which the tokenizer reads as white space.
void ResponseScan::begin_data() noexcept
{
    if (data_seen_) {
        static constexpr char kLineFeed[] = "\n";
        json(kLineFeed, kLineFeed + 1);
    }

    data_seen_ = true;
}

void ResponseScan::events(const char *p, const char *end) noexcept
{
    static const char kDataField[] = "data";

    while (p < end && status_ == AFFINITY_SCAN_MORE) {
        if (!data_seen_ && scanned_ > kMaxPreamble) {
            stop(AFFINITY_SCAN_NONE, AFFINITY_SCAN_NO_EVENT);
            break;
        }

        char c = *p;

        switch (line_) {

        case kLineStart:
            if (after_cr_) {
                after_cr_ = false;

                if (c == '\n') {
                    p++;
                    continue;
                }
            }

            if (c == '\n' || c == '\r') {
                // A blank line dispatches the event: the first one with
                // data had to hold a whole object.
                p++;
                scanned_++;
                after_cr_ = c == '\r';

                if (data_seen_) {
                    stop(AFFINITY_SCAN_NONE,
                         depth_ == 0 && state_ == kValue
                             ? AFFINITY_SCAN_MALFORMED
                             : AFFINITY_SCAN_TRUNCATED);
                }

                continue;
            }

            line_ = kFieldName;
            field_len_ = 0;
            continue;

        case kFieldName:
            p++;
            scanned_++;

            if (c == ':' || c == '\n' || c == '\r') {
                bool data = field_len_ == 4;

                if (c == ':') {
                    line_ = data ? kDataSpace : kSkipLine;

                } else {
                    line_ = kLineStart;
                    after_cr_ = c == '\r';
                }

                if (data) {
                    begin_data();
                }

                continue;
            }

            field_len_ = field_len_ < 4 && c == kDataField[field_len_]
                         ? field_len_ + 1 : 5;
            continue;

        case kDataSpace:
            if (c == ' ') {
                p++;
            }

            line_ = kData;
            continue;

        case kData:
        case kSkipLine: {
            const char *eol = line_end(p, end);

            if (line_ == kData) {
                json(p, eol);

            } else if (!data_seen_) {
                scanned_ += uint64_t(eol - p) + (eol < end ? 1 : 0);
            }

            p = eol;

            if (p < end) {
                after_cr_ = *p == '\r';
                p++;
                line_ = kLineStart;
            }

            continue;
        }
        }
    }
}

}  // namespace affinity

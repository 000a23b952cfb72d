#include "resp_reader.h"

#include <algorithm>
#include <cstring>

namespace affinity {

namespace {

constexpr uint8_t kCr = '\r';
constexpr uint8_t kLf = '\n';

uint32_t type_of(uint8_t c) noexcept
{
    switch (c) {
    case '+':
        return AFFINITY_RESP_SIMPLE;
    case '-':
        return AFFINITY_RESP_ERROR;
    case ':':
        return AFFINITY_RESP_INTEGER;
    case '$':
        return AFFINITY_RESP_BULK;
    case '*':
        return AFFINITY_RESP_ARRAY;
    default:
        return 0;
    }
}

// A decimal integer of a header line, optionally negative: false if it is
// not one, or does not fit.
bool parse_integer(const char *p, size_t len, int64_t *out) noexcept
{
    bool negative = len > 0 && p[0] == '-';
    size_t i = negative ? 1 : 0;
    uint64_t v = 0;

    if (i == len) {
        return false;
    }

    for (; i < len; i++) {
        if (p[i] < '0' || p[i] > '9') {
            return false;
        }
        if (v > (uint64_t(INT64_MAX) - uint64_t(p[i] - '0')) / 10) {
            return false;
        }
        v = v * 10 + uint64_t(p[i] - '0');
    }

    *out = negative ? -int64_t(v) : int64_t(v);
    return true;
}

}  // namespace

RespReader::RespReader(affinity_resp_node_t *nodes,
                       const affinity_resp_limits_t &lim, char *bytes) noexcept
    : nodes_(nodes), bytes_(bytes), lim_(lim)
{
    lim_.depth = std::min(lim_.depth, kRespMaxDepth);
    lim_.string_max = std::min(lim_.string_max, lim_.bytes);
}

void RespReader::reset() noexcept
{
    state_ = State::Type;
    type_ = 0;
    current_ = kRespNone;
    header_len_ = 0;
    line_len_ = 0;
    bulk_left_ = 0;
    depth_ = 0;
    root_ = kRespNone;
    nodes_used_ = 0;
    bytes_used_ = 0;
    delivered_ = false;
    error_ = nullptr;
}

RespReader::Status RespReader::broken(const char *why) noexcept
{
    if (error_ == nullptr) {
        error_ = why;
    }
    return Status::Broken;
}

const affinity_resp_node_t *RespReader::node(uint32_t index) const noexcept
{
    return index < nodes_used_ ? &nodes_[index] : nullptr;
}

const affinity_resp_node_t *RespReader::root() const noexcept
{
    return node(root_);
}

// A node for an element of this type, linked into its array, or kRespNone
// when none is left or its array is not kept: then its array (if kept) is
// marked cut.
uint32_t RespReader::begin(uint32_t type) noexcept
{
    Frame *parent = depth_ ? &stack_[depth_ - 1] : nullptr;

    if ((parent && parent->node == kRespNone) || nodes_used_ >= lim_.nodes) {
        if (parent && parent->node != kRespNone) {
            nodes_[parent->node].flags |=
                AFFINITY_RESP_CUT | AFFINITY_RESP_FULL;
        }
        return kRespNone;
    }

    uint32_t index = nodes_used_++;
    affinity_resp_node_t &n = nodes_[index];
    std::memset(&n, 0, sizeof(n));
    n.type = type;
    n.str = bytes_ + bytes_used_;
    n.first = kRespNone;
    n.next = kRespNone;

    if (parent == nullptr) {
        root_ = index;

    } else {
        if (parent->last == kRespNone) {
            nodes_[parent->node].first = index;
        } else {
            nodes_[parent->last].next = index;
        }
        parent->last = index;
    }

    return index;
}

void RespReader::keep_byte(uint8_t c) noexcept
{
    if (current_ == kRespNone) {
        return;
    }

    affinity_resp_node_t &n = nodes_[current_];

    if (n.flags & AFFINITY_RESP_CUT) {
        return;
    }

    if (n.len >= lim_.string_max || bytes_used_ >= lim_.bytes) {
        // Cut strings keep nothing: a prefix would pass for the whole.
        n.flags |= n.len >= lim_.string_max
                   ? AFFINITY_RESP_CUT : AFFINITY_RESP_CUT | AFFINITY_RESP_FULL;
        bytes_used_ -= uint32_t(n.len);
        n.len = 0;
        return;
    }

    bytes_[bytes_used_++] = char(c);
    n.len++;
}

// An element is whole: the arrays it completes are too.  True when the
// reply is.
bool RespReader::finish() noexcept
{
    while (depth_ > 0) {
        Frame &top = stack_[depth_ - 1];

        if (--top.left > 0) {
            return false;
        }
        depth_--;
    }
    return true;
}

// The header line of the element being read is in header_: its integer,
// length or count.
RespReader::Header RespReader::header_done() noexcept
{
    int64_t v;

    if (!parse_integer(header_, header_len_, &v)) {
        return Header::Invalid;
    }

    affinity_resp_node_t *n = current_ == kRespNone ? nullptr
                                                    : &nodes_[current_];

    if (type_ == AFFINITY_RESP_INTEGER) {
        if (n) {
            n->integer = v;
        }
        return Header::Whole;
    }

    if (v == -1) {
        if (n) {
            n->type = AFFINITY_RESP_NIL;
        }
        return Header::Whole;
    }

    if (v < 0) {
        return Header::Invalid;
    }

    if (n) {
        n->integer = v;
    }

    if (type_ == AFFINITY_RESP_BULK) {
        if (uint64_t(v) > kRespBulkMax) {
            return Header::Invalid;
        }
        if (n && uint64_t(v) > lim_.string_max) {
            n->flags |= AFFINITY_RESP_CUT;

        } else if (n && uint64_t(v) > uint64_t(lim_.bytes - bytes_used_)) {
            n->flags |= AFFINITY_RESP_CUT | AFFINITY_RESP_FULL;
        }
        bulk_left_ = uint64_t(v);
        state_ = bulk_left_ ? State::Bulk : State::BulkEnd;
        return Header::Continues;
    }

    // An array: its elements follow, unless it has none.
    if (v == 0) {
        return Header::Whole;
    }

    if (depth_ >= lim_.depth) {
        return Header::Invalid;
    }

    stack_[depth_++] = Frame{current_, kRespNone, uint64_t(v)};
    state_ = State::Type;
    return Header::Continues;
}

RespReader::Status RespReader::feed(const uint8_t *data, size_t len,
                                    size_t *used) noexcept
{
    size_t i = 0;
    *used = 0;

    if (error_) {
        return Status::Broken;
    }

    if (delivered_) {
        // The reply returned last is the caller's no more.
        root_ = kRespNone;
        nodes_used_ = 0;
        bytes_used_ = 0;
        delivered_ = false;
    }

    while (i < len) {
        uint8_t c = data[i++];

        switch (state_) {

        case State::Type:
            type_ = type_of(c);
            if (type_ == 0) {
                *used = i;
                return broken("not a RESP2 reply");
            }
            current_ = begin(type_);
            header_len_ = 0;
            line_len_ = 0;
            state_ = (type_ == AFFINITY_RESP_SIMPLE
                      || type_ == AFFINITY_RESP_ERROR)
                     ? State::Line : State::Header;
            continue;

        case State::Header:
            if (c == kCr) {
                state_ = State::LineEnd;
                continue;
            }
            if (header_len_ == sizeof(header_)) {
                *used = i;
                return broken("a reply's header is too long");
            }
            header_[header_len_++] = char(c);
            continue;

        case State::Line:
            if (c == kCr) {
                state_ = State::LineEnd;
                continue;
            }
            if (c == kLf || ++line_len_ > kRespLineMax) {
                *used = i;
                return broken(c == kLf ? "a line without its carriage return"
                                       : "a reply's line is too long");
            }
            keep_byte(c);
            continue;

        case State::LineEnd:
            if (c != kLf) {
                *used = i;
                return broken("a carriage return without its line feed");
            }
            if (type_ != AFFINITY_RESP_SIMPLE && type_ != AFFINITY_RESP_ERROR)
            {
                Header h = header_done();

                if (h == Header::Invalid) {
                    *used = i;
                    return broken("a reply's header is not valid");
                }
                if (h == Header::Continues) {
                    continue;   // a bulk's bytes, or an array's elements
                }
            }
            state_ = State::Type;
            if (finish()) {
                *used = i;
                delivered_ = true;
                return Status::Reply;
            }
            continue;

        case State::Bulk: {
            // The rest of the string, or what the input has of it.
            size_t n = size_t(std::min<uint64_t>(bulk_left_, len - i + 1));

            if (current_ != kRespNone
                && !(nodes_[current_].flags & AFFINITY_RESP_CUT))
            {
                affinity_resp_node_t &node = nodes_[current_];
                std::memcpy(bytes_ + bytes_used_, data + i - 1, n);
                bytes_used_ += uint32_t(n);
                node.len += n;
            }

            i += n - 1;
            bulk_left_ -= n;
            if (bulk_left_ == 0) {
                state_ = State::BulkEnd;
            }
            continue;
        }

        case State::BulkEnd:
            if (c != kCr) {
                *used = i;
                return broken("a bulk string longer than it said");
            }
            state_ = State::BulkEndLf;
            continue;

        case State::BulkEndLf:
            if (c != kLf) {
                *used = i;
                return broken("a carriage return without its line feed");
            }
            state_ = State::Type;
            if (finish()) {
                *used = i;
                delivered_ = true;
                return Status::Reply;
            }
            continue;
        }
    }

    *used = i;
    return Status::More;
}

size_t resp_command(uint8_t *out, size_t cap, size_t argc,
                    const char *const *argv, const size_t *lens) noexcept
{
    char head[32];
    size_t pos = 0;

    auto put = [&](const void *p, size_t n) {
        if (pos + n > cap) {
            return false;
        }
        std::memcpy(out + pos, p, n);
        pos += n;
        return true;
    };

    auto number = [&](char type, uint64_t v) {
        char digits[24];
        size_t n = 0;
        do {
            digits[n++] = char('0' + v % 10);
            v /= 10;
        } while (v);
        size_t h = 0;
        head[h++] = type;
        while (n) {
            head[h++] = digits[--n];
        }
        head[h++] = '\r';
        head[h++] = '\n';
        return put(head, h);
    };

    if (!number('*', argc)) {
        return 0;
    }

    for (size_t i = 0; i < argc; i++) {
        if (!number('$', lens[i]) || !put(argv[i], lens[i])
            || !put("\r\n", 2))
        {
            return 0;
        }
    }

    return pos;
}

}  // namespace affinity

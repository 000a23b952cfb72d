#include "usage_scan.h"

#include <cstring>

namespace affinity {

namespace {

bool blank(char c) noexcept
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

bool is_key(const char *buf, size_t len, const char *name) noexcept
{
    return len == std::strlen(name) && std::memcmp(buf, name, len) == 0;
}

}  // namespace

void UsageScan::end_string() noexcept
{
    key_ = kOther;

    if (!too_long_) {
        if (is_key(key_buf_, key_len_, "cached_tokens")) {
            key_ = kCached;
        } else if (is_key(key_buf_, key_len_, "prompt_tokens")
                   || is_key(key_buf_, key_len_, "input_tokens"))
        {
            key_ = kPrompt;
        } else if (is_key(key_buf_, key_len_, "completion_tokens")
                   || is_key(key_buf_, key_len_, "output_tokens"))
        {
            key_ = kOutput;
        }
    }

    state_ = kAfterString;
}

void UsageScan::end_number() noexcept
{
    if (digits_ > 0 && digits_ <= kMaxDigits) {
        if (key_ == kCached) {
            cached_ = number_;
            have_cached_ = true;
        } else if (key_ == kOutput) {
            output_ = number_;
        } else {
            prompt_ = number_;
        }
    }

    state_ = kOutside;
}

void UsageScan::feed(const char *data, size_t len) noexcept
{
    const char *p = data;
    const char *end = data + len;

    while (p < end) {
        char c = *p;

        switch (state_) {

        case kOutside:
            // Only a string can start anything of ours: skip to one.
            p = static_cast<const char *>(std::memchr(p, '"', size_t(end - p)));

            if (p == nullptr) {
                return;
            }

            p++;
            state_ = kString;
            escape_ = false;
            too_long_ = false;
            key_len_ = 0;
            continue;

        case kString:
            if (c == '\n') {
                state_ = kOutside;
            } else if (escape_) {
                escape_ = false;
                too_long_ = true;   // no key of ours has an escape
            } else if (c == '\\') {
                escape_ = true;
            } else if (c == '"') {
                end_string();
            } else if (key_len_ < kKeyMax) {
                key_buf_[key_len_++] = c;
            } else {
                too_long_ = true;
            }

            p++;
            continue;

        case kAfterString:
            if (blank(c)) {
                p++;
                continue;
            }

            if (c == ':' && key_ != kOther) {
                state_ = kValue;
                p++;
                continue;
            }

            // Not a key of ours: read the character again from outside.
            state_ = kOutside;
            continue;

        case kValue:
            if (blank(c)) {
                p++;
                continue;
            }

            if (c >= '0' && c <= '9') {
                state_ = kNumber;
                number_ = 0;
                digits_ = 0;
                continue;
            }

            // null, a negative or any other value: not a count.
            state_ = kOutside;
            continue;

        case kNumber:
            if (c >= '0' && c <= '9') {
                if (digits_ < kMaxDigits) {
                    number_ = number_ * 10 + uint64_t(c - '0');
                }

                if (digits_ <= kMaxDigits) {
                    digits_++;
                }

                p++;
                continue;
            }

            // A fraction or an exponent makes no count of tokens.
            if (c == '.' || c == 'e' || c == 'E') {
                digits_ = 0;
            }

            end_number();
            continue;
        }
    }
}

}  // namespace affinity

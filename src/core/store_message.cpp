#include "store_message.h"

#include <cstring>

namespace affinity {

namespace {

void put16(uint8_t *p, uint16_t v) noexcept
{
    p[0] = uint8_t(v);
    p[1] = uint8_t(v >> 8);
}

void put32(uint8_t *p, uint32_t v) noexcept
{
    for (int i = 0; i < 4; i++) {
        p[i] = uint8_t(v >> (8 * i));
    }
}

void put64(uint8_t *p, uint64_t v) noexcept
{
    for (int i = 0; i < 8; i++) {
        p[i] = uint8_t(v >> (8 * i));
    }
}

uint16_t get16(const uint8_t *p) noexcept
{
    return uint16_t(p[0] | p[1] << 8);
}

uint32_t get32(const uint8_t *p) noexcept
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) {
        v = v << 8 | p[i];
    }
    return v;
}

uint64_t get64(const uint8_t *p) noexcept
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = v << 8 | p[i];
    }
    return v;
}

// A FILLED message's body: the characters, 32 bits.
constexpr size_t kFilledBody = 4;

// A SENT or DONE message's body: the milliseconds past its time, 16 bits.
constexpr size_t kNewsBody = 2;
constexpr uint32_t kMsecPerSecond = 1000;

bool keyed(uint32_t kind) noexcept
{
    return kind == AFFINITY_STORE_PIN || kind == AFFINITY_STORE_RESPONSE;
}

// News of a request's start or end: its time to the millisecond.
bool request_news(uint32_t kind) noexcept
{
    return kind == AFFINITY_STORE_SENT || kind == AFFINITY_STORE_DONE;
}

}  // namespace

size_t encode_store_message(const affinity_store_message_t &m, uint8_t *out,
                            size_t cap) noexcept
{
    size_t body;

    if (keyed(m.kind)) {
        if (m.key == nullptr || m.key_len == 0
            || m.key_len > AFFINITY_STORE_KEY_MAX)
        {
            return 0;
        }
        body = m.key_len;

    } else if (m.kind == AFFINITY_STORE_LEVELS) {
        if (m.levels == nullptr || m.nlevels == 0
            || m.nlevels > AFFINITY_MAX_LEVELS)
        {
            return 0;
        }
        body = m.nlevels * 8;

    } else if (request_news(m.kind)) {
        if (m.msec >= kMsecPerSecond) {
            return 0;
        }
        body = kNewsBody;

    } else if (m.kind == AFFINITY_STORE_FILLED) {
        if (m.chars == 0) {
            return 0;
        }
        body = kFilledBody;

    } else {
        return 0;
    }

    if (m.peer == 0 || cap < kStoreHeader + body) {
        return 0;
    }

    out[0] = kStoreVersion;
    out[1] = uint8_t(m.kind);
    put16(out + 2, uint16_t(body));
    put32(out + 4, m.time);
    put64(out + 8, m.instance);
    put64(out + 16, m.peer);

    if (keyed(m.kind)) {
        std::memcpy(out + kStoreHeader, m.key, m.key_len);

    } else if (m.kind == AFFINITY_STORE_LEVELS) {
        for (size_t i = 0; i < m.nlevels; i++) {
            put64(out + kStoreHeader + 8 * i, m.levels[i]);
        }

    } else if (m.kind == AFFINITY_STORE_FILLED) {
        put32(out + kStoreHeader, m.chars);

    } else {
        put16(out + kStoreHeader, uint16_t(m.msec));
    }

    return kStoreHeader + body;
}

bool decode_store_message(const uint8_t *data, size_t len,
                          affinity_store_message_t &m, uint64_t *levels,
                          size_t levels_cap) noexcept
{
    std::memset(&m, 0, sizeof(m));

    if (data == nullptr || len < kStoreHeader || data[0] != kStoreVersion) {
        return false;
    }

    uint32_t kind = data[1];
    size_t body = get16(data + 2);

    // No message is without a body (versions before SENT and DONE skip
    // those kinds).
    if (len != kStoreHeader + body || body == 0) {
        return false;
    }

    m.kind = kind;
    m.time = get32(data + 4);
    m.instance = get64(data + 8);
    m.peer = get64(data + 16);

    if (m.peer == 0) {
        return false;
    }

    const uint8_t *p = data + kStoreHeader;

    if (keyed(kind)) {
        if (body > AFFINITY_STORE_KEY_MAX) {
            return false;
        }
        m.key = reinterpret_cast<const char *>(p);
        m.key_len = body;
        return true;
    }

    if (kind == AFFINITY_STORE_LEVELS) {
        size_t n = body / 8;

        if (body % 8 != 0 || n > AFFINITY_MAX_LEVELS || n > levels_cap
            || levels == nullptr)
        {
            return false;
        }

        for (size_t i = 0; i < n; i++) {
            levels[i] = get64(p + 8 * i);
        }
        m.levels = levels;
        m.nlevels = n;
        return true;
    }

    if (kind == AFFINITY_STORE_FILLED) {
        if (body != kFilledBody) {
            return false;
        }
        m.chars = get32(p);
        return m.chars != 0;
    }

    if (request_news(kind)) {
        if (body != kNewsBody) {
            return false;
        }
        m.msec = get16(p);
        return m.msec < kMsecPerSecond;
    }

    return false;
}

}  // namespace affinity

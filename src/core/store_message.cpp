#include "store_message.h"

#include <cstring>

#include <openssl/crypto.h>

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

// A SENT message's body: its sender's ticket and watch number.
constexpr size_t kSentBody = 12;

bool keyed(uint32_t kind) noexcept
{
    return kind == AFFINITY_STORE_PIN || kind == AFFINITY_STORE_RESPONSE;
}

// The body a kind has, by its length: false if none of that length.
bool body_fits(uint32_t kind, size_t body) noexcept
{
    switch (kind) {
    case AFFINITY_STORE_PIN:
    case AFFINITY_STORE_RESPONSE:
        return body == kStoreDigest;
    case AFFINITY_STORE_LEVELS:
        return body > 0 && body % 8 == 0 && body / 8 <= AFFINITY_MAX_LEVELS;
    case AFFINITY_STORE_FILLED:
        return body == kFilledBody;
    case AFFINITY_STORE_SENT:
        return body == kSentBody;
    case AFFINITY_STORE_DONE:
        return body == 0;
    default:
        return false;
    }
}

// The authenticator of a message for a stream: its first bytes.
bool authenticate(StoreKeys &keys, const void *stream, size_t stream_len,
                  const uint8_t *message, size_t len,
                  uint8_t out[kSha256Size]) noexcept
{
    uint8_t name_len[2];
    put16(name_len, uint16_t(stream_len));

    StoreKeys::Part parts[] = {
        {name_len, sizeof(name_len)},
        {stream, stream_len},
        {message, len},
    };

    return stream_len <= UINT16_MAX
           && keys.mac(StoreKeys::Entries, parts, 3, out);
}

}  // namespace

void store_digest(StoreKeys &keys, uint32_t kind, const void *id, size_t len,
                  uint8_t out[kStoreDigest]) noexcept
{
    uint8_t k = uint8_t(kind);
    uint8_t full[kSha256Size];

    StoreKeys::Part parts[] = {{&k, 1}, {id, len}};

    if (!keys.mac(StoreKeys::Ids, parts, 2, full)) {
        // Only out of memory: a digest no message will match.
        std::memset(full, 0, sizeof(full));
    }

    std::memcpy(out, full, kStoreDigest);
}

size_t encode_store_message(StoreKeys &keys, const void *stream,
                            size_t stream_len,
                            const affinity_store_message_t &m, uint8_t *out,
                            size_t cap) noexcept
{
    size_t body;

    if (keyed(m.kind)) {
        if (m.digest == nullptr) {
            return 0;
        }
        body = kStoreDigest;

    } else if (m.kind == AFFINITY_STORE_LEVELS) {
        if (m.levels == nullptr) {
            return 0;
        }
        body = m.nlevels * 8;

    } else if (m.kind == AFFINITY_STORE_FILLED) {
        if (m.chars == 0) {
            return 0;
        }
        body = kFilledBody;

    } else if (m.kind == AFFINITY_STORE_SENT) {
        body = kSentBody;

    } else {
        body = 0;
    }

    if (!body_fits(m.kind, body) || m.peer == 0
        || (m.kind == AFFINITY_STORE_LEVELS
            && m.nlevels > AFFINITY_MAX_LEVELS)
        || cap < kStoreHeader + body + kStoreMac)
    {
        return 0;
    }

    out[0] = kStoreVersion;
    out[1] = uint8_t(m.kind);
    put16(out + 2, uint16_t(body));
    put32(out + 4, m.sender);
    put64(out + 8, m.ms);
    put64(out + 16, m.instance);
    put64(out + 24, m.peer);
    put64(out + 32, m.seq);

    uint8_t *p = out + kStoreHeader;

    if (keyed(m.kind)) {
        std::memcpy(p, m.digest, kStoreDigest);

    } else if (m.kind == AFFINITY_STORE_LEVELS) {
        for (size_t i = 0; i < m.nlevels; i++) {
            put64(p + 8 * i, m.levels[i]);
        }

    } else if (m.kind == AFFINITY_STORE_FILLED) {
        put32(p, m.chars);

    } else if (m.kind == AFFINITY_STORE_SENT) {
        put64(p, m.ticket);
        put32(p + 8, m.watch);
    }

    return seal_store_message(keys, stream, stream_len, out,
                              kStoreHeader + body, cap);
}

size_t seal_store_message(StoreKeys &keys, const void *stream,
                          size_t stream_len, uint8_t *message, size_t len,
                          size_t cap) noexcept
{
    uint8_t mac[kSha256Size];

    if (cap < len + kStoreMac
        || !authenticate(keys, stream, stream_len, message, len, mac))
    {
        return 0;
    }

    std::memcpy(message + len, mac, kStoreMac);
    return len + kStoreMac;
}

affinity_store_decoded_e decode_store_message(
    StoreKeys &keys, const void *stream, size_t stream_len,
    const uint8_t *data, size_t len, affinity_store_message_t &m,
    uint64_t *levels, size_t levels_cap) noexcept
{
    std::memset(&m, 0, sizeof(m));

    if (data == nullptr || len < kStoreHeader + kStoreMac
        || data[0] != kStoreVersion)
    {
        return AFFINITY_STORE_MALFORMED;
    }

    uint32_t kind = data[1];
    size_t body = get16(data + 2);

    if (len != kStoreHeader + body + kStoreMac || !body_fits(kind, body)) {
        return AFFINITY_STORE_MALFORMED;
    }

    uint8_t mac[kSha256Size];

    if (!authenticate(keys, stream, stream_len, data, kStoreHeader + body,
                      mac)
        || CRYPTO_memcmp(mac, data + kStoreHeader + body, kStoreMac) != 0)
    {
        return AFFINITY_STORE_FORGED;
    }

    m.kind = kind;
    m.sender = get32(data + 4);
    m.ms = get64(data + 8);
    m.instance = get64(data + 16);
    m.peer = get64(data + 24);
    m.seq = get64(data + 32);

    if (m.peer == 0) {
        return AFFINITY_STORE_MALFORMED;
    }

    const uint8_t *p = data + kStoreHeader;

    if (keyed(kind)) {
        m.digest = p;
        return AFFINITY_STORE_OK;
    }

    if (kind == AFFINITY_STORE_LEVELS) {
        size_t n = body / 8;

        if (n > levels_cap || levels == nullptr) {
            return AFFINITY_STORE_MALFORMED;
        }

        for (size_t i = 0; i < n; i++) {
            levels[i] = get64(p + 8 * i);
        }
        m.levels = levels;
        m.nlevels = n;
        return AFFINITY_STORE_OK;
    }

    if (kind == AFFINITY_STORE_FILLED) {
        m.chars = get32(p);
        return m.chars ? AFFINITY_STORE_OK : AFFINITY_STORE_MALFORMED;
    }

    if (kind == AFFINITY_STORE_SENT) {
        m.ticket = get64(p);
        m.watch = get32(p + 8);
    }

    return AFFINITY_STORE_OK;
}

}  // namespace affinity

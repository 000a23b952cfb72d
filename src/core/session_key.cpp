#include "session_key.h"

#include <openssl/rand.h>

namespace affinity {

bool key_echoable(const char *key, size_t len) noexcept
{
    if (len == 0 || len > kMaxEchoedKey) {
        return false;
    }

    for (size_t i = 0; i < len; i++) {
        unsigned char c = static_cast<unsigned char>(key[i]);

        if (c <= ' ' || c >= 0x7f || c == '"' || c == ',' || c == ';'
            || c == '\\')
        {
            return false;
        }
    }

    return true;
}

bool key_exposable(const char *key, size_t len) noexcept
{
    if (len == 0) {
        return false;
    }

    for (size_t i = 0; i < len; i++) {
        unsigned char c = static_cast<unsigned char>(key[i]);

        if (c < ' ' || c == 0x7f) {
            return false;
        }
    }

    return true;
}

bool uuid_v4(char out[kUuidLength]) noexcept
{
    static const char hex[] = "0123456789abcdef";
    unsigned char bytes[16];

    if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
        return false;
    }

    bytes[6] = static_cast<unsigned char>((bytes[6] & 0x0f) | 0x40);
    bytes[8] = static_cast<unsigned char>((bytes[8] & 0x3f) | 0x80);

    size_t o = 0;
    for (size_t i = 0; i < sizeof(bytes); i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) {
            out[o++] = '-';
        }
        out[o++] = hex[bytes[i] >> 4];
        out[o++] = hex[bytes[i] & 0x0f];
    }

    return true;
}

}  // namespace affinity

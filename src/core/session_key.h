// Session keys: which keys may be echoed to clients, and generated ids.
#pragma once

#include <cstddef>

#include "affinity_core.h"

namespace affinity {

constexpr size_t kMaxEchoedKey = AFFINITY_KEY_MAX_ECHO;
constexpr size_t kUuidLength = AFFINITY_UUID_LEN;

// At most kMaxEchoedKey cookie octets (RFC 6265: printable ASCII but
// space, '"', ',', ';' and '\\'): safe as it is in a cookie value and in a
// response header.
bool key_echoable(const char *key, size_t len) noexcept;

// Not empty and free of control characters (bytes below 0x20, and 0x7f):
// safe as a header value, and in a log line.
bool key_exposable(const char *key, size_t len) noexcept;

// A random (version 4) UUID in its 36-character text form.
bool uuid_v4(char out[kUuidLength]) noexcept;

}  // namespace affinity

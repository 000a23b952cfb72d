// Session keys: which keys may be echoed to clients, and generated ids.
#pragma once

#include <cstddef>

namespace affinity {

constexpr size_t kMaxEchoedKey = 256;
constexpr size_t kUuidLength = 36;

// At most kMaxEchoedKey bytes of printable ASCII other than ';', ',' and
// space: safe in a response header and a cookie value as it is.
bool key_echoable(const char *key, size_t len) noexcept;

// A random (version 4) UUID in its 36-character text form.
bool uuid_v4(char out[kUuidLength]) noexcept;

}  // namespace affinity

// fuzz_session_key: which session keys may be echoed to the client and
// shown in headers and logs.
//
// The input is a key (any bytes), copied into a heap block of its exact
// size.  Checked, in both directions, against the documented rules:
//
//   - affinity_key_echoable(): 1 <= len <= 256 and every byte an RFC 6265
//     cookie-octet (0x21, 0x23-0x2B, 0x2D-0x3A, 0x3C-0x5B, 0x5D-0x7E);
//   - affinity_key_exposable(): len >= 1, no byte below 0x20, no 0x7f;
//   - echoable implies exposable.
//
// For an echoable key, the Set-Cookie value is built as the module builds
// it ("llm_session=" KEY "; Path=/; HttpOnly; SameSite=Lax") and checked:
// no CR, LF, '"' or '\\' in it; the first '=' ends the cookie name, so a
// client reads the name "llm_session" (the key itself may hold '=': it is a
// cookie-octet, as in base64 padding); and sent back as a Cookie line
// ("llm_session=KEY", perhaps among other pairs), the key has no byte that
// ends or trims a pair (';', ',', space, tab), so a reader of that line
// (nginx's $cookie_NAME) gets exactly the key.
//
// Each run also draws a UUID v4 (the generated key) and checks its form:
// 36 characters, 8-4-4-4-12 lowercase hex digits, version 4, variant 8-b;
// it is echoable and exposable.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "affinity_core.h"

namespace {

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond)) {                                                      \
            __builtin_printf("fuzz_session_key: check failed: %s "          \
                             "(line %d)\n", #cond, __LINE__);               \
            __builtin_trap();                                               \
        }                                                                   \
    } while (0)

bool cookie_octet(uint8_t c)
{
    return c == 0x21 || (c >= 0x23 && c <= 0x2b) || (c >= 0x2d && c <= 0x3a)
           || (c >= 0x3c && c <= 0x5b) || (c >= 0x5d && c <= 0x7e);
}

bool expect_echoable(const uint8_t *key, size_t len)
{
    if (len < 1 || len > AFFINITY_KEY_MAX_ECHO) {
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        if (!cookie_octet(key[i])) {
            return false;
        }
    }
    return true;
}

bool expect_exposable(const uint8_t *key, size_t len)
{
    if (len < 1) {
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        if (key[i] < 0x20 || key[i] == 0x7f) {
            return false;
        }
    }
    return true;
}

void check_set_cookie(const char *key, size_t len)
{
    static const char kName[] = "llm_session";
    std::string value = std::string(kName) + "=" + std::string(key, len)
                        + "; Path=/; HttpOnly; SameSite=Lax";

    for (char c : value) {
        CHECK(c != '\r' && c != '\n' && c != '"' && c != '\\');
    }

    size_t semi = value.find(';');
    size_t eq = value.find('=');
    CHECK(semi != std::string::npos && eq < semi);
    CHECK(eq == sizeof(kName) - 1);
    CHECK(semi == sizeof(kName) + len);     // the key holds no ';'

    // Sent back by the client, nothing in the key ends its pair early or
    // is skipped: nginx's $cookie_NAME ends a value at ';', moves to the
    // next pair at ';' or ',', and skips spaces around a pair.
    for (size_t i = 0; i < len; i++) {
        CHECK(key[i] != ';' && key[i] != ',' && key[i] != ' '
              && key[i] != '\t');
    }
}

void check_uuid()
{
    char uuid[AFFINITY_UUID_LEN];

    CHECK(affinity_uuid_v4(uuid) == 0);

    for (size_t i = 0; i < AFFINITY_UUID_LEN; i++) {
        char c = uuid[i];
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            CHECK(c == '-');
        } else {
            CHECK((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
        }
    }
    CHECK(uuid[14] == '4');
    CHECK(uuid[19] == '8' || uuid[19] == '9' || uuid[19] == 'a'
          || uuid[19] == 'b');
    CHECK(affinity_key_echoable(uuid, AFFINITY_UUID_LEN) == 1);
    CHECK(affinity_key_exposable(uuid, AFFINITY_UUID_LEN) == 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    // An empty key still gets a valid (non-null) pointer.
    char *key = static_cast<char *>(std::malloc(size ? size : 1));
    CHECK(key != nullptr);
    if (size) {
        std::memcpy(key, data, size);
    }

    int echoable = affinity_key_echoable(key, size);
    int exposable = affinity_key_exposable(key, size);

    CHECK(echoable == 0 || echoable == 1);
    CHECK(exposable == 0 || exposable == 1);
    CHECK((echoable == 1) == expect_echoable(data, size));
    CHECK((exposable == 1) == expect_exposable(data, size));
    CHECK(!echoable || exposable);

    if (echoable) {
        check_set_cookie(key, size);
    }

    check_uuid();

    std::free(key);
    return 0;
}

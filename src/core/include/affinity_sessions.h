/*
 * affinity_sessions.h - session keys: which may be echoed or exposed, and
 * generated ids.
 * Included by affinity_core.h.
 */

#ifndef AFFINITY_SESSIONS_H
#define AFFINITY_SESSIONS_H

#include "affinity_api.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AFFINITY_KEY_MAX_ECHO  256
#define AFFINITY_UUID_LEN      36

/*
 * Whether a key may be echoed to the client in a header or a cookie: at most
 * 256 cookie octets (RFC 6265: printable ASCII but space, '"', ',', ';' and
 * backslash).
 */
AFFINITY_API int affinity_key_echoable(const char *key, size_t len)
    AFFINITY_NOEXCEPT;

/*
 * Whether a key may be shown in $affinity_session, which ends up in
 * request and response headers and in logs: not empty and without control
 * characters (bytes below 0x20, and 0x7f).
 */
AFFINITY_API int affinity_key_exposable(const char *key, size_t len)
    AFFINITY_NOEXCEPT;

/* Writes a random UUID v4 (36 characters, no NUL) from OpenSSL RAND_bytes.
 * Returns 0, or -1 if the random generator failed. */
AFFINITY_API int affinity_uuid_v4(char out[AFFINITY_UUID_LEN])
    AFFINITY_NOEXCEPT;


#ifdef __cplusplus
}
#endif

#endif /* AFFINITY_SESSIONS_H */

/*
 * affinity_json.h - JSON request bodies, parsed once per request.
 * Included by affinity_core.h.
 */

#ifndef AFFINITY_JSON_H
#define AFFINITY_JSON_H

#include "affinity_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes a body buffer must have readable past its end for the parser. */
#define AFFINITY_JSON_PADDING  64

typedef struct affinity_json_s  affinity_json_t;

/*
 * A reader of JSON request bodies for one thread (an nginx worker).  It
 * owns the JSON parser and its buffers, which grow with the largest body
 * read and are kept for the next; affinity_json_shrink() frees what grew
 * past retain bytes of body.  NULL when out of memory.  Not for the hot
 * path.
 */
AFFINITY_API affinity_json_t *affinity_json_create(size_t retain)
    AFFINITY_NOEXCEPT;
AFFINITY_API void affinity_json_destroy(affinity_json_t *json)
    AFFINITY_NOEXCEPT;

/*
 * Indexes a body, body[0..len) with AFFINITY_JSON_PADDING readable bytes
 * after it, for the reads below; the body must stay in place until
 * affinity_json_unload().  The whole body is validated, once, whatever is
 * read from it.  Returns 0, or -1 when it is not a JSON object (malformed,
 * truncated, not UTF-8, nested too deep, a number out of range): nothing
 * is then read from it.
 */
AFFINITY_API int affinity_json_load(affinity_json_t *json, const char *body,
    size_t len) AFFINITY_NOEXCEPT;

/* Forgets the body loaded. */
AFFINITY_API void affinity_json_unload(affinity_json_t *json)
    AFFINITY_NOEXCEPT;

/* Frees the buffers grown past the retain size; returns 1 if it freed any
 * (the caller may then give the memory back to the system). */
AFFINITY_API int affinity_json_shrink(affinity_json_t *json)
    AFFINITY_NOEXCEPT;

typedef enum {
    AFFINITY_FIELD_FOUND = 0,
    AFFINITY_FIELD_MISSING,     /* valid JSON, no string/number at path */
    AFFINITY_FIELD_INVALID      /* no body loaded */
} affinity_field_e;

/*
 * Looks up a top-level or dotted field ("user", "metadata.session_id") in
 * the body loaded.  A string value is returned unescaped (it may hold any
 * byte, control characters included), a number in its shortest form (42,
 * 42.0 and 4.2e1 all give "42").  The value is copied to out (at most
 * out_cap bytes; a longer value is MISSING).
 */
AFFINITY_API affinity_field_e affinity_json_field(affinity_json_t *json,
    const char *path, size_t path_len, char *out, size_t out_cap,
    size_t *out_len) AFFINITY_NOEXCEPT;


#ifdef __cplusplus
}
#endif

#endif /* AFFINITY_JSON_H */

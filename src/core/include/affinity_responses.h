/*
 * affinity_responses.h - Responses API continuations, and the usage a reply
 * reports.
 * Included by affinity_core.h.
 */

#ifndef AFFINITY_RESPONSES_H
#define AFFINITY_RESPONSES_H

#include "affinity_api.h"
#include "affinity_json.h"
#include "affinity_zone.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * A responses zone (AFFINITY_ZONE_RESPONSES) remembers which peer produced
 * each response or conversation id, keyed by affinity_zone_key_hash() of
 * the id: set-associative, LRU with idle expiry, as sessions.  Both
 * functions: caller holds the zone lock; now and timeout in seconds.
 */

/* The peer id that produced the id, made most recently used; 0 if the
 * zone does not know it (never seen, evicted or expired). */
AFFINITY_API uint64_t affinity_responses_owner(affinity_zone_t *zone,
    uint64_t key_hash, uint32_t now, uint32_t timeout) AFFINITY_NOEXCEPT;

typedef enum {
    AFFINITY_LEARNED = 0,           /* the zone holds it now */
    AFFINITY_LEARNED_STALE,         /* it holds a newer one, or it expired */
    AFFINITY_LEARNED_TAKEN          /* the id belongs to another peer */
} affinity_learned_e;

/* Remembers that peer_id (non-zero) produced the id at version_ms (the
 * wall clock in milliseconds, here or at the instance that learned it):
 * the first peer to produce an id keeps it while its entry lives, so that
 * a reply reusing a live id (an engine lets clients choose them) cannot
 * take another's follow-ups; each such refusal is counted (conflicts). */
AFFINITY_API int affinity_responses_learn(affinity_zone_t *zone,
    uint64_t key_hash, uint64_t peer_id, uint64_t version_ms, uint32_t now,
    uint32_t timeout) AFFINITY_NOEXCEPT;

/* Longest id learned; a longer one is not (nor looked up). */
#define AFFINITY_RESPONSE_ID_MAX  256

typedef enum {
    AFFINITY_RESPONSE_JSON = 1,     /* application/json */
    AFFINITY_RESPONSE_EVENTS        /* text/event-stream */
} affinity_response_format_e;

typedef enum {
    AFFINITY_SCAN_MORE = 0,         /* feed more of the body */
    AFFINITY_SCAN_FOUND,            /* an id was read: stop feeding */
    AFFINITY_SCAN_NONE              /* nothing to learn: stop feeding */
} affinity_scan_e;

typedef enum {
    AFFINITY_SCAN_OK = 0,
    AFFINITY_SCAN_MALFORMED,        /* not a JSON object */
    AFFINITY_SCAN_TRUNCATED,        /* ended inside the object */
    AFFINITY_SCAN_NO_ID,            /* no id of a response or conversation */
    AFFINITY_SCAN_ID_TOO_LONG,      /* over AFFINITY_RESPONSE_ID_MAX */
    AFFINITY_SCAN_ID_ESCAPED,       /* an escape other than \" \\ \/ */
    AFFINITY_SCAN_NO_EVENT,         /* an event stream without data (in its
                                       first MiB, or at all) */
    AFFINITY_SCAN_NOT_STORED        /* a response with "store": false */
} affinity_scan_reason_e;

typedef enum {
    AFFINITY_OBJECT_NONE = 0,
    AFFINITY_OBJECT_RESPONSE,
    AFFINITY_OBJECT_CONVERSATION
} affinity_object_e;

/*
 * The state of reading one response body, in memory the caller owns (the
 * request's pool): no allocation, and nothing of the body is kept but the
 * id.  The body is fed as it passes, in pieces split anywhere; the id is
 * known when a JSON body's top-level object (with "object": "response" or
 * "conversation") closes, or when the first event of a stream (the
 * "response" member of response.created) does.
 */
#define AFFINITY_RESPONSE_SCAN_SIZE  512

typedef struct {
    uint64_t    opaque[AFFINITY_RESPONSE_SCAN_SIZE / 8];
} affinity_response_scan_t;

AFFINITY_API void affinity_response_scan_start(affinity_response_scan_t *scan,
    affinity_response_format_e format) AFFINITY_NOEXCEPT;

/* Reads the next len bytes. */
AFFINITY_API affinity_scan_e affinity_response_scan(
    affinity_response_scan_t *scan, const char *data, size_t len)
    AFFINITY_NOEXCEPT;

/* The body ended (MORE becomes NONE). */
AFFINITY_API affinity_scan_e affinity_response_scan_end(
    affinity_response_scan_t *scan) AFFINITY_NOEXCEPT;

/* Why a scan ended without an id. */
AFFINITY_API affinity_scan_reason_e affinity_response_scan_reason(
    const affinity_response_scan_t *scan) AFFINITY_NOEXCEPT;

/* The id read (not NUL-terminated), or NULL before FOUND. */
AFFINITY_API const char *affinity_response_scan_id(
    const affinity_response_scan_t *scan, size_t *len,
    affinity_object_e *object) AFFINITY_NOEXCEPT;


/*
 * The usage a reply gives (usage.prompt_tokens or usage.input_tokens, and
 * their details' cached_tokens), read from its body as it passes, JSON or
 * event stream, in pieces split anywhere; the last figures win.  In memory
 * the caller owns; nothing of the body is kept.
 */
#define AFFINITY_USAGE_SCAN_SIZE  64

typedef struct {
    uint64_t    opaque[AFFINITY_USAGE_SCAN_SIZE / 8];
} affinity_usage_scan_t;

AFFINITY_API void affinity_usage_scan_start(affinity_usage_scan_t *scan)
    AFFINITY_NOEXCEPT;

/* Reads the next len bytes. */
AFFINITY_API void affinity_usage_scan(affinity_usage_scan_t *scan,
    const char *data, size_t len) AFFINITY_NOEXCEPT;

/* The body ended: 1 and the figures (prompt_tokens 0 if none was read)
 * if a count of cached tokens was read, else 0. */
AFFINITY_API int affinity_usage_scan_result(affinity_usage_scan_t *scan,
    uint64_t *cached_tokens, uint64_t *prompt_tokens) AFFINITY_NOEXCEPT;

/* The body ended: its prompt's tokens and its own (usage.completion_tokens
 * or usage.output_tokens), 0 for a figure not read, whether or not a count
 * of cached tokens was. */
AFFINITY_API void affinity_usage_scan_tokens(affinity_usage_scan_t *scan,
    uint64_t *prompt_tokens, uint64_t *output_tokens) AFFINITY_NOEXCEPT;


#ifdef __cplusplus
}
#endif

#endif /* AFFINITY_RESPONSES_H */

/*
 * affinity_store.h - several nginx instances, one routing: the store's
 * replies as the core reads them (RESP2, bounded), the protocol state of a
 * connection to the store, and the messages the instances exchange,
 * authenticated with the secret they share.  Included by affinity_core.h.
 *
 * The store (a Redis or Valkey server) is outside the trust boundary: it
 * may send anything, and anyone who can write to it may write entries.
 * Every function here takes its input as hostile, and is fuzzed
 * (fuzz/fuzz_store_reply.cpp, fuzz/fuzz_store_message.cpp).
 */

#ifndef AFFINITY_STORE_H
#define AFFINITY_STORE_H

#include "affinity_api.h"

#ifdef __cplusplus
extern "C" {
#endif


/* ---- the store's replies --------------------------------------------- */

typedef enum {
    AFFINITY_RESP_SIMPLE = 1,       /* +text */
    AFFINITY_RESP_ERROR,            /* -text */
    AFFINITY_RESP_INTEGER,          /* :number */
    AFFINITY_RESP_BULK,             /* $length, then the bytes */
    AFFINITY_RESP_NIL,              /* $-1 or *-1 */
    AFFINITY_RESP_ARRAY             /* *count, then the elements */
} affinity_resp_type_e;

/* no node: the end of an array's elements */
#define AFFINITY_RESP_NONE  UINT32_MAX

/* affinity_resp_node_t.flags: not all of it was kept (CUT: a string of
 * which no byte is kept, an array some of whose elements were not kept);
 * FULL too when that is because the reply's room ran out, not because the
 * string is longer than any kept */
#define AFFINITY_RESP_CUT   1
#define AFFINITY_RESP_FULL  2

/* One element of a reply, in the link's memory until the next feed. */
typedef struct {
    uint32_t     type;          /* affinity_resp_type_e */
    uint32_t     flags;
    int64_t      integer;       /* INTEGER: its value; ARRAY: the elements
                                   it declared; BULK: the length it
                                   declared */
    const char  *str;           /* SIMPLE, ERROR, BULK: the bytes kept */
    size_t       len;
    uint32_t     first;         /* ARRAY: its first element kept */
    uint32_t     next;          /* the next element of its array */
} affinity_resp_node_t;

/*
 * What a link keeps of one reply, whatever the reply declares: nodes, the
 * bytes of its strings, the longest string kept (a longer one is read past
 * unbuffered), the deepest nesting accepted (at most 16; deeper is a
 * protocol error), and the commands that may await their replies.
 */
typedef struct {
    uint32_t     nodes;
    uint32_t     bytes;
    uint32_t     string_max;
    uint32_t     depth;
    uint32_t     pending;
} affinity_resp_limits_t;


/* ---- a connection's protocol state ------------------------------------ */

/*
 * A link pairs each reply with the command that asked for it: the caller
 * tells it each command it sends (a tag and an argument of its own), and
 * the link returns each whole reply with them.  A reply nobody asked for,
 * or bytes that are not RESP2, break the link: the connection must be
 * closed (and the commands still pending taken back with
 * affinity_store_link_forget()).  Caller-owned memory, of
 * affinity_store_link_size() bytes (8-byte aligned); no allocation.
 */
typedef struct affinity_store_link_s  affinity_store_link_t;

AFFINITY_API size_t affinity_store_link_size(
    const affinity_resp_limits_t *limits) AFFINITY_NOEXCEPT;
AFFINITY_API affinity_store_link_t *affinity_store_link_init(void *mem,
    size_t size, const affinity_resp_limits_t *limits) AFFINITY_NOEXCEPT;

/* A new connection: nothing pending, nothing read, not broken. */
AFFINITY_API void affinity_store_link_reset(affinity_store_link_t *link)
    AFFINITY_NOEXCEPT;

/* A command was sent: 0, or -1 when limits.pending are awaited already
 * (the caller must not send it). */
AFFINITY_API int affinity_store_link_expect(affinity_store_link_t *link,
    uint32_t tag, uint64_t arg) AFFINITY_NOEXCEPT;
AFFINITY_API size_t affinity_store_link_pending(
    const affinity_store_link_t *link) AFFINITY_NOEXCEPT;

/* Takes back the oldest command still awaiting its reply: 1, 0 if none. */
AFFINITY_API int affinity_store_link_forget(affinity_store_link_t *link,
    uint32_t *tag, uint64_t *arg) AFFINITY_NOEXCEPT;

typedef enum {
    AFFINITY_LINK_BROKEN = -1,      /* reply->error says why */
    AFFINITY_LINK_MORE = 0,         /* all taken, no reply whole yet */
    AFFINITY_LINK_REPLY = 1         /* reply->root, with its command's tag
                                       and arg */
} affinity_link_status_e;

typedef struct {
    const affinity_resp_node_t  *root;
    uint32_t                     tag;
    uint64_t                     arg;
    const char                  *error;
} affinity_store_reply_t;

/*
 * Reads len bytes of data; *used is set to how many were taken.  Returns
 * at the first whole reply, which stays valid until the next call (call
 * again with the rest).
 */
AFFINITY_API int affinity_store_link_feed(affinity_store_link_t *link,
    const void *data, size_t len, size_t *used,
    affinity_store_reply_t *reply) AFFINITY_NOEXCEPT;

/* The node at an index (a node's first or next), or NULL. */
AFFINITY_API const affinity_resp_node_t *affinity_resp_node(
    const affinity_store_link_t *link, uint32_t index) AFFINITY_NOEXCEPT;

/* The command argv as RESP, into out: its length, 0 if it does not fit. */
AFFINITY_API size_t affinity_resp_command(void *out, size_t cap,
    size_t argc, const char *const *argv, const size_t *lens)
    AFFINITY_NOEXCEPT;


/* ---- stream entries in a reply --------------------------------------- */

/*
 * The entries of an XREAD reply ([[stream, [[id, [field, value, ...]],
 * ...]]], or nil) or of an XRANGE / XREVRANGE one ([[id, fields], ...]),
 * in order.  An entry whose id is not "ms-seq" is skipped; one not wholly
 * kept is given with cut set (and full, when the reply's room ran out
 * before it: read again, it may fit), its message only if whole.
 */
typedef struct {
    uint64_t     ms;            /* its id, ms-seq */
    uint64_t     seq;
    const char  *message;       /* its field "m", or NULL */
    size_t       message_len;
    uint32_t     cut;
    uint32_t     full;
} affinity_store_entry_t;

typedef struct {
    uint32_t     next;          /* the next entry's node */
} affinity_store_entries_t;

/* range: the reply is X(REV)RANGE's, else XREAD's.  0, or -1 when the
 * reply is not one of those (an error, say). */
AFFINITY_API int affinity_store_entries(const affinity_store_link_t *link,
    const affinity_resp_node_t *reply, int range,
    affinity_store_entries_t *entries) AFFINITY_NOEXCEPT;
/* 1 and the next entry, or 0 after the last. */
AFFINITY_API int affinity_store_entries_next(
    const affinity_store_link_t *link, affinity_store_entries_t *entries,
    affinity_store_entry_t *entry) AFFINITY_NOEXCEPT;

/* Parses a stream id "ms-seq": 0, or -1. */
AFFINITY_API int affinity_store_parse_id(const char *id, size_t len,
    uint64_t *ms, uint64_t *seq) AFFINITY_NOEXCEPT;


/* ---- what the instances share ---------------------------------------- */

typedef enum {
    AFFINITY_STORE_PIN = 1,         /* a session pinned to a peer */
    AFFINITY_STORE_RESPONSE,        /* a response id produced by a peer */
    AFFINITY_STORE_LEVELS,          /* a prompt's levels served by a peer */
    AFFINITY_STORE_SENT,            /* a request sent to a peer (with
                                       affinity_metrics) */
    AFFINITY_STORE_FILLED,          /* characters a peer's modelled cache
                                       took in (affinity_decision_t
                                       .cache_chars) */
    AFFINITY_STORE_DONE             /* a request announced as SENT ended */
} affinity_store_kind_e;

/* A session key or response id crosses the store as a keyed digest. */
#define AFFINITY_STORE_DIGEST        16

/* The authenticator that ends every message. */
#define AFFINITY_STORE_MAC           16

/* Longest message: its header, AFFINITY_MAX_LEVELS level hashes, its
 * authenticator. */
#define AFFINITY_STORE_MESSAGE_MAX \
    (40 + 8 * AFFINITY_MAX_LEVELS + AFFINITY_STORE_MAC)

/*
 * The keys of the instances sharing a store, derived from their secret:
 * one authenticates messages (HMAC-SHA-256 over the stream's name and the
 * message), one digests session keys and response ids.  Without a secret
 * (len 0) both are derived from a fixed text: messages are then checked
 * for integrity only, and ids only hidden by a hash anyone can compute.
 * Made once, at configuration (allocates); used by one thread at a time.
 */
typedef struct affinity_store_keys_s  affinity_store_keys_t;

AFFINITY_API affinity_store_keys_t *affinity_store_keys_create(
    const void *secret, size_t len) AFFINITY_NOEXCEPT;
AFFINITY_API void affinity_store_keys_free(affinity_store_keys_t *keys)
    AFFINITY_NOEXCEPT;

/* The digest of a session key (AFFINITY_STORE_PIN) or response id
 * (AFFINITY_STORE_RESPONSE), AFFINITY_STORE_DIGEST bytes into out. */
AFFINITY_API void affinity_store_digest(affinity_store_keys_t *keys,
    uint32_t kind, const void *id, size_t len, uint8_t *out)
    AFFINITY_NOEXCEPT;

typedef struct {
    uint32_t                 kind;      /* affinity_store_kind_e */
    uint32_t                 chars;     /* FILLED: not 0 */
    uint64_t                 ms;        /* wall clock, when it was
                                           learned */
    uint64_t                 instance;  /* who learned it
                                           (affinity_zone_info_t
                                           .instance) */
    uint64_t                 peer;      /* affinity_peer_id(), not 0 */
    const uint8_t           *digest;    /* PIN, RESPONSE:
                                           AFFINITY_STORE_DIGEST bytes */
    const uint64_t          *levels;    /* LEVELS: affinity_level_t.hash */
    size_t                   nlevels;
    uint64_t                 ticket;    /* SENT: for its sender, when it
                                           reads it back
                                           (affinity_zone_peer_heard()) */
    uint32_t                 watch;     /* SENT: its number in the sender's
                                           watch, or 0 */
    uint32_t                 sender;    /* the writer within the instance
                                           (a worker) */
    uint64_t                 seq;       /* that writer's count, growing with
                                           each message */
} affinity_store_message_t;

/* Writes a message for the stream of that name into out
 * (AFFINITY_STORE_MESSAGE_MAX bytes suffice): its length, or 0 when the
 * message is not valid. */
AFFINITY_API size_t affinity_store_encode(affinity_store_keys_t *keys,
    const void *stream, size_t stream_len,
    const affinity_store_message_t *message, void *out, size_t cap)
    AFFINITY_NOEXCEPT;

/* Writes the authenticator of the first len bytes of message, for the
 * stream of that name, after them (cap: the room message has): the whole
 * length, or 0 if it does not fit.  affinity_store_encode() does this;
 * tests and the fuzzers make messages of any layout with it. */
AFFINITY_API size_t affinity_store_seal(affinity_store_keys_t *keys,
    const void *stream, size_t stream_len, void *message, size_t len,
    size_t cap) AFFINITY_NOEXCEPT;

typedef enum {
    AFFINITY_STORE_OK = 0,
    AFFINITY_STORE_MALFORMED = -1,  /* not a message this version knows */
    AFFINITY_STORE_FORGED = -2      /* its authenticator is wrong: written
                                       without the secret, for another
                                       stream, or altered */
} affinity_store_decoded_e;

/* Reads a message of len bytes taken from the stream of that name.  The
 * digest points into data; levels are copied to the caller's array
 * (AFFINITY_MAX_LEVELS entries suffice). */
AFFINITY_API int affinity_store_decode(affinity_store_keys_t *keys,
    const void *stream, size_t stream_len, const void *data, size_t len,
    affinity_store_message_t *message, uint64_t *levels, size_t levels_cap)
    AFFINITY_NOEXCEPT;


/* ---- each writer's messages once ------------------------------------- */

/*
 * The writers heard from on one store, each with the highest count of its
 * messages taken: a message whose count is not above it was taken
 * already (written again into the stream, by anyone) and is refused.
 * Lives where the caller puts it (a zone shared by the workers; zeroed is
 * empty), used under the caller's lock.  When full, the writer heard from
 * least recently gives way.
 */
#define AFFINITY_STORE_SENDERS       256

typedef struct {
    uint64_t                 key;       /* of stream, instance and sender */
    uint64_t                 seq;
    uint32_t                 heard;     /* seconds, the caller's clock */
    uint32_t                 reserved;
} affinity_store_sender_t;

typedef struct {
    affinity_store_sender_t  entries[AFFINITY_STORE_SENDERS];
} affinity_store_senders_t;

/* 1: the message of that writer and count is new, and is now the
 * writer's highest; 0: it was taken before. */
AFFINITY_API int affinity_store_senders_admit(affinity_store_senders_t *table,
    uint32_t stream, uint64_t instance, uint32_t sender, uint64_t seq,
    uint32_t now) AFFINITY_NOEXCEPT;


#ifdef __cplusplus
}
#endif

#endif /* AFFINITY_STORE_H */

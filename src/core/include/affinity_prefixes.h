/*
 * affinity_prefixes.h - prompt prefixes: the levels of a request's canonical
 * prompt text.
 * Included by affinity_core.h.
 */

#ifndef AFFINITY_PREFIXES_H
#define AFFINITY_PREFIXES_H

#include "affinity_api.h"
#include "affinity_json.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most levels a prompt is hashed at. */
#define AFFINITY_MAX_LEVELS  128

/* Characters of prompt text per token, where a size in tokens is turned
 * into characters (affinity_request_t.prefix_capacity). */
#define AFFINITY_CHARS_PER_TOKEN  4

typedef struct affinity_level_s  affinity_level_t;

struct affinity_level_s {
    uint32_t    length;     /* code points of canonical text hashed */
    uint32_t    turn;       /* 1: at a message's end, 0: scheduled */
    uint64_t    hash;       /* XXH3, fixed seed (same in every instance) */
};

typedef enum {
    AFFINITY_PROMPT_OK = 0,
    AFFINITY_PROMPT_NONE,       /* valid JSON object without a prompt */
    AFFINITY_PROMPT_INVALID     /* not a JSON object, malformed, or not
                                   UTF-8 */
} affinity_prompt_e;

/*
 * The lengths (code points) a prompt is hashed at: the given lengths
 * (sorted, duplicates dropped), then, after the last one, lengths growing
 * by max(step, previous * growth_percent / 100) up to max.  step 0 adds
 * nothing after the given lengths.  Returns how many were written to out.
 */
AFFINITY_API size_t affinity_level_schedule(const uint32_t *lengths,
    size_t nlengths, uint32_t step, uint32_t growth_percent, uint32_t max,
    uint32_t *out, size_t out_cap) AFFINITY_NOEXCEPT;

/* Most turn levels a prompt may have (affinity_json_prompt()). */
#define AFFINITY_TURNS_MAX  16

/*
 * Builds the canonical prompt text of the chat completions, completions or
 * Responses API body loaded, and hashes its first L code points for each
 * scheduled L it reaches; a text shorter than schedule[0] gives one level
 * of its own length.  Reading stops at the last scheduled length.  Also
 * hashes it at the ends of its last turns messages (or Responses input
 * items) that end between the first and the last scheduled lengths, at
 * most AFFINITY_TURNS_MAX: turn levels, which let a conversation's next turn
 * find this whole prompt (when it adds fewer than turns messages).  The
 * instructions of a Responses API body end a turn too.  schedule is
 * strictly increasing.  Levels are written shortest first, as many as
 * out_cap allows (nschedule + min(turns, AFFINITY_TURNS_MAX): all of
 * them), the scheduled ones first, then the most recent turn levels.
 * Allocates only when a body's tools or items are larger than any
 * compacted before.
 */
AFFINITY_API affinity_prompt_e affinity_json_prompt(affinity_json_t *json,
    const uint32_t *schedule, size_t nschedule, size_t turns,
    affinity_level_t *out, size_t out_cap, size_t *nout) AFFINITY_NOEXCEPT;


#ifdef __cplusplus
}
#endif

#endif /* AFFINITY_PREFIXES_H */

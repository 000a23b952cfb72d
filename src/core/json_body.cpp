#include "json_body.h"

#include "json_field.h"
#include "level_hasher.h"
#include "prompt_walk.h"

namespace affinity {

static_assert(AFFINITY_JSON_PADDING >= simdjson::SIMDJSON_PADDING,
              "the C API's padding must cover simdjson's");

bool JsonBody::load(const char *data, size_t len) noexcept
{
    simdjson::dom::element root;

    unload();

    // The caller's buffer has the padding: parsed in place, not copied.
    if (parser_.parse(data, len, false).get(root) != simdjson::SUCCESS
        || root.get_object().get(root_) != simdjson::SUCCESS)
    {
        return false;
    }

    loaded_ = true;
    return true;
}

affinity_field_e JsonBody::field(std::string_view dotted_path, char *out,
                                 size_t out_cap, size_t *out_len)
{
    if (!loaded_) {
        return AFFINITY_FIELD_INVALID;
    }

    return read_field(root_, dotted_path, scratch_, out, out_cap, out_len);
}

affinity_prompt_e JsonBody::prompt(const uint32_t *schedule, size_t nschedule,
                                   size_t turns, affinity_level_t *out,
                                   size_t out_cap,
                                   size_t *nout)
{
    *nout = 0;

    if (!loaded_) {
        return AFFINITY_PROMPT_INVALID;
    }

    if (nschedule == 0) {
        return AFFINITY_PROMPT_NONE;
    }

    LevelHasher hasher(schedule, nschedule, turns, out, out_cap);
    affinity_prompt_e rc = walk_prompt(root_, hasher, scratch_);

    if (rc != AFFINITY_PROMPT_OK) {
        return rc;
    }

    *nout = hasher.finish();
    return *nout ? AFFINITY_PROMPT_OK : AFFINITY_PROMPT_NONE;
}

void JsonBody::unload() noexcept
{
    loaded_ = false;
    root_ = simdjson::dom::object();
}

bool JsonBody::shrink() noexcept
{
    bool freed = false;

    unload();

    // The parser keeps buffers sized for the largest body it has seen, and
    // the scratch buffer for the largest JSON it wrote: past retain bytes
    // both are dropped, so that large bodies do not hold their memory for
    // the worker's lifetime.
    if (parser_.capacity() > retain_) {
        parser_ = simdjson::dom::parser();
        freed = true;
    }

    if (scratch_.capacity() > retain_) {
        std::string().swap(scratch_);
        freed = true;
    }

    return freed;
}

}  // namespace affinity

#include "json_field.h"

#include <cstring>
#include <string>

#include <simdjson.h>

namespace affinity {

namespace {

static_assert(AFFINITY_JSON_PADDING >= simdjson::SIMDJSON_PADDING,
              "the C API's padding must cover simdjson's");

// "metadata.session_id" -> "/metadata/session_id" (RFC 6901 escapes).
std::string json_pointer(std::string_view dotted)
{
    std::string pointer;
    pointer.reserve(dotted.size() + 8);
    pointer.push_back('/');

    for (char c : dotted) {
        if (c == '.') {
            pointer.push_back('/');
        } else if (c == '~') {
            pointer += "~0";
        } else if (c == '/') {
            pointer += "~1";
        } else {
            pointer.push_back(c);
        }
    }

    return pointer;
}

simdjson::ondemand::parser &thread_parser()
{
    // One parser per thread, reused: it keeps its buffers between requests
    // (nginx workers are single-threaded).
    thread_local simdjson::ondemand::parser parser;
    return parser;
}

affinity_field_e copy_out(std::string_view value, char *out, size_t out_cap,
                          size_t *out_len)
{
    if (value.empty() || value.size() > out_cap) {
        return AFFINITY_FIELD_MISSING;
    }

    std::memcpy(out, value.data(), value.size());
    *out_len = value.size();
    return AFFINITY_FIELD_FOUND;
}

}  // namespace

affinity_field_e json_field(std::string_view padded_body,
                            std::string_view dotted_path, char *out,
                            size_t out_cap, size_t *out_len)
{
    using namespace simdjson;

    ondemand::document doc;
    if (thread_parser()
            .iterate(padded_body.data(), padded_body.size(),
                     padded_body.size() + AFFINITY_JSON_PADDING)
            .get(doc)
        != SUCCESS)
    {
        return AFFINITY_FIELD_INVALID;
    }

    ondemand::json_type type;
    if (doc.type().get(type) != SUCCESS
        || type != ondemand::json_type::object)
    {
        return AFFINITY_FIELD_INVALID;
    }

    ondemand::value value;
    error_code error = doc.at_pointer(json_pointer(dotted_path)).get(value);

    if (error == NO_SUCH_FIELD || error == INCORRECT_TYPE
        || error == INDEX_OUT_OF_BOUNDS)
    {
        return AFFINITY_FIELD_MISSING;
    }

    if (error != SUCCESS || value.type().get(type) != SUCCESS) {
        return AFFINITY_FIELD_INVALID;
    }

    if (type == ondemand::json_type::string) {
        std::string_view text;
        if (value.get_string().get(text) != SUCCESS) {
            return AFFINITY_FIELD_INVALID;
        }
        return copy_out(text, out, out_cap, out_len);
    }

    if (type == ondemand::json_type::number) {
        // As written, so 42 and "42" are the same session but 42.0 is not.
        std::string_view raw = value.raw_json_token();
        while (!raw.empty()
               && (raw.back() == ' ' || raw.back() == '\n'
                   || raw.back() == '\r' || raw.back() == '\t'))
        {
            raw.remove_suffix(1);
        }
        return copy_out(raw, out, out_cap, out_len);
    }

    return AFFINITY_FIELD_MISSING;
}

}  // namespace affinity

#include "json_field.h"

#include <cstring>

#include <simdjson.h>

namespace affinity {

namespace {

static_assert(AFFINITY_JSON_PADDING >= simdjson::SIMDJSON_PADDING,
              "the C API's padding must cover simdjson's");

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

// RFC 8259: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?  Checked here
// rather than by converting, so that integers of any size are numbers.
bool is_json_number(std::string_view t)
{
    size_t i = 0;
    auto digits = [&]() {
        size_t start = i;
        while (i < t.size() && t[i] >= '0' && t[i] <= '9') {
            i++;
        }
        return i > start;
    };

    if (i < t.size() && t[i] == '-') {
        i++;
    }

    if (i < t.size() && t[i] == '0') {
        i++;
    } else if (!digits()) {
        return false;
    }

    if (i < t.size() && t[i] == '.') {
        i++;
        if (!digits()) {
            return false;
        }
    }

    if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
        i++;
        if (i < t.size() && (t[i] == '+' || t[i] == '-')) {
            i++;
        }
        if (!digits()) {
            return false;
        }
    }

    return i == t.size();
}

affinity_field_e error_result(simdjson::error_code error)
{
    // A member that is absent, or a path step that is not an object, means
    // the body has no such field; anything else means it is not valid JSON.
    switch (error) {
    case simdjson::NO_SUCH_FIELD:
    case simdjson::INCORRECT_TYPE:
        return AFFINITY_FIELD_MISSING;
    default:
        return AFFINITY_FIELD_INVALID;
    }
}

affinity_field_e leaf_value(simdjson::ondemand::value value, char *out,
                            size_t out_cap, size_t *out_len)
{
    using namespace simdjson;

    ondemand::json_type type;
    if (value.type().get(type) != SUCCESS) {
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
        // Returned as written, so 42 and "42" are one session but 42.0 is
        // another; tokens like 42abc or 01 are not numbers.
        std::string_view raw = value.raw_json_token();
        while (!raw.empty()
               && (raw.back() == ' ' || raw.back() == '\n'
                   || raw.back() == '\r' || raw.back() == '\t'))
        {
            raw.remove_suffix(1);
        }

        if (!is_json_number(raw)) {
            return AFFINITY_FIELD_INVALID;
        }
        return copy_out(raw, out, out_cap, out_len);
    }

    return AFFINITY_FIELD_MISSING;
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

    ondemand::object object;
    if (doc.get_object().get(object) != SUCCESS) {
        return AFFINITY_FIELD_INVALID;
    }

    // Walk the dotted path through object members only: "items.0" names no
    // member of an array.
    for (;;) {
        size_t dot = dotted_path.find('.');
        std::string_view name = dotted_path.substr(0, dot);

        ondemand::value value;
        error_code error = object.find_field_unordered(name).get(value);
        if (error != SUCCESS) {
            return error_result(error);
        }

        if (dot == std::string_view::npos) {
            return leaf_value(value, out, out_cap, out_len);
        }

        dotted_path.remove_prefix(dot + 1);

        error = value.get_object().get(object);
        if (error != SUCCESS) {
            return error_result(error);
        }
    }
}

}  // namespace affinity

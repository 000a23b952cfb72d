#include "json_field.h"

#include <cstring>

#include "compact_json.h"

namespace affinity {

namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

affinity_field_e copy_out(std::string_view value, char *out, size_t out_cap,
                          size_t *out_len) noexcept
{
    if (value.empty() || value.size() > out_cap) {
        return AFFINITY_FIELD_MISSING;
    }

    std::memcpy(out, value.data(), value.size());
    *out_len = value.size();
    return AFFINITY_FIELD_FOUND;
}

}  // namespace

affinity_field_e read_field(simdjson::dom::object root,
                            std::string_view dotted_path, std::string &scratch,
                            char *out, size_t out_cap, size_t *out_len)
{
    simdjson::dom::object object = root;
    element value;

    // Walk the dotted path through object members only: "items.0" names no
    // member of an array.
    for (;;) {
        size_t dot = dotted_path.find('.');

        if (object.at_key(dotted_path.substr(0, dot)).get(value)
            != simdjson::SUCCESS)
        {
            return AFFINITY_FIELD_MISSING;
        }

        if (dot == std::string_view::npos) {
            break;
        }

        if (value.type() != element_type::OBJECT) {
            return AFFINITY_FIELD_MISSING;
        }

        object = value.get_object().value_unsafe();
        dotted_path.remove_prefix(dot + 1);
    }

    switch (value.type()) {

    case element_type::STRING:
        return copy_out(value.get_string().value_unsafe(), out, out_cap,
                        out_len);

    case element_type::INT64:
    case element_type::UINT64:
    case element_type::DOUBLE:
        // Numbers in one form, so that 42, 42.0 and 4.2e1 are one key.
        scratch.clear();
        append_json_number(value, scratch);
        return copy_out(scratch, out, out_cap, out_len);

    default:
        return AFFINITY_FIELD_MISSING;
    }
}

}  // namespace affinity

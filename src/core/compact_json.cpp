#include "compact_json.h"

#include <charconv>
#include <string_view>

namespace affinity {

namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

void append_string(std::string_view text, std::string &out)
{
    static const char hex[] = "0123456789abcdef";

    out += '"';

    size_t run = 0;

    for (size_t i = 0; i < text.size(); i++) {
        unsigned char c = static_cast<unsigned char>(text[i]);

        if (c >= 0x20 && c != '"' && c != '\\') {
            continue;
        }

        out.append(text.data() + run, i - run);
        run = i + 1;

        switch (c) {
        case '"':
            out += "\\\"";
            break;
        case '\\':
            out += "\\\\";
            break;
        case '\n':
            out += "\\n";
            break;
        case '\r':
            out += "\\r";
            break;
        case '\t':
            out += "\\t";
            break;
        default:
            out += "\\u00";
            out += hex[c >> 4];
            out += hex[c & 0xf];
            break;
        }
    }

    out.append(text.data() + run, text.size() - run);
    out += '"';
}

}  // namespace

void append_json_number(element number, std::string &out)
{
    char buf[32];
    char *end = buf + sizeof(buf);
    std::to_chars_result r{buf, std::errc()};

    // The type is checked before each value is taken: nothing here throws.
    switch (number.type()) {
    case element_type::INT64:
        r = std::to_chars(buf, end, number.get_int64().value_unsafe());
        break;
    case element_type::UINT64:
        r = std::to_chars(buf, end, number.get_uint64().value_unsafe());
        break;
    case element_type::DOUBLE:
        r = std::to_chars(buf, end, number.get_double().value_unsafe());
        break;
    default:
        return;
    }

    if (r.ec == std::errc()) {
        out.append(buf, static_cast<size_t>(r.ptr - buf));
    }
}

void append_compact_json(element value, std::string &out)
{
    simdjson::dom::object object;
    simdjson::dom::array array;
    bool first = true;

    switch (value.type()) {

    case element_type::OBJECT:
        object = value.get_object().value_unsafe();
        out += '{';
        for (simdjson::dom::key_value_pair member : object) {
            if (!first) {
                out += ',';
            }
            first = false;
            append_string(member.key, out);
            out += ':';
            append_compact_json(member.value, out);
        }
        out += '}';
        break;

    case element_type::ARRAY:
        array = value.get_array().value_unsafe();
        out += '[';
        for (element item : array) {
            if (!first) {
                out += ',';
            }
            first = false;
            append_compact_json(item, out);
        }
        out += ']';
        break;

    case element_type::STRING:
        append_string(value.get_string().value_unsafe(), out);
        break;

    case element_type::INT64:
    case element_type::UINT64:
    case element_type::DOUBLE:
        append_json_number(value, out);
        break;

    case element_type::BOOL:
        out += value.get_bool().value_unsafe() ? "true" : "false";
        break;

    case element_type::NULL_VALUE:
        out += "null";
        break;
    }
}

}  // namespace affinity

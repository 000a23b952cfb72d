// One field of a JSON request body, by a top-level or dotted path
// ("user", "metadata.session_id"): a session key.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <simdjson.h>

#include "affinity_core.h"

namespace affinity {

// The value at path in the root object of a parsed body: a string
// unescaped, a number in its shortest form (compact_json.h).  scratch holds
// the text of a number.
affinity_field_e read_field(simdjson::dom::object root,
                            std::string_view dotted_path, std::string &scratch,
                            char *out, size_t out_cap, size_t *out_len);

}  // namespace affinity

// Extraction of one field from a JSON request body, with simdjson On-Demand:
// it parses only as far as the field, at several GB/s.
#pragma once

#include <cstddef>
#include <string_view>

#include "affinity_core.h"

namespace affinity {

// See affinity_json_field() in affinity_core.h.
affinity_field_e json_field(std::string_view padded_body,
                            std::string_view dotted_path, char *out,
                            size_t out_cap, size_t *out_len);

}  // namespace affinity

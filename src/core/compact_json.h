// Compact JSON text of a parsed value, for the canonical prompt text of
// tools, tool calls and Responses API items.
//
// Written from the parsed value, not copied from the client's text, so that
// equal values give equal text whatever the client's encoding: keys in the
// client's order, no whitespace, strings with only the escapes JSON
// requires ('"', '\\' and control characters), numbers in their shortest
// round-trip form (42, 1.5, 1e+300).
#pragma once

#include <string>

#include <simdjson.h>

namespace affinity {

// Appends the compact JSON of value to out.  Nesting is bounded by the
// parser's depth limit.
void append_compact_json(simdjson::dom::element value, std::string &out);

// Appends a number in the form above.
void append_json_number(simdjson::dom::element number, std::string &out);

}  // namespace affinity

// The canonical prompt text of an OpenAI-style request body, fed to a
// LevelHasher.
//
// The canonical text makes equal prompts hash equally whatever the client's
// JSON encoding (escapes, key order, whitespace, extra fields):
//
//   "model" US model RS
//   "tool" US compact-json RS              for each element of "tools"
//   role US text RS                        for each message; text is the
//                                          string content, or the content
//                                          parts in order: text parts as
//                                          they are, other parts as
//                                          GS type ":" hash-of-url-or-data GS
//   "prompt" US text RS                    completions: "prompt" (a string,
//                                          or the first element of a list)
//   "instructions" US text RS, then the "input" string as a user message or
//                                          its items as messages (items
//                                          without a role: type US json RS)
//
// with US = 0x1f, RS = 0x1e, GS = 0x1d, and compact JSON as compact_json.h
// writes it.  The walk stops as soon as the hasher has its longest level.
#pragma once

#include <string>

#include <simdjson.h>

#include "affinity_core.h"
#include "level_hasher.h"

namespace affinity {

// Walks the root object of a parsed body.  scratch is a buffer for compact
// JSON (tools, tool calls), reused between calls.
affinity_prompt_e walk_prompt(simdjson::dom::object body, LevelHasher &hasher,
                              std::string &scratch);

}  // namespace affinity

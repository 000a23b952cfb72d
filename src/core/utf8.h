// Code points of UTF-8 text, counted many bytes at a time: prompt
// lengths are code points, and prompts are long.
#pragma once

#include <cstddef>
#include <cstdint>

namespace affinity {

// Code points in p[0..n) (valid UTF-8).
size_t count_code_points(const char *p, size_t n) noexcept;

// The byte offset where the first need code points of p[0..n) end: the
// start of code point need + 1 (p holds more than need code points).
size_t code_point_offset(const char *p, size_t n, uint64_t need) noexcept;

}  // namespace affinity

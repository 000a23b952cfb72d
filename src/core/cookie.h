// Cookie request headers (RFC 6265, section 4.2): the value of a named
// cookie in a "Cookie:" header line.
#pragma once

#include <cstddef>
#include <string_view>

namespace affinity {

// The value of the first cookie called name in a Cookie header line:
// "name=value" pairs separated by ';' (optional spaces and tabs around
// them).  The value is returned as sent, quotes included.  False if the
// line has no such cookie; a pair without '=' names no cookie.
bool find_cookie(std::string_view line, std::string_view name,
                 std::string_view &value) noexcept;

}  // namespace affinity

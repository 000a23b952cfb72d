#include "cookie.h"

namespace affinity {

namespace {

bool is_space(char c) noexcept
{
    return c == ' ' || c == '\t';
}

std::string_view trim(std::string_view s) noexcept
{
    while (!s.empty() && is_space(s.front())) {
        s.remove_prefix(1);
    }
    while (!s.empty() && is_space(s.back())) {
        s.remove_suffix(1);
    }
    return s;
}

}  // namespace

bool find_cookie(std::string_view line, std::string_view name,
                 std::string_view &value) noexcept
{
    if (name.empty()) {
        return false;
    }

    while (!line.empty()) {
        size_t end = line.find(';');
        std::string_view pair = line.substr(0, end);
        size_t eq = pair.find('=');

        if (eq != std::string_view::npos
            && trim(pair.substr(0, eq)) == name)
        {
            value = trim(pair.substr(eq + 1));
            return true;
        }

        if (end == std::string_view::npos) {
            break;
        }

        line.remove_prefix(end + 1);
    }

    return false;
}

}  // namespace affinity

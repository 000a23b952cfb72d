// fuzz_cookie: the value of a named cookie in a Cookie header line.
//
// The input is "NAME\nLINE": a cookie name (as in "key cookie=NAME") and
// one Cookie header line.  Each is copied into a heap block of its exact
// size, so that AddressSanitizer reports any read past them.  Checked:
//
//   - an empty name is never found;
//   - a value found lies inside the line (pointer arithmetic on the line's
//     block), has no leading or trailing space or tab, and holds no ';';
//   - the text from the start of its pair (the previous ';' or the line
//     start) to the value is "NAME =" with optional spaces and tabs around
//     NAME and around '=': the pair's name, trimmed, is NAME, and the value
//     starts right after the first '=' of the pair;
//   - after the value come only spaces and tabs up to the next ';' or the
//     end of the line (the value is the rest of its pair, trimmed);
//   - it is the first such pair: no pair before it is called NAME; and a
//     name not found is the name of no pair of the line.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "affinity_core.h"

namespace {

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond)) {                                                      \
            __builtin_printf("fuzz_cookie: check failed: %s (line %d)\n",   \
                             #cond, __LINE__);                              \
            __builtin_trap();                                               \
        }                                                                   \
    } while (0)

bool blank(char c)
{
    return c == ' ' || c == '\t';
}

std::string_view trim(std::string_view s)
{
    while (!s.empty() && blank(s.front())) {
        s.remove_prefix(1);
    }
    while (!s.empty() && blank(s.back())) {
        s.remove_suffix(1);
    }
    return s;
}

// Whether a pair (the text between two ';') is a cookie called name.
bool pair_named(std::string_view pair, std::string_view name)
{
    size_t eq = pair.find('=');
    return eq != std::string_view::npos && trim(pair.substr(0, eq)) == name;
}

// Whether any pair of text is called name.
bool any_pair_named(std::string_view text, std::string_view name)
{
    for (;;) {
        size_t semi = text.find(';');
        if (pair_named(text.substr(0, semi), name)) {
            return true;
        }
        if (semi == std::string_view::npos) {
            return false;
        }
        text.remove_prefix(semi + 1);
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nl = static_cast<const uint8_t *>(
        std::memchr(data, '\n', size));

    if (nl == nullptr) {
        return 0;
    }

    size_t name_len = static_cast<size_t>(nl - data);
    size_t line_len = size - name_len - 1;

    // Exact-size blocks (at least one byte, for a valid pointer).
    char *name = static_cast<char *>(std::malloc(name_len ? name_len : 1));
    char *line = static_cast<char *>(std::malloc(line_len ? line_len : 1));
    CHECK(name != nullptr && line != nullptr);
    std::memcpy(name, data, name_len);
    std::memcpy(line, nl + 1, line_len);

    const char *value = nullptr;
    size_t value_len = 12345;
    int found = affinity_cookie_find(line, line_len, name, name_len, &value,
                                     &value_len);

    CHECK(found == 0 || found == 1);

    std::string_view l(line, line_len);
    std::string_view n(name, name_len);

    if (name_len == 0) {
        CHECK(found == 0);
    }

    if (!found) {
        CHECK(name_len == 0 || !any_pair_named(l, n));

    } else {
        CHECK(value != nullptr);
        CHECK(value >= line && value <= line + line_len);
        CHECK(value_len <= static_cast<size_t>(line + line_len - value));

        size_t at = static_cast<size_t>(value - line);
        std::string_view v(value, value_len);

        if (value_len) {
            CHECK(!blank(v.front()) && !blank(v.back()));
        }
        CHECK(v.find(';') == std::string_view::npos);

        // Before the value: its pair's "NAME =" (blanks around both).
        // (A value found follows a '=', so at >= 1.)
        CHECK(at >= 1);
        size_t start = l.rfind(';', at - 1);
        start = start == std::string_view::npos ? 0 : start + 1;
        std::string_view before = l.substr(start, at - start);
        size_t eq = before.find('=');
        CHECK(eq != std::string_view::npos);
        CHECK(trim(before.substr(0, eq)) == n);
        CHECK(trim(before.substr(eq + 1)).empty());

        // After the value: blanks, then ';' or the end.
        std::string_view after = l.substr(at + value_len);
        size_t semi = after.find(';');
        CHECK(trim(after.substr(0, semi)).empty());

        // The first pair with that name: none in the pairs before it.
        if (start > 0) {
            CHECK(!any_pair_named(l.substr(0, start - 1), n));
        }
    }

    std::free(name);
    std::free(line);
    return 0;
}

#include "prompt_levels.h"

#include <algorithm>
#include <cstring>
#include <string>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <simdjson.h>

namespace affinity {

namespace {

// Fixed: a prefix hashes alike in every nginx instance, so that several
// instances place a cold prompt on the same peer.
constexpr uint64_t kPrefixSeed = 0x70726566'69783031ULL;    // "prefix01"

constexpr char kUnitSep = '\x1f';
constexpr char kRecordSep = '\x1e';
constexpr char kGroupSep = '\x1d';

// Code points in UTF-8 text: one starts at every byte but the continuation
// bytes (10xxxxxx, -128..-65 as signed chars).  Prompts are long, so both
// scans below take 32 bytes at a time with AVX2 when the build has it, 8
// with a word trick otherwise: a mask of the bytes that start a code point.

inline bool starts_code_point(char c) noexcept
{
    return static_cast<signed char>(c) > -65;
}

// Bits 7 of the bytes of w that start a code point.
inline uint64_t start_bits(uint64_t w) noexcept
{
    return ~(w & ~(w << 1)) & 0x8080808080808080ULL;
}

#if defined(__AVX2__)
inline uint32_t start_mask32(const char *p) noexcept
{
    __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p));
    __m256i starts = _mm256_cmpgt_epi8(bytes, _mm256_set1_epi8(-65));
    return static_cast<uint32_t>(_mm256_movemask_epi8(starts));
}
#endif

size_t count_code_points(const char *p, size_t n) noexcept
{
    size_t count = 0;
    size_t i = 0;

#if defined(__AVX2__)
    for (; i + 32 <= n; i += 32) {
        count += static_cast<size_t>(__builtin_popcount(start_mask32(p + i)));
    }
#endif

    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        std::memcpy(&w, p + i, sizeof(w));
        count += static_cast<size_t>(__builtin_popcountll(start_bits(w)));
    }

    for (; i < n; i++) {
        count += starts_code_point(p[i]);
    }

    return count;
}

// The byte offset where the first `need` code points of p[0..n) end: the
// start of code point need + 1 (p holds more than need code points).
size_t code_point_offset(const char *p, size_t n, uint64_t need) noexcept
{
    uint64_t seen = 0;
    size_t i = 0;

#if defined(__AVX2__)
    for (; i + 32 <= n; i += 32) {
        uint32_t mask = start_mask32(p + i);
        uint64_t c = static_cast<uint64_t>(__builtin_popcount(mask));

        if (seen + c > need) {
            // Skip the `need - seen` starts before the one we look for.
            for (uint64_t k = need - seen; k > 0; k--) {
                mask &= mask - 1;
            }
            return i + static_cast<size_t>(__builtin_ctz(mask));
        }
        seen += c;
    }
#endif

    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        std::memcpy(&w, p + i, sizeof(w));
        uint64_t c = static_cast<uint64_t>(__builtin_popcountll(start_bits(w)));

        if (seen + c > need) {
            break;
        }
        seen += c;
    }

    for (; i < n; i++) {
        if (starts_code_point(p[i])) {
            if (seen == need) {
                break;
            }
            seen++;
        }
    }

    return i;
}

}  // namespace

LevelHasher::LevelHasher(const uint32_t *schedule, size_t nschedule,
                         affinity_level_t *out, size_t out_cap) noexcept
    : schedule_(schedule), nschedule_(nschedule), out_(out), out_cap_(out_cap)
{
    XXH3_INITSTATE(&state_);
    XXH3_64bits_reset_withSeed(&state_, kPrefixSeed);
}

void LevelHasher::emit(uint32_t length) noexcept
{
    if (nout_ < out_cap_) {
        out_[nout_++] = {length, 0, XXH3_64bits_digest(&state_)};
    }
}

bool LevelHasher::append(std::string_view text) noexcept
{
    const char *p = text.data();
    size_t n = text.size();
    uint64_t count = n ? count_code_points(p, n) : 0;

    while (n > 0 && !done()) {
        uint64_t need = schedule_[next_] - code_points_;

        if (count < need) {
            XXH3_64bits_update(&state_, p, n);
            code_points_ += count;
            return true;
        }

        // A level ends inside this text; in ASCII, after `need` bytes.
        size_t end = count == n ? need : code_point_offset(p, n, need);

        XXH3_64bits_update(&state_, p, end);
        code_points_ += need;
        emit(schedule_[next_]);
        next_++;

        p += end;
        n -= end;
        count -= need;
    }

    return !done();
}

size_t LevelHasher::finish() noexcept
{
    if (nout_ == 0 && code_points_ > 0) {
        emit(static_cast<uint32_t>(
            std::min<uint64_t>(code_points_, UINT32_MAX)));
    }

    return nout_;
}

namespace {

using namespace simdjson;

enum class Step { More, Done, Invalid };

// The text of a JSON string value.  Most prompt text has no escapes: it is
// then used in place in the body, and only strings with a backslash are
// unescaped (into the parser's buffer).  The body was validated as UTF-8
// when the parser indexed it.
error_code get_text(ondemand::value value, std::string_view &text) noexcept
{
    std::string_view raw = value.raw_json_token();

    if (raw.size() >= 2 && raw.front() == '"') {
        size_t close = raw.rfind('"');

        if (close > 0) {
            std::string_view inner = raw.substr(1, close - 1);

            if (std::memchr(inner.data(), '\\', inner.size()) == nullptr) {
                text = inner;
                return SUCCESS;
            }
        }
    }

    return value.get_string().get(text);
}

// Walks a request body and feeds its canonical prompt text to a hasher.
class PromptWalker {
public:
    explicit PromptWalker(LevelHasher &hasher) : hasher_(hasher) {}

    affinity_prompt_e walk(ondemand::object body);

private:
    Step add(std::string_view text)
    {
        return hasher_.append(text) ? Step::More : Step::Done;
    }

    Step record(std::string_view tag, std::string_view text);
    Step model(ondemand::object body);
    Step tools(ondemand::object body);
    Step messages(ondemand::array list, bool responses_items);
    Step message(ondemand::object msg);
    Step content(ondemand::value content);
    Step part(ondemand::object part);
    Step compact(std::string_view tag, std::string_view raw);
    Step completion_prompt(ondemand::value prompt);

    LevelHasher &hasher_;
    bool found_prompt_ = false;
};

// tag US text RS
Step PromptWalker::record(std::string_view tag, std::string_view text)
{
    if (add(tag) == Step::Done || hasher_.append_byte(kUnitSep) == false
        || add(text) == Step::Done || hasher_.append_byte(kRecordSep) == false)
    {
        return Step::Done;
    }
    return Step::More;
}

// tag US compact-json RS
Step PromptWalker::compact(std::string_view tag, std::string_view raw)
{
    // One buffer per thread, grown as needed and reused.
    thread_local std::string minified;

    if (minified.size() < raw.size()) {
        minified.resize(std::max(raw.size(), minified.size() * 2));
    }

    size_t len = 0;
    if (simdjson::minify(raw.data(), raw.size(), minified.data(), len)
        != SUCCESS)
    {
        return Step::Invalid;
    }

    return record(tag, std::string_view(minified.data(), len));
}

Step PromptWalker::model(ondemand::object body)
{
    std::string_view name;
    error_code error = body.find_field_unordered("model").get_string().get(name);

    if (error == NO_SUCH_FIELD || error == INCORRECT_TYPE) {
        return Step::More;
    }
    if (error != SUCCESS) {
        return Step::Invalid;
    }
    return record("model", name);
}

Step PromptWalker::tools(ondemand::object body)
{
    ondemand::array list;
    error_code error = body.find_field_unordered("tools").get_array().get(list);

    if (error == NO_SUCH_FIELD || error == INCORRECT_TYPE) {
        return Step::More;
    }
    if (error != SUCCESS) {
        return Step::Invalid;
    }

    for (auto element : list) {
        ondemand::object tool;
        std::string_view raw;

        if (element.get_object().get(tool) != SUCCESS
            || tool.raw_json().get(raw) != SUCCESS)
        {
            return Step::Invalid;
        }

        Step step = compact("tool", raw);
        if (step != Step::More) {
            return step;
        }
    }

    return Step::More;
}

// A non-text content part: its type and a hash of what it refers to (the
// URL or inline data), so equal images make equal prompts at a few bytes.
Step PromptWalker::part(ondemand::object part)
{
    std::string_view type;
    error_code error = part.find_field_unordered("type").get_string().get(type);
    if (error != SUCCESS && error != NO_SUCH_FIELD) {
        return Step::Invalid;
    }

    if (type == "text" || type == "input_text" || type == "output_text") {
        std::string_view text;
        ondemand::value v;
        error = part.find_field_unordered("text").get(v);
        if (error == NO_SUCH_FIELD) {
            return Step::More;
        }
        if (error != SUCCESS || get_text(v, text) != SUCCESS) {
            return Step::Invalid;
        }
        return add(text);
    }

    // The reference: a member that names the content (image_url, file_id,
    // ...) as a string, or the url/data of such a member that is an object
    // (image_url, input_audio, file).  Other members (detail, format,
    // filename) do not identify it.
    std::string_view ref;
    bool found = false;

    if (part.reset().error() != SUCCESS) {
        return Step::Invalid;
    }

    for (auto field : part) {
        std::string_view key;
        ondemand::value value;

        if (field.unescaped_key().get(key) != SUCCESS
            || field.value().get(value) != SUCCESS)
        {
            return Step::Invalid;
        }

        bool names_content = false;
        for (const char *name : {"image_url", "file_id", "file_data", "file_url",
                                 "url", "data", "input_audio", "file",
                                 "audio_url", "video_url"})
        {
            names_content |= key == name;
        }

        if (!names_content || found) {
            continue;
        }

        ondemand::json_type kind;
        if (value.type().get(kind) != SUCCESS) {
            return Step::Invalid;
        }

        if (kind == ondemand::json_type::string) {
            if (get_text(value, ref) != SUCCESS) {
                return Step::Invalid;
            }
            found = true;
            continue;
        }

        if (kind != ondemand::json_type::object) {
            continue;
        }

        ondemand::object inner;
        if (value.get_object().get(inner) != SUCCESS) {
            return Step::Invalid;
        }

        for (const char *name : {"url", "data", "file_data", "file_id"}) {
            ondemand::value v;
            error_code e = inner.find_field_unordered(name).get(v);

            if (e == NO_SUCH_FIELD) {
                continue;
            }

            // Any other error leaves the parser unusable: stop here.
            if (e != SUCCESS || get_text(v, ref) != SUCCESS) {
                return Step::Invalid;
            }

            found = true;
            break;
        }
    }

    char tag[1 + 32 + 1 + 16 + 1];
    static const char hex[] = "0123456789abcdef";
    uint64_t h = found ? XXH3_64bits(ref.data(), ref.size()) : 0;
    size_t n = 0;

    tag[n++] = kGroupSep;
    for (size_t i = 0; i < type.size() && i < 32; i++) {
        tag[n++] = type[i];
    }
    tag[n++] = ':';
    for (int shift = 60; shift >= 0; shift -= 4) {
        tag[n++] = hex[(h >> shift) & 0xf];
    }
    tag[n++] = kGroupSep;

    return add(std::string_view(tag, n));
}

Step PromptWalker::content(ondemand::value content)
{
    ondemand::json_type kind;
    if (content.type().get(kind) != SUCCESS) {
        return Step::Invalid;
    }

    if (kind == ondemand::json_type::string) {
        std::string_view text;
        if (get_text(content, text) != SUCCESS) {
            return Step::Invalid;
        }
        return add(text);
    }

    if (kind != ondemand::json_type::array) {
        return Step::More;      // null: an assistant turn with tool calls
    }

    ondemand::array parts;
    if (content.get_array().get(parts) != SUCCESS) {
        return Step::Invalid;
    }

    for (auto element : parts) {
        ondemand::json_type part_kind;
        if (element.type().get(part_kind) != SUCCESS) {
            return Step::Invalid;
        }

        Step step;

        if (part_kind == ondemand::json_type::string) {
            std::string_view text;
            ondemand::value v;
            if (element.get(v) != SUCCESS || get_text(v, text) != SUCCESS) {
                return Step::Invalid;
            }
            step = add(text);

        } else if (part_kind == ondemand::json_type::object) {
            ondemand::object p;
            if (element.get_object().get(p) != SUCCESS) {
                return Step::Invalid;
            }
            step = part(p);

        } else {
            continue;
        }

        if (step != Step::More) {
            return step;
        }
    }

    return Step::More;
}

// role US content [tool calls] RS
Step PromptWalker::message(ondemand::object msg)
{
    std::string_view role;
    error_code error = msg.find_field_unordered("role").get_string().get(role);
    if (error != SUCCESS && error != NO_SUCH_FIELD) {
        return Step::Invalid;
    }

    if (add(role) == Step::Done || !hasher_.append_byte(kUnitSep)) {
        return Step::Done;
    }

    ondemand::value value;
    error = msg.find_field_unordered("content").get(value);
    if (error == SUCCESS) {
        Step step = content(value);
        if (step != Step::More) {
            return step;
        }
    } else if (error != NO_SUCH_FIELD) {
        return Step::Invalid;
    }

    // Agent loops: an assistant turn may be only tool calls.
    ondemand::array calls;
    error = msg.find_field_unordered("tool_calls").get_array().get(calls);
    if (error == SUCCESS) {
        std::string_view raw;
        if (calls.raw_json().get(raw) != SUCCESS) {
            return Step::Invalid;
        }
        Step step = compact("tool_calls", raw);
        if (step != Step::More) {
            return step;
        }
    } else if (error != NO_SUCH_FIELD && error != INCORRECT_TYPE) {
        return Step::Invalid;
    }

    return hasher_.append_byte(kRecordSep) ? Step::More : Step::Done;
}

// Chat "messages", or Responses "input" items: items with a role are
// messages; the others (function calls and their outputs, ...) are their
// type and compact JSON.
Step PromptWalker::messages(ondemand::array list, bool responses_items)
{
    for (auto element : list) {
        ondemand::object msg;
        error_code error = element.get_object().get(msg);

        if (error == INCORRECT_TYPE) {
            continue;
        }
        if (error != SUCCESS) {
            return Step::Invalid;
        }

        found_prompt_ = true;

        Step step;

        if (responses_items) {
            std::string_view probe;
            error = msg.find_field_unordered("role").get_string().get(probe);

            if (error == NO_SUCH_FIELD) {
                std::string_view type, raw;
                if (msg.reset().error() != SUCCESS) {
                    return Step::Invalid;
                }
                error = msg.find_field_unordered("type").get_string().get(type);
                if ((error != SUCCESS && error != NO_SUCH_FIELD)
                    || msg.reset().error() != SUCCESS
                    || msg.raw_json().get(raw) != SUCCESS)
                {
                    return Step::Invalid;
                }
                step = compact(type, raw);

                if (step != Step::More) {
                    return step;
                }
                continue;
            }

            if (error != SUCCESS || msg.reset().error() != SUCCESS) {
                return Step::Invalid;
            }
        }

        step = message(msg);
        if (step != Step::More) {
            return step;
        }
    }

    return Step::More;
}

// Completions: a string, or the first element of a list (a string, or a
// list of token ids, taken as compact JSON).
Step PromptWalker::completion_prompt(ondemand::value prompt)
{
    ondemand::json_type kind;
    if (prompt.type().get(kind) != SUCCESS) {
        return Step::Invalid;
    }

    if (kind == ondemand::json_type::string) {
        std::string_view text;
        if (get_text(prompt, text) != SUCCESS) {
            return Step::Invalid;
        }
        found_prompt_ = true;
        return record("prompt", text);
    }

    if (kind != ondemand::json_type::array) {
        return Step::More;
    }

    ondemand::array list;
    std::string_view raw;
    if (prompt.get_array().get(list) != SUCCESS) {
        return Step::Invalid;
    }

    for (auto first : list) {
        ondemand::json_type first_kind;
        if (first.type().get(first_kind) != SUCCESS) {
            return Step::Invalid;
        }

        if (first_kind == ondemand::json_type::string) {
            std::string_view text;
            ondemand::value v;
            if (first.get(v) != SUCCESS || get_text(v, text) != SUCCESS) {
                return Step::Invalid;
            }
            found_prompt_ = true;
            return record("prompt", text);
        }

        if (first_kind == ondemand::json_type::array) {
            ondemand::array tokens;
            if (first.get_array().get(tokens) != SUCCESS
                || tokens.raw_json().get(raw) != SUCCESS)
            {
                return Step::Invalid;
            }
            found_prompt_ = true;
            return compact("prompt", raw);
        }

        break;      // a list of token ids: the whole list below
    }

    if (list.reset().error() != SUCCESS || list.raw_json().get(raw) != SUCCESS) {
        return Step::Invalid;
    }
    found_prompt_ = true;
    return compact("prompt", raw);
}

affinity_prompt_e PromptWalker::walk(ondemand::object body)
{
    Step step = model(body);

    if (step == Step::More) {
        step = tools(body);
    }

    if (step == Step::More) {
        ondemand::array list;
        error_code error = body.find_field_unordered("messages").get_array()
                               .get(list);

        if (error == SUCCESS) {
            step = messages(list, false);

        } else if (error != NO_SUCH_FIELD && error != INCORRECT_TYPE) {
            step = Step::Invalid;

        } else {
            ondemand::value prompt;
            error = body.find_field_unordered("prompt").get(prompt);

            if (error == SUCCESS) {
                step = completion_prompt(prompt);

            } else if (error != NO_SUCH_FIELD) {
                step = Step::Invalid;

            } else {
                // Responses API: instructions, then input.
                std::string_view text;
                ondemand::value v;
                error = body.find_field_unordered("instructions").get(v);
                if (error == SUCCESS && get_text(v, text) == SUCCESS) {
                    found_prompt_ = true;
                    step = record("instructions", text);
                } else if (error != SUCCESS && error != NO_SUCH_FIELD) {
                    step = Step::Invalid;
                }

                ondemand::value input;
                error = step == Step::More
                        ? body.find_field_unordered("input").get(input)
                        : NO_SUCH_FIELD;

                if (error != SUCCESS && error != NO_SUCH_FIELD) {
                    step = Step::Invalid;

                } else if (error == SUCCESS) {
                    ondemand::json_type kind;
                    if (input.type().get(kind) != SUCCESS) {
                        step = Step::Invalid;

                    } else if (kind == ondemand::json_type::string) {
                        found_prompt_ = true;
                        step = get_text(input, text) == SUCCESS
                               ? record("user", text) : Step::Invalid;

                    } else if (kind == ondemand::json_type::array) {
                        step = input.get_array().get(list) == SUCCESS
                               ? messages(list, true) : Step::Invalid;
                    }
                }
            }
        }
    }

    if (step == Step::Invalid) {
        return AFFINITY_PROMPT_INVALID;
    }

    if (step == Step::Done && !found_prompt_) {
        // Model and tools alone reached the last level: it is a prompt if
        // the body has one.
        for (const char *name : {"messages", "prompt", "input", "instructions"}) {
            ondemand::value v;
            error_code error = body.find_field_unordered(name).get(v);

            if (error == SUCCESS) {
                return AFFINITY_PROMPT_OK;
            }
            if (error != NO_SUCH_FIELD) {
                return AFFINITY_PROMPT_INVALID;
            }
        }
    }

    return found_prompt_ ? AFFINITY_PROMPT_OK : AFFINITY_PROMPT_NONE;
}

ondemand::parser &thread_parser()
{
    thread_local ondemand::parser parser;
    return parser;
}

}  // namespace

affinity_prompt_e prompt_levels(std::string_view padded_body,
                                const uint32_t *schedule, size_t nschedule,
                                affinity_level_t *out, size_t out_cap,
                                size_t *nout)
{
    *nout = 0;

    if (nschedule == 0) {
        return AFFINITY_PROMPT_NONE;
    }

    ondemand::document doc;
    ondemand::object body;

    if (thread_parser()
            .iterate(padded_body.data(), padded_body.size(),
                     padded_body.size() + AFFINITY_JSON_PADDING)
            .get(doc)
            != SUCCESS
        || doc.get_object().get(body) != SUCCESS)
    {
        return AFFINITY_PROMPT_INVALID;
    }

    LevelHasher hasher(schedule, nschedule, out, out_cap);
    affinity_prompt_e rc = PromptWalker(hasher).walk(body);

    if (rc != AFFINITY_PROMPT_OK) {
        return rc;
    }

    *nout = hasher.finish();
    return *nout ? AFFINITY_PROMPT_OK : AFFINITY_PROMPT_NONE;
}

size_t level_schedule(const uint32_t *lengths, size_t nlengths, uint32_t step,
                      uint32_t growth_percent, uint32_t max, uint32_t *out,
                      size_t out_cap) noexcept
{
    size_t n = 0;
    uint32_t last = 0;

    // The given lengths, sorted and without duplicates (insertion: a few).
    for (size_t i = 0; i < nlengths; i++) {
        uint32_t length = lengths[i];
        if (length == 0) {
            continue;
        }
        size_t at = 0;
        while (at < n && out[at] < length) {
            at++;
        }
        if ((at < n && out[at] == length) || at == out_cap) {
            continue;
        }
        if (n == out_cap) {
            n--;        // full: the longest given length makes room
        }
        for (size_t k = n; k > at; k--) {
            out[k] = out[k - 1];
        }
        out[at] = length;
        n++;
    }

    if (n > 0) {
        last = out[n - 1];
    }

    if (step == 0) {
        return n;
    }

    while (n < out_cap) {
        uint64_t gap = std::max<uint64_t>(
            step, uint64_t{last} * growth_percent / 100);
        uint64_t next = uint64_t{last} + gap;

        if (next > max) {
            break;
        }

        last = static_cast<uint32_t>(next);
        out[n++] = last;
    }

    return n;
}

}  // namespace affinity

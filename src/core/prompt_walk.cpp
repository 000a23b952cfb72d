#include "prompt_walk.h"

#include <algorithm>

#include "compact_json.h"

namespace affinity {

namespace {

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::element_type;
using simdjson::dom::key_value_pair;
using simdjson::dom::object;

constexpr char kUnitSep = '\x1f';
constexpr char kRecordSep = '\x1e';
constexpr char kGroupSep = '\x1d';

// The parser validated the whole body before the walk: a value is read
// only after its type is checked, so no accessor here can fail or throw.

bool member(object parent, std::string_view key, element &out) noexcept
{
    return parent.at_key(key).get(out) == simdjson::SUCCESS;
}

bool is_string(element e) noexcept
{
    return e.type() == element_type::STRING;
}

std::string_view text_of(element e) noexcept
{
    return e.get_string().value_unsafe();
}

object object_of(element e) noexcept
{
    return e.get_object().value_unsafe();
}

array array_of(element e) noexcept
{
    return e.get_array().value_unsafe();
}

// More: go on.  Stop: the hasher has its longest level, or the body turned
// out to be unusable (the walker's invalid flag says which).
enum class Step { More, Stop };

class PromptWalker {
public:
    PromptWalker(LevelHasher &hasher, std::string &scratch) noexcept
        : hasher_(hasher), scratch_(scratch) {}

    affinity_prompt_e walk(object body);

private:
    Step invalid() noexcept
    {
        invalid_ = true;
        return Step::Stop;
    }

    Step add(std::string_view text) noexcept
    {
        return hasher_.append(text) ? Step::More : Step::Stop;
    }

    Step add_byte(char c) noexcept
    {
        return hasher_.append_byte(c) ? Step::More : Step::Stop;
    }

    Step record(std::string_view tag, std::string_view text) noexcept;
    Step compact(std::string_view tag, element value);
    Step model(object body) noexcept;
    Step salt(object body) noexcept;
    Step tools(object body);
    Step conversation(object body);
    Step responses(object body);
    Step messages(array list, bool responses_items);
    Step message(object msg);
    Step content(element content) noexcept;
    Step part(object part) noexcept;
    Step completion_prompt(element prompt);

    LevelHasher &hasher_;
    std::string &scratch_;
    bool found_prompt_ = false;
    bool invalid_ = false;
};

// tag US text RS
Step PromptWalker::record(std::string_view tag, std::string_view text) noexcept
{
    if (add(tag) == Step::More && add_byte(kUnitSep) == Step::More
        && add(text) == Step::More)
    {
        return add_byte(kRecordSep);
    }
    return Step::Stop;
}

// tag US compact-json RS
Step PromptWalker::compact(std::string_view tag, element value)
{
    scratch_.clear();
    append_compact_json(value, scratch_);

    return record(tag, scratch_);
}

Step PromptWalker::model(object body) noexcept
{
    element value;

    if (!member(body, "model", value) || !is_string(value)) {
        return Step::More;
    }

    return record("model", text_of(value));
}

// vLLM's cache_salt keeps tenants from sharing cached prefixes: it is part
// of the prompt's scope, right after the model, so that prompts with
// different salts (or one and none) never share a level.  Bodies without
// one hash as they always did.
Step PromptWalker::salt(object body) noexcept
{
    element value;

    if (!member(body, "cache_salt", value) || !is_string(value)) {
        return Step::More;
    }

    return record("salt", text_of(value));
}

Step PromptWalker::tools(object body)
{
    element value;

    if (!member(body, "tools", value) || value.type() != element_type::ARRAY)
    {
        return Step::More;
    }

    for (element tool : array_of(value)) {
        if (tool.type() != element_type::OBJECT) {
            return invalid();       // a tool is an object
        }

        if (compact("tool", tool) == Step::Stop) {
            return Step::Stop;
        }
    }

    return Step::More;
}

// A non-text content part: its type and a hash of what it refers to (the
// URL or inline data), so equal images make equal prompts at a few bytes.
Step PromptWalker::part(object part) noexcept
{
    static const char hex[] = "0123456789abcdef";

    element value;
    std::string_view type;

    if (member(part, "type", value)) {
        if (!is_string(value)) {
            return invalid();
        }
        type = text_of(value);
    }

    if (type == "text" || type == "input_text" || type == "output_text") {
        if (!member(part, "text", value)) {
            return Step::More;
        }
        if (!is_string(value)) {
            return invalid();
        }
        return add(text_of(value));
    }

    // The reference: the first member that names the content (image_url,
    // file_id, ...) as a string, or the url/data of such a member that is
    // an object (image_url, input_audio, file).  Other members (detail,
    // format, filename) do not identify it.
    std::string_view ref;
    bool found = false;

    for (key_value_pair field : part) {
        bool names_content = false;

        for (const char *name : {"image_url", "file_id", "file_data",
                                 "file_url", "url", "data", "input_audio",
                                 "file", "audio_url", "video_url"})
        {
            names_content |= field.key == name;
        }

        if (!names_content) {
            continue;
        }

        if (is_string(field.value)) {
            ref = text_of(field.value);
            found = true;
            break;
        }

        if (field.value.type() != element_type::OBJECT) {
            continue;
        }

        for (const char *name : {"url", "data", "file_data", "file_id"}) {
            if (!member(object_of(field.value), name, value)) {
                continue;
            }
            if (!is_string(value)) {
                return invalid();
            }
            ref = text_of(value);
            found = true;
            break;
        }

        if (found) {
            break;
        }
    }

    char tag[1 + 32 + 1 + 16 + 1];
    uint64_t h = found ? XXH3_64bits(ref.data(), ref.size()) : 0;
    size_t n = 0;

    // At most 32 bytes of the type, cut between two code points.
    size_t cut = std::min<size_t>(type.size(), 32);
    while (cut > 0 && cut < type.size()
           && (static_cast<unsigned char>(type[cut]) & 0xc0) == 0x80)
    {
        cut--;
    }

    tag[n++] = kGroupSep;
    for (size_t i = 0; i < cut; i++) {
        tag[n++] = type[i];
    }
    tag[n++] = ':';
    for (int shift = 60; shift >= 0; shift -= 4) {
        tag[n++] = hex[(h >> shift) & 0xf];
    }
    tag[n++] = kGroupSep;

    return add(std::string_view(tag, n));
}

Step PromptWalker::content(element content) noexcept
{
    switch (content.type()) {

    case element_type::STRING:
        return add(text_of(content));

    case element_type::ARRAY:
        break;

    default:
        return Step::More;      // null: an assistant turn with tool calls
    }

    for (element p : array_of(content)) {
        Step step = Step::More;

        if (is_string(p)) {
            step = add(text_of(p));

        } else if (p.type() == element_type::OBJECT) {
            step = part(object_of(p));
        }

        if (step == Step::Stop) {
            return Step::Stop;
        }
    }

    return Step::More;
}

// role US content [tool calls] RS
Step PromptWalker::message(object msg)
{
    element value;
    std::string_view role;

    if (member(msg, "role", value)) {
        if (!is_string(value)) {
            return invalid();
        }
        role = text_of(value);
    }

    if (add(role) == Step::Stop || add_byte(kUnitSep) == Step::Stop) {
        return Step::Stop;
    }

    if (member(msg, "content", value) && content(value) == Step::Stop) {
        return Step::Stop;
    }

    // Agent loops: an assistant turn may be only tool calls.
    if (member(msg, "tool_calls", value)
        && value.type() == element_type::ARRAY
        && compact("tool_calls", value) == Step::Stop)
    {
        return Step::Stop;
    }

    return add_byte(kRecordSep);
}

// Chat "messages", or Responses "input" items: items with a role are
// messages; the others (function calls and their outputs, reasoning, ...)
// are their type and compact JSON.
Step PromptWalker::messages(array list, bool responses_items)
{
    for (element item : list) {
        element value;
        Step step;

        if (item.type() != element_type::OBJECT) {
            continue;       // not a message
        }

        found_prompt_ = true;

        object msg = object_of(item);

        if (responses_items && !member(msg, "role", value)) {
            std::string_view type;

            if (member(msg, "type", value)) {
                if (!is_string(value)) {
                    return invalid();
                }
                type = text_of(value);
            }

            step = compact(type, item);

        } else {
            step = message(msg);
        }

        if (step == Step::Stop) {
            return Step::Stop;
        }

        hasher_.end_of_turn();
    }

    return Step::More;
}

// Completions: a string, or the first element of a list (a string, or a
// list of token ids, as compact JSON); a list of token ids, whole.
Step PromptWalker::completion_prompt(element prompt)
{
    if (is_string(prompt)) {
        found_prompt_ = true;
        return record("prompt", text_of(prompt));
    }

    if (prompt.type() != element_type::ARRAY) {
        return Step::More;
    }

    found_prompt_ = true;

    for (element first : array_of(prompt)) {
        if (is_string(first)) {
            return record("prompt", text_of(first));
        }

        if (first.type() == element_type::ARRAY) {
            return compact("prompt", first);
        }

        break;
    }

    return compact("prompt", prompt);
}

// Responses API: instructions, then input.
Step PromptWalker::responses(object body)
{
    element value;

    if (member(body, "instructions", value) && is_string(value)) {
        found_prompt_ = true;

        if (record("instructions", text_of(value)) == Step::Stop) {
            return Step::Stop;
        }

        hasher_.end_of_turn();     // as a system message's end
    }

    if (!member(body, "input", value)) {
        return Step::More;
    }

    switch (value.type()) {

    case element_type::STRING:
        found_prompt_ = true;
        return record("user", text_of(value));

    case element_type::ARRAY:
        return messages(array_of(value), true);

    default:
        return Step::More;
    }
}

// The prompt: chat messages, else a completions prompt, else a Responses
// API input.
Step PromptWalker::conversation(object body)
{
    element value;

    if (member(body, "messages", value)
        && value.type() == element_type::ARRAY)
    {
        return messages(array_of(value), false);
    }

    if (member(body, "prompt", value)) {
        return completion_prompt(value);
    }

    return responses(body);
}

affinity_prompt_e PromptWalker::walk(object body)
{
    Step step = model(body);

    if (step == Step::More) {
        step = salt(body);
    }

    if (step == Step::More) {
        step = tools(body);
    }

    if (step == Step::More) {
        step = conversation(body);
    }

    if (invalid_) {
        return AFFINITY_PROMPT_INVALID;
    }

    if (step == Step::Stop && !found_prompt_) {
        // Model and tools alone reached the last level: it is a prompt if
        // the body has one.
        for (const char *name :
             {"messages", "prompt", "input", "instructions"})
        {
            element value;
            found_prompt_ |= member(body, name, value);
        }
    }

    return found_prompt_ ? AFFINITY_PROMPT_OK : AFFINITY_PROMPT_NONE;
}

}  // namespace

affinity_prompt_e walk_prompt(object body, LevelHasher &hasher,
                              std::string &scratch)
{
    return PromptWalker(hasher, scratch).walk(body);
}

}  // namespace affinity

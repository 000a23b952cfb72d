// The C API of affinity_store.h: noexcept wrappers over the store's link,
// keys and messages.
#include "affinity_core.h"

#include "store_keys.h"
#include "store_link.h"
#include "store_message.h"
#include "store_senders.h"

using namespace affinity;

namespace {

StoreLink &link_of(affinity_store_link_t *link) noexcept
{
    return *reinterpret_cast<StoreLink *>(link);
}

const StoreLink &link_of(const affinity_store_link_t *link) noexcept
{
    return *reinterpret_cast<const StoreLink *>(link);
}

StoreKeys &keys_of(affinity_store_keys_t *keys) noexcept
{
    return *reinterpret_cast<StoreKeys *>(keys);
}

}  // namespace

extern "C" {

size_t affinity_store_link_size(const affinity_resp_limits_t *limits) noexcept
{
    return limits ? StoreLink::size(*limits) : 0;
}

affinity_store_link_t *affinity_store_link_init(
    void *mem, size_t size, const affinity_resp_limits_t *limits) noexcept
{
    if (limits == nullptr) {
        return nullptr;
    }
    return reinterpret_cast<affinity_store_link_t *>(
        StoreLink::init(mem, size, *limits));
}

void affinity_store_link_reset(affinity_store_link_t *link) noexcept
{
    link_of(link).reset();
}

int affinity_store_link_expect(affinity_store_link_t *link, uint32_t tag,
                               uint64_t arg) noexcept
{
    return link_of(link).expect(tag, arg) ? 0 : -1;
}

size_t affinity_store_link_pending(const affinity_store_link_t *link) noexcept
{
    return link_of(link).pending();
}

int affinity_store_link_forget(affinity_store_link_t *link, uint32_t *tag,
                               uint64_t *arg) noexcept
{
    return link_of(link).forget(tag, arg) ? 1 : 0;
}

int affinity_store_link_feed(affinity_store_link_t *link, const void *data,
                             size_t len, size_t *used,
                             affinity_store_reply_t *reply) noexcept
{
    return link_of(link).feed(static_cast<const uint8_t *>(data), len, used,
                              reply);
}

const affinity_resp_node_t *affinity_resp_node(
    const affinity_store_link_t *link, uint32_t index) noexcept
{
    return link_of(link).node(index);
}

size_t affinity_resp_command(void *out, size_t cap, size_t argc,
                             const char *const *argv,
                             const size_t *lens) noexcept
{
    return resp_command(static_cast<uint8_t *>(out), cap, argc, argv, lens);
}

int affinity_store_entries(const affinity_store_link_t *link,
                           const affinity_resp_node_t *reply, int range,
                           affinity_store_entries_t *entries) noexcept
{
    return store_entries(link_of(link), reply, range != 0, entries) ? 0 : -1;
}

int affinity_store_entries_next(const affinity_store_link_t *link,
                                affinity_store_entries_t *entries,
                                affinity_store_entry_t *entry) noexcept
{
    return store_entries_next(link_of(link), entries, entry) ? 1 : 0;
}

int affinity_store_parse_id(const char *id, size_t len, uint64_t *ms,
                            uint64_t *seq) noexcept
{
    return parse_stream_id(id, len, ms, seq) ? 0 : -1;
}

affinity_store_keys_t *affinity_store_keys_create(const void *secret,
                                                  size_t len) noexcept
{
    return reinterpret_cast<affinity_store_keys_t *>(
        StoreKeys::create(secret, len));
}

void affinity_store_keys_free(affinity_store_keys_t *keys) noexcept
{
    delete reinterpret_cast<StoreKeys *>(keys);
}

void affinity_store_digest(affinity_store_keys_t *keys, uint32_t kind,
                           const void *id, size_t len, uint8_t *out) noexcept
{
    store_digest(keys_of(keys), kind, id, len, out);
}

size_t affinity_store_encode(affinity_store_keys_t *keys, const void *stream,
                             size_t stream_len,
                             const affinity_store_message_t *message,
                             void *out, size_t cap) noexcept
{
    if (keys == nullptr || message == nullptr || out == nullptr) {
        return 0;
    }
    return encode_store_message(keys_of(keys), stream, stream_len, *message,
                                static_cast<uint8_t *>(out), cap);
}

size_t affinity_store_seal(affinity_store_keys_t *keys, const void *stream,
                          size_t stream_len, void *message, size_t len,
                          size_t cap) noexcept
{
    if (keys == nullptr || message == nullptr) {
        return 0;
    }
    return seal_store_message(keys_of(keys), stream, stream_len,
                              static_cast<uint8_t *>(message), len, cap);
}

int affinity_store_decode(affinity_store_keys_t *keys, const void *stream,
                          size_t stream_len, const void *data, size_t len,
                          affinity_store_message_t *message, uint64_t *levels,
                          size_t levels_cap) noexcept
{
    if (keys == nullptr || message == nullptr) {
        return AFFINITY_STORE_MALFORMED;
    }
    return decode_store_message(keys_of(keys), stream, stream_len,
                                static_cast<const uint8_t *>(data), len,
                                *message, levels, levels_cap);
}

int affinity_store_senders_admit(affinity_store_senders_t *table,
                                 uint32_t stream, uint64_t instance,
                                 uint32_t sender, uint64_t seq,
                                 uint32_t now) noexcept
{
    return table
           && store_senders_admit(*table, stream, instance, sender, seq, now);
}

}  // extern "C"

#include "store_link.h"

#include <new>

namespace affinity {

namespace {

constexpr size_t kAlign = 8;

size_t aligned(size_t n) noexcept
{
    return (n + kAlign - 1) & ~(kAlign - 1);
}

bool valid(const affinity_resp_limits_t &lim) noexcept
{
    return lim.nodes >= kLinkMinNodes && lim.bytes >= kLinkMinBytes
           && lim.pending >= 1 && lim.depth >= 1;
}

const affinity_resp_node_t *element(const StoreLink &link,
                                    const affinity_resp_node_t *array,
                                    size_t i) noexcept
{
    if (array == nullptr || array->type != AFFINITY_RESP_ARRAY) {
        return nullptr;
    }

    const affinity_resp_node_t *n = link.node(array->first);

    while (n && i--) {
        n = link.node(n->next);
    }
    return n;
}

bool whole(const affinity_resp_node_t *n) noexcept
{
    return n && !(n->flags & AFFINITY_RESP_CUT);
}

// Not wholly kept for want of room in the reply (an array whose elements
// found no node is marked so too).
bool full(const affinity_resp_node_t *n) noexcept
{
    return n && (n->flags & AFFINITY_RESP_FULL);
}

}  // namespace

size_t StoreLink::size(const affinity_resp_limits_t &lim) noexcept
{
    if (!valid(lim)) {
        return 0;
    }

    return aligned(sizeof(StoreLink))
           + aligned(size_t(lim.nodes) * sizeof(affinity_resp_node_t))
           + aligned(size_t(lim.pending) * sizeof(PendingCommand))
           + aligned(lim.bytes);
}

StoreLink *StoreLink::init(void *mem, size_t size,
                           const affinity_resp_limits_t &lim) noexcept
{
    if (mem == nullptr || reinterpret_cast<uintptr_t>(mem) % kAlign
        || size < StoreLink::size(lim) || StoreLink::size(lim) == 0)
    {
        return nullptr;
    }

    char *p = static_cast<char *>(mem);
    auto *nodes = reinterpret_cast<affinity_resp_node_t *>(
        p + aligned(sizeof(StoreLink)));
    auto *ring = reinterpret_cast<PendingCommand *>(
        reinterpret_cast<char *>(nodes)
        + aligned(size_t(lim.nodes) * sizeof(affinity_resp_node_t)));
    char *bytes = reinterpret_cast<char *>(ring)
                  + aligned(size_t(lim.pending) * sizeof(PendingCommand));

    return new (mem) StoreLink(nodes, lim, bytes, ring);
}

void StoreLink::reset() noexcept
{
    reader_.reset();
    first_ = 0;
    count_ = 0;
    error_ = nullptr;
}

bool StoreLink::expect(uint32_t tag, uint64_t arg) noexcept
{
    if (count_ == capacity_) {
        return false;
    }

    ring_[(first_ + count_) % capacity_] = PendingCommand{tag, 0, arg};
    count_++;
    return true;
}

bool StoreLink::forget(uint32_t *tag, uint64_t *arg) noexcept
{
    if (count_ == 0) {
        return false;
    }

    *tag = ring_[first_].tag;
    *arg = ring_[first_].arg;
    first_ = (first_ + 1) % capacity_;
    count_--;
    return true;
}

affinity_link_status_e StoreLink::feed(const uint8_t *data, size_t len,
                                       size_t *used,
                                       affinity_store_reply_t *reply) noexcept
{
    *reply = affinity_store_reply_t{};
    *used = 0;

    if (error_) {
        reply->error = error_;
        return AFFINITY_LINK_BROKEN;
    }

    // A reply begins that no command asked for: nothing of it is read.
    if (len > 0 && count_ == 0 && !reader_.midway()) {
        error_ = "a reply nobody asked for";
        reply->error = error_;
        return AFFINITY_LINK_BROKEN;
    }

    RespReader::Status s = reader_.feed(data, len, used);

    if (s == RespReader::Status::Broken) {
        error_ = reader_.error();
        reply->error = error_;
        return AFFINITY_LINK_BROKEN;
    }

    if (s == RespReader::Status::More) {
        return AFFINITY_LINK_MORE;
    }

    reply->root = reader_.root();
    (void) forget(&reply->tag, &reply->arg);
    return AFFINITY_LINK_REPLY;
}

bool parse_stream_id(const char *id, size_t len, uint64_t *ms,
                     uint64_t *seq) noexcept
{
    uint64_t part[2] = {0, 0};
    size_t digits[2] = {0, 0};
    size_t k = 0;

    for (size_t i = 0; i < len; i++) {
        char c = id[i];

        if (c == '-' && k == 0) {
            k = 1;
            continue;
        }
        if (c < '0' || c > '9' || digits[k] == 20
            || part[k] > (UINT64_MAX - uint64_t(c - '0')) / 10)
        {
            return false;
        }
        part[k] = part[k] * 10 + uint64_t(c - '0');
        digits[k]++;
    }

    if (k != 1 || digits[0] == 0 || digits[1] == 0) {
        return false;
    }

    *ms = part[0];
    *seq = part[1];
    return true;
}

// XREAD: [[stream, entries]] or nil; X(REV)RANGE: entries.  An entry:
// [id, [field, value, ...]].
bool store_entries(const StoreLink &link, const affinity_resp_node_t *reply,
                   bool range, affinity_store_entries_t *entries) noexcept
{
    entries->next = kRespNone;

    if (reply == nullptr) {
        return false;
    }

    if (reply->type == AFFINITY_RESP_NIL) {
        return true;
    }

    if (reply->type != AFFINITY_RESP_ARRAY) {
        return false;
    }

    if (range) {
        entries->next = reply->first;
        return true;
    }

    // XREAD of one stream: its first element is [stream name, entries].
    const affinity_resp_node_t *first = link.node(reply->first);

    if (first == nullptr) {
        return reply->integer == 0;
    }

    const affinity_resp_node_t *list = element(link, first, 1);

    if (list == nullptr || list->type != AFFINITY_RESP_ARRAY) {
        return false;
    }

    entries->next = list->first;
    return true;
}

bool store_entries_next(const StoreLink &link,
                        affinity_store_entries_t *entries,
                        affinity_store_entry_t *entry) noexcept
{
    for (;;) {
        const affinity_resp_node_t *e = link.node(entries->next);

        if (e == nullptr) {
            return false;
        }
        entries->next = e->next;

        const affinity_resp_node_t *id = element(link, e, 0);

        if (!whole(id) || id->type != AFFINITY_RESP_BULK) {
            continue;
        }

        *entry = affinity_store_entry_t{};

        if (!parse_stream_id(id->str, id->len, &entry->ms, &entry->seq)) {
            continue;
        }

        const affinity_resp_node_t *fields = element(link, e, 1);

        entry->cut = !whole(e) || !whole(fields) || e->integer != 2;
        entry->full = full(e) || full(fields);

        if (fields == nullptr || fields->type != AFFINITY_RESP_ARRAY) {
            return true;
        }

        // The first field "m" whose value was kept whole; anything cut
        // among the fields cuts the entry.
        for (const affinity_resp_node_t *f = link.node(fields->first); f;
             f = link.node(f->next))
        {
            const affinity_resp_node_t *v = link.node(f->next);

            if (!whole(f) || (v && !whole(v))) {
                entry->cut = 1;
                entry->full |= full(f) || (v && full(v));
            }
            if (v == nullptr) {
                break;
            }
            if (entry->message == nullptr && whole(f)
                && f->type == AFFINITY_RESP_BULK && f->len == 1
                && f->str[0] == 'm' && whole(v)
                && v->type == AFFINITY_RESP_BULK)
            {
                entry->message = v->str;
                entry->message_len = v->len;
            }
            f = v;
        }

        return true;
    }
}

}  // namespace affinity

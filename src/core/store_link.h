// A connection to the store, as its protocol sees it: the replies read
// (resp_reader.h), each paired with the command that asked for it, and the
// stream entries in them.  Lives in caller-owned memory (the shim's per
// connection), laid out as the link, its reply nodes, its pending
// commands and its string bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "affinity_core.h"
#include "resp_reader.h"

namespace affinity {

// The fewest nodes a link keeps: an error reply and an XADD's id fit.
constexpr uint32_t kLinkMinNodes = 4;
constexpr uint32_t kLinkMinBytes = 256;

struct PendingCommand {
    uint32_t tag;
    uint32_t reserved;
    uint64_t arg;
};

class StoreLink {
public:
    static size_t size(const affinity_resp_limits_t &limits) noexcept;
    static StoreLink *init(void *mem, size_t size,
                           const affinity_resp_limits_t &limits) noexcept;

    void reset() noexcept;
    bool expect(uint32_t tag, uint64_t arg) noexcept;
    size_t pending() const noexcept { return count_; }
    bool forget(uint32_t *tag, uint64_t *arg) noexcept;

    affinity_link_status_e feed(const uint8_t *data, size_t len, size_t *used,
                                affinity_store_reply_t *reply) noexcept;

    const affinity_resp_node_t *node(uint32_t index) const noexcept
    {
        return reader_.node(index);
    }

private:
    StoreLink(affinity_resp_node_t *nodes, const affinity_resp_limits_t &lim,
              char *bytes, PendingCommand *ring) noexcept
        : reader_(nodes, lim, bytes), ring_(ring), capacity_(lim.pending) {}

    RespReader reader_;
    PendingCommand *ring_;
    uint32_t capacity_;
    uint32_t first_ = 0;
    uint32_t count_ = 0;
    const char *error_ = nullptr;
};

// The entries of an XREAD or X(REV)RANGE reply (affinity_store_entries()).
bool store_entries(const StoreLink &link, const affinity_resp_node_t *reply,
                   bool range, affinity_store_entries_t *entries) noexcept;
bool store_entries_next(const StoreLink &link,
                        affinity_store_entries_t *entries,
                        affinity_store_entry_t *entry) noexcept;

bool parse_stream_id(const char *id, size_t len, uint64_t *ms,
                     uint64_t *seq) noexcept;

}  // namespace affinity

// fuzz_store_reply: what a store endpoint sends on a connection, as the
// module's link reads it (affinity_store_link_*): anything a proxy, a
// protocol mismatch or whoever binds the store's port may send, in pieces
// of any size, with the commands the module sends outstanding.
//
// The input's first byte picks the link's limits and how many commands are
// awaited; the next ones, the sizes of the pieces the rest is fed in.
// Every whole reply is walked as the module walks it: as the entries of
// an XREAD or XREVRANGE reply, each message decoded.  Checked:
//
//   - the link never keeps more nodes or bytes than its limits;
//   - a reply is paired with the oldest command awaited, and none comes
//     without one: a reply nobody asked for breaks the link;
//   - a broken link stays broken, and says why;
//   - every byte is taken, or the link is broken: it never stalls;
//   - entries end, ids parse, a message lies inside the reply's bytes.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "affinity_core.h"

namespace {

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond)) {                                                      \
            __builtin_printf("fuzz_store_reply: check failed: %s "          \
                             "(line %d)\n", #cond, __LINE__);               \
            __builtin_trap();                                               \
        }                                                                   \
    } while (0)

const char kStream[] = "nginx:affinity:fuzz";

affinity_store_keys_t *keys;

// The module's reader's limits, and smaller ones that the fuzzer fills.
const affinity_resp_limits_t kLimits[] = {
    {2048, 384 * 1024, 2048, 8, 4},
    {16, 4096, 1024, 4, 512},
    {4, 256, 16, 2, 3},
    {64, 1024, 100, 16, 1},
};

// How many nodes a reply's tree holds, walked from its root.
size_t count(const affinity_store_link_t *link,
             const affinity_resp_node_t *n, size_t depth)
{
    CHECK(depth <= 17);
    size_t total = 1;

    if (n->type == AFFINITY_RESP_ARRAY) {
        for (const affinity_resp_node_t *e =
                 affinity_resp_node(link, n->first);
             e; e = affinity_resp_node(link, e->next))
        {
            total += count(link, e, depth + 1);
        }
    } else if (n->type == AFFINITY_RESP_BULK
               || n->type == AFFINITY_RESP_SIMPLE
               || n->type == AFFINITY_RESP_ERROR)
    {
        CHECK(n->str != nullptr || n->len == 0);
        if (n->flags & AFFINITY_RESP_CUT) {
            CHECK(n->len == 0);
        }
    }

    return total;
}

void walk(const affinity_store_link_t *link, const affinity_resp_node_t *root,
          const affinity_resp_limits_t &lim, int range)
{
    CHECK(root != nullptr);
    CHECK(count(link, root, 0) <= lim.nodes);

    affinity_store_entries_t entries;

    if (affinity_store_entries(link, root, range, &entries) != 0) {
        return;
    }

    affinity_store_entry_t entry;
    uint64_t levels[AFFINITY_MAX_LEVELS];
    size_t n = 0;

    while (affinity_store_entries_next(link, &entries, &entry)) {
        CHECK(++n <= lim.nodes);

        if (entry.message == nullptr) {
            continue;
        }

        CHECK(entry.message_len <= lim.string_max);

        affinity_store_message_t m;
        (void) affinity_store_decode(keys, kStream, sizeof(kStream) - 1,
                                     entry.message, entry.message_len, &m,
                                     levels, AFFINITY_MAX_LEVELS);
    }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***)
{
    static const char secret[] = "the fuzzer's secret, sixteen bytes or more";
    keys = affinity_store_keys_create(secret, sizeof(secret) - 1);
    CHECK(keys != nullptr);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) {
        return 0;
    }

    const affinity_resp_limits_t &lim = kLimits[data[0] & 3];
    uint32_t awaited = 1 + ((data[0] >> 2) & 7);
    int range = (data[0] >> 5) & 1;
    size_t step_seed = data[1];
    data += 2;
    size -= 2;

    // Each variant's memory, made once: the link starts afresh in it.
    static std::vector<uint64_t> memory[4];
    std::vector<uint64_t> &mem = memory[data[-2] & 3];
    size_t mem_size = affinity_store_link_size(&lim);
    CHECK(mem_size > 0);
    if (mem.empty()) {
        mem.resize(mem_size / 8 + 1);
    }
    affinity_store_link_t *link = affinity_store_link_init(mem.data(),
                                                           mem_size, &lim);
    CHECK(link != nullptr);

    uint32_t sent = 0, answered = 0;

    for (; sent < awaited && sent < lim.pending; sent++) {
        CHECK(affinity_store_link_expect(link, 100 + sent, sent) == 0);
    }

    // The input in pieces of 1 to 64 bytes, from a copy of each piece so
    // that AddressSanitizer sees any read past it.
    size_t pos = 0;
    bool broken = false;

    while (pos < size && !broken) {
        step_seed = step_seed * 1103515245 + 12345;
        size_t piece = std::min<size_t>(size - pos, 1 + (step_seed >> 16) % 64);
        std::vector<uint8_t> copy(data + pos, data + pos + piece);
        size_t off = 0;

        while (off < piece) {
            size_t used = 0;
            affinity_store_reply_t reply;
            int rc = affinity_store_link_feed(link, copy.data() + off,
                                              piece - off, &used, &reply);
            CHECK(used <= piece - off);
            off += used;

            if (rc == AFFINITY_LINK_BROKEN) {
                CHECK(reply.error != nullptr);
                broken = true;

                size_t again;
                affinity_store_reply_t still;
                CHECK(affinity_store_link_feed(link, "+OK\r\n", 5, &again,
                                               &still)
                      == AFFINITY_LINK_BROKEN);
                break;
            }

            if (rc == AFFINITY_LINK_MORE) {
                CHECK(off == piece);
                break;
            }

            CHECK(rc == AFFINITY_LINK_REPLY);
            CHECK(answered < sent);
            CHECK(reply.tag == 100 + answered && reply.arg == answered);
            answered++;
            walk(link, reply.root, lim, range);
        }

        pos += piece;
    }

    // What is still awaited comes back when the connection goes.
    uint32_t tag;
    uint64_t arg;
    while (affinity_store_link_forget(link, &tag, &arg)) {
        CHECK(arg == answered);
        answered++;
    }
    CHECK(answered == sent);

    return 0;
}

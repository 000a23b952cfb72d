// A set-associative bucket kept in most-recently-used order.
//
// Entries are packed at the front of the bucket, most recent first; empty
// ways (key 0) follow.  A hit moves its entry to the front, an insert puts
// the new entry at the front and pushes the least recently used out of the
// last way.  Order, not timestamps, decides eviction, so it stays exact
// however many entries are used within one clock tick; timestamps serve only
// the idle expiry.  Moving a few entries of 32 bytes costs less than the
// cache misses of a list.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace affinity {

// Entry needs: uint64_t key (0 = empty) and uint32_t last_used (seconds).
template <typename Entry, size_t Ways>
struct LruBucket {
    Entry entries[Ways];

    static bool expired(const Entry &e, uint32_t now, uint32_t timeout)
    {
        // A clock that went backwards does not expire anything.
        return now > e.last_used && now - e.last_used > timeout;
    }

    // Drops expired entries (calling dropped(entry) for each) and packs the
    // others at the front, keeping their order.  Returns the live count.
    template <typename Dropped>
    size_t expire(uint32_t now, uint32_t timeout, Dropped dropped)
    {
        size_t live = 0;

        for (size_t i = 0; i < Ways && entries[i].key != 0; i++) {
            if (expired(entries[i], now, timeout)) {
                dropped(entries[i]);
                continue;
            }

            if (live != i) {
                entries[live] = entries[i];
            }
            live++;
        }

        for (size_t i = live; i < Ways && entries[i].key != 0; i++) {
            entries[i] = Entry{};
        }

        return live;
    }

    // Moves entry i (of the first live ones) to the front.
    Entry *promote(size_t i)
    {
        if (i > 0) {
            Entry e = entries[i];
            std::memmove(&entries[1], &entries[0], i * sizeof(Entry));
            entries[0] = e;
        }
        return &entries[0];
    }

    // The live entry with key, used now: moved to the front, its last use
    // stamped.  nullptr if absent.
    Entry *find(uint64_t key, size_t live, uint32_t now)
    {
        for (size_t i = 0; i < live; i++) {
            if (entries[i].key == key) {
                Entry *e = promote(i);
                e->last_used = now;
                return e;
            }
        }
        return nullptr;
    }

    // Makes room at the front for a new entry; when the bucket is full the
    // least recently used entry is passed to evicted(entry) first.  Returns
    // the zeroed front entry.
    template <typename Evicted>
    Entry *push_front(size_t live, Evicted evicted)
    {
        if (live == Ways) {
            evicted(entries[Ways - 1]);
            live = Ways - 1;
        }

        std::memmove(&entries[1], &entries[0], live * sizeof(Entry));
        entries[0] = Entry{};
        return &entries[0];
    }
};

}  // namespace affinity

#include "prefix_table.h"

#include <cstring>

namespace affinity {

uint64_t PrefixTable::key(uint64_t level_hash) const noexcept
{
    // Level hashes are the same in every instance (fixed seed); the zone's
    // seed makes their buckets unpredictable.  Mixed with the final step of
    // MurmurHash3, which spreads every input bit over the output.
    uint64_t k = level_hash ^ zone_.header().seed;
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k != 0 ? k : 1;
}

size_t PrefixTable::expire(PrefixBucket &bucket) noexcept
{
    return bucket.expire(now_, timeout_, [this](const PrefixEntry &) {
        zone_.header().used--;
        zone_.header().expiries++;
    });
}

PrefixEntry *PrefixTable::find(uint64_t key) noexcept
{
    PrefixBucket &bucket = zone_.bucket_of<PrefixBucket>(key);
    return bucket.find(key, expire(bucket), now_);
}

bool PrefixTable::peek(uint64_t key, uint32_t *last_used) noexcept
{
    PrefixBucket &bucket = zone_.bucket_of<PrefixBucket>(key);
    size_t live = expire(bucket);

    for (size_t i = 0; i < live; i++) {
        if (bucket.entries[i].key == key) {
            *last_used = bucket.entries[i].last_used;
            return true;
        }
    }
    return false;
}

int PrefixTable::record(uint64_t key, uint64_t peer_id, uint8_t stamp)
    noexcept
{
    PrefixBucket &bucket = zone_.bucket_of<PrefixBucket>(key);
    size_t live = expire(bucket);
    PrefixEntry *entry = bucket.find(key, live, now_);

    if (entry == nullptr) {
        entry = bucket.push_front(live, [this](const PrefixEntry &) {
            zone_.header().used--;
            zone_.header().evictions++;
        });
        entry->key = key;
        zone_.header().used++;
        zone_.header().inserts++;
    }

    entry->last_used = now_;

    // Move (or insert) the peer to the front of the entry's list; the
    // last one falls off when the list is full and the peer is not in it.
    uint32_t id = short_peer_id(peer_id);
    size_t at = kPrefixPeers - 1;
    int before = kNotHeld;

    for (size_t i = 0; i < kPrefixPeers; i++) {
        if (entry->peers[i] == id) {
            before = entry->stamps[i];
            at = i;
            break;
        }

        if (entry->peers[i] == 0) {
            at = i;
            break;
        }
    }

    std::memmove(&entry->peers[1], &entry->peers[0], at * sizeof(uint32_t));
    std::memmove(&entry->stamps[1], &entry->stamps[0], at);
    entry->peers[0] = id;
    entry->stamps[0] = stamp;

    return before;
}

}  // namespace affinity

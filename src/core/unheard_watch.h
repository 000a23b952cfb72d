// An instance's watch over the requests it announced to the store while
// others of its own were unheard on the same peer: until it reads each
// back, it counts the other instances' requests on that peer it reads
// first.  Those are the requests routing could not count beside the
// unheard ones (Zone::learn_unheard()).  Where the caller keeps it
// (affinity_unheard_watch_t): nginx, in the zone that counts requests,
// under its lock, for the workers that announce and the one that reads
// the whole stream, in the store's order, the instance's messages among
// the others'.
#pragma once

#include <cstdint>

#include "affinity_core.h"

namespace affinity {

class UnheardWatch {
public:
    explicit UnheardWatch(affinity_unheard_watch_t &w) noexcept : w_(w) {}

    // The number to send with the message; 0: nothing to learn.
    uint32_t announced(uint64_t peer_id, int64_t unheard) noexcept;
    void sent_elsewhere(uint64_t peer_id) noexcept;
    bool read_back(uint32_t number, uint32_t &unheard, uint32_t &others)
        noexcept;

private:
    affinity_unheard_watch_t &w_;
};

}  // namespace affinity

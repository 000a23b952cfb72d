#include "unheard_watch.h"

#include <algorithm>

namespace affinity {

uint32_t UnheardWatch::announced(uint64_t peer_id, int64_t unheard) noexcept
{
    if (peer_id == 0 || unheard <= 0) {
        return 0;
    }

    // Numbers go round, skipping 0; the entry of one AFFINITY_WATCHED
    // announcements older is taken over, its lesson forgotten.
    uint32_t number = w_.last + 1 != 0 ? w_.last + 1 : 1;
    size_t i = number % AFFINITY_WATCHED;

    w_.last = number;
    w_.peer[i] = peer_id;
    w_.number[i] = number;
    w_.unheard[i] = uint32_t(std::min<int64_t>(unheard, UINT32_MAX));
    w_.others[i] = 0;

    return number;
}

void UnheardWatch::sent_elsewhere(uint64_t peer_id) noexcept
{
    for (size_t i = 0; i < AFFINITY_WATCHED; i++) {
        if (w_.peer[i] == peer_id && peer_id != 0
            && w_.others[i] != UINT32_MAX)
        {
            w_.others[i]++;
        }
    }
}

bool UnheardWatch::read_back(uint32_t number, uint32_t &unheard,
                             uint32_t &others) noexcept
{
    size_t i = number % AFFINITY_WATCHED;

    if (number == 0 || w_.peer[i] == 0 || w_.number[i] != number) {
        return false;
    }

    unheard = w_.unheard[i];
    others = w_.others[i];
    w_.peer[i] = 0;

    return true;
}

}  // namespace affinity

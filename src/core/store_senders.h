// Each writer's messages taken once (affinity_store_senders_t): the
// highest count taken per writer, so that a message written into the
// stream again — by whoever can write to the store, or by a writer that
// sent it again after losing its connection — changes nothing twice.
#pragma once

#include <cstdint>

#include "affinity_core.h"

namespace affinity {

bool store_senders_admit(affinity_store_senders_t &table, uint32_t stream,
                         uint64_t instance, uint32_t sender, uint64_t seq,
                         uint32_t now) noexcept;

}  // namespace affinity

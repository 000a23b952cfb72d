/*
 * affinity_core.h - the C API of the affinity balancer's C++17 core.
 *
 * This is the only header the nginx shim includes.  It exposes opaque
 * handles and plain-old-data structs; no C++ type and no exception crosses
 * it (every function is noexcept on the C++ side and catches internally).
 *
 * Concurrency contract: the zone functions operate on memory shared by all
 * nginx workers.  Functions marked "caller holds the zone lock" must be
 * called with the mutex the caller associates with the zone held (the shim
 * uses the slab pool's mutex, which nginx's master force-unlocks when a
 * worker dies holding it).  The in-flight counters are updated atomically
 * and may be changed without the lock.
 */

#ifndef AFFINITY_CORE_H
#define AFFINITY_CORE_H

#include "affinity_api.h"
#include "affinity_peers.h"
#include "affinity_zone.h"
#include "affinity_json.h"
#include "affinity_prefixes.h"
#include "affinity_route.h"
#include "affinity_sessions.h"
#include "affinity_responses.h"
#include "affinity_engine.h"
#include "affinity_instances.h"
#include "affinity_store.h"

/*
 * The release of the module and its core, one string for both: the status
 * page, the Prometheus info metric, the module's startup notice, the Debian
 * package and the container image all read it from here.
 */
#define AFFINITY_VERSION  "0.9.0"

#endif /* AFFINITY_CORE_H */

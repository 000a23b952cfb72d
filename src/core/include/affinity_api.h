/*
 * affinity_api.h - what every header of the core's C API shares: the
 * fixed-width types, how a function is exported and that it never
 * throws.  Included by every affinity_*.h.
 */

#ifndef AFFINITY_API_H
#define AFFINITY_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define AFFINITY_NOEXCEPT noexcept
#else
#define AFFINITY_NOEXCEPT
#endif

#define AFFINITY_API __attribute__((visibility("default")))


#endif /* AFFINITY_API_H */

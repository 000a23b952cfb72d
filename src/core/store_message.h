// Messages that several nginx instances exchange through a shared store
// (affinity_store): what one instance learned — a session pinned, a
// response id, a prompt's levels recorded and how far the prompt filled
// the peer's modelled cache — for the others to apply, and, with
// affinity_metrics, each request it sent and its end, for the others to
// count.
//
// A message is of fixed layout, little endian, with a version, so that
// instances running other versions of the module skip what they do not
// understand:
//
//   u8 version, u8 kind, u16 body length, u32 sender,
//   u64 milliseconds of the wall clock, u64 instance, u64 peer,
//   u64 the sender's count of its messages,
//   body:  16 bytes of digest (sessions, responses)  or
//          8 bytes a level hash (prefixes)  or
//          u32 characters (a peer's modelled cache filled)  or
//          u64 ticket and u32 watch number, for its sender (a request
//          sent)  or nothing (a request ended),
//   16 bytes of authenticator: HMAC-SHA-256, with the key of the
//   instances' secret, of the stream's name (u16 length first) and of
//   everything before it, truncated.
//
// The store is written by whoever can reach it: the decoder checks the
// layout against the message's size before the authenticator, the
// authenticator before anything is read, and is fuzzed
// (fuzz/fuzz_store_message.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "affinity_core.h"
#include "store_keys.h"

namespace affinity {

constexpr uint8_t kStoreVersion = 3;
constexpr size_t kStoreHeader = 40;
constexpr size_t kStoreMac = AFFINITY_STORE_MAC;
constexpr size_t kStoreDigest = AFFINITY_STORE_DIGEST;

static_assert(AFFINITY_STORE_MESSAGE_MAX
              == kStoreHeader + 8 * AFFINITY_MAX_LEVELS + kStoreMac,
              "the largest message is a prompt's levels");

size_t encode_store_message(StoreKeys &keys, const void *stream,
                            size_t stream_len,
                            const affinity_store_message_t &message,
                            uint8_t *out, size_t cap) noexcept;

affinity_store_decoded_e decode_store_message(
    StoreKeys &keys, const void *stream, size_t stream_len,
    const uint8_t *data, size_t len, affinity_store_message_t &message,
    uint64_t *levels, size_t levels_cap) noexcept;

size_t seal_store_message(StoreKeys &keys, const void *stream,
                          size_t stream_len, uint8_t *message, size_t len,
                          size_t cap) noexcept;

void store_digest(StoreKeys &keys, uint32_t kind, const void *id, size_t len,
                  uint8_t out[kStoreDigest]) noexcept;

}  // namespace affinity

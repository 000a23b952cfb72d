// Messages that several nginx instances exchange through a shared store
// (affinity_store): what one instance learned — a session pinned, a
// response id, a prompt's levels recorded and how far the prompt filled
// the peer's modelled cache — for the others to apply, and, with
// affinity_metrics, each request it sent, for the others to count.
//
// A message is 24 bytes to a few thousand of fixed layout, little
// endian, with a version, so that instances running different versions of
// the module skip what they do not understand:
//
//   u8 version, u8 kind, u16 key_len, u32 time,
//   u64 instance, u64 peer,
//   key_len bytes of key (sessions, responses)  or
//   key_len / 8 level hashes (prefixes)  or
//   u16 milliseconds past time (a request sent or ended: key_len 2)  or
//   u32 characters (a peer's modelled cache filled: key_len 4)
//
// Versions before a kind skip it.
//
// The decoder reads messages from the store, which anyone with access to
// it can write: it checks every length against the message's size and is
// fuzzed (fuzz/fuzz_store_message.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "affinity_core.h"

namespace affinity {

constexpr uint8_t kStoreVersion = 1;
constexpr size_t kStoreHeader = 24;

size_t encode_store_message(const affinity_store_message_t &message,
                            uint8_t *out, size_t cap) noexcept;

bool decode_store_message(const uint8_t *data, size_t len,
                          affinity_store_message_t &message,
                          uint64_t *levels, size_t levels_cap) noexcept;

}  // namespace affinity

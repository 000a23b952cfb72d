// The keys of the instances that share a store (affinity_store secret=):
// HMAC-SHA-256 over OpenSSL's digest, with the key's inner and outer
// states computed once, so that each message costs two digest copies
// rather than the key schedule and algorithm lookup of a one-shot HMAC.
#pragma once

#include <cstddef>
#include <cstdint>

#include <openssl/evp.h>

#include "affinity_core.h"

namespace affinity {

constexpr size_t kSha256Size = 32;

class StoreKeys {
public:
    enum Use { Entries = 0, Ids = 1 };

    // nullptr when OpenSSL fails (out of memory).
    static StoreKeys *create(const void *secret, size_t len) noexcept;
    ~StoreKeys();

    // HMAC with the key of this use over the parts, concatenated.
    struct Part {
        const void *data;
        size_t len;
    };
    bool mac(Use use, const Part *parts, size_t nparts,
             uint8_t out[kSha256Size]) noexcept;

private:
    StoreKeys() = default;
    bool key(Use use, const uint8_t *key, size_t len) noexcept;

    EVP_MD_CTX *inner_[2] = {nullptr, nullptr};
    EVP_MD_CTX *outer_[2] = {nullptr, nullptr};
    EVP_MD_CTX *work_ = nullptr;
};

}  // namespace affinity

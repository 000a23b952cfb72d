#include "store_keys.h"

#include <cstring>
#include <new>

#include <openssl/hmac.h>

namespace affinity {

namespace {

constexpr size_t kBlock = 64;      // SHA-256's block

// Labels that separate the two keys derived from one secret.
constexpr char kEntriesLabel[] = "nginx affinity store: entries";
constexpr char kIdsLabel[] = "nginx affinity store: ids";

}  // namespace

StoreKeys *StoreKeys::create(const void *secret, size_t len) noexcept
{
    StoreKeys *keys = new (std::nothrow) StoreKeys();

    if (keys == nullptr) {
        return nullptr;
    }

    static const uint8_t empty = 0;
    const uint8_t *s = len ? static_cast<const uint8_t *>(secret) : &empty;
    uint8_t derived[2][kSha256Size];
    unsigned int n;

    bool ok = HMAC(EVP_sha256(), s, int(len), reinterpret_cast<const uint8_t *>(
                       kEntriesLabel), sizeof(kEntriesLabel) - 1,
                   derived[Entries], &n)
              && HMAC(EVP_sha256(), s, int(len),
                      reinterpret_cast<const uint8_t *>(kIdsLabel),
                      sizeof(kIdsLabel) - 1, derived[Ids], &n);

    ok = ok && (keys->work_ = EVP_MD_CTX_new()) != nullptr
         && keys->key(Entries, derived[Entries], kSha256Size)
         && keys->key(Ids, derived[Ids], kSha256Size);

    OPENSSL_cleanse(derived, sizeof(derived));

    if (!ok) {
        delete keys;
        return nullptr;
    }

    return keys;
}

StoreKeys::~StoreKeys()
{
    for (int i = 0; i < 2; i++) {
        EVP_MD_CTX_free(inner_[i]);
        EVP_MD_CTX_free(outer_[i]);
    }
    EVP_MD_CTX_free(work_);
}

// The digest states after the key's inner and outer pads (RFC 2104).
bool StoreKeys::key(Use use, const uint8_t *key, size_t len) noexcept
{
    uint8_t ipad[kBlock], opad[kBlock];

    for (size_t i = 0; i < kBlock; i++) {
        uint8_t k = i < len ? key[i] : 0;
        ipad[i] = k ^ 0x36;
        opad[i] = k ^ 0x5c;
    }

    inner_[use] = EVP_MD_CTX_new();
    outer_[use] = EVP_MD_CTX_new();

    bool ok = inner_[use] && outer_[use]
              && EVP_DigestInit_ex(inner_[use], EVP_sha256(), nullptr)
              && EVP_DigestUpdate(inner_[use], ipad, kBlock)
              && EVP_DigestInit_ex(outer_[use], EVP_sha256(), nullptr)
              && EVP_DigestUpdate(outer_[use], opad, kBlock);

    OPENSSL_cleanse(ipad, sizeof(ipad));
    OPENSSL_cleanse(opad, sizeof(opad));
    return ok;
}

bool StoreKeys::mac(Use use, const Part *parts, size_t nparts,
                    uint8_t out[kSha256Size]) noexcept
{
    uint8_t inner[kSha256Size];
    unsigned int n;

    if (!EVP_MD_CTX_copy_ex(work_, inner_[use])) {
        return false;
    }

    for (size_t i = 0; i < nparts; i++) {
        if (parts[i].len && !EVP_DigestUpdate(work_, parts[i].data,
                                              parts[i].len))
        {
            return false;
        }
    }

    return EVP_DigestFinal_ex(work_, inner, &n)
           && EVP_MD_CTX_copy_ex(work_, outer_[use])
           && EVP_DigestUpdate(work_, inner, sizeof(inner))
           && EVP_DigestFinal_ex(work_, out, &n);
}

}  // namespace affinity

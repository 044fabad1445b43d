#include "core/crypto/crypto.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace tributary::internal {
namespace {

[[noreturn]] void fatal(const char* what) {
  std::fprintf(stderr, "tributary: OpenSSL failed: %s\n", what);
  std::abort();
}

EVP_CIPHER_CTX* cipher(void* p) { return static_cast<EVP_CIPHER_CTX*>(p); }

}  // namespace

Digest sha256(std::string_view data) {
  Digest d{};
  unsigned int n = 0;
  if (EVP_Digest(data.data(), data.size(), d.data(), &n, EVP_sha256(), nullptr) != 1 ||
      n != d.size()) {
    fatal("SHA-256");
  }
  return d;
}

uint64_t digest64(std::string_view text) {
  const Digest d = sha256(text);
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | d[static_cast<size_t>(i)];  // little-endian
  return v;
}

Digest hmac_sha256(std::string_view key, std::string_view message) {
  Digest d{};
  unsigned int n = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), d.data(),
           &n) == nullptr ||
      n != d.size()) {
    fatal("HMAC-SHA256");
  }
  return d;
}

bool digest_equal(const Digest& a, const Digest& b) { return bytes_equal(a.data(), b.data(), 32); }

bool bytes_equal(const void* a, const void* b, size_t n) { return CRYPTO_memcmp(a, b, n) == 0; }

void random_bytes(void* out, size_t n) {
  if (RAND_bytes(static_cast<unsigned char*>(out), static_cast<int>(n)) != 1) {
    fatal("no random bytes");
  }
}

FrameMac::FrameMac(const Digest& key) {
  EVP_CIPHER_CTX* c = EVP_CIPHER_CTX_new();
  if (c == nullptr || EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), nullptr, key.data(), nullptr) != 1) {
    fatal("AES-256-GCM key setup");
  }
  ctx_ = c;
}

FrameMac::~FrameMac() { EVP_CIPHER_CTX_free(cipher(ctx_)); }

FrameMac::FrameMac(FrameMac&& other) noexcept
    : ctx_(std::exchange(other.ctx_, nullptr)), counter_(other.counter_) {}

FrameMac& FrameMac::operator=(FrameMac&& other) noexcept {
  if (this != &other) {
    EVP_CIPHER_CTX_free(cipher(ctx_));
    ctx_ = std::exchange(other.ctx_, nullptr);
    counter_ = other.counter_;
  }
  return *this;
}

void FrameMac::begin() { begin_at(counter_++); }

void FrameMac::begin_at(uint64_t frame) {
  // The 96-bit GCM nonce: 4 zero bytes and the frame number. Unique per key as long as fewer than
  // 2^64 frames are sent on one connection.
  unsigned char iv[12] = {};
  for (int i = 0; i < 8; ++i) iv[4 + i] = static_cast<unsigned char>(frame >> (8 * i));
  if (EVP_EncryptInit_ex(cipher(ctx_), nullptr, nullptr, nullptr, iv) != 1) fatal("GCM nonce");
}

void FrameMac::update(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    const int piece = static_cast<int>(std::min<size_t>(n, size_t{1} << 30));
    int out = 0;
    if (EVP_EncryptUpdate(cipher(ctx_), nullptr, &out, p, piece) != 1) fatal("GMAC update");
    p += piece;
    n -= static_cast<size_t>(piece);
  }
}

FrameMac::Tag FrameMac::finish() {
  unsigned char none[16];
  int out = 0;
  Tag tag{};
  if (EVP_EncryptFinal_ex(cipher(ctx_), none, &out) != 1 ||
      EVP_CIPHER_CTX_ctrl(cipher(ctx_), EVP_CTRL_GCM_GET_TAG, static_cast<int>(kTagBytes),
                          tag.data()) != 1) {
    fatal("GMAC tag");
  }
  return tag;
}

FrameMac::Tag FrameMac::of(const void* data, size_t n) {
  begin();
  update(data, n);
  return finish();
}

}  // namespace tributary::internal

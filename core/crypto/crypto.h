// The cryptography tributary uses, private to it, on OpenSSL's libcrypto:
// - SHA-256 and HMAC-SHA256, to prove a shared secret (TRIBUTARY_SECRET) in handshakes and to
//   derive per-connection keys from it;
// - FrameMac, a keyed MAC on every frame of a connection (GMAC: AES-256-GCM with the frame as
//   additional authenticated data, nothing encrypted), so that a process without the secret can
//   neither change nor replay nor reorder what a peer sent.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tributary::internal {

using Digest = std::array<uint8_t, 32>;

Digest sha256(std::string_view data);
// The first 8 bytes of sha256(text): a short fingerprint of a setting that peers compare (cluster
// ids, layouts), not a secret.
uint64_t digest64(std::string_view text);
Digest hmac_sha256(std::string_view key, std::string_view message);
// Compares in time independent of where the digests differ (CRYPTO_memcmp).
bool digest_equal(const Digest& a, const Digest& b);
bool bytes_equal(const void* a, const void* b, size_t n);
// `n` bytes from the operating system's random source (RAND_bytes); aborts the process if none is
// available, since every caller needs unpredictable nonces for its security.
void random_bytes(void* out, size_t n);

// The MAC of one direction of one connection. Each frame's tag is GMAC under the connection's key
// with the frame's number (0, 1, 2, ... in the order frames are sent) as the nonce: a frame that is
// altered, dropped, replayed or reordered fails the receiver's check. Both ends derive the same key
// (for example HMAC(secret, both handshake nonces, sender, receiver)) and count frames the same
// way. Not thread-safe: one thread at a time per direction. Feeding a frame in pieces (update()
// as bytes are sent or arrive) gives the same tag as feeding it whole.
class FrameMac {
 public:
  static constexpr size_t kTagBytes = 16;
  using Tag = std::array<uint8_t, kTagBytes>;

  FrameMac() = default;
  ~FrameMac();
  FrameMac(FrameMac&& other) noexcept;
  FrameMac& operator=(FrameMac&& other) noexcept;
  FrameMac(const FrameMac&) = delete;
  FrameMac& operator=(const FrameMac&) = delete;

  // A MAC under `key`, at frame 0.
  explicit FrameMac(const Digest& key);
  // False for a default-constructed one (no secret: frames carry no tag).
  bool enabled() const { return ctx_ != nullptr; }

  // Starts the next frame.
  void begin();
  // Starts frame number `frame`, leaving the count alone: for transports whose frames complete out
  // of order (each numbered when it is posted, in the order of the wire).
  void begin_at(uint64_t frame);
  void update(const void* data, size_t n);
  // The tag of the frame begun last.
  Tag finish();
  // begin + update + finish of one whole frame.
  Tag of(const void* data, size_t n);
  // Frames begun so far.
  uint64_t frames() const { return counter_; }

 private:
  void* ctx_ = nullptr;  // EVP_CIPHER_CTX
  uint64_t counter_ = 0;
};

}  // namespace tributary::internal

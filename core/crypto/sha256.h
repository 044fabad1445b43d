// SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104), private to tributary: used to authenticate peers
// that share TRIBUTARY_SECRET during the transport handshake. Not a general crypto library.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace tributary::internal {

using Digest = std::array<uint8_t, 32>;

Digest sha256(std::string_view data);
// The first 8 bytes of sha256(text): a short fingerprint of a setting that peers compare (cluster
// ids, layouts), not a secret.
uint64_t digest64(std::string_view text);
Digest hmac_sha256(std::string_view key, std::string_view message);
// Compares in time independent of where the digests differ.
bool digest_equal(const Digest& a, const Digest& b);

}  // namespace tributary::internal

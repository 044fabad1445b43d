// The TcpStore wire protocol (private to tributary; no Asio here, so it can be unit-tested alone).
//
// Every message is a frame: a 4-byte little-endian body length, then the body. The length is
// checked against kMaxFrameBytes before anything is allocated, and a receiver grows its buffer only
// as bytes actually arrive. Strings are a 4-byte length and the bytes; integers are little-endian.
//
// Requests (body = op byte, then fields):
//   kHello   magic[8] version:u32 nonce[32] secret:u8   must be the first request of a connection
//   kAuth    proof[32]                              next, when the server answered secret=1
//   kSet     key:str value:str
//   kGet     timeout_ms:u64 key:str                 parked until the key exists or the timeout
//   kAdd     key:str delta:i64
//   kWait    timeout_ms:u64 count:u32 key:str...    parked until all exist or the timeout
//   kCheck   count:u32 key:str...
//   kDelete  key:str
//   kWill    key:str value:str                      this connection's last will ("" key: none)
//   kCall    method:str payload:str                 a procedure of the server's call handler
//                                                   (TcpStoreServerOptions::call_handler), parked
//                                                   until the handler replies
// Responses (body = status byte: 0 = OK, else a StatusCode, followed by message:str):
//   kHello   magic[8] version:u32 nonce[32] secret:u8 proof[32]
//   kAuth    (nothing)
//   kSet     (nothing)
//   kGet     found:u8, then value:str when found
//   kAdd     value:i64
//   kWait    count:u32 missing-key:str...           count 0 = all present
//   kCheck   all_present:u8
//   kDelete  existed:u8
//   kWill    (nothing)
//   kCall    answer:str                             (an error status when the handler failed, or
//                                                   kUnimplemented when the server has none)
// A connection with a will that ends other than by the server stopping (the client's process died,
// the network dropped it, or the client closed it without withdrawing the will first) makes the
// server append the value and a newline to the key, as a set would, waking its readers.
// A malformed request (bad length, unknown op, fields that do not parse, no hello first) gets an
// error response when possible and the connection is closed; other connections are unaffected.
//
// Authentication (a shared secret on both sides, StoreOptions::secret and
// TcpStoreServerOptions::secret): the hello carries the client's nonce, the answer the server's
// nonce and its proof HMAC(secret, "store-server" | client nonce | server nonce); the client checks
// it and sends kAuth with HMAC(secret, "store-client" | server nonce | client nonce). A server with
// a secret refuses a client without one, and serves nothing before kAuth succeeds; a client with a
// secret refuses a server without one. From the kAuth answer on, every frame in each direction is
// sealed: its length counts a 16-byte tag that follows the body, GMAC (FrameMac) over the length
// and body under a key per direction derived from the secret and both nonces, frames numbered
// from 0. Until then frames are at most kMaxUnauthenticatedFrameBytes.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "core/crypto/crypto.h"
#include "tributary/store.h"

namespace tributary::internal::wire {

// The longest wait the server parks (a year): longer timeouts are clamped to it, on both sides.
inline constexpr std::chrono::milliseconds kMaxServerWait{std::chrono::hours(24 * 365)};

inline constexpr char kMagic[8] = {'t', 'r', 'i', 'b', 's', 't', 'o', 'r'};
// 2: nonces in the hello, kAuth, sealed frames. 3: kWill. 4: kCall.
inline constexpr std::uint32_t kVersion = 4;
inline constexpr std::size_t kNonceBytes = 32;
// A server with a secret notes here the last connections it refused for the secret, one line each
// ("127.0.0.1:40412: wrong secret"), so that a rank that waits in vain can say why its peer may
// not have come (name_lost_ranks). Only clients that hold the secret can read it.
inline constexpr char kRefusedClientsKey[] = "tributary/refused";
inline constexpr int kRefusedClientsKept = 8;
// The largest frame before a connection is authenticated (the hello and kAuth are far smaller).
inline constexpr std::size_t kMaxUnauthenticatedFrameBytes = 1024;
inline constexpr std::size_t kFrameHeaderBytes = 4;
// The largest body: a set of the largest key and value, plus field headers.
inline constexpr std::size_t kMaxFrameBytes = kMaxStoreKeyBytes + kMaxStoreValueBytes + 64;

enum class Op : std::uint8_t {
  kHello = 1,
  kSet = 2,
  kGet = 3,
  kAdd = 4,
  kWait = 5,
  kCheck = 6,
  kDelete = 7,
  kAuth = 8,
  kWill = 9,
  kCall = 10,
};

using Nonce = std::array<std::uint8_t, kNonceBytes>;

inline std::string_view bytes_of(const Nonce& n) {
  return {reinterpret_cast<const char*>(n.data()), n.size()};
}

// The proofs of the two sides ('S' server, 'C' client) and the frame keys of the two directions
// ('c' client to server, 's' server to client).
inline Digest session_digest(const std::string& secret, std::string_view what,
                             const Nonce& client, const Nonce& server) {
  std::string msg = "tributary-store|";
  msg += what;
  msg += '|';
  msg += bytes_of(client);
  msg += bytes_of(server);
  return hmac_sha256(secret, msg);
}

inline void put_length(std::string& frame, std::size_t body_bytes) {
  for (std::size_t i = 0; i < kFrameHeaderBytes; ++i)
    frame[i] = static_cast<char>((body_bytes >> (8 * i)) & 0xff);
}

// Seals a finished frame (from Writer::finish()): appends its tag and counts it in the length.
inline void seal(FrameMac& mac, std::string& frame) {
  put_length(frame, frame.size() - kFrameHeaderBytes + FrameMac::kTagBytes);
  const FrameMac::Tag tag = mac.of(frame.data(), frame.size());
  frame.append(reinterpret_cast<const char*>(tag.data()), tag.size());
}

// Checks and strips the tag of a sealed frame whose length header is `header` and whose body
// (tag included) is `body`; false when it is missing or wrong.
inline bool unseal(FrameMac& mac, const char* header, std::string_view& body) {
  if (body.size() < FrameMac::kTagBytes) return false;
  const std::size_t n = body.size() - FrameMac::kTagBytes;
  mac.begin();
  mac.update(header, kFrameHeaderBytes);
  mac.update(body.data(), n);
  const FrameMac::Tag want = mac.finish();
  if (!bytes_equal(want.data(), body.data() + n, want.size())) return false;
  body = body.substr(0, n);
  return true;
}

// Builds one frame; the length header is filled in by finish().
class Writer {
 public:
  Writer() : buf_(kFrameHeaderBytes, '\0') {}
  Writer& u8(std::uint8_t v) {
    buf_ += static_cast<char>(v);
    return *this;
  }
  Writer& u32(std::uint32_t v) { return le(v, 4); }
  Writer& u64(std::uint64_t v) { return le(v, 8); }
  Writer& i64(std::int64_t v) { return le(static_cast<std::uint64_t>(v), 8); }
  Writer& raw(std::string_view s) {
    buf_ += s;
    return *this;
  }
  Writer& str(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    return raw(s);
  }
  // The frame, header included; leaves the writer empty. The body must fit kMaxFrameBytes (callers
  // validate sizes first).
  std::string finish() {
    put_length(buf_, buf_.size() - kFrameHeaderBytes);
    return std::move(buf_);
  }

 private:
  Writer& le(std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) buf_ += static_cast<char>((v >> (8 * i)) & 0xff);
    return *this;
  }
  std::string buf_;
};

inline std::uint32_t read_frame_length(const char* p) {
  std::uint32_t n = 0;
  for (std::size_t i = 0; i < kFrameHeaderBytes; ++i) {
    n |= std::uint32_t(static_cast<unsigned char>(p[i])) << (8 * i);
  }
  return n;
}

// Parses one body. Any read past the end sets failed() and yields zeros/empty strings, so a parser
// can read every field and check failed() once at the end.
class Reader {
 public:
  explicit Reader(std::string_view body) : data_(body) {}
  std::uint8_t u8() { return static_cast<std::uint8_t>(le(1)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(le(4)); }
  std::uint64_t u64() { return le(8); }
  std::int64_t i64() { return static_cast<std::int64_t>(le(8)); }
  std::string_view raw(std::size_t n) {
    if (failed_ || data_.size() - pos_ < n) {
      failed_ = true;
      return {};
    }
    std::string_view out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  std::string_view str() { return raw(u32()); }
  // A count of items that each take at least `min_item_bytes`: fails instead of trusting a count
  // the remaining bytes cannot hold (so nobody reserves memory for 4 billion keys).
  std::uint32_t count(std::size_t min_item_bytes) {
    std::uint32_t n = u32();
    if (!failed_ && std::uint64_t(n) * min_item_bytes > remaining()) failed_ = true;
    return failed_ ? 0 : n;
  }
  std::size_t remaining() const { return data_.size() - pos_; }
  bool failed() const { return failed_; }
  // True when every byte was consumed and nothing failed.
  bool done() const { return !failed_ && pos_ == data_.size(); }

 private:
  std::uint64_t le(int bytes) {
    std::string_view b = raw(static_cast<std::size_t>(bytes));
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < b.size(); ++i)
      v |= std::uint64_t(static_cast<unsigned char>(b[i])) << (8 * i);
    return v;
  }
  std::string_view data_;
  std::size_t pos_ = 0;
  bool failed_ = false;
};

}  // namespace tributary::internal::wire

// Helpers shared by the store implementations (private to tributary): key and value checks, counter
// parsing, deadlines and the quoting of keys in messages.
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tributary/status.h"
#include "tributary/store.h"

namespace tributary::internal {

using StoreClock = std::chrono::steady_clock;

// The port that `fd` listens on when it is a TCP socket (IPv4 or IPv6) in the listening state, else
// -1 (TcpStoreServerOptions::listen_fd; tcp_store_server.cc).
int listening_tcp_port(int fd);

// now + timeout, saturated so that "wait forever" timeouts cannot overflow the clock.
inline StoreClock::time_point store_deadline(std::chrono::milliseconds timeout) {
  constexpr auto kMax = std::chrono::hours(24 * 365 * 10);
  auto t = std::clamp<std::chrono::milliseconds>(timeout, std::chrono::milliseconds(0), kMax);
  return StoreClock::now() + t;
}

// 'rank/1/addr', with non-printable bytes as \xNN and very long keys shortened.
inline std::string quote_key(std::string_view key) {
  constexpr std::size_t kShown = 120;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "'";
  for (std::size_t i = 0; i < key.size() && i < kShown; ++i) {
    auto c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (key.size() > kShown) out += "...(" + std::to_string(key.size()) + " bytes)";
  out += "'";
  return out;
}

// "'a', 'b' and 3 more"
inline std::string quote_keys(const std::vector<std::string>& keys) {
  constexpr std::size_t kShown = 8;
  std::string out;
  for (std::size_t i = 0; i < keys.size() && i < kShown; ++i) {
    if (i > 0) out += ", ";
    out += quote_key(keys[i]);
  }
  if (keys.size() > kShown) out += " and " + std::to_string(keys.size() - kShown) + " more";
  return out;
}

inline Status validate_store_key(std::string_view key) {
  if (key.empty()) return invalid_argument("store keys must not be empty");
  if (key.size() > kMaxStoreKeyBytes) {
    return invalid_argument("store key " + quote_key(key) + " is " + std::to_string(key.size()) +
                            " bytes, above the limit of " + std::to_string(kMaxStoreKeyBytes) +
                            " bytes; use shorter keys");
  }
  return Status();
}

inline Status validate_store_value(std::string_view key, std::size_t size) {
  if (size > kMaxStoreValueBytes) {
    return invalid_argument("the value for store key " + quote_key(key) + " is " +
                            std::to_string(size) + " bytes, above the limit of " +
                            std::to_string(kMaxStoreValueBytes) +
                            " bytes (64 MiB); a store is for addresses and ids, not bulk data");
  }
  return Status();
}

// The counter held in `value` plus `delta`, or an error naming the key. An absent key is 0.
inline StatusOr<std::int64_t> add_to_counter(std::string_view key, const std::string* value,
                                             std::int64_t delta) {
  std::int64_t current = 0;
  if (value != nullptr) {
    const char* begin = value->data();
    const char* end = begin + value->size();
    auto [ptr, ec] = std::from_chars(begin, end, current);
    if (ec != std::errc() || ptr != end || value->empty()) {
      return invalid_argument("key " + quote_key(key) + " holds " + std::to_string(value->size()) +
                              " bytes that are not a decimal integer (it was written by set(), "
                              "not add()); use a separate key for the counter");
    }
  }
  std::int64_t result = 0;
  if (__builtin_add_overflow(current, delta, &result)) {
    return out_of_range("counter " + quote_key(key) + " at " + std::to_string(current) + " plus " +
                        std::to_string(delta) + " would overflow int64");
  }
  return result;
}

// Sleeps for the current backoff (never past `deadline`) and doubles it up to `cap`.
inline void sleep_with_backoff(std::chrono::microseconds* backoff, std::chrono::microseconds cap,
                               StoreClock::time_point deadline) {
  auto now = StoreClock::now();
  if (now >= deadline) return;
  auto pause = std::min<StoreClock::duration>(*backoff, deadline - now);
  std::this_thread::sleep_for(pause);
  *backoff = std::min(*backoff * 2, cap);
}

}  // namespace tributary::internal

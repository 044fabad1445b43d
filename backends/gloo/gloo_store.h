// GlooStore: Gloo's rendezvous::Store interface over a tributary::Store, so that Gloo's TCP
// rendezvous (every rank publishes its listening addresses and reads its peers') goes through the
// same store as every other backend: the chief's TCP store, a file store, or a memory store in
// tests.
//
// Gloo calls set/get/wait and expects them to throw on failure. A failure here (the store cannot be
// reached, a key did not appear within the timeout) throws StoreError, which carries the tributary
// Status; the backend's boundary catches it and returns that Status, so a rendezvous that times out
// reads "rendezvous of backend 'gloo' ... did not find key 'rank_1' ... within 30s" rather than an
// opaque Gloo message. Thread safety: as the wrapped store (every tributary Store is thread-safe).
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "tributary/status.h"
#include "tributary/store.h"

namespace tributary::backends {

// Thrown through Gloo's code by GlooStore; caught at the backend's boundary.
class StoreError : public std::runtime_error {
 public:
  explicit StoreError(Status status)
      : std::runtime_error(status.to_string()), status_(std::move(status)) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

class GlooStore final : public gloo::rendezvous::Store {
 public:
  // get() and wait() without a timeout wait up to `timeout`.
  GlooStore(std::shared_ptr<tributary::Store> store, std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  [[noreturn]] void fail(const Status& s, const std::string& what) const;

  std::shared_ptr<tributary::Store> store_;
  std::chrono::milliseconds timeout_;
};

}  // namespace tributary::backends

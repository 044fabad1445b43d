#include "backends/gloo/gloo_store.h"

#include <algorithm>
#include <utility>

namespace tributary::backends {

GlooStore::GlooStore(std::shared_ptr<tributary::Store> store, std::chrono::milliseconds timeout)
    : store_(std::move(store)), timeout_(timeout) {}

void GlooStore::fail(const Status& s, const std::string& what) const {
  throw StoreError(s.with_context("Gloo rendezvous through " + store_->describe() + ": " + what));
}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  Status s = store_->set(key, std::string_view(data.data(), data.size()));
  if (!s.ok()) fail(s, "set '" + key + "'");
}

std::vector<char> GlooStore::get(const std::string& key) {
  StatusOr<std::string> v = store_->get(key, timeout_);
  if (!v.ok()) fail(v.status(), "get '" + key + "'");
  return std::vector<char>(v->begin(), v->end());
}

void GlooStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  // Gloo passes its context timeout; never wait longer than the backend's own timeout either.
  Status s = store_->wait(keys, std::min(timeout, timeout_));
  if (!s.ok()) fail(s, "wait");
}

}  // namespace tributary::backends

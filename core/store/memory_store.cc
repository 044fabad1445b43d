// The Store front door (validation and the one timeout message every store gives), PrefixStore and
// MemoryStore.
#include <condition_variable>
#include <map>
#include <mutex>

#include "core/store/store_common.h"
#include "tributary/options.h"
#include "tributary/store.h"

namespace tributary {
namespace {

using internal::quote_key;
using internal::quote_keys;

std::string op_context(const Store& store, std::string_view op, std::string_view args) {
  return std::string(op) + "(" + std::string(args) + ") on " + store.describe();
}

// The advice is the same for every store: the missing key is written by some other rank, which is
// either slow, dead or waiting for something itself.
constexpr std::string_view kTimeoutAdvice =
    "; is every rank of the job running and has it reached this rendezvous (the rank that writes a "
    "key is often named in it)? raise the timeout (timeout=, StoreOptions::timeout) to wait longer";

Store::Duration non_negative(Store::Duration timeout) {
  return timeout.count() < 0 ? Store::Duration(0) : timeout;
}

}  // namespace

// --- Store: the front door -----------------------------------------------------------------------

// The "<op>(<args>) on <store>" context is built only on the error paths: set/add/check run in
// barrier loops and should not pay for messages they do not print.

Status Store::set(std::string_view key, std::string_view value) {
  Status s = internal::validate_store_key(key);
  if (s.ok()) s = internal::validate_store_value(key, value.size());
  if (s.ok()) s = set_impl(key, value);
  if (s.ok()) return s;
  return s.with_context(op_context(*this, "set", quote_key(key)));
}

Status Store::set(std::string_view key, std::string_view value, Duration timeout) {
  Status s = internal::validate_store_key(key);
  if (s.ok()) s = internal::validate_store_value(key, value.size());
  if (s.ok()) s = set_within_impl(key, value, non_negative(timeout));
  if (s.ok()) return s;
  return s.with_context(op_context(*this, "set", quote_key(key)));
}

Status Store::set_within_impl(std::string_view key, std::string_view value, Duration) {
  return set_impl(key, value);
}

StatusOr<std::string> Store::get(std::string_view key, Duration timeout) {
  auto context = [&] { return op_context(*this, "get", quote_key(key)); };
  Status s = internal::validate_store_key(key);
  if (!s.ok()) return s.with_context(context());
  auto value = get_impl(key, non_negative(timeout));
  if (!value.ok()) return value.status().with_context(context());
  if (!value->has_value()) {
    return deadline_exceeded(context() + ": key " + quote_key(key) + " was not set within " +
                             format_duration(non_negative(timeout)) + std::string(kTimeoutAdvice));
  }
  return std::move(**value);
}

StatusOr<std::int64_t> Store::add(std::string_view key, std::int64_t delta) {
  auto context = [&] {
    return op_context(*this, "add", quote_key(key) + ", " + std::to_string(delta));
  };
  Status s = internal::validate_store_key(key);
  if (!s.ok()) return s.with_context(context());
  auto result = add_impl(key, delta);
  if (!result.ok()) return result.status().with_context(context());
  return result;
}

Status Store::wait(const std::vector<std::string>& keys, Duration timeout) {
  auto context = [&] { return op_context(*this, "wait", quote_keys(keys)); };
  for (const std::string& key : keys) {
    Status s = internal::validate_store_key(key);
    if (!s.ok()) return s.with_context(context());
  }
  if (keys.empty()) return Status();
  std::vector<std::string> missing;
  Status s = wait_impl(keys, non_negative(timeout), &missing);
  if (!s.ok()) return s.with_context(context());
  if (missing.empty()) return Status();
  return deadline_exceeded(context() + ": " + std::to_string(missing.size()) + " of " +
                           std::to_string(keys.size()) + " key(s) still missing after " +
                           format_duration(non_negative(timeout)) + ": " + quote_keys(missing) +
                           std::string(kTimeoutAdvice));
}

StatusOr<bool> Store::check(const std::vector<std::string>& keys) {
  auto context = [&] { return op_context(*this, "check", quote_keys(keys)); };
  for (const std::string& key : keys) {
    Status s = internal::validate_store_key(key);
    if (!s.ok()) return s.with_context(context());
  }
  if (keys.empty()) return true;
  auto result = check_impl(keys);
  if (!result.ok()) return result.status().with_context(context());
  return result;
}

StatusOr<bool> Store::delete_key(std::string_view key) {
  auto context = [&] { return op_context(*this, "delete_key", quote_key(key)); };
  Status s = internal::validate_store_key(key);
  if (!s.ok()) return s.with_context(context());
  auto result = delete_key_impl(key);
  if (!result.ok()) return result.status().with_context(context());
  return result;
}

Status Store::set_last_will(std::string_view key, std::string_view value) {
  Status s = key.empty() ? Status() : internal::validate_store_key(key);
  if (s.ok()) s = internal::validate_store_value(key, value.size() + 1);
  if (s.ok()) s = set_last_will_impl(key, value);
  if (s.ok()) return s;
  return s.with_context(op_context(*this, "set_last_will", quote_key(key)));
}

Status Store::set_last_will_impl(std::string_view, std::string_view) {
  return unimplemented(describe() +
                       " cannot tell a lost client from a live one, so it keeps no last will "
                       "(TcpStore does)");
}

// --- PrefixStore ---------------------------------------------------------------------------------

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : Store(base ? base->options() : StoreOptions{}),
      prefix_(std::move(prefix)),
      base_(std::move(base)) {}

std::string PrefixStore::describe() const {
  std::string base = base_ ? base_->describe() : "no store";
  return base + ", keys under prefix " + quote_key(prefix_ + "/");
}

std::string PrefixStore::full_key(std::string_view key) const {
  std::string full = prefix_;
  full += '/';
  full += key;
  return full;
}

std::vector<std::string> PrefixStore::full_keys(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& k : keys) out.push_back(full_key(k));
  return out;
}

namespace {
Status check_prefixed(const std::shared_ptr<Store>& base, const std::vector<std::string>& full) {
  if (!base) return failed_precondition("the PrefixStore was built on a null store");
  for (const std::string& k : full) TRIBUTARY_RETURN_IF_ERROR(internal::validate_store_key(k));
  return Status();
}
}  // namespace

Status PrefixStore::set_impl(std::string_view key, std::string_view value) {
  std::vector<std::string> full{full_key(key)};
  TRIBUTARY_RETURN_IF_ERROR(check_prefixed(base_, full));
  return base_->set_impl(full[0], value);
}

Status PrefixStore::set_within_impl(std::string_view key, std::string_view value,
                                    Duration timeout) {
  std::vector<std::string> full{full_key(key)};
  TRIBUTARY_RETURN_IF_ERROR(check_prefixed(base_, full));
  return base_->set_within_impl(full[0], value, timeout);
}

StatusOr<std::optional<std::string>> PrefixStore::get_impl(std::string_view key, Duration timeout) {
  std::vector<std::string> full{full_key(key)};
  TRIBUTARY_RETURN_IF_ERROR(check_prefixed(base_, full));
  return base_->get_impl(full[0], timeout);
}

StatusOr<std::int64_t> PrefixStore::add_impl(std::string_view key, std::int64_t delta) {
  std::vector<std::string> full{full_key(key)};
  TRIBUTARY_RETURN_IF_ERROR(check_prefixed(base_, full));
  return base_->add_impl(full[0], delta);
}

Status PrefixStore::wait_impl(const std::vector<std::string>& keys, Duration timeout,
                              std::vector<std::string>* missing) {
  std::vector<std::string> full = full_keys(keys);
  TRIBUTARY_RETURN_IF_ERROR(check_prefixed(base_, full));
  std::vector<std::string> missing_full;
  TRIBUTARY_RETURN_IF_ERROR(base_->wait_impl(full, timeout, &missing_full));
  // Report the keys as the caller named them; describe() shows the prefix.
  for (std::string& k : missing_full) missing->push_back(k.substr(prefix_.size() + 1));
  return Status();
}

StatusOr<bool> PrefixStore::check_impl(const std::vector<std::string>& keys) {
  std::vector<std::string> full = full_keys(keys);
  TRIBUTARY_RETURN_IF_ERROR(check_prefixed(base_, full));
  return base_->check_impl(full);
}

StatusOr<bool> PrefixStore::delete_key_impl(std::string_view key) {
  std::vector<std::string> full{full_key(key)};
  TRIBUTARY_RETURN_IF_ERROR(check_prefixed(base_, full));
  return base_->delete_key_impl(full[0]);
}

Status PrefixStore::set_last_will_impl(std::string_view key, std::string_view value) {
  if (!base_) return failed_precondition("the PrefixStore was built on a null store");
  if (key.empty()) return base_->set_last_will_impl(key, value);
  std::vector<std::string> full{full_key(key)};
  TRIBUTARY_RETURN_IF_ERROR(check_prefixed(base_, full));
  return base_->set_last_will_impl(full[0], value);
}

// --- MemoryStore ---------------------------------------------------------------------------------

struct MemoryStore::State {
  std::mutex mu;
  std::condition_variable changed;  // notified on every set/add
  std::map<std::string, std::string, std::less<>> data;

  bool has_all(const std::vector<std::string>& keys) const {
    for (const std::string& k : keys) {
      if (data.find(k) == data.end()) return false;
    }
    return true;
  }
};

MemoryStore::MemoryStore(StoreOptions options)
    : Store(options), state_(std::make_unique<State>()) {}
MemoryStore::~MemoryStore() = default;

Status MemoryStore::set_impl(std::string_view key, std::string_view value) {
  {
    std::lock_guard lock(state_->mu);
    state_->data.insert_or_assign(std::string(key), std::string(value));
  }
  state_->changed.notify_all();
  return Status();
}

StatusOr<std::optional<std::string>> MemoryStore::get_impl(std::string_view key, Duration timeout) {
  std::unique_lock lock(state_->mu);
  auto deadline = internal::store_deadline(timeout);
  auto present = [&] { return state_->data.find(key) != state_->data.end(); };
  if (!state_->changed.wait_until(lock, deadline, present)) return std::optional<std::string>();
  auto it = state_->data.find(key);
  return std::optional<std::string>(it->second);
}

StatusOr<std::int64_t> MemoryStore::add_impl(std::string_view key, std::int64_t delta) {
  std::int64_t result = 0;
  {
    std::lock_guard lock(state_->mu);
    auto it = state_->data.find(key);
    TRIBUTARY_ASSIGN_OR_RETURN(
        result,
        internal::add_to_counter(key, it == state_->data.end() ? nullptr : &it->second, delta));
    state_->data.insert_or_assign(std::string(key), std::to_string(result));
  }
  state_->changed.notify_all();
  return result;
}

Status MemoryStore::wait_impl(const std::vector<std::string>& keys, Duration timeout,
                              std::vector<std::string>* missing) {
  std::unique_lock lock(state_->mu);
  auto deadline = internal::store_deadline(timeout);
  if (state_->changed.wait_until(lock, deadline, [&] { return state_->has_all(keys); })) {
    return Status();
  }
  for (const std::string& k : keys) {
    if (state_->data.find(k) == state_->data.end()) missing->push_back(k);
  }
  return Status();
}

StatusOr<bool> MemoryStore::check_impl(const std::vector<std::string>& keys) {
  std::lock_guard lock(state_->mu);
  return state_->has_all(keys);
}

StatusOr<bool> MemoryStore::delete_key_impl(std::string_view key) {
  std::lock_guard lock(state_->mu);
  auto it = state_->data.find(key);
  if (it == state_->data.end()) return false;
  state_->data.erase(it);
  return true;
}

}  // namespace tributary

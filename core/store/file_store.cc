// FileStore: one file per key in a shared directory.
//
// Why this scheme: a value is written to a private temporary file and rename()d over the key's
// file, so a reader opens either the whole old file or the whole new one, never a torn value,
// without taking any lock (rename is atomic on local filesystems and on NFS). Writers (set, add,
// delete_key) serialise on flock() of one lock file, which makes add() an exact read-modify-write
// across processes and threads (flock locks belong to open file descriptions, so two threads of one
// process exclude each other too) and keeps set/add on the same key linearisable. Readers poll with
// backoff.
//
// File names: "k" + the key with bytes outside [A-Za-z0-9._-] escaped as %XX. A name that would be
// too long for the filesystem becomes "h" + a 64-bit hash + a readable head. Each file starts with
// a magic and the full key, so a hash collision (or a stray file) is reported, never returned as
// data.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <system_error>

#include "core/store/store_common.h"
#include "tributary/store.h"

namespace tributary {
namespace {

constexpr char kMagic[8] = {'T', 'R', 'I', 'B', 'K', 'V', '0', '1'};
constexpr std::size_t kHeaderBytes = sizeof(kMagic) + 8;  // magic + little-endian key length
constexpr std::size_t kMaxNameBytes = 200;                // below NAME_MAX (255) everywhere
constexpr auto kInitialPoll = std::chrono::microseconds(1000);
constexpr auto kMaxPoll = std::chrono::microseconds(50'000);

std::string errno_text(int err) { return std::system_category().message(err); }

// An owned file descriptor; closes on destruction, moves empty the source.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

std::uint64_t fnv1a64(std::string_view s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string file_name_for(std::string_view key) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string escaped;
  escaped.reserve(key.size());
  for (unsigned char c : key) {
    bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
    if (plain) {
      escaped += static_cast<char>(c);
    } else {
      escaped += '%';
      escaped += kHex[c >> 4];
      escaped += kHex[c & 15];
    }
  }
  if (escaped.size() + 1 <= kMaxNameBytes) return "k" + escaped;
  char hash[17];
  std::uint64_t h = fnv1a64(key);
  for (int i = 15; i >= 0; --i, h >>= 4) hash[i] = kHex[h & 15];
  hash[16] = '\0';
  return "h" + std::string(hash) + "-" + escaped.substr(0, 100);
}

// Magic, key length and key; the value follows.
std::string encode_header(std::string_view key) {
  std::string out(kMagic, sizeof(kMagic));
  std::uint64_t n = key.size();
  for (int i = 0; i < 8; ++i) out += static_cast<char>((n >> (8 * i)) & 0xff);
  out += key;
  return out;
}

Status write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return unavailable(errno_text(errno));
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return Status();
}

// Holds the store's writer lock (flock on <dir>/lock) for its lifetime. Waits for it at most
// `timeout`: a process that holds it and has been stopped (SIGSTOP, a debugger, a frozen cgroup) or
// hangs in a write to a dead NFS server never releases it (a process that dies does: the kernel
// drops its locks), and every other rank's writes would wait for it forever.
class WriterLock {
 public:
  static StatusOr<WriterLock> acquire(const std::string& dir, std::chrono::milliseconds timeout) {
    std::string path = dir + "/lock";
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!fd.valid())
      return unavailable("cannot open the lock file " + path + ": " + errno_text(errno));
    const auto deadline = internal::store_deadline(timeout);
    auto backoff = std::chrono::duration_cast<std::chrono::microseconds>(kInitialPoll);
    while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EINTR) continue;
      if (errno != EWOULDBLOCK) {
        return unavailable("cannot lock " + path + ": " + errno_text(errno));
      }
      if (internal::StoreClock::now() >= deadline) {
        return deadline_exceeded(
            "the file store's lock " + path + " was held by another process for the store's " +
            "whole timeout (" + std::to_string(timeout.count()) +
            " ms); the process holding it may be stopped or hung (a stopped rank, or a write to "
            "a file server that stopped answering): find it with 'fuser " + path +
            "', or raise the store's timeout if writers are only slow");
      }
      internal::sleep_with_backoff(&backoff, kMaxPoll, deadline);
    }
    WriterLock lock;
    lock.fd_ = std::move(fd);
    return lock;
  }
  // Closing the descriptor releases the flock.

 private:
  UniqueFd fd_;
};

}  // namespace

FileStore::FileStore(std::string path, StoreOptions options)
    : Store(options), path_(std::move(path)) {}
FileStore::~FileStore() = default;

StatusOr<std::unique_ptr<FileStore>> FileStore::open(const std::string& path,
                                                     StoreOptions options) {
  if (path.empty()) return invalid_argument("FileStore::open: the path is empty");
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec || !std::filesystem::is_directory(path, ec)) {
    return unavailable("FileStore::open: cannot create the directory " + path + ": " +
                       (ec ? ec.message() : std::string("it exists and is not a directory")) +
                       "; check that the path is on a filesystem every process can write");
  }
  // Take and release the lock once so that a read-only or lock-less filesystem fails here, early.
  auto lock = WriterLock::acquire(path, options.timeout);
  if (!lock.ok()) return lock.status().with_context("FileStore::open(" + path + ")");
  return std::unique_ptr<FileStore>(new FileStore(path, options));
}

std::string FileStore::describe() const { return "file store at " + path_; }

namespace {

// Reads the value of `key` from `dir`; nullopt when the file does not exist.
StatusOr<std::optional<std::string>> read_value(const std::string& dir, std::string_view key) {
  std::string path = dir + "/" + file_name_for(key);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return std::optional<std::string>();
    return unavailable("cannot open " + path + ": " + errno_text(errno));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    return unavailable("cannot stat " + path + ": " + errno_text(errno));
  std::string contents;
  if (st.st_size > 0 && static_cast<std::uint64_t>(st.st_size) <=
                            kHeaderBytes + kMaxStoreKeyBytes + kMaxStoreValueBytes) {
    contents.reserve(static_cast<std::size_t>(st.st_size));
  }
  char buf[64 * 1024];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return unavailable("cannot read " + path + ": " + errno_text(errno));
    }
    if (n == 0) break;
    contents.append(buf, static_cast<std::size_t>(n));
    if (contents.size() > kHeaderBytes + kMaxStoreKeyBytes + kMaxStoreValueBytes) {
      return internal_error(path +
                            " is larger than any value the store writes; remove stray files "
                            "from the store directory or use a fresh directory");
    }
  }
  std::uint64_t key_len = 0;
  bool ok =
      contents.size() >= kHeaderBytes && std::memcmp(contents.data(), kMagic, sizeof(kMagic)) == 0;
  if (ok) {
    for (int i = 0; i < 8; ++i) {
      key_len |= std::uint64_t(static_cast<unsigned char>(contents[sizeof(kMagic) + i])) << (8 * i);
    }
    ok = key_len <= contents.size() - kHeaderBytes;
  }
  if (!ok) {
    return internal_error(path +
                          " is not a store file (bad header); remove stray files from the "
                          "store directory or use a fresh directory");
  }
  if (std::string_view(contents).substr(kHeaderBytes, key_len) != key) {
    return internal_error(path +
                          " holds another key whose file name collides with this one; use "
                          "shorter keys");
  }
  contents.erase(0, kHeaderBytes + key_len);
  return std::optional<std::string>(std::move(contents));
}

bool key_exists(const std::string& dir, std::string_view key, Status* error) {
  std::string path = dir + "/" + file_name_for(key);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return true;
  if (errno != ENOENT) *error = unavailable("cannot stat " + path + ": " + errno_text(errno));
  return false;
}

// Writes a whole file under a unique temporary name and renames it over the key's file. The caller
// holds the writer lock.
Status write_value(const std::string& dir, std::string_view key, std::string_view value) {
  // Unique across hosts sharing the directory, not only across pids of one host.
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char host[64] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string tmp =
      dir + "/.tmp-" + host + "-" + std::to_string(::getpid()) + "-" + std::to_string(rng());
  std::string path = dir + "/" + file_name_for(key);
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!fd.valid()) return unavailable("cannot create " + tmp + ": " + errno_text(errno));
    Status s = write_all(fd.get(), encode_header(key));
    if (s.ok()) s = write_all(fd.get(), value);
    // close() can report a deferred write error (NFS); the descriptor is gone either way.
    if (::close(fd.release()) != 0 && s.ok()) s = unavailable(errno_text(errno));
    if (!s.ok()) {
      ::unlink(tmp.c_str());
      return s.with_context("cannot write " + tmp);
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return unavailable("cannot rename " + tmp + " to " + path + ": " + errno_text(err));
  }
  return Status();
}

}  // namespace

Status FileStore::set_impl(std::string_view key, std::string_view value) {
  TRIBUTARY_ASSIGN_OR_RETURN(WriterLock lock, WriterLock::acquire(path_, options().timeout));
  return write_value(path_, key, value);
}

StatusOr<std::optional<std::string>> FileStore::get_impl(std::string_view key, Duration timeout) {
  auto deadline = internal::store_deadline(timeout);
  auto backoff = std::chrono::duration_cast<std::chrono::microseconds>(kInitialPoll);
  for (;;) {
    TRIBUTARY_ASSIGN_OR_RETURN(std::optional<std::string> value, read_value(path_, key));
    if (value.has_value()) return value;
    if (internal::StoreClock::now() >= deadline) return std::optional<std::string>();
    internal::sleep_with_backoff(&backoff, kMaxPoll, deadline);
  }
}

StatusOr<std::int64_t> FileStore::add_impl(std::string_view key, std::int64_t delta) {
  TRIBUTARY_ASSIGN_OR_RETURN(WriterLock lock, WriterLock::acquire(path_, options().timeout));
  TRIBUTARY_ASSIGN_OR_RETURN(std::optional<std::string> current, read_value(path_, key));
  TRIBUTARY_ASSIGN_OR_RETURN(
      std::int64_t result,
      internal::add_to_counter(key, current.has_value() ? &*current : nullptr, delta));
  TRIBUTARY_RETURN_IF_ERROR(write_value(path_, key, std::to_string(result)));
  return result;
}

Status FileStore::wait_impl(const std::vector<std::string>& keys, Duration timeout,
                            std::vector<std::string>* missing) {
  auto deadline = internal::store_deadline(timeout);
  auto backoff = std::chrono::duration_cast<std::chrono::microseconds>(kInitialPoll);
  std::vector<std::string> pending = keys;
  for (;;) {
    std::vector<std::string> still;
    for (const std::string& k : pending) {
      Status error;
      if (!key_exists(path_, k, &error)) {
        if (!error.ok()) return error;
        still.push_back(k);
      }
    }
    if (still.empty()) return Status();
    pending = std::move(still);
    if (internal::StoreClock::now() >= deadline) {
      *missing = std::move(pending);
      return Status();
    }
    internal::sleep_with_backoff(&backoff, kMaxPoll, deadline);
  }
}

StatusOr<bool> FileStore::check_impl(const std::vector<std::string>& keys) {
  for (const std::string& k : keys) {
    Status error;
    if (!key_exists(path_, k, &error)) {
      if (!error.ok()) return error;
      return false;
    }
  }
  return true;
}

StatusOr<bool> FileStore::delete_key_impl(std::string_view key) {
  TRIBUTARY_ASSIGN_OR_RETURN(WriterLock lock, WriterLock::acquire(path_, options().timeout));
  std::string path = path_ + "/" + file_name_for(key);
  if (::unlink(path.c_str()) == 0) return true;
  if (errno == ENOENT) return false;
  return unavailable("cannot remove " + path + ": " + errno_text(errno));
}

}  // namespace tributary

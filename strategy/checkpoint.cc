// save_checkpoint / restore_checkpoint: a small self-describing binary file written by the chief
// (its layout: checkpoint_format.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "fmt/format.h"
#include "strategy/checkpoint_format.h"
#include "tributary/strategy/variable.h"

namespace tributary {
namespace checkpoint_internal {
namespace {

constexpr std::string_view kMagicStem = "TRIBUTARY-CKPT-";
constexpr std::string_view kMagic = "TRIBUTARY-CKPT-1\n";

// An errno from a file operation as a Status whose code says what to do about it.
Status file_error(int err, std::string what) {
  what += std::string(": ") + std::strerror(err);
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return not_found(std::move(what));
    case EACCES:
    case EPERM:
    case EROFS:
      return failed_precondition(std::move(what) + " (permission denied)");
    case EISDIR:
      return invalid_argument(std::move(what));
    case ENOSPC:
    case EDQUOT:
      return resource_exhausted(std::move(what));
    default:
      return unavailable(std::move(what));
  }
}

// The process's umask, read without changing it (umask() sets it, racing other threads' files):
// /proc/self/status says it; 022 where that is not known.
mode_t current_umask() {
  FILE* f = std::fopen("/proc/self/status", "re");
  unsigned mask = 022;
  if (f != nullptr) {
    char line[256];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      if (std::sscanf(line, "Umask: %o", &mask) == 1) break;
    }
    std::fclose(f);
  }
  return static_cast<mode_t>(mask);
}

// The bytes a dtype and shape take, or false when the shape is negative or overflows.
bool shape_bytes(DType dtype, const Shape& shape, uint64_t* bytes) {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *bytes = n;
  return true;
}

uint64_t fnv1a(std::string_view bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  template <typename T>
  bool get(T& v) {
    if (data_.size() - pos_ < sizeof v) return false;
    std::memcpy(&v, data_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return true;
  }
  bool bytes(size_t n, std::string_view& out) {
    if (data_.size() - pos_ < n) return false;
    out = data_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  std::string_view data_;
  size_t pos_ = 0;
};

}  // namespace

std::string encode(const std::vector<std::pair<std::string, Array>>& entries) {
  std::string out(kMagic);
  put<uint64_t>(out, entries.size());
  for (const auto& [name, value] : entries) {
    put<uint32_t>(out, static_cast<uint32_t>(name.size()));
    out += name;
    put<uint8_t>(out, static_cast<uint8_t>(value.dtype()));
    put<uint8_t>(out, static_cast<uint8_t>(value.rank()));
    for (int64_t d : value.shape()) put<int64_t>(out, d);
    put<uint64_t>(out, value.nbytes());
    out.append(value.data<char>(), value.nbytes());
  }
  put<uint64_t>(out, fnv1a(out));
  return out;
}

StatusOr<std::map<std::string, Array>> decode(const std::string& path, std::string_view data) {
  auto corrupt = [&](std::string_view why) {
    return invalid_argument(
        fmt::format("checkpoint '{}' is corrupt or truncated ({}); was it "
                    "written by save_checkpoint and copied whole?",
                    path, why));
  };
  if (data.substr(0, kMagicStem.size()) == kMagicStem && data.substr(0, kMagic.size()) != kMagic) {
    // A later format ("TRIBUTARY-CKPT-<n>\n", n > 1) says so; anything else there is damage.
    const std::string_view rest = data.substr(kMagicStem.size());
    size_t digits = 0;
    uint64_t version = 0;
    while (digits < rest.size() && digits < 9 && rest[digits] >= '0' && rest[digits] <= '9') {
      version = version * 10 + static_cast<uint64_t>(rest[digits++] - '0');
    }
    if (digits > 0 && digits < rest.size() && rest[digits] == '\n' && version > 1) {
      return unimplemented(fmt::format(
          "checkpoint '{}' has format '{}', which this version of tributary does not read (it "
          "reads format 1): restore it with the version that wrote it",
          path, version));
    }
  }
  if (data.size() < kMagic.size() + 16 || data.substr(0, kMagic.size()) != kMagic) {
    return corrupt("bad header");
  }
  const std::string_view body = data.substr(0, data.size() - 8);
  uint64_t stored;
  std::memcpy(&stored, data.data() + body.size(), 8);
  if (fnv1a(body) != stored) return corrupt("checksum mismatch");
  Reader r(body.substr(kMagic.size()));
  uint64_t count;
  if (!r.get(count)) return corrupt("no count");
  std::map<std::string, Array> out;
  for (uint64_t k = 0; k < count; ++k) {
    uint32_t name_len;
    std::string_view name, bytes;
    uint8_t dtype, rank;
    if (!r.get(name_len) || !r.bytes(name_len, name) || !r.get(dtype) || !r.get(rank)) {
      return corrupt("bad entry");
    }
    if (dtype >= all_dtypes().size()) return corrupt("bad dtype");
    Shape shape(rank);
    for (auto& d : shape) {
      if (!r.get(d)) return corrupt("bad shape");
    }
    uint64_t nbytes, expected = 0;
    if (!r.get(nbytes) || !r.bytes(nbytes, bytes)) return corrupt("bad data");
    // Checked before allocating: a damaged shape never asks for more memory than the file holds.
    if (!shape_bytes(static_cast<DType>(dtype), shape, &expected) || expected != nbytes) {
      return corrupt(fmt::format("entry '{}' claims {}{} but holds {} bytes", name,
                                 dtype_name(static_cast<DType>(dtype)), shape_to_string(shape),
                                 nbytes));
    }
    StatusOr<Array> a = Array::zeros(static_cast<DType>(dtype), shape);
    if (!a.ok()) return a.status();
    if (nbytes) std::memcpy(a->mutable_data<void>(), bytes.data(), nbytes);
    if (!out.emplace(std::string(name), *a).second) {
      return corrupt(fmt::format("two entries named '{}'", name));
    }
  }
  if (r.pos() != body.size() - kMagic.size()) return corrupt("bytes after the last entry");
  return out;
}

Status write_atomically(const std::string& path, const std::string& bytes) {
  // A temporary file of its own beside `path` (mkstemp: O_EXCL, so neither another save of the same
  // path nor a link planted there is written through), synced, renamed over `path`, and the
  // directory synced: a crash leaves the old checkpoint or the new one, never a part of one.
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) {
    return file_error(errno, fmt::format("cannot create checkpoint '{}' (a temporary file beside "
                                         "it)",
                                         path));
  }
  Status written;
  // mkstemp makes the file 0600; a checkpoint gets the mode any new file would (0666 less umask).
  if (::fchmod(fd, 0666 & ~current_umask()) != 0) {
    written = file_error(errno, fmt::format("cannot set the mode of checkpoint '{}'", path));
  }
  for (size_t done = 0; done < bytes.size() && written.ok();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      written = file_error(n < 0 ? errno : EIO, fmt::format("cannot write checkpoint "
                                                            "'{}'",
                                                            path));
    else
      done += static_cast<size_t>(n);
  }
  if (written.ok() && ::fsync(fd) != 0) {
    written = file_error(errno, fmt::format("cannot sync checkpoint '{}'", path));
  }
  if (::close(fd) != 0 && written.ok()) {
    written = file_error(errno, fmt::format("cannot write checkpoint '{}'", path));
  }
  if (written.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    written = file_error(errno, fmt::format("cannot put checkpoint '{}' in place", path));
  }
  if (!written.ok()) {
    ::unlink(tmp.c_str());
    return written;
  }
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);  // best effort: some file systems refuse to sync a directory
    ::close(dfd);
  }
  return written;
}

StatusOr<std::string> read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return file_error(errno, fmt::format("checkpoint '{}' cannot be opened", path));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return file_error(err, fmt::format("checkpoint '{}' cannot be read", path));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(
        fmt::format("checkpoint '{}' is {}, not a file", path,
                    S_ISDIR(st.st_mode) ? "a directory" : "not a regular file"));
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return file_error(err, fmt::format("cannot read checkpoint '{}'", path));
    }
    if (n == 0) break;  // shorter than it was: the checksum refuses it
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(done);
  return out;
}

StatusOr<Array> find_entry(const std::string& path, const std::map<std::string, Array>& saved,
                           const std::string& name, DType dtype, const Shape& shape) {
  auto it = saved.find(name);
  if (it == saved.end()) {
    std::string have;
    for (const auto& [n, a] : saved) have += (have.empty() ? "" : ", ") + n;
    return not_found(fmt::format("checkpoint '{}' has no variable '{}' (it has: {})", path, name,
                                 have.empty() ? "none" : have));
  }
  if (it->second.dtype() != dtype || it->second.shape() != shape) {
    return invalid_argument(fmt::format("checkpoint '{}': variable '{}' was saved as {} but is {}{} now",
                                        path, name, it->second.tensor().to_string(),
                                        dtype_name(dtype), shape_to_string(shape)));
  }
  return it->second;
}

}  // namespace checkpoint_internal

namespace {

constexpr size_t kMessageBytes = 1024;            // a worker's status, gathered by every worker
constexpr size_t kSlotBytes = kMessageBytes + 8;  // the status, then the variables' digest

Status check_variables(std::span<const Variable> variables, Strategy*& strategy) {
  std::set<std::string> names;
  strategy = nullptr;
  if (variables.empty()) {
    // Refused: without a variable there is no strategy to agree through, and a worker that saved
    // nothing would write an empty checkpoint over the chief's.
    return invalid_argument("checkpoint: no variables given; pass the strategy's variables");
  }
  for (const Variable& v : variables) {
    if (!v.valid()) return invalid_argument("checkpoint: an empty Variable handle");
    if (!names.insert(v.name()).second) {
      return invalid_argument(fmt::format(
          "checkpoint: two variables are named '{}'; names identify variables in the file, give "
          "each a unique VariableOptions::name",
          v.name()));
    }
    if (strategy && &v.strategy() != strategy) {
      return invalid_argument(fmt::format(
          "checkpoint: variable '{}' belongs to {} but others to {}; checkpoint each strategy's "
          "variables separately",
          v.name(), v.strategy().describe(), strategy->describe()));
    }
    strategy = &v.strategy();
  }
  return ok_status();
}

// The variables' names, dtypes and shapes in order, as one number: workers that pass different
// lists (or the same in another order) would save or restore one variable's value into another.
uint64_t layout_digest(std::span<const Variable> variables) {
  std::string all;
  for (const Variable& v : variables) {
    if (!v.valid()) continue;
    // Name, dtype and shape: a broadcast of the chief's value needs the same size everywhere.
    all += v.name() + '\0' + std::string(dtype_name(v.dtype())) + shape_to_string(v.shape()) + '\0';
  }
  return checkpoint_internal::fnv1a(all);
}

// The strategy of the variables, for agreeing with the other workers even when this worker's list
// is bad: the first valid variable's, else the current one.
Strategy& strategy_of(std::span<const Variable> variables) {
  for (const Variable& v : variables) {
    if (v.valid()) return v.strategy();
  }
  return get_strategy();
}

// Every worker's status (and the digest of its variables) made known to every worker, in
// one all-gather: each returns its own error, else the first other worker's, else, when the
// digests differ, an error naming the workers whose lists differ. So no worker goes on, or waits
// for a collective, alone.
Status agree(Strategy& s, const Status& mine, uint64_t digest, std::string_view what) {
  if (s.num_workers() == 1) return mine;
  const int R = s.num_local_replicas();
  const int N = s.num_replicas_in_sync();
  std::vector<Array> in, out;
  for (int i = 0; i < R; ++i) {
    TRIBUTARY_ASSIGN_OR_RETURN(
        Array a, Array::zeros(DType::kUInt8, Shape{static_cast<int64_t>(kSlotBytes)}));
    auto* p = a.mutable_data<uint8_t>();
    if (!mine.ok()) {
      std::string m = mine.message();
      m.resize(std::min(m.size(), kMessageBytes - 2));
      p[0] = static_cast<uint8_t>(mine.code());
      std::memcpy(p + 1, m.data(), m.size());
    }
    std::memcpy(p + kMessageBytes, &digest, sizeof digest);
    TRIBUTARY_ASSIGN_OR_RETURN(a, a.to_device(s.worker_devices()[i]));
    TRIBUTARY_ASSIGN_OR_RETURN(
        Array o, Array::zeros(DType::kUInt8, Shape{static_cast<int64_t>(N * kSlotBytes)},
                              s.worker_devices()[i]));
    in.push_back(std::move(a));
    out.push_back(std::move(o));
  }
  std::vector<Tensor> ti, to;
  for (int i = 0; i < R; ++i) {
    ti.push_back(in[i].tensor());
    to.push_back(out[i].tensor());
  }
  Status gathered =
      s.cross_device_ops()
          .all_gather(PerReplica<Tensor>(std::move(ti)), PerReplica<Tensor>(std::move(to)))
          .wait();
  if (!mine.ok()) return mine;
  if (!gathered.ok()) {
    return gathered.with_context(fmt::format("{}: agreeing with the other workers", what));
  }
  TRIBUTARY_ASSIGN_OR_RETURN(Array host, out[0].to_device(Device::cpu()));
  const auto* all = host.data<uint8_t>();
  auto slot = [&](int w) { return all + static_cast<size_t>(w) * R * kSlotBytes; };  // replica 0
  uint64_t first = 0;
  std::memcpy(&first, slot(0) + kMessageBytes, sizeof first);
  std::string differ;
  for (int w = 0; w < s.num_workers(); ++w) {
    const uint8_t* p = slot(w);
    if (p[0] != 0) {
      return Status(static_cast<StatusCode>(p[0]),
                    fmt::format("{} failed on worker {}: {}", what, w,
                                std::string(reinterpret_cast<const char*>(p + 1))));
    }
    uint64_t d = 0;
    std::memcpy(&d, p + kMessageBytes, sizeof d);
    if (d != first) differ += (differ.empty() ? "" : ", ") + std::to_string(w);
  }
  if (!differ.empty()) {
    return invalid_argument(fmt::format(
        "{}: worker(s) {} passed other variables than worker 0 (names, dtypes or shapes), or the "
        "same in another order; pass the same list, in the same order, on every worker",
        what, differ));
  }
  return ok_status();
}

}  // namespace

Status save_checkpoint(const std::string& path, std::span<const Variable> variables) {
  // Every worker makes the same collectives whatever fails where: its own errors go into the
  // agreements (an all-gather of every worker's status), never into an early return between them.
  Strategy* s = nullptr;
  const Status checked = check_variables(variables, s);
  if (s == nullptr) s = &strategy_of(variables);
  TRIBUTARY_RETURN_IF_ERROR(s->require_cross_replica("save_checkpoint"));
  const uint64_t digest = layout_digest(variables);
  TRIBUTARY_RETURN_IF_ERROR(agree(*s, checked, digest, "save_checkpoint"));
  std::vector<std::pair<std::string, Array>> entries;
  Status written;
  for (const Variable& v : variables) {
    StatusOr<Array> value = v.read();  // ON_READ: aggregated, a collective on every worker
    if (!value.ok()) {
      if (written.ok()) written = value.status();
      continue;  // the other reads still take part in their collectives
    }
    StatusOr<Array> host = value->to_device(Device::cpu());  // a GPU copy too
    if (!host.ok()) {
      if (written.ok()) written = host.status();
      continue;
    }
    entries.emplace_back(v.name(), std::move(*host));
  }
  if (written.ok() && s->should_checkpoint()) {
    written = checkpoint_internal::write_atomically(path, checkpoint_internal::encode(entries));
  }
  return agree(*s, written, digest, "save_checkpoint");
}

Status restore_checkpoint(const std::string& path, std::span<const Variable> variables) {
  Strategy* s = nullptr;
  const Status checked = check_variables(variables, s);
  if (s == nullptr) s = &strategy_of(variables);
  TRIBUTARY_RETURN_IF_ERROR(s->require_cross_replica("restore_checkpoint"));
  const uint64_t digest = layout_digest(variables);
  TRIBUTARY_RETURN_IF_ERROR(agree(*s, checked, digest, "restore_checkpoint"));
  std::map<std::string, Array> saved;
  Status loaded;
  if (s->is_chief()) {
    StatusOr<std::string> bytes = checkpoint_internal::read_file(path);
    StatusOr<std::map<std::string, Array>> parsed =
        bytes.ok() ? checkpoint_internal::decode(path, *bytes)
                   : StatusOr<std::map<std::string, Array>>(bytes.status());
    if (!parsed.ok()) {
      loaded = parsed.status();
    } else {
      saved = std::move(*parsed);
    }
    for (const Variable& v : variables) {
      if (!loaded.ok()) break;
      loaded = checkpoint_internal::find_entry(path, saved, v.name(), v.dtype(), v.shape()).status();
    }
  }
  // The broadcast buffers, made before the workers agree, so that a worker that cannot make them
  // says so there rather than leaving the others in a broadcast.
  // On several workers they live on the first replica device, as a backend of that device (nccl:
  // GPU memory only) takes them.
  const Device on = s->num_workers() > 1 ? s->worker_devices()[0] : Device::cpu();
  std::vector<Array> values, outs;
  for (const Variable& v : variables) {
    if (!loaded.ok()) break;
    StatusOr<Array> value = s->is_chief() ? saved.at(v.name()).to_device(on)
                                          : Array::zeros(v.dtype(), v.shape(), on);  // not read
    if (!value.ok())
      loaded = value.status();
    else
      values.push_back(std::move(*value));
    if (s->num_workers() > 1 && loaded.ok()) {
      StatusOr<Array> out = Array::zeros(v.dtype(), v.shape(), on);
      if (!out.ok())
        loaded = out.status();
      else
        outs.push_back(std::move(*out));
    }
  }
  TRIBUTARY_RETURN_IF_ERROR(agree(*s, loaded, digest, "restore_checkpoint"));
  // Every value is known good on the chief: share them, then assign (nothing changed before here).
  // A failed broadcast is recorded, and the others are still made, as on the other workers.
  Status assigned;
  if (s->num_workers() > 1) {
    for (size_t i = 0; i < variables.size(); ++i) {
      Status moved = s->cross_device_ops()
                         .broadcast(values[i].tensor(), Mirrored<Tensor>({outs[i].tensor()}), 0)
                         .wait();
      if (!moved.ok() && assigned.ok()) assigned = moved;
      StatusOr<Array> host = outs[i].to_device(Device::cpu());
      if (!host.ok() && assigned.ok()) assigned = host.status();
      if (host.ok()) values[i] = std::move(*host);
    }
  }
  for (size_t i = 0; i < variables.size() && assigned.ok(); ++i) {
    // Cross-replica assign is TF's restore rule: ON_READ SUM splits the value evenly across the
    // replicas; everything else gives every copy the value.
    Variable v = variables[i];
    assigned = v.assign(values[i]);
  }
  // Every value was checked before; an assignment can still fail (memory, a device): the workers
  // agree on the outcome.
  return agree(*s, assigned, digest, "restore_checkpoint");
}

}  // namespace tributary

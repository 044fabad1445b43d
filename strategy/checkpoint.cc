// save_checkpoint / restore_checkpoint: a small self-describing binary file written by the chief
// (its layout: checkpoint_format.h).
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "fmt/format.h"
#include "strategy/checkpoint_format.h"
#include "tributary/strategy/variable.h"

namespace tributary {
namespace checkpoint_internal {
namespace {

constexpr std::string_view kMagic = "TRIBUTARY-CKPT-1\n";

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
    uint64_t nbytes;
    if (!r.get(nbytes) || !r.bytes(nbytes, bytes)) return corrupt("bad data");
    StatusOr<Array> a = Array::zeros(static_cast<DType>(dtype), shape);
    if (!a.ok() || a->nbytes() != nbytes) return corrupt("size does not match shape");
    if (nbytes) std::memcpy(a->mutable_data<void>(), bytes.data(), nbytes);
    out.emplace(std::string(name), *a);
  }
  return out;
}

Status write_atomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  Status written;
  if (!f) {
    written =
        unavailable(fmt::format("could not write checkpoint '{}': {}", tmp, std::strerror(errno)));
  } else if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    written = unavailable(
        fmt::format("could not rename '{}' to '{}': {}", tmp, path, std::strerror(errno)));
  }
  if (!written.ok()) std::remove(tmp.c_str());
  return written;
}

StatusOr<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    return not_found(fmt::format("checkpoint '{}' cannot be opened: {}", path, std::strerror(errno)));
  }
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
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

constexpr size_t kMessageBytes = 1024;  // the chief's status, broadcast to every worker

Status check_variables(std::span<const Variable> variables, Strategy*& strategy) {
  std::set<std::string> names;
  strategy = nullptr;
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

// The chief's status, made known to every worker (the others return it too, so none waits for a
// broadcast that never comes).
Status agree(Strategy& s, const Status& chief_status) {
  if (s.num_workers() == 1) return chief_status;
  StatusOr<Array> buf = Array::zeros(DType::kUInt8, Shape{static_cast<int64_t>(kMessageBytes)});
  if (!buf.ok()) return buf.status();
  if (s.is_chief() && !chief_status.ok()) {
    std::string m = chief_status.message();
    m.resize(std::min(m.size(), kMessageBytes - 2));
    auto* p = buf->mutable_data<uint8_t>();
    p[0] = static_cast<uint8_t>(chief_status.code());
    std::memcpy(p + 1, m.data(), m.size());
  }
  StatusOr<Array> out = Array::zeros(DType::kUInt8, Shape{static_cast<int64_t>(kMessageBytes)});
  if (!out.ok()) return out.status();
  TRIBUTARY_RETURN_IF_ERROR(
      s.cross_device_ops().broadcast(buf->tensor(), Mirrored<Tensor>({out->tensor()}), 0).wait());
  const auto* p = out->data<uint8_t>();
  if (p[0] == 0) return ok_status();
  if (s.is_chief()) return chief_status;
  return Status(static_cast<StatusCode>(p[0]),
                "on the chief: " + std::string(reinterpret_cast<const char*>(p + 1)));
}

}  // namespace

Status save_checkpoint(const std::string& path, std::span<const Variable> variables) {
  Strategy* s = nullptr;
  TRIBUTARY_RETURN_IF_ERROR(check_variables(variables, s));
  if (s == nullptr) s = &get_strategy();
  TRIBUTARY_RETURN_IF_ERROR(s->require_cross_replica("save_checkpoint"));
  std::vector<std::pair<std::string, Array>> entries;
  for (const Variable& v : variables) {
    TRIBUTARY_ASSIGN_OR_RETURN(Array value, v.read());  // ON_READ: aggregated, on every worker
    entries.emplace_back(v.name(), std::move(value));
  }
  const std::string out = checkpoint_internal::encode(entries);
  Status written;
  if (s->should_checkpoint()) written = checkpoint_internal::write_atomically(path, out);
  return agree(*s, written);
}

Status restore_checkpoint(const std::string& path, std::span<const Variable> variables) {
  Strategy* s = nullptr;
  TRIBUTARY_RETURN_IF_ERROR(check_variables(variables, s));
  if (s == nullptr) s = &get_strategy();
  TRIBUTARY_RETURN_IF_ERROR(s->require_cross_replica("restore_checkpoint"));
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
  TRIBUTARY_RETURN_IF_ERROR(agree(*s, loaded));
  // Every value is known good on the chief: share them, then assign (nothing changed before here).
  std::vector<Array> values;
  for (const Variable& v : variables) {
    Array value;
    if (s->is_chief()) {
      value = saved.at(v.name());
    } else {
      TRIBUTARY_ASSIGN_OR_RETURN(value, Array::zeros(v.dtype(), v.shape()));  // not read
    }
    if (s->num_workers() > 1) {
      TRIBUTARY_ASSIGN_OR_RETURN(Array out, Array::zeros(v.dtype(), v.shape()));
      TRIBUTARY_RETURN_IF_ERROR(s->cross_device_ops()
                                    .broadcast(value.tensor(), Mirrored<Tensor>({out.tensor()}), 0)
                                    .wait());
      value = out;
    }
    values.push_back(std::move(value));
  }
  for (size_t i = 0; i < variables.size(); ++i) {
    // Cross-replica assign is TF's restore rule: ON_READ SUM splits the value evenly across the
    // replicas; everything else gives every copy the value.
    Variable v = variables[i];
    TRIBUTARY_RETURN_IF_ERROR(v.assign(values[i]));
  }
  return ok_status();
}

}  // namespace tributary

// ParameterServerStrategy, ClusterCoordinator and the task servers (parameter_server.h).
//
// Every server is a TcpStoreServer with a call handler; every request a TcpStore::call. A ps
// task's handler applies variable operations on the server's I/O thread (each is one copy or one
// element-wise pass, under the variable's own lock); a worker's hands worker.run to its executor
// thread, which answers when the function returns. The coordinator runs one dispatcher thread per
// worker, each taking the next function from one queue.
#include "tributary/strategy/parameter_server.h"

#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include "core/logging.h"
#include "core/rendezvous.h"
#include "core/store/tcp_store_protocol.h"
#include "strategy/checkpoint_format.h"
#include "tributary/options.h"
#include "tributary/store.h"

namespace tributary {

namespace wire = internal::wire;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

namespace {

// --- Encoding --------------------------------------------------------------------------------------

void put_array(wire::Writer& w, const Array& a) {
  w.u8(static_cast<uint8_t>(a.dtype())).u32(static_cast<uint32_t>(a.rank()));
  for (int64_t d : a.shape()) w.i64(d);
  w.str(std::string_view(static_cast<const char*>(a.tensor().data()), a.nbytes()));
}

StatusOr<Array> get_array(wire::Reader& r) {
  const uint8_t dtype = r.u8();
  const uint32_t rank = r.count(8);
  Shape shape;
  for (uint32_t i = 0; i < rank; ++i) shape.push_back(r.i64());
  std::string_view bytes = r.str();
  if (r.failed() || dtype > static_cast<uint8_t>(DType::kUInt8)) {
    return invalid_argument("a malformed array in a parameter-server message");
  }
  for (int64_t d : shape) {
    if (d < 0) return invalid_argument("a negative dimension in a parameter-server message");
  }
  TRIBUTARY_ASSIGN_OR_RETURN(Array a, Array::zeros(static_cast<DType>(dtype), shape));
  if (a.nbytes() != bytes.size()) {
    return invalid_argument("an array of " + shape_to_string(shape) + " with " +
                            std::to_string(bytes.size()) + " bytes in a parameter-server message");
  }
  if (!bytes.empty()) std::memcpy(a.mutable_data<char>(), bytes.data(), bytes.size());
  return a;
}

std::string body(wire::Writer& w) { return w.finish().substr(wire::kFrameHeaderBytes); }

milliseconds resolve_timeout(milliseconds given, const Config& config) {
  if (given.count() > 0) return given;
  if (std::optional<std::string> text = config.get("TRIBUTARY_TIMEOUT")) {
    auto d = parse_duration(*text);
    if (d.ok() && d->count() > 0) return std::chrono::duration_cast<milliseconds>(*d);
  }
  return std::chrono::minutes(5);
}

Status split_address(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return invalid_argument("TF_CONFIG: the address \"" + address + "\" has no port");
  }
  *host = address.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  try {
    *port = std::stoi(address.substr(colon + 1));
  } catch (abi::__forced_unwind&) {
    throw;  // a thread being ended (pthread_exit, Python finalizing) must unwind
  } catch (...) {
    *port = 0;
  }
  if (*port <= 0 || *port > 65535) {
    return invalid_argument("TF_CONFIG: the address \"" + address + "\" has no valid port");
  }
  return Status();
}

internal::Logger& ps_log() {
  static internal::Logger logger(internal::log_level_from(Config::from_environment()), "ps");
  return logger;
}

// Row-wise element updates of `dst` (a view of a variable's rows) by `src` of the same shape.
Status combine_into(const Array& dst, const Array& src, uint8_t kind) {
  StatusOr<Array> out = kind == 0   ? StatusOr<Array>(src)
                        : kind == 1 ? add(dst, src)
                                    : subtract(dst, src);
  TRIBUTARY_RETURN_IF_ERROR(out.status());
  if (out->nbytes() != dst.nbytes()) return internal_error("update of another size");
  if (dst.nbytes() > 0) std::memmove(dst.mutable_data<char>(), out->data<char>(), dst.nbytes());
  return Status();
}

// The registries of functions by name (process-wide, as the binary is the same everywhere).
struct Registries {
  std::mutex mu;
  std::map<std::string, WorkerFunction> functions;
  std::map<std::string, DatasetFunction> datasets;
};
Registries& registries() {
  static Registries* r = new Registries;
  return *r;
}

}  // namespace

// =================================================================================================
// PsClient: connections to the ps tasks, for the coordinator and for workers.
// =================================================================================================
namespace ps_internal {

class PsClient {
 public:
  PsClient(std::vector<std::string> addresses, StoreOptions options, milliseconds timeout)
      : addresses_(std::move(addresses)), options_(std::move(options)), timeout_(timeout),
        stores_(addresses_.size()) {}

  int num_ps() const { return static_cast<int>(addresses_.size()); }
  milliseconds timeout() const { return timeout_; }

  std::string who(int ps) const {
    return "parameter server ps:" + std::to_string(ps) + " (" + addresses_[static_cast<size_t>(ps)] +
           ")";
  }

  StatusOr<std::string> call(int ps, std::string_view method, std::string_view payload) {
    if (ps < 0 || ps >= num_ps()) return internal_error("no ps task " + std::to_string(ps));
    TcpStore* store = nullptr;
    {
      std::lock_guard lock(mu_);
      auto& s = stores_[static_cast<size_t>(ps)];
      if (!s) {
        std::string host;
        int port = 0;
        TRIBUTARY_RETURN_IF_ERROR(split_address(addresses_[static_cast<size_t>(ps)], &host, &port));
        StoreOptions o = options_;
        o.server_role = "parameter server ps:" + std::to_string(ps);
        auto c = TcpStore::connect(host, static_cast<uint16_t>(port), o);
        if (!c.ok()) return lost(ps, c.status());
        s = std::move(*c);
      }
      store = s.get();
    }
    auto answer = store->call(method, payload, timeout_);
    if (!answer.ok()) {
      const StatusCode code = answer.status().code();
      const bool answered = answer.status().message().rfind("the server answered: ", 0) == 0;
      if (!answered && (code == StatusCode::kUnavailable || code == StatusCode::kDeadlineExceeded)) {
        return lost(ps, answer.status());
      }
      return Status(code, who(ps) + ": " + answer.status().message());
    }
    return answer;
  }

 private:
  Status lost(int ps, const Status& why) const {
    return Status(why.code(),
                  who(ps) + " failed or is unreachable: " + why.message() +
                      ". A parameter server that fails is not recovered (as in TF): restart the "
                      "job and restore_checkpoint() what save_checkpoint() saved, if you saved "
                      "one");
  }
  std::vector<std::string> addresses_;
  StoreOptions options_;
  milliseconds timeout_;
  std::mutex mu_;
  std::vector<std::unique_ptr<TcpStore>> stores_;
};

}  // namespace ps_internal

// =================================================================================================
// Checkpoints
// =================================================================================================

namespace {
Status check_names(std::span<const PSVariable> variables) {
  std::set<std::string> names;
  for (const PSVariable& v : variables) {
    if (!v.valid()) return invalid_argument("checkpoint: an empty PSVariable handle");
    if (!names.insert(v.name()).second) {
      return invalid_argument("checkpoint: two variables are named '" + v.name() + "'");
    }
  }
  return ok_status();
}
}  // namespace

Status save_checkpoint(const std::string& path, std::span<const PSVariable> variables) {
  TRIBUTARY_RETURN_IF_ERROR(check_names(variables));
  std::vector<std::pair<std::string, Array>> entries;
  for (const PSVariable& v : variables) {
    StatusOr<Array> value = v.read();
    if (!value.ok()) {
      return value.status().with_context("save_checkpoint('" + path + "'): reading '" + v.name() +
                                         "'; nothing was written");
    }
    entries.emplace_back(v.name(), std::move(*value));
  }
  return checkpoint_internal::write_atomically(path, checkpoint_internal::encode(entries));
}

Status restore_checkpoint(const std::string& path, std::span<const PSVariable> variables) {
  TRIBUTARY_RETURN_IF_ERROR(check_names(variables));
  TRIBUTARY_ASSIGN_OR_RETURN(std::string bytes, checkpoint_internal::read_file(path));
  TRIBUTARY_ASSIGN_OR_RETURN(auto saved, checkpoint_internal::decode(path, bytes));
  std::vector<Array> values;
  for (const PSVariable& v : variables) {
    TRIBUTARY_ASSIGN_OR_RETURN(
        Array a, checkpoint_internal::find_entry(path, saved, v.name(), v.dtype(), v.shape()));
    values.push_back(std::move(a));
  }
  for (size_t i = 0; i < variables.size(); ++i) {
    PSVariable v = variables[i];
    Status s = v.assign(values[i]);
    if (!s.ok()) {
      return s.with_context("restore_checkpoint('" + path + "'): assigning '" + v.name() + "' (" +
                            std::to_string(i) + " of " + std::to_string(variables.size()) +
                            " variables were restored before it; restore again once every ps "
                            "task is up)");
    }
  }
  return ok_status();
}

// =================================================================================================
// Partitioners
// =================================================================================================

namespace {
int64_t element_bytes(DType dtype, int64_t bytes_per_string) {
  (void)bytes_per_string;  // no string dtype here
  return static_cast<int64_t>(dtype_size(dtype));
}
// The partitioners' answer shape: one part per dimension (a scalar counts as one dimension).
std::vector<int64_t> one_part_each(const Shape& shape) {
  return std::vector<int64_t>(std::max<size_t>(shape.size(), 1), 1);
}
}  // namespace

StatusOr<VariablePartitioner> fixed_shards_partitioner(int num_shards) {
  if (num_shards <= 0) {
    return invalid_argument("Argument `num_shards` must be positive. Received: " +
                            std::to_string(num_shards));
  }
  return VariablePartitioner([num_shards](const Shape& shape, DType) {
    std::vector<int64_t> parts = one_part_each(shape);
    if (!shape.empty()) parts[0] = std::min<int64_t>(num_shards, shape[0]);
    return parts;
  });
}


StatusOr<VariablePartitioner> min_size_partitioner(int64_t min_shard_bytes, int max_shards,
                                                   int64_t bytes_per_string) {
  if (min_shard_bytes < 1 || max_shards < 1 || bytes_per_string < 1) {
    return invalid_argument(
        "Argument `min_shard_bytes`, `max_shards` and `bytes_per_string` must be positive. "
        "Received: " +
        std::to_string(min_shard_bytes) + ", " + std::to_string(max_shards) + ", " +
        std::to_string(bytes_per_string));
  }
  return VariablePartitioner([=](const Shape& shape, DType dtype) {
    std::vector<int64_t> parts = one_part_each(shape);
    if (shape.empty() || shape[0] == 0) return parts;
    // TF: shards = min(max_shards, ceil(total / min_shard_bytes)), at most shape[0].
    const int64_t total = shape_num_elements(shape) * element_bytes(dtype, bytes_per_string);
    int64_t shards = std::max<int64_t>(1, total / min_shard_bytes + (total % min_shard_bytes != 0));
    shards = std::min<int64_t>({shards, max_shards, shape[0]});
    parts[0] = shards;
    return parts;
  });
}

StatusOr<VariablePartitioner> max_size_partitioner(int64_t max_shard_bytes, int max_shards,
                                                   int64_t bytes_per_string) {
  if (max_shard_bytes < 1 || max_shards < 0 || bytes_per_string < 1) {
    return invalid_argument(
        "Argument `max_shard_bytes` and `bytes_per_string` must be positive, and `max_shards` "
        "positive or 0 (no limit). Received: " +
        std::to_string(max_shard_bytes) + ", " + std::to_string(max_shards) + ", " +
        std::to_string(bytes_per_string));
  }
  return VariablePartitioner([=](const Shape& shape, DType dtype) {
    std::vector<int64_t> parts = one_part_each(shape);
    if (shape.empty() || shape[0] == 0) return parts;
    // TF (variable_axis_size_partitioner): slices of whole rows of at most max_shard_bytes.
    const int64_t row_bytes =
        std::max<int64_t>(1, shape_num_elements(shape) / shape[0]) *
        element_bytes(dtype, bytes_per_string);
    const int64_t rows_per_shard = std::max<int64_t>(1, max_shard_bytes / row_bytes);
    int64_t shards = (shape[0] + rows_per_shard - 1) / rows_per_shard;
    if (max_shards > 0) shards = std::min<int64_t>(shards, max_shards);
    parts[0] = std::max<int64_t>(1, shards);
    return parts;
  });
}

// =================================================================================================
// PSVariable
// =================================================================================================

namespace {

// Rows of dimension 0 grouped by the shard that holds them: shard k gets local[k] (its own row
// numbers) for the positions from[k] of `rows`. A row out of range is kInvalidArgument.
struct RowsByShard {
  std::vector<std::vector<int64_t>> local;
  std::vector<std::vector<size_t>> from;
};
StatusOr<RowsByShard> group_rows(const std::string& name, const Shape& shape,
                                 const std::vector<PSVariableShard>& shards,
                                 std::span<const int64_t> rows) {
  RowsByShard g;
  g.local.resize(shards.size());
  g.from.resize(shards.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t r = rows[i];
    if (r < 0 || r >= shape[0]) {
      return invalid_argument("PSVariable '" + name + "': row " + std::to_string(r) +
                              " is outside 0.." + std::to_string(shape[0] - 1));
    }
    size_t k = 0;
    while (r >= shards[k].row_end) ++k;
    g.local[k].push_back(r - shards[k].row_begin);
    g.from[k].push_back(i);
  }
  return g;
}

}  // namespace

PSVariable::PSVariable(std::shared_ptr<ps_internal::PsClient> client, std::string name,
                       DType dtype, Shape shape, std::vector<PSVariableShard> shards)
    : client_(std::move(client)), name_(std::move(name)), dtype_(dtype), shape_(std::move(shape)),
      shards_(std::move(shards)) {}

namespace {
Status invalid_handle() { return failed_precondition("an empty PSVariable handle"); }

Shape row_shape(const Shape& shape, int64_t rows) {
  Shape s = shape;
  if (s.empty()) return s;
  s[0] = rows;
  return s;
}
}  // namespace

StatusOr<Array> PSVariable::read() const {
  if (!valid()) return invalid_handle();
  std::vector<Array> parts;
  for (const PSVariableShard& s : shards_) {
    wire::Writer w;
    w.str(s.name);
    TRIBUTARY_ASSIGN_OR_RETURN(std::string answer, client_->call(s.ps_task, "ps.read", body(w)));
    wire::Reader r(answer);
    TRIBUTARY_ASSIGN_OR_RETURN(Array a, get_array(r));
    parts.push_back(std::move(a));
  }
  if (parts.size() == 1) return parts[0];
  return concat(parts, 0);
}

Status PSVariable::update(Kind kind, const Array& value) {
  if (!valid()) return invalid_handle();
  if (value.dtype() != dtype_ || value.shape() != shape_) {
    return invalid_argument("PSVariable '" + name_ + "' is " + std::string(dtype_name(dtype_)) +
                            shape_to_string(shape_) + ", the value " +
                            std::string(dtype_name(value.dtype())) +
                            shape_to_string(value.shape()));
  }
  if (!value.device().is_cpu()) return invalid_argument("PSVariable: values must be on the CPU");
  for (const PSVariableShard& s : shards_) {
    Array part = value;
    if (!shape_.empty() && shards_.size() > 1) {
      TRIBUTARY_ASSIGN_OR_RETURN(part, value.rows(s.row_begin, s.row_end));
    }
    wire::Writer w;
    w.str(s.name).u8(static_cast<uint8_t>(kind));
    put_array(w, part);
    TRIBUTARY_RETURN_IF_ERROR(client_->call(s.ps_task, "ps.update", body(w)).status());
  }
  return Status();
}

Status PSVariable::assign(const Array& value) { return update(Kind::kAssign, value); }
Status PSVariable::assign_add(const Array& delta) { return update(Kind::kAdd, delta); }
Status PSVariable::assign_sub(const Array& delta) { return update(Kind::kSub, delta); }

StatusOr<Array> PSVariable::gather(std::span<const int64_t> rows) const {
  if (!valid()) return invalid_handle();
  if (shape_.empty()) return invalid_argument("PSVariable '" + name_ + "': gather on a scalar");
  // Rows grouped by shard, then put back in the order asked.
  TRIBUTARY_ASSIGN_OR_RETURN(const RowsByShard g, group_rows(name_, shape_, shards_, rows));
  const auto& local = g.local;
  std::vector<Array> answers(shards_.size());
  for (size_t k = 0; k < shards_.size(); ++k) {
    if (local[k].empty()) continue;
    wire::Writer w;
    w.str(shards_[k].name).u32(static_cast<uint32_t>(local[k].size()));
    for (int64_t r : local[k]) w.i64(r);
    TRIBUTARY_ASSIGN_OR_RETURN(std::string answer,
                               client_->call(shards_[k].ps_task, "ps.gather", body(w)));
    wire::Reader rd(answer);
    TRIBUTARY_ASSIGN_OR_RETURN(answers[k], get_array(rd));
  }
  TRIBUTARY_ASSIGN_OR_RETURN(
      Array out, Array::zeros(dtype_, row_shape(shape_, static_cast<int64_t>(rows.size()))));
  const size_t row_bytes = shape_[0] == 0 ? 0 : out.nbytes() / std::max<size_t>(rows.size(), 1);
  for (size_t k = 0; k < shards_.size(); ++k) {
    for (size_t j = 0; j < g.from[k].size(); ++j) {
      std::memcpy(out.mutable_data<char>() + g.from[k][j] * row_bytes,
                  answers[k].data<char>() + j * row_bytes, row_bytes);
    }
  }
  return out;
}

Status PSVariable::scatter(Kind kind, std::span<const int64_t> rows, const Array& updates) {
  if (!valid()) return invalid_handle();
  if (shape_.empty()) return invalid_argument("PSVariable '" + name_ + "': scatter on a scalar");
  const Shape want = row_shape(shape_, static_cast<int64_t>(rows.size()));
  if (updates.dtype() != dtype_ || updates.shape() != want) {
    return invalid_argument("PSVariable '" + name_ + "': scatter updates must be " +
                            std::string(dtype_name(dtype_)) + shape_to_string(want) + ", not " +
                            std::string(dtype_name(updates.dtype())) +
                            shape_to_string(updates.shape()));
  }
  if (!updates.device().is_cpu()) return invalid_argument("PSVariable: values must be on the CPU");
  TRIBUTARY_ASSIGN_OR_RETURN(const RowsByShard g, group_rows(name_, shape_, shards_, rows));
  const auto& local = g.local;
  const auto& which = g.from;
  const size_t row_bytes = rows.empty() ? 0 : updates.nbytes() / rows.size();
  for (size_t k = 0; k < shards_.size(); ++k) {
    if (local[k].empty()) continue;
    TRIBUTARY_ASSIGN_OR_RETURN(
        Array part, Array::zeros(dtype_, row_shape(shape_, static_cast<int64_t>(local[k].size()))));
    for (size_t j = 0; j < which[k].size(); ++j) {
      std::memcpy(part.mutable_data<char>() + j * row_bytes,
                  updates.data<char>() + which[k][j] * row_bytes, row_bytes);
    }
    wire::Writer w;
    w.str(shards_[k].name).u8(static_cast<uint8_t>(kind)).u32(static_cast<uint32_t>(local[k].size()));
    for (int64_t r : local[k]) w.i64(r);
    put_array(w, part);
    TRIBUTARY_RETURN_IF_ERROR(client_->call(shards_[k].ps_task, "ps.scatter", body(w)).status());
  }
  return Status();
}

Status PSVariable::scatter_add(std::span<const int64_t> rows, const Array& updates) {
  return scatter(Kind::kAdd, rows, updates);
}
Status PSVariable::scatter_sub(std::span<const int64_t> rows, const Array& updates) {
  return scatter(Kind::kSub, rows, updates);
}
Status PSVariable::scatter_update(std::span<const int64_t> rows, const Array& updates) {
  return scatter(Kind::kAssign, rows, updates);
}

// =================================================================================================
// Registration
// =================================================================================================

Status register_worker_function(const std::string& name, WorkerFunction fn) {
  if (name.empty() || !fn) return invalid_argument("register_worker_function: needs a name and a function");
  Registries& r = registries();
  std::lock_guard lock(r.mu);
  if (!r.functions.emplace(name, std::move(fn)).second) {
    return invalid_argument("a worker function named '" + name + "' is already registered");
  }
  return Status();
}

Status register_dataset_function(const std::string& name, DatasetFunction fn) {
  if (name.empty() || !fn) return invalid_argument("register_dataset_function: needs a name and a function");
  Registries& r = registries();
  std::lock_guard lock(r.mu);
  if (!r.datasets.emplace(name, std::move(fn)).second) {
    return invalid_argument("a dataset function named '" + name + "' is already registered");
  }
  return Status();
}

// =================================================================================================
// Directory of variables (sent with every worker.run)
// =================================================================================================
namespace {

void put_directory(wire::Writer& w, const std::vector<PSVariable>& vars) {
  w.u32(static_cast<uint32_t>(vars.size()));
  for (const PSVariable& v : vars) {
    w.str(v.name()).u8(static_cast<uint8_t>(v.dtype())).u32(static_cast<uint32_t>(v.shape().size()));
    for (int64_t d : v.shape()) w.i64(d);
    w.u32(static_cast<uint32_t>(v.shards().size()));
    for (const PSVariableShard& s : v.shards()) {
      w.u32(static_cast<uint32_t>(s.ps_task)).str(s.name).i64(s.row_begin).i64(s.row_end);
    }
  }
}

Status get_directory(wire::Reader& r, const std::shared_ptr<ps_internal::PsClient>& client,
                     std::map<std::string, PSVariable>* out) {
  const uint32_t n = r.count(8);
  for (uint32_t i = 0; i < n && !r.failed(); ++i) {
    std::string name(r.str());
    const auto dtype = static_cast<DType>(r.u8());
    const uint32_t rank = r.count(8);
    Shape shape;
    for (uint32_t d = 0; d < rank; ++d) shape.push_back(r.i64());
    const uint32_t nshards = r.count(20);
    std::vector<PSVariableShard> shards;
    for (uint32_t k = 0; k < nshards && !r.failed(); ++k) {
      PSVariableShard s;
      s.ps_task = static_cast<int>(r.u32());
      s.name = std::string(r.str());
      s.row_begin = r.i64();
      s.row_end = r.i64();
      if (s.ps_task >= client->num_ps()) {
        return invalid_argument("the coordinator placed '" + name + "' on ps:" +
                                std::to_string(s.ps_task) + ", which this worker's TF_CONFIG lacks");
      }
      shards.push_back(std::move(s));
    }
    if (r.failed()) break;
    out->insert_or_assign(name, PSVariable(client, name, dtype, std::move(shape), std::move(shards)));
  }
  if (r.failed()) return invalid_argument("a malformed variable directory from the coordinator");
  return Status();
}

}  // namespace

// =================================================================================================
// Servers
// =================================================================================================
namespace ps_internal {

struct WorkerCall {
  static WorkerContext context(WorkerCall* call) {
    WorkerContext ctx;
    ctx.call_ = call;
    ctx.worker_index_ = call->worker_index;
    ctx.num_workers_ = call->num_workers;
    return ctx;
  }
  std::map<std::string, PSVariable>* variables = nullptr;
  std::map<int64_t, std::string>* iterator_functions = nullptr;
  std::map<int64_t, std::unique_ptr<DatasetIterator>>* iterators = nullptr;
  int worker_index = 0, num_workers = 1;
};

}  // namespace ps_internal

StatusOr<PSVariable> WorkerContext::variable(const std::string& name) const {
  auto it = call_->variables->find(name);
  if (it == call_->variables->end()) {
    return not_found("no variable named '" + name +
                     "': create it with ParameterServerStrategy::create_variable on the "
                     "coordinator before scheduling functions that use it");
  }
  return it->second;
}

StatusOr<Element> WorkerContext::next(const PerWorkerIterator& iterator) {
  auto& its = *call_->iterators;
  auto it = its.find(iterator.id);
  if (it == its.end()) {
    auto fn_name = call_->iterator_functions->find(iterator.id);
    if (fn_name == call_->iterator_functions->end()) {
      return invalid_argument("PerWorkerIterator " + std::to_string(iterator.id) +
                              " was not passed to this function by schedule()");
    }
    DatasetFunction fn;
    {
      Registries& r = registries();
      std::lock_guard lock(r.mu);
      auto f = r.datasets.find(fn_name->second);
      if (f == r.datasets.end()) {
        return not_found("no dataset function named '" + fn_name->second +
                         "' is registered in this worker; register it in every task");
      }
      fn = f->second;
    }
    // TF's ParameterServerStrategy: no synchronisation beyond a worker, one replica per (CPU)
    // worker: InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=1).
    Dataset ds = fn(InputContext(1, 0, 1));
    TRIBUTARY_ASSIGN_OR_RETURN(auto made, ds.make_iterator());
    it = its.emplace(iterator.id, std::move(made)).first;
  }
  TRIBUTARY_ASSIGN_OR_RETURN(std::optional<Element> e, it->second->get_next());
  if (!e) return out_of_range("End of sequence");  // TF's OutOfRangeError text
  return std::move(*e);
}

struct Server::Impl {
  ClusterSpec cluster;
  milliseconds timeout{0};
  std::unique_ptr<TcpStoreServer> server;
  // ps: the variables.
  struct Var {
    std::mutex mu;
    Array value;
  };
  std::mutex vars_mu;
  std::map<std::string, std::shared_ptr<Var>> vars;
  // worker: the executor and what functions see.
  std::shared_ptr<ps_internal::PsClient> ps;
  std::mutex jobs_mu;
  std::condition_variable_any jobs_cv;
  std::deque<std::function<void()>> jobs;
  std::jthread executor;
  std::map<int64_t, std::unique_ptr<DatasetIterator>> iterators;
  // join()
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stopped = false;

  void request_stop() {
    {
      std::lock_guard lock(stop_mu);
      stopped = true;
    }
    stop_cv.notify_all();
  }

  std::shared_ptr<Var> find(std::string_view name) {
    std::lock_guard lock(vars_mu);
    auto it = vars.find(std::string(name));
    return it == vars.end() ? nullptr : it->second;
  }
  Status missing(std::string_view name) const {
    return not_found("ps:" + std::to_string(cluster.task_index) + " holds no variable '" +
                     std::string(name) + "' (was this parameter server restarted?)");
  }

  StatusOr<std::string> ps_call(std::string_view method, std::string_view payload);
  void worker_run(std::string payload, StoreCallReply reply);
  void handle(std::string_view method, std::string_view payload, StoreCallReply reply);
};

StatusOr<std::string> Server::Impl::ps_call(std::string_view method, std::string_view payload) {
  wire::Reader r(payload);
  const std::string name(r.str());
  if (method == "ps.create") {
    TRIBUTARY_ASSIGN_OR_RETURN(Array a, get_array(r));
    if (!r.done()) return invalid_argument("malformed ps.create");
    auto v = std::make_shared<Var>();
    v->value = std::move(a);
    std::lock_guard lock(vars_mu);
    vars.insert_or_assign(name, std::move(v));
    return std::string();
  }
  std::shared_ptr<Var> v = find(name);
  if (!v) return missing(name);
  std::lock_guard lock(v->mu);
  if (method == "ps.read") {
    if (!r.done()) return invalid_argument("malformed ps.read");
    if (v->value.nbytes() + 64 > kMaxStoreValueBytes) {
      return resource_exhausted("variable '" + name + "' (" + std::to_string(v->value.nbytes()) +
                                " bytes) is larger than one message of " +
                                std::to_string(kMaxStoreValueBytes) +
                                " bytes; shard it with a variable_partitioner");
    }
    wire::Writer w;
    put_array(w, v->value);
    return body(w);
  }
  if (method == "ps.update") {
    const uint8_t kind = r.u8();
    TRIBUTARY_ASSIGN_OR_RETURN(Array a, get_array(r));
    if (!r.done() || kind > 2) return invalid_argument("malformed ps.update");
    if (a.dtype() != v->value.dtype() || a.shape() != v->value.shape()) {
      return invalid_argument("ps.update of '" + name + "' with " + shape_to_string(a.shape()) +
                              ", the variable is " + shape_to_string(v->value.shape()));
    }
    TRIBUTARY_RETURN_IF_ERROR(combine_into(v->value, a, kind));
    return std::string();
  }
  if (method == "ps.gather" || method == "ps.scatter") {
    const bool scatter = method == "ps.scatter";
    const uint8_t kind = scatter ? r.u8() : 0;
    const uint32_t n = r.count(8);
    std::vector<int64_t> rows;
    for (uint32_t i = 0; i < n; ++i) rows.push_back(r.i64());
    const int64_t nrows = v->value.dim0();
    for (int64_t row : rows) {
      if (row < 0 || row >= nrows || v->value.rank() == 0) {
        return invalid_argument("row " + std::to_string(row) + " of '" + name + "' is out of range");
      }
    }
    const size_t row_bytes = nrows == 0 ? 0 : v->value.nbytes() / static_cast<size_t>(nrows);
    if (!scatter) {
      if (!r.done()) return invalid_argument("malformed ps.gather");
      Shape s = v->value.shape();
      s[0] = static_cast<int64_t>(rows.size());
      TRIBUTARY_ASSIGN_OR_RETURN(Array out, Array::zeros(v->value.dtype(), s));
      for (size_t i = 0; i < rows.size(); ++i) {
        std::memcpy(out.mutable_data<char>() + i * row_bytes,
                    v->value.data<char>() + static_cast<size_t>(rows[i]) * row_bytes, row_bytes);
      }
      wire::Writer w;
      put_array(w, out);
      return body(w);
    }
    TRIBUTARY_ASSIGN_OR_RETURN(Array u, get_array(r));
    if (!r.done() || kind > 2 || u.dtype() != v->value.dtype() || u.dim0() != static_cast<int64_t>(rows.size()) ||
        u.nbytes() != rows.size() * row_bytes) {
      return invalid_argument("malformed ps.scatter of '" + name + "'");
    }
    for (size_t i = 0; i < rows.size(); ++i) {
      TRIBUTARY_ASSIGN_OR_RETURN(Array dst, v->value.rows(rows[i], rows[i] + 1));
      TRIBUTARY_ASSIGN_OR_RETURN(Array src, u.rows(static_cast<int64_t>(i), static_cast<int64_t>(i) + 1));
      TRIBUTARY_RETURN_IF_ERROR(combine_into(dst, src, kind));
    }
    return std::string();
  }
  return unimplemented("ps:" + std::to_string(cluster.task_index) + " has no method '" +
                       std::string(method) + "'");
}

void Server::Impl::worker_run(std::string payload, StoreCallReply reply) {
  wire::Reader r(payload);
  const std::string fn_name(r.str());
  const uint32_t nargs = r.count(1);
  std::vector<RemoteArg> args;
  std::map<int64_t, std::string> iterator_functions;
  Status st;
  for (uint32_t i = 0; i < nargs && st.ok() && !r.failed(); ++i) {
    if (r.u8() == 0) {
      auto a = get_array(r);
      if (!a.ok()) st = a.status();
      else args.emplace_back(std::move(*a));
    } else {
      PerWorkerIterator it{r.i64()};
      iterator_functions[it.id] = std::string(r.str());
      args.emplace_back(it);
    }
  }
  std::map<std::string, PSVariable> variables;
  if (st.ok()) st = get_directory(r, ps, &variables);
  if (st.ok() && !r.done()) st = invalid_argument("a malformed worker.run request");
  WorkerFunction fn;
  if (st.ok()) {
    Registries& reg = registries();
    std::lock_guard lock(reg.mu);
    auto f = reg.functions.find(fn_name);
    if (f == reg.functions.end()) {
      st = not_found("no worker function named '" + fn_name + "' is registered in worker:" +
                     std::to_string(cluster.task_index) +
                     "; register it in every task with register_worker_function");
    } else {
      fn = f->second;
    }
  }
  StatusOr<std::vector<Array>> result = st;
  if (st.ok()) {
    ps_internal::WorkerCall call;
    call.variables = &variables;
    call.iterator_functions = &iterator_functions;
    call.iterators = &iterators;
    call.worker_index = cluster.task_index;
    call.num_workers = static_cast<int>(cluster.jobs.at("worker").size());
    WorkerContext ctx = ps_internal::WorkerCall::context(&call);
    try {
      result = fn(ctx, args);
    } catch (const std::exception& e) {
      result = internal_error("worker function '" + fn_name + "' threw: " + e.what());
    }
  }
  wire::Writer w;
  if (!result.ok()) {
    w.u8(static_cast<uint8_t>(result.status().code())).str(result.status().message()).u32(0);
  } else {
    w.u8(0).str("").u32(static_cast<uint32_t>(result->size()));
    for (const Array& a : *result) put_array(w, a);
  }
  reply(body(w));
}

void Server::Impl::handle(std::string_view method, std::string_view payload,
                          StoreCallReply reply) {
  const std::string me = cluster.task_type + ":" + std::to_string(cluster.task_index);
  if (method.ends_with(".ping")) return reply(me);
  if (method.ends_with(".shutdown")) {
    reply(std::string());
    return request_stop();
  }
  if (cluster.task_type == "ps") return reply(ps_call(method, payload));
  if (method == "worker.run") {
    {
      std::lock_guard lock(jobs_mu);
      jobs.push_back([this, p = std::string(payload), reply] { worker_run(p, reply); });
    }
    jobs_cv.notify_one();
    return;
  }
  reply(unimplemented(me + " has no method '" + std::string(method) + "'"));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  stop();
  impl_->server.reset();  // no more requests
  impl_->executor = std::jthread();
}

StatusOr<std::unique_ptr<Server>> Server::start(ServerOptions options) {
  const Config config = options.config ? *options.config : Config::from_environment();
  TRIBUTARY_ASSIGN_OR_RETURN(ClusterSpec cluster, resolve_cluster_spec(config));
  if (cluster.source != "TF_CONFIG" || (cluster.task_type != "worker" && cluster.task_type != "ps")) {
    return invalid_argument(
        "run_server: this process is " + cluster.describe() +
        "; a parameter-server cluster's servers are its \"worker\" and \"ps\" tasks of TF_CONFIG "
        "(the \"chief\" runs the ClusterCoordinator instead)");
  }
  auto impl = std::make_unique<Impl>();
  impl->cluster = cluster;
  impl->timeout = resolve_timeout(options.timeout, config);
  const std::string& address =
      cluster.jobs.at(cluster.task_type)[static_cast<size_t>(cluster.task_index)];
  std::string host;
  int port = 0;
  TRIBUTARY_RETURN_IF_ERROR(split_address(address, &host, &port));
  TcpStoreServerOptions so;
  TRIBUTARY_ASSIGN_OR_RETURN(so.secret, internal::read_secret(config, ""));
  Impl* raw = impl.get();
  so.call_handler = [raw](std::string_view method, std::string_view payload,
                          StoreCallReply reply) { raw->handle(method, payload, std::move(reply)); };
  if (cluster.task_type == "worker") {
    StoreOptions store;
    store.secret = so.secret;
    store.timeout = impl->timeout;
    // The ps tasks are up before any function runs (the coordinator met them), so one that does not
    // accept a connection is gone: fail fast, well within the coordinator's deadline for the call.
    store.connect_timeout = std::min<milliseconds>(impl->timeout / 4, std::chrono::seconds(10));
    std::vector<std::string> ps_addresses;
    if (cluster.jobs.contains("ps")) ps_addresses = cluster.jobs.at("ps");
    impl->ps = std::make_shared<ps_internal::PsClient>(ps_addresses, store, impl->timeout);
    impl->executor = std::jthread([raw](std::stop_token stop) {
      for (;;) {
        std::function<void()> job;
        {
          std::unique_lock lock(raw->jobs_mu);
          raw->jobs_cv.wait(lock, stop, [raw] { return !raw->jobs.empty(); });
          if (stop.stop_requested()) return;
          job = std::move(raw->jobs.front());
          raw->jobs.pop_front();
        }
        job();
      }
    });
  }
  // A launcher that bound the task's port for it (TRIBUTARY_STORE_FD, as train_embedding's does)
  // hands over the socket: the port was never free for another process to take.
  so.listen_fd = internal::inherited_listener(config, port);
  auto server = TcpStore::create_server("0.0.0.0", static_cast<uint16_t>(port), so);
  if (!server.ok()) {
    return server.status().with_context(cluster.task_type + ":" +
                                        std::to_string(cluster.task_index) +
                                        " cannot serve its TF_CONFIG address " + address +
                                        internal::held_port_trouble(config, port, ""));
  }
  impl->server = std::move(*server);
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

void Server::join() {
  std::unique_lock lock(impl_->stop_mu);
  impl_->stop_cv.wait(lock, [this] { return impl_->stopped; });
  lock.unlock();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the shutdown's answer goes out
}
void Server::stop() { impl_->request_stop(); }
int Server::port() const { return impl_->server ? impl_->server->port() : 0; }
const ClusterSpec& Server::cluster() const { return impl_->cluster; }

Status run_server(ServerOptions options) {
  TRIBUTARY_ASSIGN_OR_RETURN(auto server, Server::start(std::move(options)));
  server->join();
  return Status();
}

// =================================================================================================
// ParameterServerStrategy
// =================================================================================================

struct ParameterServerStrategy::Impl {
  ClusterSpec cluster;
  milliseconds timeout{0};
  std::string secret;
  VariablePartitioner partitioner;
  std::shared_ptr<ps_internal::PsClient> ps;
  std::mutex mu;
  std::vector<PSVariable> variables;
  int64_t placed = 0;  // variables (shards) placed so far: the next goes to placed % num_ps
};

ParameterServerStrategy::ParameterServerStrategy(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
ParameterServerStrategy::~ParameterServerStrategy() = default;

StatusOr<std::unique_ptr<ParameterServerStrategy>> ParameterServerStrategy::create(
    ParameterServerStrategyOptions options) {
  const Config config = options.config ? *options.config : Config::from_environment();
  TRIBUTARY_ASSIGN_OR_RETURN(ClusterSpec cluster, resolve_cluster_spec(config));
  auto count = [&](const char* job) {
    auto it = cluster.jobs.find(job);
    return it == cluster.jobs.end() ? 0 : static_cast<int>(it->second.size());
  };
  if (cluster.source != "TF_CONFIG" || count("ps") == 0 || count("worker") == 0) {
    return invalid_argument(
        "ParameterServerStrategy needs a TF_CONFIG cluster with \"worker\" and \"ps\" jobs (and "
        "this process as its \"chief\"); this process is " +
        cluster.describe());
  }
  if (cluster.task_type != "chief") {
    return invalid_argument(
        "ParameterServerStrategy is created on the coordinator, the \"chief\" task; this process "
        "is " +
        cluster.task_type + ":" + std::to_string(cluster.task_index) +
        ", which should call run_server() instead (TF: tf.distribute.Server(...).join())");
  }
  auto impl = std::make_unique<Impl>();
  impl->cluster = cluster;
  impl->timeout = resolve_timeout(options.timeout, config);
  impl->partitioner = std::move(options.variable_partitioner);
  TRIBUTARY_ASSIGN_OR_RETURN(impl->secret, internal::read_secret(config, ""));
  StoreOptions store;
  store.secret = impl->secret;
  store.timeout = impl->timeout;
  store.connect_timeout = impl->timeout;  // the ps tasks may still be starting
  impl->ps = std::make_shared<ps_internal::PsClient>(cluster.jobs.at("ps"), store, impl->timeout);
  for (int p = 0; p < impl->ps->num_ps(); ++p) {
    TRIBUTARY_RETURN_IF_ERROR(impl->ps->call(p, "ps.ping", "").status());
  }
  return std::unique_ptr<ParameterServerStrategy>(new ParameterServerStrategy(std::move(impl)));
}

StatusOr<PSVariable> ParameterServerStrategy::create_variable(const std::string& name,
                                                              const Array& initial,
                                                              bool partition) {
  if (name.empty() || name.find('\0') != std::string::npos || name.size() > 1024) {
    return invalid_argument("create_variable: a variable needs a name (1 to 1024 bytes)");
  }
  if (!initial.device().is_cpu()) {
    return invalid_argument("create_variable: the initial value must be on the CPU");
  }
  Impl& im = *impl_;
  std::lock_guard lock(im.mu);
  for (const PSVariable& v : im.variables) {
    if (v.name() == name) return invalid_argument("a variable named '" + name + "' exists already");
  }
  int64_t nshards = 1;
  if (partition && im.partitioner && initial.rank() >= 1) {
    const std::vector<int64_t> parts = im.partitioner(initial.shape(), initial.dtype());
    bool valid = !parts.empty() && parts[0] >= 1;
    for (size_t i = 1; i < parts.size(); ++i) valid = valid && parts[i] == 1;
    if (!valid) {
      std::string text = "[";
      for (size_t j = 0; j < parts.size(); ++j) text += (j ? ", " : "") + std::to_string(parts[j]);
      return invalid_argument(
          "variable_partitioner must return a list/tuple whose elements are 1 besides the first "
          "element (non-zero), got: " +
          text + "]");
    }
    nshards = std::max<int64_t>(std::min<int64_t>(parts[0], initial.dim0()), 1);
  }
  std::vector<PSVariableShard> shards;
  const int64_t rows = initial.rank() == 0 ? 1 : initial.dim0();
  int64_t begin = 0;
  for (int64_t i = 0; i < nshards; ++i) {
    const int64_t len = rows / nshards + (i < rows % nshards ? 1 : 0);
    PSVariableShard s;
    s.ps_task = static_cast<int>((im.placed + i) % im.ps->num_ps());
    s.name = nshards == 1 ? name : name + "/part_" + std::to_string(i);
    s.row_begin = begin;
    s.row_end = begin + len;
    begin += len;
    Array part = initial;
    if (nshards > 1) {
      TRIBUTARY_ASSIGN_OR_RETURN(part, initial.rows(s.row_begin, s.row_end));
    }
    if (part.nbytes() + 1024 > kMaxStoreValueBytes) {
      return invalid_argument("variable '" + name + "' has a part of " +
                              std::to_string(part.nbytes()) + " bytes, more than one message of " +
                              std::to_string(kMaxStoreValueBytes) +
                              " bytes holds; shard it (ParameterServerStrategyOptions::"
                              "variable_partitioner, e.g. max_size_partitioner(32 << 20))");
    }
    wire::Writer w;
    w.str(s.name);
    put_array(w, part);
    TRIBUTARY_RETURN_IF_ERROR(im.ps->call(s.ps_task, "ps.create", body(w)).status());
    shards.push_back(std::move(s));
  }
  im.placed += nshards;
  PSVariable v(im.ps, name, initial.dtype(), initial.shape(), std::move(shards));
  im.variables.push_back(v);
  return v;
}

int ParameterServerStrategy::num_workers() const {
  return static_cast<int>(impl_->cluster.jobs.at("worker").size());
}
int ParameterServerStrategy::num_ps() const { return impl_->ps->num_ps(); }
const ClusterSpec& ParameterServerStrategy::cluster() const { return impl_->cluster; }
milliseconds ParameterServerStrategy::timeout() const { return impl_->timeout; }
const std::vector<PSVariable>& ParameterServerStrategy::variables() const {
  return impl_->variables;
}

// =================================================================================================
// ClusterCoordinator
// =================================================================================================

struct RemoteValue::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  StatusOr<std::vector<Array>> result = internal_error("not run");
  void finish(StatusOr<std::vector<Array>> r) {
    {
      std::lock_guard lock(mu);
      if (done) return;
      result = std::move(r);
      done = true;
    }
    cv.notify_all();
  }
};

StatusOr<std::vector<Array>> RemoteValue::fetch() const {
  if (!state_) return failed_precondition("an empty RemoteValue");
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [this] { return state_->done; });
  return state_->result;
}

bool RemoteValue::ready() const {
  if (!state_) return false;
  std::lock_guard lock(state_->mu);
  return state_->done;
}

namespace ps_internal {

struct Closure {
  std::string function;
  std::vector<RemoteArg> args;
  std::shared_ptr<RemoteValue::State> value;
};

struct CoordinatorState {
  ParameterServerStrategy::Impl* strategy = nullptr;
  std::mutex mu;
  std::condition_variable cv;  // queue changes, completions
  std::deque<Closure> queue;
  int in_flight = 0;
  Status error;  // the first failure not yet reported by join()
  bool stopping = false;
  std::atomic<int64_t> rescheduled{0};
  std::map<int64_t, std::string> iterator_functions;
  int64_t next_iterator = 0;
  std::vector<bool> alive;
  Clock::time_point last_alive = Clock::now();
  std::vector<std::jthread> threads;

  void fail_all_queued(const Status& why) {  // under mu
    for (Closure& c : queue) c.value->finish(why);
    queue.clear();
  }
  void record_error(const Status& s) {  // under mu
    if (error.ok()) error = s;
    fail_all_queued(aborted("cancelled: an earlier scheduled function failed: " + s.message()));
  }
  // Under mu: when no worker has answered for the whole timeout and nothing runs, what is queued
  // cannot run: it fails (so a fetch() waiting for it returns), and the error stands until join()
  // reports it (so schedule() refuses). Checked by the dispatchers while they wait for their
  // workers, and by join(); false when the rule does not apply (yet).
  bool give_up_without_workers() {
    if (queue.empty() || in_flight != 0 ||
        std::any_of(alive.begin(), alive.end(), [](bool a) { return a; })) {
      return false;
    }
    const milliseconds timeout = strategy->timeout;
    if (Clock::now() - last_alive <= timeout) return false;
    Status why = unavailable("no worker has answered for " + format_duration(timeout) +
                             " (the timeout); " + std::to_string(queue.size()) +
                             " scheduled function(s) could not run. Are the worker tasks "
                             "running run_server() at their TF_CONFIG addresses?");
    if (error.ok()) error = why;
    fail_all_queued(why);
    return true;
  }
  std::string request_for(const Closure& c) {
    wire::Writer w;
    w.str(c.function).u32(static_cast<uint32_t>(c.args.size()));
    for (const RemoteArg& a : c.args) {
      if (const Array* arr = std::get_if<Array>(&a)) {
        w.u8(0);
        put_array(w, *arr);
      } else {
        const auto& it = std::get<PerWorkerIterator>(a);
        w.u8(1).i64(it.id);
        std::lock_guard lock(mu);
        auto f = iterator_functions.find(it.id);
        w.str(f == iterator_functions.end() ? std::string() : f->second);
      }
    }
    std::vector<PSVariable> vars;
    {
      std::lock_guard lock(strategy->mu);
      vars = strategy->variables;
    }
    put_directory(w, vars);
    return body(w);
  }
  void dispatch(int worker);
};

void CoordinatorState::dispatch(int worker) {
  const std::string address =
      strategy->cluster.jobs.at("worker")[static_cast<size_t>(worker)];
  const std::string who = "worker:" + std::to_string(worker) + " (" + address + ")";
  std::string host;
  int port = 0;
  (void)split_address(address, &host, &port);
  StoreOptions so;
  so.secret = strategy->secret;
  so.timeout = strategy->timeout;
  so.connect_timeout = std::chrono::seconds(1);
  so.server_role = "worker:" + std::to_string(worker);
  std::unique_ptr<TcpStore> client;
  bool was_alive = true;
  while (true) {
    {
      std::lock_guard lock(mu);
      if (stopping) return;
    }
    if (!client) {
      auto c = TcpStore::connect(host, static_cast<uint16_t>(port), so);
      if (c.ok()) {
        auto ping = (*c)->call("worker.ping", "", std::min<milliseconds>(strategy->timeout,
                                                                          std::chrono::seconds(10)));
        if (ping.ok()) client = std::move(*c);
      }
      std::lock_guard lock(mu);
      alive[static_cast<size_t>(worker)] = client != nullptr;
      if (client) {
        last_alive = Clock::now();
        if (!was_alive && ps_log().enabled(internal::LogLevel::kInfo)) {
          internal::write_log_line(internal::LogLevel::kInfo, "coordinator",
                                   who + " is back; sending it work again");
        }
        was_alive = true;
      } else {
        was_alive = false;
        cv.notify_all();  // join() checks whether any worker is left
      }
    }
    if (!client) {
      std::unique_lock lock(mu);
      if (give_up_without_workers()) cv.notify_all();
      cv.wait_for(lock, std::chrono::milliseconds(500), [this] { return stopping; });
      continue;
    }
    Closure c;
    {
      std::unique_lock lock(mu);
      cv.wait_for(lock, std::chrono::milliseconds(200), [this] { return stopping || !queue.empty(); });
      if (stopping) return;
      if (queue.empty()) continue;
      c = std::move(queue.front());
      queue.pop_front();
      ++in_flight;
    }
    const std::string request = request_for(c);
    // The function's own calls to the ps tasks each have the timeout; the function as a whole gets
    // half as long again, so that a ps failure it meets comes back as its error, not as a silent
    // worker.
    const milliseconds budget = strategy->timeout + strategy->timeout / 2;
    auto answer = client->call("worker.run", request, budget);
    // Only a worker that died, was cut off or did not answer in time makes the function run
    // elsewhere (TF retries on a worker's unavailability only). An error the worker answered (its
    // result too large to send back, say) or one raised here before sending (an argument above
    // the frame limit) would come back on every worker: it is the function's error.
    bool worker_lost = !answer.ok() &&
                       answer.status().message().rfind("the server answered: ", 0) != 0 &&
                       (answer.status().code() == StatusCode::kUnavailable ||
                        answer.status().code() == StatusCode::kDeadlineExceeded);
    if (worker_lost && answer.status().code() == StatusCode::kDeadlineExceeded &&
        client
            ->call("worker.ping", "",
                   std::min<milliseconds>(strategy->timeout, std::chrono::seconds(10)))
            .ok()) {
      // No answer in time from a worker that answers a ping: alive, and busy with a function that
      // outlasts the budget, as it would on any worker.
      worker_lost = false;
      answer = deadline_exceeded("it did not finish within " + format_duration(budget) +
                                 " (1.5 x the timeout) on a worker that still answers; raise "
                                 "TRIBUTARY_TIMEOUT for functions that run longer");
    }
    std::lock_guard lock(mu);
    --in_flight;
    if (worker_lost) {
      internal::write_log_line(internal::LogLevel::kWarning, "coordinator",
                               who + " failed (" + answer.status().message() +
                                   "); its function '" + c.function +
                                   "' is scheduled again on another worker");
      client.reset();
      alive[static_cast<size_t>(worker)] = false;
      was_alive = false;
      ++rescheduled;
      if (stopping || !error.ok()) {
        c.value->finish(aborted("cancelled: the coordinator stopped or an earlier function failed"));
      } else {
        queue.push_front(std::move(c));
      }
      cv.notify_all();
      continue;
    }
    if (!answer.ok()) {
      Status st(answer.status().code(), "function '" + c.function + "' could not run on " + who +
                                            ": " + answer.status().message());
      c.value->finish(st);
      record_error(st);
      last_alive = Clock::now();
      cv.notify_all();
      continue;
    }
    wire::Reader r(*answer);
    const uint8_t code = r.u8();
    std::string message(r.str());
    const uint32_t n = r.count(1);
    std::vector<Array> values;
    Status st;
    for (uint32_t i = 0; i < n && st.ok(); ++i) {
      auto a = get_array(r);
      if (!a.ok()) st = a.status();
      else values.push_back(std::move(*a));
    }
    if (st.ok() && (!r.done() || code > static_cast<uint8_t>(StatusCode::kDataLoss))) {
      st = internal_error("a malformed answer from " + who);
    }
    if (st.ok() && code != 0) {
      st = Status(static_cast<StatusCode>(code),
                  "function '" + c.function + "' failed on " + who + ": " + message);
    }
    if (st.ok()) {
      c.value->finish(std::move(values));
    } else {
      c.value->finish(st);
      record_error(st);
    }
    last_alive = Clock::now();
    cv.notify_all();
  }
}

}  // namespace ps_internal

ClusterCoordinator::ClusterCoordinator(std::shared_ptr<ps_internal::CoordinatorState> state)
    : state_(std::move(state)) {}

StatusOr<std::unique_ptr<ClusterCoordinator>> ClusterCoordinator::create(
    ParameterServerStrategy& strategy) {
  auto state = std::make_shared<ps_internal::CoordinatorState>();
  state->strategy = &strategy.impl();
  const int n = strategy.num_workers();
  state->alive.assign(static_cast<size_t>(n), false);
  state->last_alive = Clock::now();
  for (int w = 0; w < n; ++w) {
    state->threads.emplace_back([s = state.get(), w] { s->dispatch(w); });
  }
  return std::unique_ptr<ClusterCoordinator>(new ClusterCoordinator(std::move(state)));
}

ClusterCoordinator::~ClusterCoordinator() {
  {
    std::lock_guard lock(state_->mu);
    state_->stopping = true;
    state_->fail_all_queued(aborted("cancelled: the ClusterCoordinator was destroyed"));
  }
  state_->cv.notify_all();
  state_->threads.clear();  // joins: functions in flight end within the timeout
}

StatusOr<RemoteValue> ClusterCoordinator::schedule(const std::string& function,
                                                   std::vector<RemoteArg> args) {
  {
    Registries& r = registries();
    std::lock_guard lock(r.mu);
    if (!r.functions.contains(function)) {
      return not_found("schedule: no worker function named '" + function +
                       "' is registered; register_worker_function it in every task");
    }
  }
  std::lock_guard lock(state_->mu);
  if (!state_->error.ok()) return state_->error;
  for (const RemoteArg& a : args) {
    if (const auto* it = std::get_if<PerWorkerIterator>(&a);
        it && !state_->iterator_functions.contains(it->id)) {
      return invalid_argument("schedule: a PerWorkerIterator that no PerWorkerDataset of this "
                              "coordinator made");
    }
  }
  auto value = std::make_shared<RemoteValue::State>();
  state_->queue.push_back({function, std::move(args), value});
  state_->cv.notify_all();
  return RemoteValue(value);
}

Status ClusterCoordinator::join() {
  std::unique_lock lock(state_->mu);
  for (;;) {
    if (!state_->error.ok()) {
      state_->fail_all_queued(aborted("cancelled: an earlier scheduled function failed"));
      if (state_->in_flight == 0) return std::exchange(state_->error, Status());
    } else if (state_->queue.empty() && state_->in_flight == 0) {
      return Status();
    }
    if (state_->give_up_without_workers()) return std::exchange(state_->error, Status());
    state_->cv.wait_for(lock, std::chrono::milliseconds(200));
  }
}

StatusOr<bool> ClusterCoordinator::done() {
  std::unique_lock lock(state_->mu);
  (void)state_->give_up_without_workers();  // as join(): no worker for the timeout is an error
  if (state_->error.ok()) return state_->queue.empty() && state_->in_flight == 0;
  // As TF's done(): cancel what is queued, let what runs end, then raise the error (once).
  state_->fail_all_queued(aborted("cancelled: an earlier scheduled function failed"));
  state_->cv.wait(lock, [&] { return state_->in_flight == 0; });
  return std::exchange(state_->error, Status());
}

StatusOr<PerWorkerDataset> ClusterCoordinator::create_per_worker_dataset(
    const std::string& dataset_function) {
  Registries& r = registries();
  std::lock_guard lock(r.mu);
  if (!r.datasets.contains(dataset_function)) {
    return not_found("create_per_worker_dataset: no dataset function named '" + dataset_function +
                     "' is registered; register_dataset_function it in every task");
  }
  PerWorkerDataset d;
  d.state_ = state_;
  d.function = dataset_function;
  return d;
}

PerWorkerIterator PerWorkerDataset::iterator() {
  std::lock_guard lock(state_->mu);
  const int64_t id = state_->next_iterator++;
  state_->iterator_functions[id] = function;
  return PerWorkerIterator{id};
}

Status ClusterCoordinator::shutdown_servers() {
  const auto& jobs = state_->strategy->cluster.jobs;
  Status first;
  for (const char* job : {"worker", "ps"}) {
    const auto& addresses = jobs.at(job);
    for (size_t i = 0; i < addresses.size(); ++i) {
      std::string host;
      int port = 0;
      if (!split_address(addresses[i], &host, &port).ok()) continue;
      StoreOptions so;
      so.secret = state_->strategy->secret;
      so.connect_timeout = std::chrono::seconds(1);
      so.server_role = std::string(job) + ":" + std::to_string(i);
      auto c = TcpStore::connect(host, static_cast<uint16_t>(port), so);
      if (!c.ok()) continue;  // already gone
      auto s = (*c)->call(std::string(job) + ".shutdown", "", std::chrono::seconds(5));
      // A task that closed the connection as it stopped has done what was asked.
      if (!s.ok() && s.status().code() != StatusCode::kUnavailable && first.ok()) {
        first = s.status();
      }
    }
  }
  return first;
}

int64_t ClusterCoordinator::rescheduled() const { return state_->rescheduled.load(); }

}  // namespace tributary

// The strategy layer: tributary.Strategy (Mirrored, MultiWorkerMirrored, ...), scope(), run(),
// reduce(), ReplicaContext, PerReplica and variables, with tf.distribute's Python vocabulary.
//
// run(fn) calls the Python function on the strategy's replica threads. They take turns on the GIL;
// every call that meets the other replicas (all_reduce, merge_call, synchronized variable updates)
// releases it while it waits, so replicas meet instead of deadlocking.
#include <cctype>

#include "common.h"

namespace tributary::python {
namespace {

// A Variable and the Python Strategy object it belongs to (kept alive as long as the variable).
struct PyVariable {
  Variable variable;
  py::object owner;
};

// A Python object carried across replica threads by value (shared_ptr copies touch no Python
// reference count); the object is released with the GIL.
struct Held {
  py::object obj;
  ~Held() {
    py::gil_scoped_acquire gil;
    obj = py::object();
  }
};
using HeldPtr = std::shared_ptr<Held>;

// TF's nest: tuples (namedtuples too), lists and dicts are structure, everything else (PerReplica
// included) a leaf. map_nest rebuilds the structure around f(leaf).
bool is_nest(py::handle h) {
  return py::isinstance<py::tuple>(h) || py::isinstance<py::list>(h) || py::isinstance<py::dict>(h);
}

// A dict's keys in TF's nest order (sorted), so that dicts built in different orders on different
// replicas or workers line up leaf by leaf; TF's TypeError when they cannot be sorted.
py::list sorted_keys(py::handle d) {
  static py::object* const sorted = new py::object(
      py::module_::import("builtins").attr("sorted"));  // never freed: no GIL at exit
  try {
    return (*sorted)(d);
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;  // KeyboardInterrupt, MemoryError: as they are
    throw py::type_error("nest only supports dicts with sortable keys");
  }
}

py::object map_nest(py::handle h, const std::function<py::object(py::handle)>& f) {
  if (py::isinstance<py::dict>(h)) {
    // Leaves are visited in sorted-key order (TF's flatten order); the result keeps the dict's own
    // key order, as TF's nest does.
    auto d = py::reinterpret_borrow<py::dict>(h);
    py::dict mapped;
    for (py::handle k : sorted_keys(h)) mapped[k] = map_nest(d[k], f);
    py::dict out;
    for (auto kv : d) out[kv.first] = mapped[kv.first];
    return out;
  }
  if (py::isinstance<py::list>(h)) {
    py::list out;
    for (py::handle x : h) out.append(map_nest(x, f));
    return out;
  }
  if (py::isinstance<py::tuple>(h)) {
    py::list items;
    for (py::handle x : h) items.append(map_nest(x, f));
    py::tuple t(items);
    if (py::hasattr(h, "_fields")) return h.get_type()(*t);  // a namedtuple: its own type
    return t;
  }
  return f(h);
}

// The shape of a nest, leaves aside, for comparing the values of several replicas: TF's
// assert_same_structure.
std::string structure_of(py::handle h) {
  if (py::isinstance<py::dict>(h)) {
    auto d = py::reinterpret_borrow<py::dict>(h);
    std::string s = "{";
    for (py::handle k : sorted_keys(h))
      s += std::string(py::repr(k)) + ": " + structure_of(d[k]) + ", ";
    return s + "}";
  }
  if (py::isinstance<py::list>(h) || py::isinstance<py::tuple>(h)) {
    std::string s = py::isinstance<py::list>(h) ? "["
                    : py::hasattr(h, "_fields")
                        ? std::string(py::str(h.get_type().attr("__name__"))) + "("
                        : "(";
    for (py::handle x : h) s += structure_of(x) + ", ";
    return s + (py::isinstance<py::list>(h) ? "]" : ")");
  }
  return ".";
}

void flatten_nest(py::handle h, std::vector<py::object>& leaves) {
  map_nest(h, [&](py::handle leaf) {
    leaves.push_back(py::reinterpret_borrow<py::object>(leaf));
    return py::object(py::none());
  });
}

// `structure` with its leaves replaced, in order, by `leaves`.
py::object pack_nest(py::handle structure, const std::vector<py::object>& leaves) {
  size_t i = 0;
  return map_nest(structure, [&](py::handle) { return leaves.at(i++); });
}

// A ReplicaContext handed to Python: it keeps its strategy's Python object alive (the strategy
// owns the context).
struct PyReplicaContext {
  ReplicaContext* ctx = nullptr;
  py::object owner;

  // The context for a collective call: only its own replica thread, inside run() (or the default
  // strategy's context where get_replica_context() returns it), may use it.
  ReplicaContext& active(const char* what) const {
    if (get_replica_context() != ctx) {
      throw StatusError(failed_precondition(
          std::string("ReplicaContext.") + what +
          "() called outside the Strategy.run() replica that the context belongs to; call "
          "tributary.get_replica_context() inside the replica function instead"));
    }
    return *ctx;
  }
};

py::object replica_context_object(ReplicaContext* c);

VariableSynchronization synchronization_from(py::handle h) {
  if (py::isinstance<VariableSynchronization>(h)) return h.cast<VariableSynchronization>();
  std::string s = py::str(h);
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "auto") return VariableSynchronization::kAuto;
  if (s == "none") return VariableSynchronization::kNone;
  if (s == "on_write") return VariableSynchronization::kOnWrite;
  if (s == "on_read") return VariableSynchronization::kOnRead;
  throw_invalid("synchronization must be 'auto', 'none', 'on_write' or 'on_read'; got '" + s + "'");
}

VariableAggregation aggregation_from(py::handle h) {
  if (py::isinstance<VariableAggregation>(h)) return h.cast<VariableAggregation>();
  std::string s = py::str(h);
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "none") return VariableAggregation::kNone;
  if (s == "sum") return VariableAggregation::kSum;
  if (s == "mean") return VariableAggregation::kMean;
  if (s == "only_first_replica") return VariableAggregation::kOnlyFirstReplica;
  throw_invalid("aggregation must be 'none', 'sum', 'mean' or 'only_first_replica'; got '" + s +
                "'");
}

// The Python object of a Strategy: the existing one when Python made it, else a non-owning
// wrapper (the default strategy lives for the whole program).
py::object strategy_object(Strategy& s) {
  return py::cast(&s, py::return_value_policy::reference);
}

// TF's dtypes for Python literals with no dtype given: floats float32, ints int32 (int64 when they
// do not fit); NumPy arrays and scalars keep theirs.
Array initial_value_from(py::handle initial) {
  const bool py_float = PyFloat_CheckExact(initial.ptr());
  const bool py_int = PyLong_CheckExact(initial.ptr());
  const bool seq = py::isinstance<py::list>(initial) || py::isinstance<py::tuple>(initial);
  if (!py_float && !py_int && !seq) return array_from(initial, "initial_value");
  py::module_ np = py::module_::import("numpy");
  py::object a = np.attr("asarray")(initial);
  const std::string dt = py::str(a.attr("dtype"));
  if (dt == "float64") return array_from(initial, "initial_value", DType::kFloat32);
  if (dt == "int64") {
    py::object info = np.attr("iinfo")(py::dtype("int32"));
    const bool fits =
        a.attr("size").cast<py::ssize_t>() == 0 || (py::int_(a.attr("min")()) >= info.attr("min") &&
                                                    py::int_(a.attr("max")()) <= info.attr("max"));
    if (fits) return array_from(initial, "initial_value", DType::kInt32);
  }
  return array_from(a, "initial_value");
}

PyVariable create_variable(Strategy& s, py::object owner, py::handle initial, std::string name,
                           py::handle synchronization, py::handle aggregation, bool trainable) {
  Array init = initial_value_from(initial);
  VariableOptions o{std::move(name), synchronization_from(synchronization),
                    aggregation_from(aggregation), trainable};
  StatusOr<Variable> v = [&] {
    py::gil_scoped_release release;  // multi-worker: the chief's value is broadcast
    return s.create_variable(init, std::move(o));
  }();
  return PyVariable{value_or_throw(std::move(v)), std::move(owner)};
}

py::object replica_context_object(ReplicaContext* c) {
  if (c == nullptr) return py::none();
  return py::cast(PyReplicaContext{c, strategy_object(c->strategy())});
}

PerReplica<Array> per_replica_arrays(const PerReplicaValue& v, const std::string& what) {
  std::vector<Array> out;
  for (size_t i = 0; i < v.values.size(); ++i) {
    out.push_back(array_from(v.values[i], what + "[" + std::to_string(i) + "]"));
  }
  return PerReplica<Array>(std::move(out));
}

std::optional<int> axis_from(py::handle axis) {
  if (axis.is_none()) return std::nullopt;
  return axis.cast<int>();
}

// A replica's failure in run(): the Python exception it raised, if any.
struct ReplicaFailure {
  std::optional<py::error_already_set> error;
  bool from_tributary = false;
};

bool is_tributary_error(const py::error_already_set& e) {
  py::object base = py::module_::import("tributary.errors").attr("Error");
  return PyObject_IsInstance(e.value().ptr(), base.ptr()) == 1;
}

py::object run(Strategy& s, py::function fn, py::handle args, py::handle kwargs) {
  const int n = s.num_local_replicas();
  // Per-replica arguments, unwrapped from PerReplica values (TF's select_replica).
  auto select = [&](py::handle a, int i) -> py::object {
    if (py::isinstance<PerReplicaValue>(a)) {
      const auto& v = a.cast<const PerReplicaValue&>();
      if (static_cast<int>(v.values.size()) != n) {
        throw_invalid("run(): a PerReplica argument has " + std::to_string(v.values.size()) +
                      " values but the strategy has " + std::to_string(n) + " local replicas");
      }
      return v.values[static_cast<size_t>(i)];
    }
    return py::reinterpret_borrow<py::object>(a);
  };
  auto select_nest = [&](py::handle a, int i) {
    return map_nest(a, [&](py::handle leaf) { return select(leaf, i); });
  };
  if (!args.is_none() && !py::isinstance<py::tuple>(args) && !py::isinstance<py::list>(args)) {
    throw_invalid("positional args must be a list or tuple, got " +
                  std::string(py::str(args.get_type())));
  }
  if (!kwargs.is_none() && !py::isinstance<py::dict>(kwargs)) {
    throw_invalid("kwargs must be a dict, got " + std::string(py::str(kwargs.get_type())));
  }
  std::vector<py::tuple> per_args;
  std::vector<py::dict> per_kwargs;
  py::tuple all_args = args.is_none() ? py::tuple() : py::tuple(py::reinterpret_borrow<py::object>(args));
  py::dict all_kwargs = kwargs.is_none() ? py::dict() : py::reinterpret_borrow<py::dict>(kwargs);
  for (int i = 0; i < n; ++i) {
    py::tuple t(all_args.size());
    for (size_t j = 0; j < all_args.size(); ++j) t[j] = select_nest(all_args[j], i);
    py::dict d;
    for (auto kv : all_kwargs) d[kv.first] = select_nest(kv.second, i);
    per_args.push_back(std::move(t));
    per_kwargs.push_back(std::move(d));
  }
  std::vector<py::object> results(static_cast<size_t>(n));
  std::vector<ReplicaFailure> failures(static_cast<size_t>(n));
  // Ctrl-C while several replicas run on their threads: the signal's handler runs here, on the
  // waiting thread; its KeyboardInterrupt is then raised in each replica thread running Python
  // code (an asynchronous exception), a replica that starts later does not call fn, and run()
  // raises it once every replica has returned. Replica threads are listed under the GIL.
  std::vector<unsigned long> replica_threads(static_cast<size_t>(n), 0);
  std::vector<bool> told(static_cast<size_t>(n), false);
  std::optional<py::error_already_set> interrupt;
  const std::function<Status()> check = [&]() -> Status {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) {
      if (!interrupt) {
        interrupt.emplace();  // the handler's exception (KeyboardInterrupt), fetched
      } else {
        PyErr_Clear();  // another Ctrl-C: the first is raised once the replicas returned
      }
    }
    if (!interrupt) return ok_status();
    for (size_t i = 0; i < replica_threads.size(); ++i) {
      if (replica_threads[i] != 0 && !told[i]) {
        PyThreadState_SetAsyncExc(replica_threads[i], interrupt->type().ptr());
        told[i] = true;
      }
    }
    return aborted(std::string("Strategy.run() was interrupted (") + interrupt->what() + ")");
  };
  Status status;
  {
    py::gil_scoped_release release;
    status = s.run_interruptible(
        [&](ReplicaContext& ctx) -> Status {
          const auto i = static_cast<size_t>(ctx.local_replica_id());
          py::gil_scoped_acquire gil;
          if (interrupt) return aborted("Strategy.run() was interrupted before this replica ran");
          const unsigned long me = PyThread_get_thread_ident();
          replica_threads[i] = me;
          told[i] = false;
          struct Leave {
            unsigned long me;
            unsigned long& slot;
            ~Leave() {
              slot = 0;
              PyThreadState_SetAsyncExc(me, nullptr);  // one set too late must not fire later
            }
          } leave{me, replica_threads[i]};
          try {
            results[i] = fn(*per_args[i], **per_kwargs[i]);
            return ok_status();
          } catch (py::error_already_set& e) {
            std::string what = e.what();
            failures[i].from_tributary = is_tributary_error(e);
            failures[i].error.emplace(std::move(e));
            return aborted("the function raised " + what);
          } catch (const StatusError& e) {
            return e.status();
          } catch (const std::exception& e) {
            return internal_error(std::string("the function threw ") + e.what());
          }
        },
        check);
  }
  if (interrupt) throw std::move(*interrupt);
  if (!status.ok()) {
    // The cause first: a replica's own (non-tributary) exception rather than the errors of the
    // replicas that were waiting for it; else the lowest failing replica's.
    ReplicaFailure* pick = nullptr;
    size_t replica = 0;
    for (size_t i = 0; i < failures.size(); ++i) {
      if (failures[i].error && !failures[i].from_tributary) {
        pick = &failures[i];
        replica = i;
        break;
      }
    }
    for (size_t i = 0; !pick && i < failures.size(); ++i) {
      if (failures[i].error) {
        pick = &failures[i];
        replica = i;
      }
    }
    if (pick) {
      py::error_already_set e = std::move(*pick->error);
      if (py::hasattr(e.value(), "add_note")) {
        e.value().attr("add_note")("raised in local replica " + std::to_string(replica) +
                                   " of Strategy.run()");
      }
      throw e;
    }
    throw StatusError(status);
  }
  // TF's regroup: a function returning (loss, acc) gives (PerReplica(loss...), PerReplica(acc...)),
  // replicas that return other structures are TF's ValueError; what is the same object on every
  // replica (so whatever one replica returns) comes back unwrapped.
  return regroup(py::cast(PerReplicaValue{std::move(results)}), Unwrap::kSameObjectExceptCounts);
}

py::object merge_call(const PyReplicaContext& pc, py::function fn, py::handle args) {
  ReplicaContext& ctx = pc.active("merge_call");
  auto arg = std::make_shared<Held>();
  arg->obj = args.is_none() ? py::tuple() : py::tuple(py::reinterpret_borrow<py::object>(args));
  std::function<StatusOr<HeldPtr>(Strategy&, const PerReplica<HeldPtr>&)> merge =
      [&fn](Strategy& s, const PerReplica<HeldPtr>& per_replica) -> StatusOr<HeldPtr> {
    py::gil_scoped_acquire gil;
    try {
      // merge_fn(strategy, *args), the replicas' args regrouped as TF: each argument (each leaf of
      // a nested one) a PerReplica of the replicas' values, or the object itself where it is the
      // same on every replica (so with one replica).
      PerReplicaValue all;
      for (const HeldPtr& h : per_replica) all.values.push_back(h->obj);
      py::list call_args;
      call_args.append(strategy_object(s));
      for (py::handle a : regroup(py::cast(std::move(all)), Unwrap::kSameObject)) {
        call_args.append(a);
      }
      auto out = std::make_shared<Held>();
      out->obj = fn(*py::tuple(call_args));
      return out;
    } catch (py::error_already_set& e) {
      return aborted(std::string("merge_call's function raised ") + e.what());
    } catch (const StatusError& e) {
      return e.status();
    }
  };
  StatusOr<HeldPtr> r = [&] {
    py::gil_scoped_release release;
    return ctx.merge_call(merge, arg);
  }();
  return value_or_throw(std::move(r))->obj;
}

bool contains_dict(py::handle h) {
  if (py::isinstance<py::dict>(h)) return true;
  if (py::isinstance<py::list>(h) || py::isinstance<py::tuple>(h)) {
    for (py::handle x : h) {
      if (contains_dict(x)) return true;
    }
  }
  return false;
}

bool is_sparse(py::handle h) { return py::isinstance<IndexedSlices>(h); }

// TF's NotImplementedError for gather/all_gather of IndexedSlices.
Status sparse_gather_refused() {
  return unimplemented(
      "gather/all_gather does not support IndexedSlices; convert them with tributary.to_dense() "
      "first");
}

bool contains_sparse(py::handle h) {
  bool found = false;
  map_nest(h, [&](py::handle leaf) {
    found = found || is_sparse(leaf);
    return py::object(py::none());
  });
  return found;
}

// One value reduced across the replicas: an IndexedSlices (concatenated, as TF) or a dense value.
py::object all_reduce_leaf(ReplicaContext& ctx, ReduceOp op, py::handle value,
                           const std::string& what) {
  if (is_sparse(value)) {
    IndexedSlices v = value.cast<IndexedSlices>();
    StatusOr<IndexedSlices> r = [&] {
      py::gil_scoped_release release;
      return ctx.all_reduce(op, v);
    }();
    return py::cast(value_or_throw(std::move(r)));
  }
  Array a = array_from(value, what);
  StatusOr<Array> r = [&] {
    py::gil_scoped_release release;
    return ctx.all_reduce(op, a);
  }();
  return to_numpy(value_or_throw(std::move(r)));
}

py::object all_reduce_in_replica(const PyReplicaContext& pc, py::handle op, py::handle value) {
  ReplicaContext& ctx = pc.active("all_reduce");
  const ReduceOp rop = reduce_op_from(op);
  if (is_nest(value) && (contains_dict(value) || contains_sparse(value))) {
    // Dicts pair their values by key, and sparse values meet one by one: replicas whose nests
    // differ would add up different values. Their structures are compared first (one more
    // meeting, for these nests only).
    const std::string mine = structure_of(value);
    Status same = [&] {
      py::gil_scoped_release release;
      return ctx.merge_call(
          [](Strategy&, const PerReplica<std::string>& all) -> Status {
            for (size_t r = 1; r < all.values().size(); ++r) {
              if (all.values()[r] != all.values()[0]) {
                return invalid_argument(
                    "all_reduce: The two structures don't have the same nested structure: "
                    "replica 0 passed " +
                    all.values()[0].substr(0, 200) + " but replica " + std::to_string(r) + " " +
                    all.values()[r].substr(0, 200) + " (. is a value)");
              }
            }
            return Status();
          },
          mine);
    }();
    check(same);
  }
  if (is_nest(value) && contains_sparse(value)) {
    // A nest with IndexedSlices: one meeting per value, in the nest's order (replicas whose
    // values differ in kind meet in different calls, and fail alike).
    size_t k = 0;
    return map_nest(value, [&](py::handle leaf) {
      return all_reduce_leaf(ctx, rop, leaf, "value[" + std::to_string(k++) + "]");
    });
  }
  if (is_nest(value)) {  // TF: the same structure back, in one meeting
    std::vector<py::object> leaves;
    flatten_nest(value, leaves);
    std::vector<Array> values;
    for (size_t k = 0; k < leaves.size(); ++k) {
      values.push_back(array_from(leaves[k], "value[" + std::to_string(k) + "]"));
    }
    StatusOr<std::vector<Array>> r = [&] {
      py::gil_scoped_release release;
      return ctx.all_reduce(rop, std::span<const Array>(values));
    }();
    std::vector<py::object> out;
    for (const Array& a : value_or_throw(std::move(r))) out.push_back(to_numpy(a));
    return pack_nest(value, out);
  }
  return all_reduce_leaf(ctx, rop, value, "value");
}

}  // namespace

// A PerReplica whose values are nests (run() of a function returning a tuple or dict) as the nest
// of PerReplica leaves (TF's regroup); any other value as it is.
// Python shares the objects of small ints (and True and False) and NumPy its booleans, so two
// replicas that counted the same rows return the same object by accident, where TF's replicas
// return two tensors. Unwrapped, the count would reduce as a value that is not distributed (an
// error for SUM on one worker, counted once per worker on several): such values stay per replica.
bool shared_by_accident(py::handle h) {
  static py::object* const numpy_bool =
      new py::object(py::module_::import("numpy").attr("bool_"));  // never freed: no GIL at exit
  return PyLong_Check(h.ptr()) || py::isinstance(h, *numpy_bool);
}

py::object regroup(py::handle value, Unwrap unwrap) {
  if (!py::isinstance<PerReplicaValue>(value)) return py::reinterpret_borrow<py::object>(value);
  const auto& v = value.cast<const PerReplicaValue&>();
  if (v.values.empty()) return py::reinterpret_borrow<py::object>(value);
  if (!is_nest(v.values[0])) {
    // TF unwraps the same object on every replica, so any value of one replica; run()'s ints and
    // booleans from several stay wrapped (see above).
    const bool same = std::all_of(v.values.begin(), v.values.end(),
                                  [&](const py::object& x) { return x.is(v.values[0]); });
    const bool counts = unwrap == Unwrap::kSameObjectExceptCounts && v.values.size() > 1 &&
                        shared_by_accident(v.values[0]);
    return unwrap != Unwrap::kNever && same && !counts ? v.values[0]
                                                       : py::reinterpret_borrow<py::object>(value);
  }
  std::vector<std::vector<py::object>> per(v.values.size());
  const std::string first = structure_of(v.values[0]);
  for (size_t r = 0; r < v.values.size(); ++r) {
    flatten_nest(v.values[r], per[r]);
    if (const std::string mine = structure_of(v.values[r]); mine != first) {
      throw_invalid("The two structures don't have the same nested structure: replica 0 returned " +
                    first.substr(0, 200) + " but replica " + std::to_string(r) + " " +
                    mine.substr(0, 200) + " (. is a value)");
    }
  }
  std::vector<py::object> leaves;
  for (size_t k = 0; k < per[0].size(); ++k) {
    PerReplicaValue leaf;
    for (size_t r = 0; r < per.size(); ++r) leaf.values.push_back(per[r][k]);
    leaves.push_back(regroup(py::cast(std::move(leaf)), unwrap));
  }
  return pack_nest(v.values[0], leaves);
}

namespace {

// A PerReplica of nests passed to reduce or gather, as the nest of its PerReplica leaves.
py::object split_per_replica_nests(py::handle value) {
  return map_nest(value, [](py::handle v) { return regroup(v, Unwrap::kNever); });
}

py::object reduce_value(Strategy& s, py::handle op, py::handle value, py::handle axis) {
  const ReduceOp rop = reduce_op_from(op);
  const std::optional<int> ax = axis_from(axis);
  return map_nest(split_per_replica_nests(value), [&](py::handle leaf) -> py::object {
    StatusOr<Array> r = invalid_argument("unset");
    if (is_sparse(leaf)) {  // not distributed: TF's reduce_non_distributed_value
      if (ax) throw_invalid("reduce(): IndexedSlices are reduced without an axis");
      IndexedSlices v = leaf.cast<IndexedSlices>();
      StatusOr<IndexedSlices> same = [&] {
        py::gil_scoped_release release;
        return s.reduce(rop, v);
      }();
      return py::cast(value_or_throw(std::move(same)));
    }
    bool any_sparse = false;
    if (py::isinstance<PerReplicaValue>(leaf)) {
      for (const py::object& v : leaf.cast<const PerReplicaValue&>().values) {
        any_sparse = any_sparse || is_sparse(v);
      }
    }
    if (any_sparse) {
      std::vector<IndexedSlices> parts;
      for (const py::object& v : leaf.cast<const PerReplicaValue&>().values) {
        if (!is_sparse(v)) {
          throw_type("reduce(): a PerReplica mixes IndexedSlices and other values; got a " +
                     std::string(py::str(v.get_type().attr("__name__"))));
        }
        parts.push_back(v.cast<IndexedSlices>());
      }
      if (ax) throw_invalid("reduce(): IndexedSlices are reduced without an axis");
      StatusOr<IndexedSlices> sparse = [&] {
        py::gil_scoped_release release;
        return s.reduce(rop, PerReplica<IndexedSlices>(std::move(parts)));
      }();
      return py::cast(value_or_throw(std::move(sparse)));
    }
    if (py::isinstance<PerReplicaValue>(leaf)) {
      PerReplica<Array> v = per_replica_arrays(leaf.cast<const PerReplicaValue&>(), "value");
      py::gil_scoped_release release;
      r = s.reduce(rop, v, ax);
    } else {
      Array a = array_from(leaf, "value");
      py::gil_scoped_release release;
      r = s.reduce(rop, a, ax);
    }
    return to_numpy(value_or_throw(std::move(r)));
  });
}

py::object gather_value(Strategy& s, py::handle value, int axis) {
  return map_nest(split_per_replica_nests(value), [&](py::handle leaf) -> py::object {
    if (is_sparse(leaf)) throw StatusError(sparse_gather_refused());
    if (!py::isinstance<PerReplicaValue>(leaf)) {  // not distributed: this worker's part
      Array a = array_from(leaf, "value");
      StatusOr<Array> r = [&] {
        py::gil_scoped_release release;
        return s.gather(a, axis);
      }();
      return to_numpy(value_or_throw(std::move(r)));
    }
    for (const py::object& part : leaf.cast<const PerReplicaValue&>().values) {
      if (is_sparse(part)) throw StatusError(sparse_gather_refused());
    }
    PerReplica<Array> v = per_replica_arrays(leaf.cast<const PerReplicaValue&>(), "value");
    StatusOr<Array> r = [&] {
      py::gil_scoped_release release;
      return s.gather(v, axis);
    }();
    return to_numpy(value_or_throw(std::move(r)));
  });
}

// Strategy.scope()'s context manager.
struct PyScope {
  Strategy* strategy;
  py::object owner;
  std::optional<StrategyScope> scope;
};

void bind_variables(py::module_& m) {
  py::enum_<VariableSynchronization>(m, "VariableSynchronization")
      .value("AUTO", VariableSynchronization::kAuto)
      .value("NONE", VariableSynchronization::kNone)
      .value("ON_WRITE", VariableSynchronization::kOnWrite)
      .value("ON_READ", VariableSynchronization::kOnRead);
  py::enum_<VariableAggregation>(m, "VariableAggregation")
      .value("NONE", VariableAggregation::kNone)
      .value("SUM", VariableAggregation::kSum)
      .value("MEAN", VariableAggregation::kMean)
      .value("ONLY_FIRST_REPLICA", VariableAggregation::kOnlyFirstReplica);

  auto update = [](Status (Variable::*fn)(const Array&)) {
    return [fn](PyVariable& v, py::handle value) {
      Array a = array_from(value, "value", v.variable.dtype());
      Status s;
      {
        py::gil_scoped_release release;  // replica context: the replicas meet here
        s = (v.variable.*fn)(a);
      }
      check(s);
    };
  };
  auto scatter = [](Status (Variable::*fn)(const IndexedSlices&)) {
    return [fn](PyVariable& v, py::handle delta) {
      if (!is_sparse(delta)) {
        throw_type("sparse_delta must be a tributary.IndexedSlices, got a " +
                   std::string(py::str(delta.get_type().attr("__name__"))));
      }
      IndexedSlices d = delta.cast<IndexedSlices>();
      Status s;
      {
        py::gil_scoped_release release;  // replica context: the replicas meet here
        s = (v.variable.*fn)(d);
      }
      check(s);
    };
  };
  py::class_<PyVariable>(m, "Variable",
                         "A variable placed by a strategy: mirrored (ON_WRITE) or sync-on-read "
                         "(ON_READ), with TF's aggregation rules.")
      .def(py::init([](py::handle initial_value, std::string name, py::handle synchronization,
                       py::handle aggregation, bool trainable) {
             Strategy& s = get_strategy();
             return create_variable(s, strategy_object(s), initial_value, std::move(name),
                                    synchronization, aggregation, trainable);
           }),
           py::arg("initial_value"), py::arg("name") = "Variable",
           py::arg("synchronization") = "auto", py::arg("aggregation") = "none",
           py::arg("trainable") = true,
           "A variable of the strategy in scope (TF's tf.Variable inside strategy.scope()).")
      .def(
          "read",
          [](const PyVariable& v) {
            StatusOr<Array> r = [&] {
              py::gil_scoped_release release;  // ON_READ in cross-replica context all-reduces
              return v.variable.read();
            }();
            return to_numpy(value_or_throw(std::move(r)));
          },
          "The value: this replica's copy in replica context, else the primary (ON_WRITE) or "
          "the aggregate (ON_READ).")
      .def(
          "numpy",
          [](const PyVariable& v) {
            StatusOr<Array> r = [&] {
              py::gil_scoped_release release;
              return v.variable.read();
            }();
            return to_numpy(value_or_throw(std::move(r)));
          },
          "read(), as TF's Variable.numpy().")
      .def(
          "__array__",
          [](const PyVariable& v, py::handle dtype) {
            StatusOr<Array> r = [&] {
              py::gil_scoped_release release;
              return v.variable.read();
            }();
            py::array a = to_numpy(value_or_throw(std::move(r)));
            if (dtype.is_none()) return py::object(a);
            return a.attr("astype")(dtype);
          },
          py::arg("dtype") = py::none())
      .def("assign", update(&Variable::assign), py::arg("value"))
      .def("assign_add", update(&Variable::assign_add), py::arg("delta"))
      .def("assign_sub", update(&Variable::assign_sub), py::arg("delta"))
      .def("scatter_add", scatter(&Variable::scatter_add), py::arg("sparse_delta"))
      .def("scatter_sub", scatter(&Variable::scatter_sub), py::arg("sparse_delta"))
      .def("scatter_mul", scatter(&Variable::scatter_mul), py::arg("sparse_delta"))
      .def("scatter_div", scatter(&Variable::scatter_div), py::arg("sparse_delta"))
      .def("scatter_min", scatter(&Variable::scatter_min), py::arg("sparse_delta"))
      .def("scatter_max", scatter(&Variable::scatter_max), py::arg("sparse_delta"))
      .def("scatter_update", scatter(&Variable::scatter_update), py::arg("sparse_delta"))
      .def_property_readonly(
          "values",
          [](const PyVariable& v) {
            py::list out;
            StatusOr<std::vector<Array>> copies = [&] {
              py::gil_scoped_release release;
              return v.variable.values_on_host();
            }();
            for (const Array& a : value_or_throw(std::move(copies))) out.append(to_numpy(a));
            return py::tuple(out);
          },
          "Snapshots of the local copies, in replica order (a tuple, TF's Variable.values).")
      .def_property_readonly("name", [](const PyVariable& v) { return v.variable.name(); })
      .def_property_readonly(
          "dtype", [](const PyVariable& v) { return std::string(dtype_name(v.variable.dtype())); })
      .def_property_readonly(
          "shape", [](const PyVariable& v) { return py::tuple(py::cast(v.variable.shape())); })
      .def_property_readonly("synchronization",
                             [](const PyVariable& v) { return v.variable.synchronization(); })
      .def_property_readonly("aggregation",
                             [](const PyVariable& v) { return v.variable.aggregation(); })
      .def_property_readonly("trainable",
                             [](const PyVariable& v) { return v.variable.trainable(); })
      .def_property_readonly("devices",
                             [](const PyVariable& v) { return device_names(v.variable.devices()); })
      .def_property_readonly("strategy", [](const PyVariable& v) { return v.owner; })
      .def("__repr__",
           [](const PyVariable& v) {
             return "<tributary.Variable '" + v.variable.name() + "' shape=" +
                    shape_to_string(v.variable.shape()) + " dtype=" +
                    std::string(dtype_name(v.variable.dtype())) + " " +
                    std::string(variable_synchronization_name(v.variable.synchronization())) + "/" +
                    std::string(variable_aggregation_name(v.variable.aggregation())) + ">";
           });
}

void bind_replica_context(py::module_& m) {
  py::class_<PyReplicaContext>(m, "ReplicaContext",
                               "A replica's view inside Strategy.run() (get_replica_context()). "
                               "It keeps its strategy alive; its collectives (all_reduce, "
                               "all_gather, merge_call) work only on its own replica's thread "
                               "inside run() (RuntimeError elsewhere).")
      .def_property_readonly(
          "replica_id_in_sync_group",
          [](const PyReplicaContext& c) { return c.ctx->replica_id_in_sync_group(); })
      .def_property_readonly("local_replica_id",
                             [](const PyReplicaContext& c) { return c.ctx->local_replica_id(); })
      .def_property_readonly(
          "num_replicas_in_sync",
          [](const PyReplicaContext& c) { return c.ctx->num_replicas_in_sync(); })
      .def_property_readonly("device",
                             [](const PyReplicaContext& c) { return c.ctx->device().to_string(); })
      .def_property_readonly("strategy", [](const PyReplicaContext& c) { return c.owner; })
      .def("all_reduce", &all_reduce_in_replica, py::arg("reduce_op"), py::arg("value"),
           "Reduces `value` (a nest of values -- tuple, list, dict -- in one meeting, returned "
           "with the same structure) across every replica in sync.")
      .def(
          "all_reduce",
          [](const PyReplicaContext& c, py::handle value, py::handle op) {
            return all_reduce_in_replica(c, op, value);
          },
          py::kw_only(), py::arg("value"), py::arg("op"),
          "all_reduce(value=..., op=...): the older keyword name of reduce_op.")
      .def(
          "all_gather",
          [](const PyReplicaContext& pc, py::handle value, int axis) {
            ReplicaContext& c = pc.active("all_gather");
            return map_nest(value, [&](py::handle leaf) -> py::object {
              if (is_sparse(leaf)) throw StatusError(sparse_gather_refused());
              Array a = array_from(leaf, "value");
              StatusOr<Array> r = [&] {
                py::gil_scoped_release release;
                return c.all_gather(a, axis);
              }();
              return to_numpy(value_or_throw(std::move(r)));
            });
          },
          py::arg("value"), py::arg("axis") = 0,
          "Concatenates every replica's `value` (or each value of a nest, returned with the same "
          "structure) along `axis` in global replica order.")
      .def("merge_call", &merge_call, py::arg("merge_fn"), py::arg("args") = py::tuple(),
           "Runs merge_fn(strategy, *args) once in cross-replica context, each argument a "
           "PerReplica of the replicas' values, and returns its result to every replica.");

  m.def(
      "get_replica_context", []() { return replica_context_object(get_replica_context()); },
      "This thread's ReplicaContext: the running replica's inside run(), None in cross-replica "
      "context (a scope), the default strategy's elsewhere.");
  m.def("in_cross_replica_context", &in_cross_replica_context);
  m.def("has_strategy", &has_strategy);
  m.def("get_strategy", []() { return strategy_object(get_strategy()); },
        "The strategy in scope on this thread, else the default strategy.");
}

void bind_indexed_slices(py::module_& m) {
  py::class_<IndexedSlices>(m, "IndexedSlices",
                            "Sparse rows of a dense tensor (TF's tf.IndexedSlices): values[k] is "
                            "row indices[k] of a tensor of shape dense_shape.")
      .def(py::init([](py::handle values, py::handle indices, py::handle dense_shape) {
             Array v = array_from(values, "values");
             Array i = array_from(indices, "indices");
             Shape shape;
             for (py::handle d : dense_shape) shape.push_back(d.cast<int64_t>());
             return value_or_throw(
                 IndexedSlices::make(std::move(v), std::move(i), std::move(shape)));
           }),
           py::arg("values"), py::arg("indices"), py::arg("dense_shape"))
      .def_property_readonly("values", [](const IndexedSlices& s) { return to_numpy(s.values()); })
      .def_property_readonly("indices",
                             [](const IndexedSlices& s) { return to_numpy(s.indices()); })
      .def_property_readonly(
          "dense_shape",
          [](const IndexedSlices& s) { return py::tuple(py::cast(s.dense_shape())); })
      .def_property_readonly("dtype",
                             [](const IndexedSlices& s) { return to_numpy(s.values()).dtype(); })
      .def("__repr__", &IndexedSlices::to_string);
  m.def(
      "to_dense", [](const IndexedSlices& s) { return to_numpy(value_or_throw(to_dense(s))); },
      py::arg("sparse"),
      "The dense NumPy array of an IndexedSlices (TF's convert_to_tensor): repeated rows sum.");
}

// The Variables of a Python sequence, for the checkpoint functions.
std::vector<Variable> variables_from(py::handle variables) {
  std::vector<Variable> out;
  if (py::isinstance<PyVariable>(variables)) {  // one variable
    out.push_back(variables.cast<const PyVariable&>().variable);
    return out;
  }
  if (!py::isinstance<py::iterable>(variables)) {
    throw_type("expected a tributary.Variable or a sequence of them, got a " +
               std::string(py::str(variables.get_type().attr("__name__"))));
  }
  for (py::handle h : variables) {
    if (!py::isinstance<PyVariable>(h)) {
      throw_type("expected a sequence of tributary.Variable, got a " +
                 std::string(py::str(h.get_type().attr("__name__"))));
    }
    out.push_back(h.cast<const PyVariable&>().variable);
  }
  return out;
}

void bind_checkpoints(py::module_& m) {
  m.def(
      "save_checkpoint",
      [](const std::string& path, py::handle variables) {
        std::vector<Variable> vars = variables_from(variables);
        Status s;
        {
          py::gil_scoped_release release;  // ON_READ values are all-reduced across workers
          s = save_checkpoint(path, vars);
        }
        check(s);
      },
      py::arg("path"), py::arg("variables"),
      "Saves the variables (ON_READ ones aggregated; every worker must call it with the same "
      "list); the chief alone writes `path`, atomically.");
  m.def(
      "restore_checkpoint",
      [](const std::string& path, py::handle variables) {
        std::vector<Variable> vars = variables_from(variables);
        Status s;
        {
          py::gil_scoped_release release;  // the chief reads and broadcasts
          s = restore_checkpoint(path, vars);
        }
        check(s);
      },
      py::arg("path"), py::arg("variables"),
      "Restores the variables from `path`, read by the chief and broadcast to every worker "
      "(ON_READ SUM values split evenly across the replicas, TF's rule). Any worker's error "
      "fails every worker and changes no variable.");
}

void bind_per_replica(py::module_& m) {
  py::class_<PerReplicaValue>(m, "PerReplica", "One value per local replica (run()'s results).")
      .def(py::init([](py::iterable values) {
             PerReplicaValue v;
             for (py::handle h : values) v.values.push_back(py::reinterpret_borrow<py::object>(h));
             return v;
           }), py::arg("values"))
      .def_property_readonly("values", [](const PerReplicaValue& v) {
             py::tuple t(v.values.size());
             for (size_t i = 0; i < v.values.size(); ++i) t[i] = v.values[i];
             return t;
           })
      .def("__len__", [](const PerReplicaValue& v) { return v.values.size(); })
      .def("__getitem__", [](const PerReplicaValue& v, size_t i) {
             if (i >= v.values.size()) throw py::index_error("PerReplica index out of range");
             return v.values[i];
           })
      .def("__iter__", [](const PerReplicaValue& v) {
             py::tuple t(v.values.size());
             for (size_t i = 0; i < v.values.size(); ++i) t[i] = v.values[i];
             return py::iter(t);
           })
      .def("__repr__", [](const PerReplicaValue& v) {
             std::string s = "PerReplica:{";
             for (size_t i = 0; i < v.values.size(); ++i) {
               s += (i ? ", " : "") + std::to_string(i) + ": " + std::string(py::repr(v.values[i]));
             }
             return s + "}";
           });
}

std::unique_ptr<Strategy> made(StatusOr<std::unique_ptr<Strategy>> s) {
  return value_or_throw(std::move(s));
}

void bind_factories(py::module_& m) {
  m.def("MirroredStrategy", [](py::handle devices, std::optional<std::string> cross_device_ops) {
          MirroredStrategyOptions o;
          o.devices = devices_from(devices, {});
          o.cross_device_ops = cross_device_ops.value_or("");
          py::gil_scoped_release release;
          return made(make_mirrored_strategy(std::move(o)));
        }, py::arg("devices") = py::none(), py::arg("cross_device_ops") = py::none(),
        "One replica per local device (default: every GPU, else CPU:0); cross_device_ops: a "
        "backend spec (default: TF's choice).");
  m.def(
      "MultiWorkerMirroredStrategy",
      [](py::handle devices, std::string implementation, int64_t bytes_per_pack, py::handle timeout,
         py::handle startup_timeout, py::handle communication_options) {
        if (!communication_options.is_none()) {
          // TF's tf.distribute.experimental.CommunicationOptions (tributary.CommunicationOptions).
          py::object impl = communication_options.attr("implementation");
          if (py::hasattr(impl, "value")) impl = impl.attr("value");  // an enum member
          implementation = py::str(impl);  // the C++ strategy reads TF's names in any case
          bytes_per_pack = communication_options.attr("bytes_per_pack").cast<int64_t>();
          timeout = communication_options.attr("timeout_seconds");
        }
        MultiWorkerMirroredStrategyOptions o;
        o.devices = devices_from(devices, {});
        o.communication.implementation = std::move(implementation);
        o.communication.bytes_per_pack = bytes_per_pack;
        o.communication.timeout = timeout_from(timeout, std::chrono::milliseconds(0));
        if (!startup_timeout.is_none()) {
          o.startup_timeout = timeout_from(startup_timeout, std::chrono::milliseconds(0));
        }
        py::gil_scoped_release release;  // rendezvous with every worker
        return made(make_multi_worker_mirrored_strategy(std::move(o)));
      },
      py::arg("devices") = py::none(), py::arg("implementation") = "auto",
      py::arg("bytes_per_pack") = 0, py::arg("timeout") = py::none(),
      py::arg("startup_timeout") = py::none(), py::kw_only(),
      py::arg("communication_options") = py::none(),
      "One replica per local device on every worker of the cluster in the environment "
      "(tributary-run, TF_CONFIG, torchrun, Slurm, Open MPI). implementation: 'auto', 'ring', "
      "'nccl' or any backend spec; timeout in seconds. communication_options: a "
      "tributary.CommunicationOptions (TF's), which then sets implementation, bytes_per_pack "
      "and timeout.");
  m.def("OneDeviceStrategy", [](const std::string& device) {
          Device d = value_or_throw(Device::parse(device));
          py::gil_scoped_release release;
          return made(make_one_device_strategy(d));
        }, py::arg("device"));
  m.def("CentralStorageStrategy",
        [](py::handle compute_devices, std::optional<std::string> parameter_device,
           std::optional<std::string> cross_device_ops) {
          CentralStorageStrategyOptions o;
          o.compute_devices = devices_from(compute_devices, {});
          if (parameter_device) o.parameter_device = value_or_throw(Device::parse(*parameter_device));
          o.cross_device_ops = cross_device_ops.value_or("");
          py::gil_scoped_release release;
          return made(make_central_storage_strategy(std::move(o)));
        }, py::arg("compute_devices") = py::none(), py::arg("parameter_device") = py::none(),
        py::arg("cross_device_ops") = py::none());
  m.def(
      "make_strategy",
      [](const std::string& name, int replicas, const std::string& backend) -> py::object {
        // TF's one default strategy: the object get_strategy() returns outside any scope.
        if (name == "default") return strategy_object(default_strategy());
        std::unique_ptr<Strategy> s;
        {
          py::gil_scoped_release release;
          s = made(make_strategy(name, replicas, backend));
        }
        return py::cast(std::move(s));
      },
      py::arg("name"), py::arg("replicas") = 1, py::arg("backend") = "",
      "By name: 'default', 'one_device', 'mirrored', 'multi_worker_mirrored', "
      "'central_storage', with `replicas` CPU replicas and a backend spec ('' = default).");
}

void bind_strategy_class(py::module_& m) {
  py::class_<PyScope>(m, "StrategyScope")
      .def("__enter__", [](PyScope& s) {
             s.scope.emplace(value_or_throw(s.strategy->scope()));
             return s.owner;
           })
      .def("__exit__", [](PyScope& s, py::args) { s.scope.reset(); });

  py::class_<Strategy>(m, "Strategy", "A tf.distribute strategy (MirroredStrategy(), ...).")
      .def(
          "scope",
          [](py::object self) {
            return PyScope{&self.cast<Strategy&>(), self, std::nullopt};
          },
          "A context manager entering this strategy's cross-replica context.")
      .def("run", &run, py::arg("fn"), py::arg("args") = py::tuple(),
           py::arg("kwargs") = py::none(),
           "Calls fn(*args, **kwargs) once per local replica, concurrently (PerReplica arguments "
           "are unwrapped per replica); returns a PerReplica of the results, regrouped as TF: a "
           "function returning (loss, acc) gives (PerReplica, PerReplica), and what is the same "
           "object on every replica (whatever a single replica returns) comes back unwrapped.")
      .def("reduce", &reduce_value, py::arg("reduce_op"), py::arg("value"),
           py::arg("axis") = py::none(),
           "TF's Strategy.reduce: across replicas (and workers); with an axis, along it first. "
           "`value` may be a nest (tuple, list, dict) of values or PerReplica, or a PerReplica of "
           "nests: the result has the nest's structure. A value that is not a PerReplica is, on "
           "a multi-worker strategy, this worker's part, reduced across the workers: a "
           "collective, which every worker must call.")
      .def("gather", &gather_value, py::arg("value"), py::arg("axis") = 0,
           "TF's Strategy.gather: each PerReplica of `value` (a nest too) concatenated along "
           "`axis` across every replica.")
      .def(
          "experimental_local_results",
          [](const Strategy& s, py::handle value) -> py::tuple {
            if (py::isinstance<PerReplicaValue>(value)) {
              return py::tuple(py::cast(value.cast<const PerReplicaValue&>().values));
            }
            if (!is_nest(value)) return py::make_tuple(value);
            // A nest: one nest per local replica, each PerReplica leaf replaced by that replica's
            // value (TF's StrategyExtended._local_results).
            py::list out;
            for (int i = 0; i < s.num_local_replicas(); ++i) {
              out.append(map_nest(value, [i](py::handle leaf) -> py::object {
                if (!py::isinstance<PerReplicaValue>(leaf)) {
                  return py::reinterpret_borrow<py::object>(leaf);
                }
                return leaf.cast<const PerReplicaValue&>().values.at(static_cast<size_t>(i));
              }));
            }
            return py::tuple(out);
          },
          py::arg("value"),
          "TF's experimental_local_results: the local replicas' values of a PerReplica, of each "
          "PerReplica in a nest (one nest per local replica), or (value,) for any other value.")
      .def(
          "create_variable",
          [](py::object self, py::handle initial_value, std::string name,
             py::handle synchronization, py::handle aggregation, bool trainable) {
            return create_variable(self.cast<Strategy&>(), self, initial_value, std::move(name),
                                   synchronization, aggregation, trainable);
          },
          py::arg("initial_value"), py::arg("name") = "Variable",
          py::arg("synchronization") = "auto", py::arg("aggregation") = "none",
          py::arg("trainable") = true)
      .def_property_readonly("name", &Strategy::name)
      .def_property_readonly("num_replicas_in_sync", &Strategy::num_replicas_in_sync)
      .def_property_readonly("num_local_replicas", &Strategy::num_local_replicas)
      .def_property_readonly("worker_devices",
                             [](const Strategy& s) { return device_names(s.worker_devices()); })
      .def_property_readonly("worker_index", &Strategy::worker_index)
      .def_property_readonly("num_workers", &Strategy::num_workers)
      .def_property_readonly("is_chief", &Strategy::is_chief)
      .def_property_readonly("should_checkpoint", &Strategy::should_checkpoint)
      .def_property_readonly(
          "cross_device_ops", [](const Strategy& s) { return s.cross_device_ops().spec(); },
          "The spec of the backend the strategy reduces with.")
      .def("describe", &Strategy::describe)
      .def("__repr__", &Strategy::describe);
}

void bind_losses(py::module_& m) {
  m.def("compute_average_loss", [](py::handle per_example_loss, py::handle sample_weight,
                                   std::optional<int64_t> global_batch_size) {
          Array loss = array_from(per_example_loss, "per_example_loss");
          std::optional<Array> w;
          if (!sample_weight.is_none()) w = array_from(sample_weight, "sample_weight", loss.dtype());
          return to_numpy(value_or_throw(compute_average_loss(loss, w, global_batch_size)));
        }, py::arg("per_example_loss"), py::arg("sample_weight") = py::none(),
        py::arg("global_batch_size") = py::none(),
        "tf.nn.compute_average_loss: sum(w * loss) / global batch size.");
  m.def("scale_regularization_loss", [](py::handle regularization_loss) {
          Array a = array_from(regularization_loss, "regularization_loss");
          return to_numpy(value_or_throw(scale_regularization_loss(a)));
        }, py::arg("regularization_loss"),
        "tf.nn.scale_regularization_loss: sum(loss) / num_replicas_in_sync.");
}

}  // namespace

void bind_strategy(py::module_& m) {
  bind_per_replica(m);
  bind_indexed_slices(m);
  bind_checkpoints(m);
  bind_variables(m);
  bind_replica_context(m);
  bind_strategy_class(m);
  bind_factories(m);
  bind_losses(m);
}

}  // namespace tributary::python

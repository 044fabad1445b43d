// tributary.Context, tributary.Backend (a CrossDeviceOps) and tributary.Work.
//
// Every collective takes one buffer per local replica (a list), or one buffer when the backend has
// one local replica. Buffers are used in place, without copies; outputs the caller leaves out are
// allocated as NumPy arrays. A synchronous call returns the outputs (a list, or one array when one
// was passed); with async_op=True it returns a Work whose wait() returns them. The buffers stay
// referenced by the Work until the collective has completed. Waits (a synchronous call's, and
// Work.wait()) are interruptible: Ctrl-C raises KeyboardInterrupt within ~100 ms, and the
// collective stays in flight (a synchronous call's exception carries its Work as `.work`).
#include <algorithm>
#include <mutex>

#include "common.h"

namespace tributary::python {
namespace {

constexpr std::chrono::milliseconds kForever = std::chrono::hours(24 * 365);

// A rendezvous made once per process: every backend made from it meets its peers under the next
// instance number (all ranks must create their backends in the same order).
// Runs `f` without the GIL when this thread holds it and the interpreter is not finalizing: what
// may block (a backend draining its collectives, a store server lingering for absent ranks) must
// not stall every Python thread, also when garbage collection destroys it.
bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}
template <typename F>
void without_gil(F&& f) {
  if (PyGILState_Check() != 0 && !finalizing()) {
    py::gil_scoped_release release;
    f();
  } else {
    f();
  }
}

struct PyContext {
  BackendContext context;

  PyContext() = default;
  explicit PyContext(BackendContext c) : context(std::move(c)) {}
  PyContext(const PyContext&) = delete;
  PyContext& operator=(const PyContext&) = delete;
  ~PyContext() {
    without_gil([this] { context = BackendContext(); });
  }
};

struct PyBackend {
  std::unique_ptr<BackendRegistry> registry;  // outlives the instance made from it
  std::mutex issue;  // CrossDeviceOps takes calls from one thread at a time

  PyBackend() = default;
  PyBackend(const PyBackend&) = delete;
  PyBackend& operator=(const PyBackend&) = delete;
  ~PyBackend() { close(); }

  // The backend, kept alive for the caller's use: close() on another thread (which releases the
  // GIL) then cannot free it under a call in progress; the last holder destroys it.
  std::shared_ptr<CrossDeviceOps> get() const {
    std::lock_guard lock(ptr_mu_);
    if (!ops_) throw StatusError(failed_precondition("this backend was closed"));
    return ops_;
  }
  // The backend, or null once closed.
  std::shared_ptr<CrossDeviceOps> peek() const {
    std::lock_guard lock(ptr_mu_);
    return ops_;
  }
  void set(std::unique_ptr<CrossDeviceOps> ops) {
    // Whoever lets go last (close(), a call that held it, garbage collection) destroys it without
    // the GIL: it may drain its collectives or wait for its store.
    std::shared_ptr<CrossDeviceOps> shared(
        ops.release(), [](CrossDeviceOps* o) { without_gil([o] { delete o; }); });
    std::lock_guard lock(ptr_mu_);
    ops_ = std::move(shared);
  }
  // Destroys the backend, without the GIL, once no collective is being issued on it.
  void close() {
    without_gil([this] {
      std::shared_ptr<CrossDeviceOps> gone;
      std::lock_guard lock(issue);
      {
        std::lock_guard ptr_lock(ptr_mu_);
        gone = std::move(ops_);
      }
    });
  }

 private:
  mutable std::mutex ptr_mu_;  // ops_ itself (get() runs with the GIL, close() without)
  std::shared_ptr<CrossDeviceOps> ops_;
};

// An issued collective, holding its buffers until it completes.
struct PyWork {
  Work work = Work::completed();  // until issued: nothing to wait for
  std::vector<HeldTensor> held;
  py::object result;
  std::string what;

  PyWork() = default;
  PyWork(const PyWork&) = delete;
  PyWork& operator=(const PyWork&) = delete;
  ~PyWork() {
    // Buffers must outlive the collective: a Work dropped early is waited for (the collective has
    // its own timeout, so this ends).
    if (!work.test()) {
      py::gil_scoped_release release;
      (void)work.wait();
    }
  }

  // Waits in slices of ~100 ms, taking the GIL between them to run Python's signal handlers: a
  // Ctrl-C raises KeyboardInterrupt (the collective stays in flight) instead of waiting on.
  py::object wait(std::chrono::milliseconds timeout) {
    using Clock = std::chrono::steady_clock;
    constexpr std::chrono::milliseconds kSlice(100);
    const auto start = Clock::now();
    Status s;
    for (;;) {
      const auto elapsed =
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
      const auto left = timeout > elapsed ? timeout - elapsed : std::chrono::milliseconds(0);
      const auto slice = std::min(left, kSlice);
      {
        py::gil_scoped_release release;
        s = work.wait(slice);
      }
      if (work.test() || left <= kSlice) break;  // done (or failed), or the caller's timeout
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
    // A slice may have timed out just before the collective ended: its status is then the Work's.
    if (work.test()) s = work.wait(std::chrono::milliseconds(0));
    check(s);
    return result;
  }
};

StatusOr<BackendContext> make_context(const std::vector<Device>& devices,
                                      std::optional<std::chrono::milliseconds> timeout,
                                      const std::optional<std::string>& spec) {
  TRIBUTARY_ASSIGN_OR_RETURN(Config config, Config::load());
  // A bad spec ends every process here, before the rendezvous (registry.h).
  // Refused before joining: with several processes it still joins to say so (the others fail at
  // once instead of waiting for it).
  TRIBUTARY_RETURN_IF_ERROR(
      builtin_backends().check_everywhere(spec.value_or(""), config, devices));
  if (!timeout && spec) timeout = spec_timeout({*spec});
  return make_backend_context(devices, std::move(config), timeout);
}

std::unique_ptr<PyBackend> create_backend(const std::optional<std::string>& spec,
                                          const BackendContext& context) {
  auto b = std::make_unique<PyBackend>();
  b->registry = std::make_unique<BackendRegistry>(builtin_backends());
  StatusOr<std::unique_ptr<CrossDeviceOps>> ops = [&] {
    py::gil_scoped_release release;
    return spec ? b->registry->create(*spec, context) : b->registry->create_from_config(context);
  }();
  b->set(value_or_throw(std::move(ops)));
  return b;
}

// The replica arguments of a call: a list (one per local replica) or one object.
struct Args {
  std::vector<py::object> objects;
  bool single = false;
};
Args args_from(py::handle obj) {
  Args a;
  if (py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj)) {
    for (py::handle o : obj) a.objects.push_back(py::reinterpret_borrow<py::object>(o));
  } else {
    a.objects.push_back(py::reinterpret_borrow<py::object>(obj));
    a.single = true;
  }
  return a;
}

const Device& replica_device(const CrossDeviceOps& ops, size_t i) {
  const auto& d = ops.devices();
  return d[std::min(i, d.size() - 1)];
}

// Holds `objs` as tensors of `ops`' replicas, appending to `held`.
std::vector<Tensor> hold_all(const CrossDeviceOps& ops, const std::vector<py::object>& objs,
                             Access access, const std::string& name,
                             std::vector<HeldTensor>& held) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < objs.size(); ++i) {
    held.push_back(hold_tensor(objs[i], replica_device(ops, i), access,
                               name + "[" + std::to_string(i) + "]"));
    out.push_back(held.back().tensor);
  }
  return out;
}

// New NumPy outputs of `shape` like `like` (a held input), one per local replica.
std::vector<py::object> new_outputs(const CrossDeviceOps& ops, const Tensor& like,
                                    const Shape& shape, size_t n, const std::string& name) {
  if (like.device().is_cuda()) {
    throw_invalid(name + " must be given for GPU buffers (only host outputs are allocated)");
  }
  (void)ops;
  std::vector<py::object> out;
  for (size_t i = 0; i < n; ++i) out.push_back(new_numpy(like.dtype(), shape));
  return out;
}

py::object result_of(const std::vector<py::object>& outputs, bool single) {
  if (single && outputs.size() == 1) return outputs[0];
  py::list l;
  for (const auto& o : outputs) l.append(o);
  return l;
}

// Issues `issue` (with the GIL released, under the backend's issue lock) and returns the outputs,
// or a Work for async_op.
template <typename Issue>
py::object finish(PyBackend& b, std::unique_ptr<PyWork> w, Issue&& issue, bool async_op) {
  {
    py::gil_scoped_release release;
    std::lock_guard lock(b.issue);
    w->work = issue(*b.get());
  }
  if (async_op) return py::cast(std::move(w));
  py::object work = py::cast(std::move(w));
  try {
    return work.cast<PyWork&>().wait(kForever);
  } catch (py::error_already_set& e) {
    // Interrupted (KeyboardInterrupt): the collective is still in flight and its buffers must
    // outlive it; the exception carries the Work (e.g. `except KeyboardInterrupt as e:
    // e.work.wait()`), and dropping it waits for the collective (bounded by its own timeout).
    if (!work.cast<PyWork&>().work.test()) {
      try {
        e.value().attr("work") = work;
      } catch (py::error_already_set&) {
      }
    }
    throw;
  }
}

// A registration of persistent buffers (Backend.register_buffers): it keeps the buffers and its
// backend alive while registered, and ends under the backend's issue lock (release(), a `with`
// block's end, or garbage collection).
struct PyRegistration {
  py::object backend;  // the PyBackend
  std::vector<HeldTensor> held;
  BufferRegistration registration;

  PyRegistration() = default;
  PyRegistration(const PyRegistration&) = delete;
  PyRegistration& operator=(const PyRegistration&) = delete;
  ~PyRegistration() {
    try {
      release();
    } catch (...) {
    }
  }
  void release() {
    if (backend) {
      PyBackend& b = backend.cast<PyBackend&>();
      py::gil_scoped_release unlocked;
      std::lock_guard lock(b.issue);
      registration.release();  // nothing when the backend was closed
    }
    held.clear();
    backend = py::object();
  }
};

std::unique_ptr<PyRegistration> register_buffers(py::object self, py::handle buffers) {
  PyBackend& b = self.cast<PyBackend&>();
  const std::shared_ptr<CrossDeviceOps> kept = b.get();
  CrossDeviceOps& ops = *kept;
  Args bufs = args_from(buffers);
  auto r = std::make_unique<PyRegistration>();
  PerReplica<Tensor> t(hold_all(ops, bufs.objects, Access::kWrite, "buffers", r->held));
  StatusOr<BufferRegistration> made = [&] {
    py::gil_scoped_release release;
    std::lock_guard lock(b.issue);
    return b.get()->register_buffers(t);  // again, under the lock: close() may have run
  }();
  r->registration = value_or_throw(std::move(made));
  r->backend = std::move(self);
  return r;
}

Shape gathered_shape(const Tensor& t, int n) {
  Shape s = t.shape();
  if (s.empty()) return {static_cast<int64_t>(n)};
  s[0] *= n;
  return s;
}

// The outputs the caller passed as `given`, or for None `count` new arrays like like[0], shaped
// shape_of(like[0]) and labelled `what`, returned as one array where `single`; `empty` is the
// error when there is no like[0] to go by.
template <typename ShapeOf>
Args given_or_new(CrossDeviceOps& ops, py::handle given, const PerReplica<Tensor>& like,
                  size_t count, bool single, const std::string& what, const std::string& empty,
                  ShapeOf&& shape_of) {
  if (!given.is_none()) return args_from(given);
  if (like.empty()) throw_invalid(empty);
  Args out;
  out.objects = new_outputs(ops, like[0], shape_of(like[0]), count, what);
  out.single = single;
  return out;
}

Shape scattered_shape(const Tensor& t, int n) {
  Shape s = t.shape();
  if (!s.empty() && s[0] % n == 0) {
    s[0] /= n;
    return s;
  }
  return {t.num_elements() / n};  // the front door says when this does not divide
}

py::object all_reduce(PyBackend& b, py::handle inputs, py::handle outputs, py::handle op,
                      bool async_op) {
  const std::shared_ptr<CrossDeviceOps> kept = b.get();
  CrossDeviceOps& ops = *kept;
  const ReduceOp rop = reduce_op_from(op);
  Args in = args_from(inputs);
  Args out = outputs.is_none() ? in : args_from(outputs);
  auto w = std::make_unique<PyWork>();
  const bool in_place = outputs.is_none();
  PerReplica<Tensor> ti(hold_all(ops, in.objects, in_place ? Access::kWrite : Access::kRead,
                                 in_place ? "inputs (in place)" : "inputs", w->held));
  PerReplica<Tensor> to = in_place ? ti : PerReplica<Tensor>(hold_all(ops, out.objects,
                                                             Access::kWrite, "outputs", w->held));
  w->result = result_of(out.objects, in.single);
  return finish(b, std::move(w), [&](CrossDeviceOps& o) { return o.all_reduce(rop, ti, to); },
                async_op);
}

py::object reduce(PyBackend& b, py::handle value, py::handle destinations, py::handle op,
                  bool async_op) {
  const std::shared_ptr<CrossDeviceOps> kept = b.get();
  CrossDeviceOps& ops = *kept;
  const ReduceOp rop = reduce_op_from(op);
  Args in = args_from(value);
  auto w = std::make_unique<PyWork>();
  PerReplica<Tensor> tv(hold_all(ops, in.objects, Access::kRead, "value", w->held));
  Args out = given_or_new(ops, destinations, tv, ops.devices().size(), in.single, "destinations",
                          "value is empty: pass one buffer per local replica",
                          [](const Tensor& t) { return t.shape(); });
  Mirrored<Tensor> td(hold_all(ops, out.objects, Access::kWrite, "destinations", w->held));
  w->result = result_of(out.objects, out.single);
  return finish(b, std::move(w), [&](CrossDeviceOps& o) { return o.reduce(rop, tv, td); },
                async_op);
}

py::object batch_reduce(PyBackend& b, py::handle pairs, py::handle op, bool async_op) {
  const std::shared_ptr<CrossDeviceOps> kept = b.get();
  CrossDeviceOps& ops = *kept;
  const ReduceOp rop = reduce_op_from(op);
  auto w = std::make_unique<PyWork>();
  std::vector<ReducePair> rp;
  py::list results;
  size_t k = 0;
  for (py::handle pair : pairs) {
    const std::string at = "pairs[" + std::to_string(k++) + "]";
    py::tuple t(py::reinterpret_borrow<py::object>(pair));
    if (t.size() != 2 && t.size() != 1) {
      throw_invalid(at + " must be (value, destinations) or (value,)");
    }
    Args in = args_from(t[0]);
    ReducePair p;
    p.value = PerReplica<Tensor>(hold_all(ops, in.objects, Access::kRead, at + ".value", w->held));
    Args out = given_or_new(ops, t.size() == 1 ? py::handle(py::none()) : py::handle(t[1]), p.value,
                            ops.devices().size(), in.single, at + ".destinations",
                            at + ".value is empty", [](const Tensor& v) { return v.shape(); });
    p.destinations = Mirrored<Tensor>(hold_all(ops, out.objects, Access::kWrite,
                                               at + ".destinations", w->held));
    rp.push_back(std::move(p));
    results.append(result_of(out.objects, out.single));
  }
  w->result = results;
  return finish(b, std::move(w), [&](CrossDeviceOps& o) { return o.batch_reduce(rop, rp); },
                async_op);
}

py::object broadcast(PyBackend& b, py::handle source, py::handle destinations, int root,
                     bool async_op) {
  const std::shared_ptr<CrossDeviceOps> kept = b.get();
  CrossDeviceOps& ops = *kept;
  auto w = std::make_unique<PyWork>();
  // Off the root the source is ignored (as in C++ and C): None there, with destinations given.
  Tensor src;
  if (source.is_none() && !destinations.is_none()) {
    if (root == ops.rank()) throw_invalid("broadcast: the root process must pass a source");
  } else {
    w->held.push_back(hold_tensor(source, replica_device(ops, 0), Access::kRead, "source"));
    src = w->held.back().tensor;
  }
  Args out;
  if (destinations.is_none()) {
    out.objects = new_outputs(ops, src, src.shape(), ops.devices().size(), "destinations");
    out.single = true;
  } else {
    out = args_from(destinations);
  }
  Mirrored<Tensor> td(hold_all(ops, out.objects, Access::kWrite, "destinations", w->held));
  w->result = result_of(out.objects, out.single);
  return finish(b, std::move(w), [&](CrossDeviceOps& o) { return o.broadcast(src, td, root); },
                async_op);
}

py::object all_gather(PyBackend& b, py::handle inputs, py::handle outputs, bool async_op) {
  const std::shared_ptr<CrossDeviceOps> kept = b.get();
  CrossDeviceOps& ops = *kept;
  Args in = args_from(inputs);
  auto w = std::make_unique<PyWork>();
  PerReplica<Tensor> ti(hold_all(ops, in.objects, Access::kRead, "inputs", w->held));
  Args out =
      given_or_new(ops, outputs, ti, ti.size(), in.single, "outputs",
                   "inputs is empty: pass one buffer per local replica",
                   [&](const Tensor& t) { return gathered_shape(t, ops.num_replicas_in_sync()); });
  PerReplica<Tensor> to(hold_all(ops, out.objects, Access::kWrite, "outputs", w->held));
  w->result = result_of(out.objects, out.single);
  return finish(b, std::move(w), [&](CrossDeviceOps& o) { return o.all_gather(ti, to); },
                async_op);
}

py::object reduce_scatter(PyBackend& b, py::handle inputs, py::handle outputs, py::handle op,
                          bool async_op) {
  const std::shared_ptr<CrossDeviceOps> kept = b.get();
  CrossDeviceOps& ops = *kept;
  const ReduceOp rop = reduce_op_from(op);
  Args in = args_from(inputs);
  auto w = std::make_unique<PyWork>();
  PerReplica<Tensor> ti(hold_all(ops, in.objects, Access::kRead, "inputs", w->held));
  Args out =
      given_or_new(ops, outputs, ti, ti.size(), in.single, "outputs",
                   "inputs is empty: pass one buffer per local replica",
                   [&](const Tensor& t) { return scattered_shape(t, ops.num_replicas_in_sync()); });
  PerReplica<Tensor> to(hold_all(ops, out.objects, Access::kWrite, "outputs", w->held));
  w->result = result_of(out.objects, out.single);
  return finish(b, std::move(w), [&](CrossDeviceOps& o) { return o.reduce_scatter(rop, ti, to); },
                async_op);
}

}  // namespace

void bind_ops(py::module_& m) {
  py::enum_<ReduceOp>(m, "ReduceOp", "How values are reduced (strings 'sum', 'mean', ... work too).")
      .value("SUM", ReduceOp::kSum)
      .value("MEAN", ReduceOp::kMean)
      .value("MIN", ReduceOp::kMin)
      .value("MAX", ReduceOp::kMax)
      .value("PROD", ReduceOp::kProd);

  py::class_<PyRegistration>(m, "Registration",
                             "Registered buffers (Backend.register_buffers), held until released.")
      .def("release", &PyRegistration::release,
           "Ends the registration on this process (every process must, at the same point).")
      .def_property_readonly("active",
                             [](const PyRegistration& r) { return r.registration.active(); })
      .def_property_readonly("id", [](const PyRegistration& r) { return r.registration.id(); })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyRegistration& r, py::args) { r.release(); });

  py::class_<PyWork>(m, "Work", "An issued collective (async_op=True).")
      .def(
          "wait",
          [](PyWork& w, py::handle timeout) { return w.wait(timeout_from(timeout, kForever)); },
          py::arg("timeout") = py::none(),
          "Waits up to `timeout` seconds (None: until done) and returns the outputs; raises the "
          "collective's error, or DeadlineExceededError when the wait timed out first (the "
          "collective then goes on). Ctrl-C raises KeyboardInterrupt within ~100 ms; the "
          "collective stays in flight (wait again, or let its own timeout end it).")
      .def(
          "done", [](const PyWork& w) { return w.work.test(); },
          "True once the collective has completed, successfully or not.")
      .def(
          "error",
          [](const PyWork& w) -> py::object {
            Status s = w.work.error();
            if (s.ok()) return py::none();
            return exception_for(s);
          },
          "The exception of a failed collective; None while pending or after success.")
      .def_property_readonly(
          "elapsed",
          [](const PyWork& w) { return std::chrono::duration<double>(w.work.elapsed()).count(); },
          "Seconds from issue to completion (0 while pending).")
      .def("__repr__", [](const PyWork& w) {
        return std::string("<tributary.Work ") + (w.work.test() ? "done" : "pending") + ">";
      });

  py::class_<PyContext>(m, "Context",
                        "This process's replicas and its place in the cluster (rank, world size), "
                        "joined once; make backends from it with backend().")
      .def_property_readonly("rank", [](const PyContext& c) { return c.context.rank; })
      .def_property_readonly("world_size", [](const PyContext& c) { return c.context.world_size; })
      .def_property_readonly("devices", [](const PyContext& c) { return device_names(c.context.devices); })
      .def("backend", [](const PyContext& c, std::optional<std::string> spec) {
             return create_backend(spec, c.context);
           }, py::arg("spec") = py::none(), py::keep_alive<0, 1>(),
           "A backend from a spec ('ring:timeout=30s', 'auto', ...); None: the config's "
           "TRIBUTARY_CROSS_DEVICE_OPS, else 'auto'.");

  m.def("make_context", [](py::handle devices, py::handle timeout) {
          std::vector<Device> d = devices_from(devices, {Device::cpu(0)});
          std::optional<std::chrono::milliseconds> t;
          if (!timeout.is_none()) t = timeout_from(timeout, kForever);
          StatusOr<BackendContext> c = [&] {
            py::gil_scoped_release release;
            return make_context(d, t, std::nullopt);
          }();
          return std::make_unique<PyContext>(value_or_throw(std::move(c)));
        }, py::arg("devices") = py::none(), py::arg("timeout") = py::none(),
        "Joins the cluster described by the environment (tributary-run, TF_CONFIG, torchrun, "
        "Slurm, Open MPI; a single process otherwise) with `devices` as this process's replicas "
        "(a list like ['CPU:0', 'CPU:1'], or a number of CPU replicas; default CPU:0). `timeout`: "
        "seconds to wait for every process (default: TRIBUTARY_TIMEOUT, else 5 minutes).");

  m.def("backend", [](std::optional<std::string> spec, py::handle devices) {
          std::vector<Device> d = devices_from(devices, {Device::cpu(0)});
          StatusOr<BackendContext> c = [&] {
            py::gil_scoped_release release;
            return make_context(d, std::nullopt, spec);
          }();
          return create_backend(spec, value_or_throw(std::move(c)));
        }, py::arg("spec") = py::none(), py::arg("devices") = py::none(),
        "A backend (CrossDeviceOps) from a spec such as 'ring:timeout=30s', 'hierarchical_copy:"
        "num_packs=2' or 'auto'; None takes TRIBUTARY_CROSS_DEVICE_OPS from the environment, else "
        "'auto', as the C++ programs do. Joins the cluster from the environment as make_context "
        "does; while another backend or context of the job is alive in this process, through its "
        "connection. Every process must create its backends in the same order.");

  py::class_<PyBackend>(m, "Backend",
                        "A CrossDeviceOps: collectives over this process's replicas "
                        "times the processes of the cluster. A synchronous collective's wait "
                        "is interruptible: Ctrl-C raises KeyboardInterrupt, the collective "
                        "stays in flight, and the exception's `work` attribute is its Work.")
      .def("all_reduce", &all_reduce, py::arg("inputs"), py::arg("outputs") = py::none(),
           py::arg("op") = "sum", py::kw_only(), py::arg("async_op") = false,
           "Reduces the replicas' inputs into every output (outputs=None: in place).")
      .def("register_buffers", &register_buffers, py::arg("buffers"),
           "Registers buffers that later collectives use (one per local replica), as NCCL's "
           "ncclCommRegister: gloo then all-reduces into them without a copy and, with "
           "verify=false, without the ranks' agreement per call; ring between processes of one "
           "host, on arrays from shareable_array, runs all-reduces, all-gathers and broadcasts "
           "into them and reduce-scatters (and out-of-place all-reduces) from them straight "
           "from every process's array; "
           "other backends change nothing. Collective: every process registers, uses and "
           "releases at the same points. Returns a Registration (release(), or use it in a "
           "`with` block).")
      .def("reduce", &reduce, py::arg("value"), py::arg("destinations") = py::none(),
           py::arg("op") = "sum", py::kw_only(), py::arg("async_op") = false,
           "Reduces the replicas' values into every destination buffer (None: new arrays, one "
           "per local replica).")
      .def("batch_reduce", &batch_reduce, py::arg("pairs"), py::arg("op") = "sum", py::kw_only(),
           py::arg("async_op") = false,
           "Several reduce()s in one call: pairs of (value, destinations or None); returns the "
           "destinations of each pair.")
      .def("broadcast", &broadcast, py::arg("source"), py::arg("destinations") = py::none(),
           py::arg("root") = 0, py::kw_only(), py::arg("async_op") = false,
           "Copies `source` of process `root` into every destination of every process. Off the "
           "root the source is not read: it may be None when destinations are given.")
      .def("all_gather", &all_gather, py::arg("inputs"), py::arg("outputs") = py::none(),
           py::kw_only(), py::arg("async_op") = false,
           "Concatenates every replica's input along axis 0 (global replica order) into each "
           "output.")
      .def("reduce_scatter", &reduce_scatter, py::arg("inputs"), py::arg("outputs") = py::none(),
           py::arg("op") = "sum", py::kw_only(), py::arg("async_op") = false,
           "Output i = the reduction of every input's slice i (i = global replica id).")
      .def_property_readonly("name", [](const PyBackend& b) { return b.get()->name(); })
      .def_property_readonly("spec", [](const PyBackend& b) { return b.get()->spec(); })
      .def_property_readonly("rank", [](const PyBackend& b) { return b.get()->rank(); })
      .def_property_readonly("world_size", [](const PyBackend& b) { return b.get()->world_size(); })
      .def_property_readonly("num_local_replicas",
                             [](const PyBackend& b) { return b.get()->num_local_replicas(); })
      .def_property_readonly("num_replicas_in_sync",
                             [](const PyBackend& b) { return b.get()->num_replicas_in_sync(); })
      .def_property_readonly("devices",
                             [](const PyBackend& b) { return device_names(b.get()->devices()); })
      .def_property_readonly(
          "timeout",
          [](const PyBackend& b) {
            return std::chrono::duration<double>(b.get()->timeout()).count();
          },
          "Seconds every collective of this backend may take.")
      .def_property_readonly("capabilities",
                             [](const PyBackend& b) { return b.get()->capabilities().to_string(); })
      .def_property_readonly("last_sequence",
                             [](const PyBackend& b) { return b.get()->last_sequence(); })
      .def(
          "check", [](const PyBackend& b) { check(b.get()->broken()); },
          "Raises the first failure of a collective, after which the backend refuses every call.")
      .def(
          "abort",
          [](PyBackend& b, const std::string& why) {
            py::gil_scoped_release release;
            b.get()->abort(aborted(why));
          },
          py::arg("why"),
          "Gives up on the group; in a multi-process group the peers are told. Thread-safe: a "
          "collective in flight on another thread fails with `why`, usually within "
          "milliseconds (gloo: only before Gloo's own algorithm runs).")
      .def(
          "close", [](PyBackend& b) { b.close(); },
          "Destroys the backend now (its collectives must be complete).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyBackend& b, py::args) { b.close(); })
      .def("__repr__", [](const PyBackend& b) {
        const std::shared_ptr<CrossDeviceOps> o = b.peek();
        if (!o) return std::string("<tributary.Backend (closed)>");
        return "<tributary.Backend " + o->spec() + " rank " + std::to_string(o->rank()) + "/" +
               std::to_string(o->world_size()) + " devices " +
               std::to_string(o->num_local_replicas()) + ">";
      });
}

}  // namespace tributary::python

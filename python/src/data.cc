// tributary.Dataset (a small tf.data: slices, shuffle, batch, repeat, ...) and distributed
// datasets: Strategy.experimental_distribute_dataset(dataset) yields a PerReplica of each
// replica's share of the global batch.
//
// Elements are tuples of NumPy arrays (read-only views of the library's values); a dataset made
// from one array (a Python list is one array, as in tf.data) yields arrays, as tf.data does. A
// distributed dataset yields a PerReplica for one-array elements, else a tuple of PerReplica.
// map() and filter() take Python functions: they run wherever the pipeline pulls an element (on
// the caller's thread inside next(), or on a prefetch thread), each call holding the GIL, which
// every blocking call of the pipeline releases.
#include <atomic>
#include <mutex>

#include "common.h"

namespace tributary::python {
namespace {

// Whether elements are one array rather than tuples: fixed by the source, or set by the last
// output of a map() function (a tuple return makes tuples), so shared by the datasets and
// iterators downstream. Unknown (-1) until such a function has run; a dataset made of others
// (concatenate, one pipeline per replica) takes the first of theirs that is known.
struct Structure {
  std::atomic<int> own{-1};
  std::vector<std::shared_ptr<const Structure>> same_as;

  int get() const {
    if (const int v = own.load(); v >= 0) return v;
    for (const auto& other : same_as) {
      if (const int v = other->get(); v >= 0) return v;
    }
    return -1;
  }
};
using Single = std::shared_ptr<Structure>;
Single make_single(bool single) {
  auto s = std::make_shared<Structure>();
  s->own = single ? 1 : 0;
  return s;
}
Single unknown_single() { return std::make_shared<Structure>(); }
Single either(std::vector<std::shared_ptr<const Structure>> alternatives) {
  auto s = std::make_shared<Structure>();
  s->same_as = std::move(alternatives);
  return s;
}
// Unknown counts as one array: a single-component element is an array unless a function said
// tuple.
bool is_single(const Single& s) { return s->get() != 0; }

// The pipeline behind a Python iterator. Live ones are listed so that an atexit hook stops them
// (their prefetch threads may be about to run Python functions) before the interpreter finalizes.
struct IteratorCore {
  std::mutex mu;  // one next() at a time: tf.data's iterators may be shared between threads
  std::unique_ptr<DatasetIterator> dataset_it;
  std::optional<DistributedIterator> distributed_it;
  bool stopped = false;

  // Stops the pipeline's threads, with the GIL released (they may be waiting for it).
  void stop() {
    std::optional<py::gil_scoped_release> release;
    if (PyGILState_Check()) release.emplace();
    std::lock_guard lock(mu);
    stopped = true;
    dataset_it.reset();
    distributed_it.reset();
  }
};

std::mutex& live_mu() {
  static auto* mu = new std::mutex;  // never destroyed: used until the process ends
  return *mu;
}
std::vector<std::weak_ptr<IteratorCore>>& live_iterators() {
  static auto* live = new std::vector<std::weak_ptr<IteratorCore>>;
  return *live;
}

std::shared_ptr<IteratorCore> new_core() {
  auto core = std::make_shared<IteratorCore>();
  std::lock_guard lock(live_mu());
  auto& live = live_iterators();
  std::erase_if(live, [](const std::weak_ptr<IteratorCore>& w) { return w.expired(); });
  live.push_back(core);
  return core;
}

void stop_live_iterators() {
  std::vector<std::shared_ptr<IteratorCore>> cores;
  {
    std::lock_guard lock(live_mu());
    for (const auto& w : live_iterators()) {
      if (auto c = w.lock()) cores.push_back(std::move(c));
    }
  }
  for (const auto& c : cores) c->stop();
}

Status stopped_iterator() {
  return failed_precondition("this iterator was stopped: the interpreter is exiting");
}

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

struct PyDataset {
  Dataset dataset;
  Single single = make_single(false);

  PyDataset then(Dataset d) const {
    check(d.status());
    return PyDataset{std::move(d), single};
  }
};

struct PyDatasetIterator {
  std::shared_ptr<IteratorCore> core;
  Single single;
  PyDatasetIterator(std::unique_ptr<DatasetIterator> i, Single s)
      : core(new_core()), single(std::move(s)) {
    core->dataset_it = std::move(i);
  }
  PyDatasetIterator(PyDatasetIterator&&) = default;
  // Its prefetch threads may be waiting for the GIL to run a map() function: let them finish.
  ~PyDatasetIterator() {
    if (core) core->stop();
  }
};

struct PyDistributedDataset {
  DistributedDataset dataset;
  Single single;
  py::object strategy;  // keeps the strategy alive
};

// TF's tf.experimental.Optional of a distributed element.
struct PyOptional {
  std::optional<py::object> value;
};

struct PyDistributedIterator {
  std::shared_ptr<IteratorCore> core;
  Single single;
  py::object strategy;
  PyDistributedIterator(DistributedIterator i, Single s, py::object st)
      : core(new_core()), single(std::move(s)), strategy(std::move(st)) {
    core->distributed_it.emplace(std::move(i));
  }
  PyDistributedIterator(PyDistributedIterator&&) = default;
  ~PyDistributedIterator() {
    if (core) core->stop();
  }
  // Elements are PerReplica in multi-worker mode or with several local replicas (TF).
  bool wrap() const {
    const Strategy& s = strategy.cast<const Strategy&>();
    return s.num_workers() > 1 || s.num_local_replicas() > 1;
  }
};

// A Python function captured by a pipeline function: released with the GIL, by whichever thread
// drops the last copy (a prefetch thread included).
struct HeldFunction {
  py::object fn;
  explicit HeldFunction(py::object f) : fn(std::move(f)) {}
  ~HeldFunction() {
    py::gil_scoped_acquire gil;
    fn = py::object();
  }
};

py::object element_to_python(const Element& e, bool single) {
  if (single && e.size() == 1) return to_numpy(e[0]);
  py::tuple t(e.size());
  for (size_t i = 0; i < e.size(); ++i) t[i] = to_numpy(e[i]);
  return t;
}

// tf.data's structure: a tuple is a tuple of components; anything else (a list included, as
// np.asarray makes it) is one tensor.
std::vector<Array> components_from(py::handle components, bool& single) {
  std::vector<Array> out;
  if (py::isinstance<py::dict>(components)) {
    throw_type(
        "Dataset elements that are dicts are not supported; pass a tuple of arrays "
        "(e.g. tuple(d.values()))");
  }
  if (py::isinstance<py::tuple>(components)) {
    size_t i = 0;
    for (py::handle c : components) {
      out.push_back(array_from(c, "components[" + std::to_string(i++) + "]"));
    }
    single = false;
  } else {
    out.push_back(array_from(components, "components"));
    single = true;
  }
  return out;
}

// What a Python function (map, from_generator) gave as an element, its structure recorded in
// `structure`. `gave` ("the map function returned") and `part` ("the map function's result") name
// it in errors: InvalidArgument for what is not an array or a tuple of arrays.
StatusOr<Element> element_from_python(py::handle value, Structure& structure, const char* gave,
                                      const char* part) {
  try {
    bool single = true;
    Element e = components_from(value, single);
    structure.own.store(single ? 1 : 0);
    return e;
  } catch (py::error_already_set& x) {
    return invalid_argument(std::string(gave) +
                            " what is not an array or a tuple of arrays: " + x.what());
  } catch (const StatusError& x) {
    return x.status().with_context(part);
  }
}

// A distributed element: a PerReplica of arrays for single-component elements, else TF's
// structure: the tuple of components, each a PerReplica.
// One local replica on one worker (TF's _create_per_replica, which wraps only in multi-worker
// mode or with several local replicas): the element itself.
py::object distributed_element(const PerReplica<Element>& per_replica, bool single, bool wrap) {
  const size_t ncomp = per_replica.size() ? per_replica[0].size() : 0;
  if (!wrap && per_replica.size() == 1) {
    if (single && ncomp == 1) return to_numpy(per_replica[0][0]);
    py::tuple t(ncomp);
    for (size_t j = 0; j < ncomp; ++j) t[j] = to_numpy(per_replica[0].at(j));
    return t;
  }
  if (single && ncomp == 1) {
    PerReplicaValue v;
    for (const Element& el : per_replica) v.values.push_back(to_numpy(el[0]));
    return py::cast(std::move(v));
  }
  py::tuple t(ncomp);
  for (size_t j = 0; j < ncomp; ++j) {
    PerReplicaValue v;
    for (const Element& el : per_replica) v.values.push_back(to_numpy(el.at(j)));
    t[j] = py::cast(std::move(v));
  }
  return t;
}

InputOptions options_from(py::handle options) {
  if (options.is_none()) return InputOptions{};
  if (!py::isinstance<InputOptions>(options)) {
    throw_type("options must be a tributary.InputOptions, got a " +
               std::string(py::str(options.get_type().attr("__name__"))));
  }
  return options.cast<InputOptions>();
}

PyDistributedDataset distribute(py::object strategy, const PyDataset& d, py::handle options) {
  Strategy& s = strategy.cast<Strategy&>();
  const InputOptions o = options_from(options);
  StatusOr<DistributedDataset> r = [&] {
    py::gil_scoped_release release;
    return distribute_dataset(s, d.dataset, o);
  }();
  return PyDistributedDataset{value_or_throw(std::move(r)), d.single, std::move(strategy)};
}

// TF's distribute_datasets_from_function: dataset_fn(InputContext) -> a tributary.Dataset
// batched by the per-replica batch size, called once per worker (or per replica).
PyDistributedDataset distribute_from_function(py::object strategy, py::function dataset_fn,
                                              py::handle options) {
  Strategy& s = strategy.cast<Strategy&>();
  const InputOptions o = options_from(options);
  std::vector<std::shared_ptr<const Structure>> structures;  // one per pipeline made
  std::optional<py::error_already_set> raised;
  auto fn = [&](const InputContext& ctx) -> StatusOr<Dataset> {
    py::gil_scoped_acquire gil;
    try {
      py::object made = dataset_fn(ctx);
      if (!py::isinstance<PyDataset>(made)) {
        return invalid_argument("it must return a tributary.Dataset, got a " +
                                std::string(py::str(made.get_type().attr("__name__"))));
      }
      const auto& d = made.cast<const PyDataset&>();
      structures.push_back(d.single);
      return d.dataset;
    } catch (py::error_already_set& e) {
      std::string what = e.what();
      raised.emplace(std::move(e));
      return aborted("dataset_fn raised " + what);
    }
  };
  StatusOr<DistributedDataset> r = [&] {
    py::gil_scoped_release release;
    return distribute_datasets_from_function(s, fn, o);
  }();
  if (raised) throw std::move(*raised);  // the function's own exception, as TF
  return PyDistributedDataset{value_or_throw(std::move(r)), either(std::move(structures)),
                              std::move(strategy)};
}

// TF's experimental_distribute_values_from_function: value_fn(ValueContext) per local replica, a
// PerReplica of whatever it returns.
py::object values_from_function(Strategy& s, py::function value_fn) {
  check(s.require_cross_replica("experimental_distribute_values_from_function"));
  if (s.kind() == StrategyKind::kDefault || s.kind() == StrategyKind::kOneDevice) {
    return value_fn(ValueContext{});  // TF's one-device strategies: the value itself
  }
  PerReplicaValue out;
  for (int i = 0; i < s.num_local_replicas(); ++i) {
    ValueContext ctx{s.worker_index() * s.num_local_replicas() + i, s.num_replicas_in_sync()};
    out.values.push_back(value_fn(ctx));
  }
  // TF regroups the results, always wrapped: a value_fn returning (a, b) gives (PerReplica(a...),
  // PerReplica(b...)).
  return regroup(py::cast(std::move(out)), Unwrap::kNever);
}

}  // namespace

namespace {
StatusOr<PerReplica<Element>> next_distributed(PyDistributedIterator& it) {
  py::gil_scoped_release release;
  std::lock_guard lock(it.core->mu);
  if (!it.core->distributed_it) return stopped_iterator();
  return it.core->distributed_it->get_next();
}

// A sequence of ints and Nones (a padded shape), not a sequence of shapes.
bool is_shape(py::handle h) {
  if (!py::isinstance<py::tuple>(h) && !py::isinstance<py::list>(h)) return false;
  for (py::handle d : h) {
    if (!d.is_none() && !py::hasattr(d, "__index__")) return false;  // ints, NumPy's too
  }
  return true;
}

// A padded shape from Python: a sequence of ints, None (or -1) for "the longest in the batch".
Shape shape_from(py::handle h) {
  Shape shape;
  for (py::handle d : h) {
    shape.push_back(d.is_none()
                        ? -1
                        : py::reinterpret_steal<py::int_>(PyNumber_Index(d.ptr())).cast<int64_t>());
  }
  return shape;
}
}  // namespace

void bind_data(py::module_& m) {
  py::class_<PyDataset>(m, "Dataset",
                        "A small tf.data.Dataset (from_tensor_slices, shuffle, batch, ...).")
      .def_static(
          "from_tensor_slices",
          [](py::handle components) {
            bool single = false;
            std::vector<Array> c = components_from(components, single);
            PyDataset d{Dataset::from_tensor_slices(std::move(c)), make_single(single)};
            check(d.dataset.status());
            return d;
          },
          py::arg("components"),
          "One element per row of dimension 0 of an array (a list is one array, as np.asarray "
          "makes it), or of each array of a tuple (elements are then tuples).")
      .def_static(
          "from_tensors",
          [](py::handle components) {
            bool single = false;
            std::vector<Array> c = components_from(components, single);
            PyDataset d{Dataset::from_tensors(std::move(c)), make_single(single)};
            check(d.dataset.status());
            return d;
          },
          py::arg("components"))
      .def_static(
          "from_generator",
          [](py::function generator) {
            // generator() gives an iterable (TF's contract); each iterator (epoch) calls it anew
            // and pulls its elements holding the GIL, wherever the pipeline runs.
            auto held = std::make_shared<HeldFunction>(std::move(generator));
            Single out = unknown_single();
            auto make = [held, out]() -> StatusOr<Generator> {
              if (interpreter_finalizing()) return stopped_iterator();
              py::gil_scoped_acquire gil;
              std::shared_ptr<HeldFunction> items;
              try {
                items = std::make_shared<HeldFunction>(py::iter(held->fn()));
              } catch (py::error_already_set& x) {
                return internal_error(std::string("the generator raised ") + x.what());
              }
              return Generator([items, out]() -> StatusOr<std::optional<Element>> {
                if (interpreter_finalizing()) return stopped_iterator();
                py::gil_scoped_acquire gil;
                py::object value;
                try {
                  PyObject* next = PyIter_Next(items->fn.ptr());
                  if (next == nullptr) {
                    if (PyErr_Occurred()) throw py::error_already_set();
                    return std::optional<Element>();
                  }
                  value = py::reinterpret_steal<py::object>(next);
                } catch (py::error_already_set& x) {
                  return internal_error(std::string("the generator raised ") + x.what());
                }
                TRIBUTARY_ASSIGN_OR_RETURN(Element e,
                                           element_from_python(value, *out, "the generator yielded",
                                                               "the generator's element"));
                return std::optional<Element>(std::move(e));
              });
            };
            PyDataset d{Dataset::from_generator(std::move(make)), out};
            check(d.dataset.status());
            return d;
          },
          py::arg("generator"),
          "TF's from_generator: generator() returns an iterable of elements (arrays, or tuples of "
          "arrays); each iteration of the dataset calls it anew. Its exceptions end the iteration "
          "with an InternalError naming them.")
      .def_static(
          "range",
          [](int64_t a, std::optional<int64_t> b, int64_t step) {
            PyDataset d{b ? Dataset::range(a, *b, step) : Dataset::range(a), make_single(true)};
            check(d.dataset.status());
            return d;
          },
          py::arg("start_or_stop"), py::arg("stop") = py::none(), py::arg("step") = 1)
      .def(
          "batch",
          [](const PyDataset& d, int64_t n, bool drop) { return d.then(d.dataset.batch(n, drop)); },
          py::arg("batch_size"), py::arg("drop_remainder") = false)
      .def(
          "repeat", [](const PyDataset& d, int64_t n) { return d.then(d.dataset.repeat(n)); },
          py::arg("count") = -1)
      .def(
          "shuffle",
          [](const PyDataset& d, int64_t buffer, uint64_t seed, bool reshuffle) {
            return d.then(d.dataset.shuffle(buffer, seed, reshuffle));
          },
          py::arg("buffer_size"), py::arg("seed"), py::arg("reshuffle_each_iteration") = true)
      .def(
          "shard",
          [](const PyDataset& d, int64_t n, int64_t i) { return d.then(d.dataset.shard(n, i)); },
          py::arg("num_shards"), py::arg("index"))
      .def(
          "take", [](const PyDataset& d, int64_t n) { return d.then(d.dataset.take(n)); },
          py::arg("count"))
      .def(
          "prefetch", [](const PyDataset& d, int64_t n) { return d.then(d.dataset.prefetch(n)); },
          py::arg("buffer_size"))
      .def(
          "map",
          [](const PyDataset& d, py::function fn) {
            // The function sees what iteration yields (one array, or a tuple's components as
            // separate arguments, as tf.data calls it); a tuple return makes tuple elements.
            auto held = std::make_shared<HeldFunction>(std::move(fn));
            Single in = d.single, out = unknown_single();
            MapFn map = [held, in, out](Element e) -> StatusOr<Element> {
              if (interpreter_finalizing()) return stopped_iterator();
              py::gil_scoped_acquire gil;
              py::object r;
              try {
                py::object args = element_to_python(e, is_single(in));
                r = py::isinstance<py::tuple>(args) ? held->fn(*args) : held->fn(args);
              } catch (py::error_already_set& x) {
                return internal_error(std::string("the map function raised ") + x.what());
              }
              return element_from_python(r, *out, "the map function returned",
                                         "the map function's result");
            };
            PyDataset mapped{d.dataset.map(std::move(map)), out};
            check(mapped.dataset.status());
            return mapped;
          },
          py::arg("map_func"),
          "Applies map_func to every element (tuple elements are passed as separate arguments); "
          "it runs, holding the GIL, wherever the pipeline pulls elements (a prefetch thread "
          "included). Its exceptions end the iteration with an InternalError naming them.")
      .def(
          "filter",
          [](const PyDataset& d, py::function fn) {
            auto held = std::make_shared<HeldFunction>(std::move(fn));
            Single in = d.single;
            FilterFn keep = [held, in](const Element& e) -> StatusOr<bool> {
              if (interpreter_finalizing()) return stopped_iterator();
              py::gil_scoped_acquire gil;
              try {
                py::object args = element_to_python(e, is_single(in));
                py::object r = py::isinstance<py::tuple>(args) ? held->fn(*args) : held->fn(args);
                return py::bool_(r).cast<bool>();
              } catch (py::error_already_set& x) {
                return internal_error(std::string("the filter predicate raised ") + x.what());
              }
            };
            return d.then(d.dataset.filter(std::move(keep)));
          },
          py::arg("predicate"),
          "The elements for which predicate(element) is true (tuple elements are passed as "
          "separate arguments).")
      .def(
          "skip", [](const PyDataset& d, int64_t n) { return d.then(d.dataset.skip(n)); },
          py::arg("count"))
      .def("unbatch", [](const PyDataset& d) { return d.then(d.dataset.unbatch()); })
      .def(
          "padded_batch",
          [](const PyDataset& d, int64_t n, py::handle shapes, py::handle values, bool drop) {
            // The arguments' own form says the elements' (a map's may not have run yet): a shape
            // is a sequence of ints and Nones, a tuple of shapes is for tuple elements.
            std::optional<std::vector<Shape>> padded;
            if (!shapes.is_none()) {
              padded.emplace();
              if (is_shape(shapes)) {
                padded->push_back(shape_from(shapes));
              } else {
                for (py::handle one : shapes) {
                  if (!is_shape(one)) {
                    throw_type(
                        "padded_shapes: expected a shape (a sequence of ints and Nones) "
                        "or a tuple of shapes, got " +
                        std::string(py::repr(shapes)));
                  }
                  padded->push_back(shape_from(one));
                }
              }
            }
            std::vector<double> fill;
            if (py::isinstance<py::tuple>(values) || py::isinstance<py::list>(values)) {
              for (py::handle v : values) fill.push_back(v.cast<double>());
            } else if (!values.is_none()) {
              // One value for every component.
              size_t n_components = padded ? padded->size() : d.dataset.element_spec().size();
              fill.assign(std::max<size_t>(n_components, 1), values.cast<double>());
            }
            return d.then(d.dataset.padded_batch(n, std::move(padded), std::move(fill), drop));
          },
          py::arg("batch_size"), py::arg("padded_shapes") = py::none(),
          py::arg("padding_values") = py::none(), py::arg("drop_remainder") = false,
          "batch() of elements whose shapes differ: each component padded at the end to its "
          "padded shape (None or -1: the longest in the batch; no shapes: every dimension), with "
          "its padding value (0 by default). For tuple elements, a tuple of shapes and of values.")
      .def(
          "concatenate",
          [](const PyDataset& d, const PyDataset& other) {
            const int a = d.single->get(), b = other.single->get();
            if (a >= 0 && b >= 0 && a != b) {
              throw_type("concatenate(): one dataset yields arrays and the other tuples");
            }
            PyDataset both{d.dataset.concatenate(other.dataset), either({d.single, other.single})};
            check(both.dataset.status());
            return both;
          },
          py::arg("dataset"))
      .def_static(
          "zip",
          [](py::args args) {
            // TF's Dataset.zip((a, b)) and, since TF 2.13, Dataset.zip(a, b); zip(a) is a's own
            // elements, as there.
            if (args.size() == 1 && py::isinstance<PyDataset>(args[0])) {
              return args[0].cast<PyDataset>();
            }
            py::handle items = args.size() == 1 ? args[0] : args;
            std::vector<Dataset> parts;
            for (py::handle h : items) {
              if (!py::isinstance<PyDataset>(h)) {
                throw_type("zip(): expected Datasets, got a " +
                           std::string(py::str(h.get_type().attr("__name__"))));
              }
              parts.push_back(h.cast<const PyDataset&>().dataset);
            }
            PyDataset z{Dataset::zip(std::move(parts)), make_single(false)};
            check(z.dataset.status());
            return z;
          },
          "Element k of every dataset side by side, as a tuple (their components in order); "
          "ends with the shortest.")
      .def("cardinality", [](const PyDataset& d) { return d.dataset.cardinality(); })
      .def_property_readonly(
          "element_spec",
          [](const PyDataset& d) { return element_spec_to_string(d.dataset.element_spec()); })
      .def("__iter__",
           [](const PyDataset& d) {
             StatusOr<std::unique_ptr<DatasetIterator>> it = [&] {
               py::gil_scoped_release release;
               return d.dataset.make_iterator();
             }();
             return PyDatasetIterator{value_or_throw(std::move(it)), d.single};
           })
      .def("__repr__", [](const PyDataset& d) {
        return "<tributary.Dataset " + d.dataset.debug_string() + ">";
      });

  py::class_<PyDatasetIterator>(m, "DatasetIterator")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", [](PyDatasetIterator& it) {
        StatusOr<std::optional<Element>> e = [&]() -> StatusOr<std::optional<Element>> {
          py::gil_scoped_release release;
          std::lock_guard lock(it.core->mu);
          if (!it.core->dataset_it) return stopped_iterator();
          return it.core->dataset_it->get_next();
        }();
        std::optional<Element> v = value_or_throw(std::move(e));
        if (!v) throw py::stop_iteration();
        return element_to_python(*v, is_single(it.single));
      });

  py::class_<PyDistributedDataset>(m, "DistributedDataset",
                                   "Strategy.experimental_distribute_dataset's result: iterate "
                                   "for a PerReplica of each replica's share of every batch (a "
                                   "tuple of PerReplica for tuple elements, as TF).")
      .def("__iter__",
           [](const PyDistributedDataset& d) {
             StatusOr<DistributedIterator> it = [&] {
               py::gil_scoped_release release;
               return d.dataset.make_iterator();
             }();
             return PyDistributedIterator{value_or_throw(std::move(it)), d.single, d.strategy};
           })
      .def_property_readonly("element_spec", [](const PyDistributedDataset& d) {
        return element_spec_to_string(d.dataset.element_spec());
      });

  // TF's tf.experimental.Optional, as get_next_as_optional() returns it.
  py::class_<PyOptional>(m, "Optional")
      .def("has_value", [](const PyOptional& o) { return o.value.has_value(); })
      .def(
          "get_value",
          [](const PyOptional& o) -> py::object {
            if (!o.value) throw_invalid("The optional variant does not have a value.");
            return *o.value;
          },
          "The value; TF's InvalidArgumentError when there is none.")
      .def("__repr__", [](const PyOptional& o) {
        return o.value ? "Optional(has_value=True)" : std::string("Optional(has_value=False)");
      });

  py::class_<PyDistributedIterator>(m, "DistributedIterator")
      .def("__iter__", [](py::object self) { return self; })
      .def(
          "get_next",
          [](PyDistributedIterator& it) {
            StatusOr<PerReplica<Element>> e = next_distributed(it);
            return distributed_element(value_or_throw(std::move(e)), is_single(it.single),
                                       it.wrap());
          },
          "The next batch: a PerReplica, or a tuple of PerReplica (one per component) for "
          "tuple elements; with one replica on one worker, the batch itself (as TF); "
          "OutOfRangeError at the end of data (TF's get_next).")
      .def(
          "get_next_as_optional",
          [](PyDistributedIterator& it) {
            StatusOr<PerReplica<Element>> e = next_distributed(it);
            PyOptional out;
            if (!e.ok() && e.status().code() == StatusCode::kOutOfRange) return out;
            out.value =
                distributed_element(value_or_throw(std::move(e)), is_single(it.single), it.wrap());
            return out;
          },
          "TF's get_next_as_optional: an Optional holding the next batch, empty at the end of "
          "data (on several workers, when no worker has data left), e.g. "
          "`while (o := it.get_next_as_optional()).has_value(): strategy.run(step, "
          "args=(o.get_value(),))`.")
      .def("__next__", [](PyDistributedIterator& it) {
        StatusOr<PerReplica<Element>> e = next_distributed(it);
        if (!e.ok() && e.status().code() == StatusCode::kOutOfRange) throw py::stop_iteration();
        return distributed_element(value_or_throw(std::move(e)), is_single(it.single), it.wrap());
      });

  // Live iterators are stopped when the interpreter starts to exit, before it finalizes: their
  // prefetch threads may be waiting to run a map() function, and a thread that takes the GIL
  // during finalization is ended on the spot.
  py::module_::import("atexit").attr("register")(py::cpp_function(&stop_live_iterators));

  // Strategy's input methods live here with the dataset types.
  py::enum_<InputReplicationMode>(m, "InputReplicationMode")
      .value("PER_WORKER", InputReplicationMode::kPerWorker)
      .value("PER_REPLICA", InputReplicationMode::kPerReplica);
  py::enum_<AutoShardPolicy>(m, "AutoShardPolicy")
      .value("OFF", AutoShardPolicy::kOff)
      .value("AUTO", AutoShardPolicy::kAuto)
      .value("FILE", AutoShardPolicy::kFile)
      .value("DATA", AutoShardPolicy::kData);
  py::class_<InputOptions>(m, "InputOptions",
                           "TF's tf.distribute.InputOptions (its experimental_ names), plus the "
                           "auto-shard policy TF sets through tf.data.Options.")
      .def(py::init([](py::handle fetch_to_device, InputReplicationMode mode, bool place_on_device,
                       int buffer, AutoShardPolicy policy) {
             if (buffer < 0) throw_invalid("experimental_per_replica_buffer_size must be >= 0");
             // TF's None means the default, True.
             const bool fetch = fetch_to_device.is_none() || fetch_to_device.cast<bool>();
             return InputOptions{fetch, mode, place_on_device, buffer, policy};
           }),
           py::arg("experimental_fetch_to_device") = py::none(),
           py::arg("experimental_replication_mode") = InputReplicationMode::kPerWorker,
           py::arg("experimental_place_dataset_on_device") = false,
           py::arg("experimental_per_replica_buffer_size") = 1,
           py::arg("auto_shard_policy") = AutoShardPolicy::kAuto)
      .def_readonly("experimental_fetch_to_device", &InputOptions::fetch_to_device)
      .def_readonly("experimental_replication_mode", &InputOptions::replication_mode)
      .def_readonly("experimental_place_dataset_on_device", &InputOptions::place_dataset_on_device)
      .def_readonly("experimental_per_replica_buffer_size", &InputOptions::per_replica_buffer_size)
      .def_readonly("auto_shard_policy", &InputOptions::auto_shard_policy);
  py::class_<InputContext>(m, "InputContext", "TF's tf.distribute.InputContext.")
      .def(py::init<int, int, int>(), py::arg("num_input_pipelines") = 1,
           py::arg("input_pipeline_id") = 0, py::arg("num_replicas_in_sync") = 1)
      .def_property_readonly("num_input_pipelines", &InputContext::num_input_pipelines)
      .def_property_readonly("input_pipeline_id", &InputContext::input_pipeline_id)
      .def_property_readonly("num_replicas_in_sync", &InputContext::num_replicas_in_sync)
      .def(
          "get_per_replica_batch_size",
          [](const InputContext& c, int64_t global) {
            return value_or_throw(c.get_per_replica_batch_size(global));
          },
          py::arg("global_batch_size"))
      .def("__repr__", &InputContext::to_string);
  py::class_<ValueContext>(m, "ValueContext", "TF's tf.distribute.experimental.ValueContext.")
      .def(py::init([](int id, int n) {
             return ValueContext{id, n};
           }),
           py::arg("replica_id_in_sync_group") = 0, py::arg("num_replicas_in_sync") = 1)
      .def_readonly("replica_id_in_sync_group", &ValueContext::replica_id_in_sync_group)
      .def_readonly("num_replicas_in_sync", &ValueContext::num_replicas_in_sync);

  auto strategy = py::reinterpret_borrow<py::object>(m.attr("Strategy"));
  // is_method first: pybind11 then names the first parameter `self` and the args the others.
  py::cpp_function from_fn(&distribute_from_function, py::is_method(strategy),
                           py::arg("dataset_fn"), py::arg("options") = py::none(),
                           py::name("distribute_datasets_from_function"), py::sibling(py::none()),
                           "dataset_fn(InputContext) builds each worker's input pipeline (each "
                           "replica's with InputReplicationMode.PER_REPLICA), batched by the "
                           "per-replica batch size; iterate for PerReplica batches.");
  strategy.attr("distribute_datasets_from_function") = from_fn;
  strategy.attr("experimental_distribute_datasets_from_function") = from_fn;
  py::cpp_function values_fn(&values_from_function, py::is_method(strategy), py::arg("value_fn"),
                             py::name("experimental_distribute_values_from_function"),
                             py::sibling(py::none()),
                             "value_fn(ValueContext) once per local replica: a PerReplica of "
                             "what it returns.");
  strategy.attr("experimental_distribute_values_from_function") = values_fn;
  py::cpp_function distribute_fn(
      &distribute, py::is_method(strategy), py::arg("dataset"), py::arg("options") = py::none(),
      py::name("experimental_distribute_dataset"), py::sibling(py::none()),
      "Splits each global batch of `dataset` across the replicas (and "
      "shards it across workers): iterate for PerReplica batches.");
  strategy.attr("experimental_distribute_dataset") = distribute_fn;
  strategy.attr("distribute_dataset") = distribute_fn;
}

}  // namespace tributary::python

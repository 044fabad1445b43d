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

#include "common.h"

namespace tributary::python {
namespace {

// Whether elements are one array rather than tuples: fixed by the source, or set by the last
// output of a map() function (a tuple return makes tuples), so shared by the datasets and
// iterators downstream.
using Single = std::shared_ptr<std::atomic<bool>>;
Single make_single(bool single) { return std::make_shared<std::atomic<bool>>(single); }

struct PyDataset {
  Dataset dataset;
  Single single = make_single(false);

  PyDataset then(Dataset d) const {
    check(d.status());
    return PyDataset{std::move(d), single};
  }
};

struct PyDatasetIterator {
  std::unique_ptr<DatasetIterator> it;
  Single single;
  PyDatasetIterator(std::unique_ptr<DatasetIterator> i, Single s)
      : it(std::move(i)), single(std::move(s)) {}
  PyDatasetIterator(PyDatasetIterator&&) = default;
  // Its prefetch threads may be waiting for the GIL to run a map() function: let them finish.
  ~PyDatasetIterator() {
    if (it && PyGILState_Check()) {
      py::gil_scoped_release release;
      it.reset();
    }
  }
};

struct PyDistributedDataset {
  DistributedDataset dataset;
  Single single;
  py::object strategy;  // keeps the strategy alive
};

struct PyDistributedIterator {
  std::optional<DistributedIterator> it;
  Single single;
  py::object strategy;
  PyDistributedIterator(std::optional<DistributedIterator> i, Single s, py::object st)
      : it(std::move(i)), single(std::move(s)), strategy(std::move(st)) {}
  PyDistributedIterator(PyDistributedIterator&&) = default;
  ~PyDistributedIterator() {
    if (it && PyGILState_Check()) {
      py::gil_scoped_release release;
      it.reset();
    }
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

// A distributed element: a PerReplica of arrays for single-component elements, else TF's
// structure: the tuple of components, each a PerReplica.
py::object distributed_element(const PerReplica<Element>& per_replica, bool single) {
  const size_t ncomp = per_replica.size() ? per_replica[0].size() : 0;
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

PyDistributedDataset distribute(py::object strategy, const PyDataset& d) {
  Strategy& s = strategy.cast<Strategy&>();
  StatusOr<DistributedDataset> r = [&] {
    py::gil_scoped_release release;
    return distribute_dataset(s, d.dataset);
  }();
  return PyDistributedDataset{value_or_throw(std::move(r)), d.single, std::move(strategy)};
}

}  // namespace

namespace {
// A padded shape from Python: a sequence of ints, None (or -1) for "the longest in the batch".
Shape shape_from(py::handle h) {
  Shape shape;
  for (py::handle d : h) shape.push_back(d.is_none() ? -1 : d.cast<int64_t>());
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
            Single in = d.single, out = make_single(true);
            MapFn map = [held, in, out](Element e) -> StatusOr<Element> {
              py::gil_scoped_acquire gil;
              try {
                py::object args = element_to_python(e, *in);
                py::object r = py::isinstance<py::tuple>(args) ? held->fn(*args) : held->fn(args);
                bool single = true;
                Element result = components_from(r, single);
                out->store(single);
                return result;
              } catch (py::error_already_set& x) {
                return internal_error(std::string("the map function raised ") + x.what());
              } catch (const StatusError& x) {
                return x.status().with_context("the map function's result");
              }
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
              py::gil_scoped_acquire gil;
              try {
                py::object args = element_to_python(e, *in);
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
            std::optional<std::vector<Shape>> padded;
            if (!shapes.is_none()) {
              padded.emplace();
              if (*d.single) {
                padded->push_back(shape_from(shapes));
              } else {
                for (py::handle one : shapes) padded->push_back(shape_from(one));
              }
            }
            std::vector<double> fill;
            if (!values.is_none()) {
              if (*d.single) {
                fill.push_back(values.cast<double>());
              } else {
                for (py::handle v : values) fill.push_back(v.cast<double>());
              }
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
            if (*d.single != *other.single) {
              throw_type("concatenate(): one dataset yields arrays and the other tuples");
            }
            return d.then(d.dataset.concatenate(other.dataset));
          },
          py::arg("dataset"))
      .def_static(
          "zip",
          [](py::args args) {
            // TF's Dataset.zip((a, b)) and, since TF 2.13, Dataset.zip(a, b).
            py::handle items =
                args.size() == 1 && !py::isinstance<PyDataset>(args[0]) ? args[0] : args;
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
             StatusOr<std::optional<Element>> e = [&] {
               py::gil_scoped_release release;
               return it.it->get_next();
             }();
             std::optional<Element> v = value_or_throw(std::move(e));
             if (!v) throw py::stop_iteration();
             return element_to_python(*v, *it.single);
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

  py::class_<PyDistributedIterator>(m, "DistributedIterator")
      .def("__iter__", [](py::object self) { return self; })
      .def(
          "get_next",
          [](PyDistributedIterator& it) {
            StatusOr<PerReplica<Element>> e = [&] {
              py::gil_scoped_release release;
              return it.it->get_next();
            }();
            return distributed_element(value_or_throw(std::move(e)), *it.single);
          },
          "The next batch: a PerReplica, or a tuple of PerReplica (one per component) for "
          "tuple elements; OutOfRangeError at the end of data (TF's get_next).")
      .def("__next__", [](PyDistributedIterator& it) {
        StatusOr<PerReplica<Element>> e = [&] {
          py::gil_scoped_release release;
          return it.it->get_next();
        }();
        if (!e.ok() && e.status().code() == StatusCode::kOutOfRange) throw py::stop_iteration();
        return distributed_element(value_or_throw(std::move(e)), *it.single);
      });

  // Strategy's input methods live here with the dataset types.
  auto strategy = py::reinterpret_borrow<py::object>(m.attr("Strategy"));
  py::cpp_function distribute_fn(&distribute, py::arg("dataset"), py::is_method(strategy),
                                 py::name("experimental_distribute_dataset"), py::sibling(py::none()),
                                 "Splits each global batch of `dataset` across the replicas (and "
                                 "shards it across workers): iterate for PerReplica batches.");
  strategy.attr("experimental_distribute_dataset") = distribute_fn;
  strategy.attr("distribute_dataset") = distribute_fn;
}

}  // namespace tributary::python

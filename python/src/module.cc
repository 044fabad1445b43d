// The extension module tributary._tributary; the package tributary (python/tributary/) re-exports
// it. See python/tributary/__init__.py for the API overview.
#include "common.h"

PYBIND11_MODULE(_tributary, m) {
  namespace tp = tributary::python;
  m.doc() = "tributary's C++ API (see the package tributary).";
  m.attr("__version__") = std::string(tributary::version());
  // NumPy's C API is set up here, on the importing thread with the GIL held: set up lazily, on the
  // first conversion, two pipeline threads could deadlock (one importing NumPy inside pybind11's
  // guarded static, which gives up the GIL, the other holding the GIL at that guard).
  pybind11::module_::import("numpy");
  (void)pybind11::dtype::of<float>();
  tp::bind_errors(m);
  tp::bind_ops(m);
  tp::bind_strategy(m);
  tp::bind_data(m);
  m.def("cuda_available", &tributary::cuda_available,
        "True when tributary was built with CUDA and sees a GPU.");
  m.def("shareable_array", &tp::shareable_array, pybind11::arg("shape"), pybind11::arg("dtype") = "float32",
        "A zeroed, writable NumPy array in memory that the other processes of this host can map "
        "(Buffer::allocate_shareable). Registered on every process with Backend.register_buffers, "
        "ring's shared memory all-reduces it in place with no copies; any backend takes it.");
  m.def("backends", [] { return tributary::builtin_backends().names(); },
        "The names of the backends built into libtributary.");
}

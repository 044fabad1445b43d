// The extension module tributary._tributary; the package tributary (python/tributary/) re-exports
// it. See python/tributary/__init__.py for the API overview.
#include "common.h"

PYBIND11_MODULE(_tributary, m) {
  namespace tp = tributary::python;
  m.doc() = "tributary's C++ API (see the package tributary).";
  m.attr("__version__") = std::string(tributary::version());
  tp::bind_errors(m);
  tp::bind_ops(m);
  tp::bind_strategy(m);
  tp::bind_data(m);
  m.def("cuda_available", &tributary::cuda_available,
        "True when tributary was built with CUDA and sees a GPU.");
  m.def("backends", [] { return tributary::builtin_backends().names(); },
        "The names of the backends built into libtributary.");
}

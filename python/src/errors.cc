// Status -> Python exception (the classes of tributary/errors.py), and the small argument parsers
// every binding file uses.
#include "common.h"

namespace tributary::python {

py::object exception_for(const Status& s, bool type_error) {
  py::module_ errors = py::module_::import("tributary.errors");
  return errors.attr("_from_status")(static_cast<int>(s.code()), s.message(), type_error);
}

ReduceOp reduce_op_from(py::handle op) {
  if (py::isinstance<ReduceOp>(op)) return op.cast<ReduceOp>();
  if (py::isinstance<py::str>(op)) return value_or_throw(parse_reduce_op(op.cast<std::string>()));
  throw_type("op must be a tributary.ReduceOp or one of 'sum', 'mean', 'min', 'max', 'prod'; got " +
             std::string(py::repr(op)));
}

std::chrono::milliseconds timeout_from(py::handle seconds, std::chrono::milliseconds none) {
  if (seconds.is_none()) return none;
  const double s = seconds.cast<double>();
  if (!(s >= 0)) throw_invalid("timeout must be a number of seconds >= 0; got " +
                               std::string(py::repr(seconds)));
  // float('inf') and anything past a year wait "forever" (a year, as the C API's longest): cast
  // as they are, they overflowed into a deadline already past.
  constexpr double kYear = 365.0 * 24 * 3600;
  if (s >= kYear) return std::chrono::hours(24 * 365);
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0 + 0.5));
}

std::vector<Device> devices_from(py::handle devices, std::vector<Device> fallback) {
  if (devices.is_none()) return fallback;
  if (py::isinstance<py::int_>(devices)) {
    const int n = devices.cast<int>();
    if (n < 1) throw_invalid("devices: a number of CPU replicas must be >= 1; got " +
                             std::to_string(n));
    std::vector<Device> out;
    for (int i = 0; i < n; ++i) out.push_back(Device::cpu(i));
    return out;
  }
  if (py::isinstance<py::str>(devices)) {
    return {value_or_throw(Device::parse(devices.cast<std::string>()))};
  }
  std::vector<Device> out;
  for (py::handle d : devices) out.push_back(value_or_throw(Device::parse(py::str(d).cast<std::string>())));
  return out;
}

std::vector<std::string> device_names(const std::vector<Device>& devices) {
  std::vector<std::string> out;
  for (const Device& d : devices) out.push_back(d.to_string());
  return out;
}

void bind_errors(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      py::object exc = exception_for(e.status(), e.type_error());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    }
  });
  m.def("status_code_name", [](int code) {
    return std::string(status_code_name(static_cast<StatusCode>(code)));
  }, "The C++ name of a status code (for checking tributary.StatusCode against the library).");
}

}  // namespace tributary::python

// Python objects as tensors without copying (NumPy arrays, the buffer protocol, the array
// interfaces), and Arrays as NumPy arrays.
#include <bit>
#include <cstdlib>
#include <cstring>

#include "common.h"

namespace tributary::python {
namespace {

const char* kSupported = "float32, float64, float16, bfloat16, int32, int64, int8, uint8";

// A dtype from its kind ('f', 'i', 'u', ...) and size in bytes, as NumPy's dtype.kind/itemsize
// and the array interfaces' typestr describe it.
std::optional<DType> dtype_from_kind(char kind, size_t size) {
  switch (kind) {
    case 'f':
      if (size == 4) return DType::kFloat32;
      if (size == 8) return DType::kFloat64;
      if (size == 2) return DType::kFloat16;
      return std::nullopt;
    case 'i':
      if (size == 4) return DType::kInt32;
      if (size == 8) return DType::kInt64;
      if (size == 1) return DType::kInt8;
      return std::nullopt;
    case 'u':
      if (size == 1) return DType::kUInt8;
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

[[noreturn]] void unsupported_dtype(const std::string& what, const std::string& got) {
  throw_type(what + " has dtype " + got + ", which tributary does not reduce; supported: " +
             kSupported);
}

// The array interfaces' typestr: "<f4", "|u1", ...
DType dtype_from_typestr(const std::string& typestr, const std::string& what) {
  if (typestr.size() < 3) unsupported_dtype(what, "'" + typestr + "'");
  const char order = typestr[0];
  const size_t size = static_cast<size_t>(std::atoi(typestr.c_str() + 2));
  const bool little = std::endian::native == std::endian::little;
  if ((order == '>' && little) || (order == '<' && !little && size > 1)) {
    throw_type(what + " is not in this machine's byte order (typestr '" + typestr +
               "'); convert it first, e.g. with numpy's .astype(dtype.newbyteorder('='))");
  }
  if (auto d = dtype_from_kind(typestr[1], size)) return *d;
  unsupported_dtype(what, "'" + typestr + "'");
}

// The struct-module format of the buffer protocol ("f", "<d", "=i", "B", "e", ...).
DType dtype_from_format(const char* format, size_t itemsize, const std::string& what) {
  std::string f = format ? format : "B";
  char order = '@';
  if (!f.empty() && std::strchr("@=<>!", f[0])) {
    order = f[0];
    f.erase(0, 1);
  }
  const bool little = std::endian::native == std::endian::little;
  if (((order == '>' || order == '!') && little) || (order == '<' && !little)) {
    if (itemsize > 1) throw_type(what + " is not in this machine's byte order (format '" +
                                 std::string(format) + "')");
  }
  if (f.size() != 1) unsupported_dtype(what, "of buffer format '" + std::string(format) + "'");
  char kind = 0;
  switch (f[0]) {
    case 'e': case 'f': case 'd': kind = 'f'; break;
    case 'b': case 'h': case 'i': case 'l': case 'q': case 'n': kind = 'i'; break;
    case 'B': case 'H': case 'I': case 'L': case 'Q': case 'N': case 'c': kind = 'u'; break;
    default: break;
  }
  if (auto d = dtype_from_kind(kind, itemsize)) return *d;
  unsupported_dtype(what, "of buffer format '" + std::string(format) + "'");
}

Shape shape_of(const py::array& a) {
  return Shape(a.shape(), a.shape() + a.ndim());
}

bool c_contiguous(const Shape& shape, const std::vector<int64_t>& strides, size_t itemsize) {
  int64_t expected = static_cast<int64_t>(itemsize);
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] == 1) continue;  // any stride is fine along a dimension of one
    if (shape[d] == 0) return true;
    if (strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

[[noreturn]] void not_contiguous(const std::string& what) {
  throw_invalid(what + " is not C-contiguous; tributary works in place on dense buffers: pass "
                "numpy.ascontiguousarray(x) (and copy the result back if it is an output)");
}
[[noreturn]] void read_only(const std::string& what) {
  throw_invalid(what + " is read-only but is written to; pass a writable array (e.g. x.copy())");
}

// The replica's device when it is of `type`, else index 0 of `type` (refused by the backend with
// its own message, or by the GPU visibility check).
Device label(const Device& replica, DeviceType type) {
  return replica.type() == type ? replica : Device(type, 0);
}

// __array_interface__ / __cuda_array_interface__, a dict with shape, typestr, data=(ptr, ro),
// strides (None when contiguous).
HeldTensor from_interface(py::handle obj, const py::dict& iface, const Device& device,
                          Access access, const std::string& what, bool gpu) {
  const char* name = gpu ? "__cuda_array_interface__" : "__array_interface__";
  if (!iface.contains("shape") || !iface.contains("typestr") || !iface.contains("data")) {
    throw_type(what + "'s " + name + " lacks shape, typestr or data");
  }
  Shape shape;
  for (py::handle d : iface["shape"]) shape.push_back(d.cast<int64_t>());
  const DType dtype = dtype_from_typestr(iface["typestr"].cast<std::string>(), what);
  py::object data = iface["data"];
  if (!py::isinstance<py::tuple>(data) || py::len(data) != 2) {
    throw_type(what + "'s " + std::string(name) +
               " data is not a (pointer, read_only) tuple; pass a NumPy array instead");
  }
  py::tuple t = data.cast<py::tuple>();
  const auto ptr = t[0].cast<uintptr_t>();
  const bool ro = t[1].cast<bool>();
  if (iface.contains("strides") && !iface["strides"].is_none()) {
    std::vector<int64_t> strides;
    for (py::handle s : iface["strides"]) strides.push_back(s.cast<int64_t>());
    if (strides.size() != shape.size() || !c_contiguous(shape, strides, dtype_size(dtype))) {
      not_contiguous(what);
    }
  }
  if (access == Access::kWrite && ro) read_only(what);
  Device on = label(device, gpu ? DeviceType::kCuda : DeviceType::kCpu);
  if (gpu && ptr != 0) {
    // The GPU the memory is really on (a CuPy or torch array on another GPU than the replica's is
    // then refused by the backend, not handed to it as the replica's).
    on = value_or_throw(cuda_device_of(reinterpret_cast<const void*>(ptr), on));
  }
  if (gpu && iface.contains("stream") && !iface["stream"].is_none()) {
    // Version 3 of the interface: the producer's stream, to synchronize with before use.
    const auto stream = iface["stream"].cast<uintptr_t>();
    if (stream == 0) {
      throw_invalid(what +
                    "'s __cuda_array_interface__ stream is 0, which the interface "
                    "disallows (ambiguous); the producer should give 1, 2 or a stream");
    }
    check(cuda_stream_synchronize(stream, on));
  }
  HeldTensor h;
  h.tensor = Tensor(reinterpret_cast<void*>(ptr), dtype, std::move(shape), on);
  h.owner = py::reinterpret_borrow<py::object>(obj);
  h.on_gpu = gpu;
  return h;
}

void require_gpu(const std::string& what) {
  if (cuda_available()) return;
  BuildInfo info = build_info();
  if (!info.cuda) {
    throw StatusError(unimplemented(
        what + " is GPU memory (__cuda_array_interface__) but this tributary was built without "
               "CUDA; rebuild with the CUDA toolkit (TRIBUTARY_WITH_CUDA=ON) or pass host arrays"));
  }
  throw StatusError(unavailable(
      what + " is GPU memory (__cuda_array_interface__) but no GPU is visible to tributary" +
      (info.gpu_error.empty() ? std::string() : ": " + info.gpu_error) + " (" +
      info.visible_devices + ")"));
}

}  // namespace

void HeldTensor::BufferRelease::operator()(Py_buffer* view) const {
  PyBuffer_Release(view);
  delete view;
}

DType dtype_from_numpy(const py::dtype& dt, const std::string& what) {
  const std::string name = py::str(dt.attr("name"));
  if (name == "bfloat16") return DType::kBFloat16;  // ml_dtypes' bfloat16
  const char order = dt.attr("byteorder").cast<std::string>()[0];
  const bool little = std::endian::native == std::endian::little;
  if ((order == '>' && little) || (order == '<' && !little)) {
    throw_type(what + " has non-native byte order (" + std::string(py::str(static_cast<py::handle>(dt))) +
               "); convert it with .astype('=" + name + "')");
  }
  if (auto d = dtype_from_kind(dt.kind(), static_cast<size_t>(dt.itemsize()))) return *d;
  unsupported_dtype(what, name);
}

std::optional<py::dtype> numpy_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return py::dtype("float32");
    case DType::kFloat64: return py::dtype("float64");
    case DType::kFloat16: return py::dtype("float16");
    case DType::kInt32: return py::dtype("int32");
    case DType::kInt64: return py::dtype("int64");
    case DType::kInt8: return py::dtype("int8");
    case DType::kUInt8: return py::dtype("uint8");
    case DType::kBFloat16:
      try {
        return py::dtype::from_args(py::module_::import("ml_dtypes").attr("bfloat16"));
      } catch (py::error_already_set&) {
        return std::nullopt;
      }
  }
  return std::nullopt;
}

py::array new_numpy(DType dtype, const Shape& shape) {
  std::optional<py::dtype> dt = numpy_dtype(dtype);
  if (!dt) {
    throw_type("NumPy has no " + std::string(dtype_name(dtype)) +
               " (install ml_dtypes); pass the output buffers yourself");
  }
  std::vector<py::ssize_t> dims(shape.begin(), shape.end());
  return py::array(*dt, dims);
}

HeldTensor hold_tensor(py::handle obj, const Device& device, Access access,
                       const std::string& what) {
  if (py::isinstance<py::array>(obj)) {
    auto a = py::reinterpret_borrow<py::array>(obj);
    const DType dtype = dtype_from_numpy(a.dtype(), what);
    if (!(a.flags() & py::array::c_style)) not_contiguous(what);
    if (access == Access::kWrite && !a.writeable()) read_only(what);
    HeldTensor h;
    h.tensor = Tensor(const_cast<void*>(a.data()), dtype, shape_of(a),
                      label(device, DeviceType::kCpu));
    h.owner = std::move(a);
    return h;
  }
  if (py::hasattr(obj, "__cuda_array_interface__")) {
    require_gpu(what);
    return from_interface(obj, obj.attr("__cuda_array_interface__").cast<py::dict>(), device,
                          access, what, /*gpu=*/true);
  }
  if (PyObject_CheckBuffer(obj.ptr())) {
    auto view = std::unique_ptr<Py_buffer, HeldTensor::BufferRelease>(new Py_buffer{});
    if (PyObject_GetBuffer(obj.ptr(), view.get(), PyBUF_RECORDS_RO) != 0) {
      delete view.release();  // nothing to release when GetBuffer failed
      throw py::error_already_set();
    }
    const DType dtype = dtype_from_format(view->format, static_cast<size_t>(view->itemsize), what);
    if (!PyBuffer_IsContiguous(view.get(), 'C')) not_contiguous(what);
    if (access == Access::kWrite && view->readonly) read_only(what);
    Shape shape(view->shape, view->shape + view->ndim);
    HeldTensor h;
    h.tensor = Tensor(view->buf, dtype, std::move(shape), label(device, DeviceType::kCpu));
    h.owner = py::reinterpret_borrow<py::object>(obj);
    h.view = std::move(view);
    return h;
  }
  if (py::hasattr(obj, "__array_interface__")) {
    return from_interface(obj, obj.attr("__array_interface__").cast<py::dict>(), device, access,
                          what, /*gpu=*/false);
  }
  throw_type(what + " is a " + std::string(py::str(obj.get_type().attr("__name__"))) +
             "; expected a NumPy array or an object with the buffer protocol, "
             "__array_interface__ or __cuda_array_interface__");
}

namespace {

// TF's convert_to_tensor of a literal (or NumPy scalar) to a given dtype: no silent narrowing. A
// float into an integer dtype is a TypeError, an integer outside the dtype's range a ValueError;
// float64 -> float32 (and int -> float) are conversions TF makes too.
void check_literal_fits(const py::module_& np, py::handle obj, const py::dtype& target,
                        const std::string& what) {
  const char kind = target.kind();
  if (kind != 'i' && kind != 'u') return;
  const std::string tname = py::str(target.attr("name"));
  py::object src;
  try {
    src = np.attr("asarray")(obj);
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_OverflowError)) throw;
    throw_invalid(what + ": " + std::string(py::repr(obj)) + " is out of range for " + tname);
  }
  const char src_kind = src.attr("dtype").attr("kind").cast<char>();
  if (src_kind == 'i' || src_kind == 'u' || src_kind == 'b') {
    if (src_kind == 'b' || src.attr("size").cast<py::ssize_t>() == 0) return;
    py::object info = np.attr("iinfo")(target);
    // Python ints compare exactly (no wrap-around of int64/uint64 mixtures).
    py::int_ lo(src.attr("min")()), hi(src.attr("max")());
    if (lo < info.attr("min") || hi > info.attr("max")) {
      throw_invalid(what + ": " + std::string(py::repr(obj)).substr(0, 80) +
                    " is out of range for " + tname + " (" +
                    std::string(py::str(info.attr("min"))) + " to " +
                    std::string(py::str(info.attr("max"))) + ")");
    }
    return;
  }
  if (src_kind == 'O') {  // ints beyond int64/uint64
    throw_invalid(what + ": " + std::string(py::repr(obj)).substr(0, 80) + " is out of range for " +
                  tname);
  }
  throw_type("Cannot convert " + std::string(py::repr(obj)).substr(0, 80) +
             " to EagerTensor of dtype " + tname + " (" + what + ": a " +
             std::string(py::str(src.attr("dtype"))) + " value would be truncated)");
}

}  // namespace

Array array_from(py::handle obj, const std::string& what, std::optional<DType> dtype) {
  py::module_ np = py::module_::import("numpy");
  py::object a;
  const bool literal = py::isinstance<py::float_>(obj) || py::isinstance<py::int_>(obj) ||
                       py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj) ||
                       py::isinstance(obj, np.attr("generic"));
  if (dtype && literal) {
    std::optional<py::dtype> dt = numpy_dtype(*dtype);
    if (!dt) dt = py::dtype("float32");
    check_literal_fits(np, obj, *dt, what);
    a = np.attr("asarray")(obj, *dt, py::arg("order") = "C");
    if (*dtype == DType::kBFloat16 && !numpy_dtype(*dtype)) {
      // No NumPy bfloat16: round through the library's own conversion.
      Array f = array_from(a, what);
      return cast(f, DType::kBFloat16);
    }
  } else if (py::hasattr(obj, "__cuda_array_interface__") && !py::isinstance<py::array>(obj)) {
    HeldTensor h = hold_tensor(obj, Device::cuda(0), Access::kRead, what);
    return value_or_throw(Array::copy_of(h.tensor));
  } else {
    // asarray keeps a 0-d shape (ascontiguousarray makes it 1-d).
    a = np.attr("asarray")(obj, py::arg("order") = "C");
  }
  HeldTensor h = hold_tensor(a, Device::cpu(), Access::kRead, what);
  return value_or_throw(Array::copy_of(h.tensor));
}

py::array shareable_array(py::handle shape, py::handle dtype) {
  const py::dtype dt = py::dtype::from_args(py::reinterpret_borrow<py::object>(dtype));
  const DType t = dtype_from_numpy(dt, "dtype");
  Shape dims;
  if (py::isinstance<py::int_>(shape)) {
    dims.push_back(shape.cast<int64_t>());
  } else {
    for (py::handle d : shape) dims.push_back(d.cast<int64_t>());
  }
  auto* keep = new Buffer(value_or_throw(Buffer::allocate_shareable(t, dims)));
  py::capsule owner(keep, [](void* p) { delete static_cast<Buffer*>(p); });
  return py::array(dt, std::vector<py::ssize_t>(dims.begin(), dims.end()),
                   std::vector<py::ssize_t>{}, keep->data(), owner);
}

py::array to_numpy(const Array& a) {
  Array host = a;
  if (!host.device().is_cpu()) host = value_or_throw(a.to_device(Device::cpu()));
  std::optional<py::dtype> dt = numpy_dtype(host.dtype());
  if (!dt) {  // bfloat16 without ml_dtypes
    host = cast(host, DType::kFloat32);
    dt = py::dtype("float32");
  }
  auto* keep = new Array(host);
  py::capsule owner(keep, [](void* p) { delete static_cast<Array*>(p); });
  std::vector<py::ssize_t> dims(host.shape().begin(), host.shape().end());
  py::array out(*dt, dims, std::vector<py::ssize_t>{}, host.tensor().data(), owner);
  // Arrays are immutable values (TF's eager tensors): the view is read-only; .copy() to modify.
  out.attr("setflags")(py::arg("write") = false);
  return out;
}

}  // namespace tributary::python

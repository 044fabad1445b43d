// The C API: a thin shell over the C++ API that converts Status to codes plus a thread-local
// message, and catches anything thrown (e.g. std::bad_alloc) so that nothing crosses into C.
#include "tributary/c_api.h"

#include <exception>
#include <memory>
#include <string>

#include "tributary/tributary.h"

using namespace tributary;

struct trib_backend {
  std::unique_ptr<CrossDeviceOps> ops;
  std::string spec;
};

namespace {

static_assert(TRIB_INTERNAL == static_cast<int>(StatusCode::kInternal) &&
                  TRIB_DATA_LOSS == static_cast<int>(StatusCode::kDataLoss) &&
                  TRIB_ABORTED == static_cast<int>(StatusCode::kAborted),
              "trib_status mirrors StatusCode");
static_assert(TRIB_UINT8 + 1 == 8 && TRIB_PROD + 1 == 5, "C enums mirror all_dtypes/all_reduce_ops");

thread_local std::string last_error;

trib_status to_code(const Status& s) {
  last_error = s.ok() ? std::string() : s.message();
  return static_cast<trib_status>(static_cast<int>(s.code()));
}

template <typename Fn>
trib_status guarded(Fn&& fn) {
  try {
    return to_code(fn());
  } catch (const std::exception& e) {
    return to_code(internal_error(std::string("unexpected exception: ") + e.what()));
  } catch (...) {
    return to_code(internal_error("unexpected exception"));
  }
}

StatusOr<DType> to_dtype(trib_dtype d) {
  int v = static_cast<int>(d);
  if (v < 0 || v >= static_cast<int>(all_dtypes().size())) {
    return invalid_argument("unknown trib_dtype " + std::to_string(v));
  }
  return all_dtypes()[static_cast<size_t>(v)];
}

StatusOr<ReduceOp> to_op(trib_reduce_op o) {
  int v = static_cast<int>(o);
  if (v < 0 || v >= static_cast<int>(all_reduce_ops().size())) {
    return invalid_argument("unknown trib_reduce_op " + std::to_string(v));
  }
  return all_reduce_ops()[static_cast<size_t>(v)];
}

Status check_backend(const trib_backend* b) {
  return b == nullptr || !b->ops ? invalid_argument("backend is NULL") : Status();
}

// One view per local replica over the caller's pointers.
StatusOr<PerReplica<Tensor>> views(const trib_backend* b, const void* const* ptrs, DType dtype,
                                   int64_t count, const char* what) {
  if (ptrs == nullptr) return invalid_argument(std::string(what) + " is NULL");
  if (count < 0) return invalid_argument("count is negative (" + std::to_string(count) + ")");
  PerReplica<Tensor> v;
  for (size_t i = 0; i < b->ops->devices().size(); ++i) {
    v.values().emplace_back(const_cast<void*>(ptrs[i]), dtype, count, b->ops->devices()[i]);
  }
  return v;
}

Status wait(CrossDeviceOps& ops, Work w) {
  auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(ops.timeout());
  return w.wait(timeout + std::chrono::seconds(1));
}

}  // namespace

extern "C" {

const char* trib_version(void) {
  static const std::string v(version());
  return v.c_str();
}

const char* trib_last_error(void) { return last_error.c_str(); }

const char* trib_backend_names(void) {
  static const std::string names = [] {
    std::string s;
    for (const std::string& n : builtin_backends().names()) s += (s.empty() ? "" : ",") + n;
    return s;
  }();
  return names.c_str();
}

trib_status trib_backend_create(const char* spec, const char* const* devices, int num_devices,
                                trib_backend** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return invalid_argument("out is NULL");
    *out = nullptr;
    if (devices == nullptr || num_devices <= 0) {
      return invalid_argument("devices is an empty replica list; pass one device per replica");
    }
    BackendContext ctx;
    ctx.devices.clear();
    for (int i = 0; i < num_devices; ++i) {
      if (devices[i] == nullptr) return invalid_argument("devices[" + std::to_string(i) + "] is NULL");
      TRIBUTARY_ASSIGN_OR_RETURN(Device d, Device::parse(devices[i]));
      ctx.devices.push_back(d);
    }
    TRIBUTARY_ASSIGN_OR_RETURN(ctx.config, Config::load());
    BackendRegistry registry = builtin_backends();
    auto made = (spec == nullptr || *spec == '\0') ? registry.create_from_config(ctx)
                                                   : registry.create(spec, ctx);
    if (!made.ok()) return made.status();
    auto b = std::make_unique<trib_backend>();
    b->ops = std::move(made).value();
    b->spec = b->ops->spec();
    *out = b.release();
    return Status();
  });
}

void trib_backend_destroy(trib_backend* backend) { delete backend; }

const char* trib_backend_spec(const trib_backend* backend) {
  return backend == nullptr ? "" : backend->spec.c_str();
}

int trib_backend_num_replicas_in_sync(const trib_backend* backend) {
  return backend == nullptr || !backend->ops ? 0 : backend->ops->num_replicas_in_sync();
}

trib_status trib_all_reduce(trib_backend* b, trib_reduce_op op, trib_dtype dtype,
                            const void* const* inputs, void* const* outputs, int64_t count) {
  return guarded([&]() -> Status {
    TRIBUTARY_RETURN_IF_ERROR(check_backend(b));
    TRIBUTARY_ASSIGN_OR_RETURN(DType t, to_dtype(dtype));
    TRIBUTARY_ASSIGN_OR_RETURN(ReduceOp o, to_op(op));
    TRIBUTARY_ASSIGN_OR_RETURN(auto in, views(b, inputs, t, count, "inputs"));
    TRIBUTARY_ASSIGN_OR_RETURN(auto out, views(b, outputs, t, count, "outputs"));
    return wait(*b->ops, b->ops->all_reduce(o, in, out));
  });
}

trib_status trib_broadcast(trib_backend* b, trib_dtype dtype, const void* source,
                           void* const* outputs, int64_t count, int root) {
  return guarded([&]() -> Status {
    TRIBUTARY_RETURN_IF_ERROR(check_backend(b));
    TRIBUTARY_ASSIGN_OR_RETURN(DType t, to_dtype(dtype));
    TRIBUTARY_ASSIGN_OR_RETURN(auto out, views(b, outputs, t, count, "outputs"));
    Tensor src(const_cast<void*>(source), t, count, b->ops->devices()[0]);
    return wait(*b->ops, b->ops->broadcast(src, Mirrored<Tensor>(out.values()), root));
  });
}

trib_status trib_all_gather(trib_backend* b, trib_dtype dtype, const void* const* inputs,
                            void* const* outputs, int64_t count) {
  return guarded([&]() -> Status {
    TRIBUTARY_RETURN_IF_ERROR(check_backend(b));
    TRIBUTARY_ASSIGN_OR_RETURN(DType t, to_dtype(dtype));
    TRIBUTARY_ASSIGN_OR_RETURN(auto in, views(b, inputs, t, count, "inputs"));
    TRIBUTARY_ASSIGN_OR_RETURN(
        auto out, views(b, outputs, t, count * b->ops->num_replicas_in_sync(), "outputs"));
    return wait(*b->ops, b->ops->all_gather(in, out));
  });
}

trib_status trib_reduce_scatter(trib_backend* b, trib_reduce_op op, trib_dtype dtype,
                                const void* const* inputs, void* const* outputs, int64_t count) {
  return guarded([&]() -> Status {
    TRIBUTARY_RETURN_IF_ERROR(check_backend(b));
    TRIBUTARY_ASSIGN_OR_RETURN(DType t, to_dtype(dtype));
    TRIBUTARY_ASSIGN_OR_RETURN(ReduceOp o, to_op(op));
    TRIBUTARY_ASSIGN_OR_RETURN(
        auto in, views(b, inputs, t, count * b->ops->num_replicas_in_sync(), "inputs"));
    TRIBUTARY_ASSIGN_OR_RETURN(auto out, views(b, outputs, t, count, "outputs"));
    return wait(*b->ops, b->ops->reduce_scatter(o, in, out));
  });
}

}  // extern "C"

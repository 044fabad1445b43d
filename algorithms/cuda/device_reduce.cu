// CUDA kernels behind device_reduce() and device_divide() (algorithms/device_reduce.h): reduce()'s
// element-wise contract (reduce_kernels.h) on device memory, and the one place where their CUDA
// errors become Status.
//
// Speed: a reduction reads every source and writes every destination once, so it is bound by
// device memory bandwidth. Each thread moves 16-byte vectors (two per source per iteration, so that
// enough loads are in flight; one for the 1-byte types) in a grid-stride loop over a grid of as
// many blocks as the device keeps resident; elements before the first 16-byte boundary, after the
// last vector, or of pointers whose offsets within 16 bytes differ are done one at a time.
// Measured with bench/micro/device_kernels_bench.cc on an H100 (80GB HBM3): a 2-source float32
// sum at 256 MiB moves 2.8 TB/s, 95-96% of cudaMemcpy's device-to-device rate (2.9-3.0 TB/s).
//
// Exactness: the same operations in the same order as the CPU kernels. float32 / float64 use the
// _rn intrinsics, which the compiler never contracts into a fused multiply-add; float16 / bfloat16
// convert exactly to float32, accumulate there and round to nearest even once on store (NaN stored
// as the CPU's conversions store it); integer sums and products wrap in the unsigned type.
//
// nvcc compiles this file as C++17 (the project's CUDA standard), so it includes no header that
// needs C++20: device_reduce.h declares the C++17-compatible entry points it defines.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

// nvcc's front end takes `status = f();` for a discarded [[nodiscard]] Status (the assignment
// returns Status&), in status.h and here; GCC and Clang do not. Silence that false positive.
#pragma nv_diag_suppress 2810

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "algorithms/device_reduce.h"
#include "tributary/status.h"

namespace tributary::algorithms {
namespace {

namespace e = device_reduce_enums;

constexpr int kThreads = 256;  // per block
constexpr int kMaxPointers = static_cast<int>(kDeviceReduceMaxPointers);
// 16-byte vectors per thread per loop iteration (loads in flight per source, per thread): two,
// except for the 1-byte types, whose 16 lanes per vector take enough registers to limit occupancy
// (measured on an H100: 2 vectors cost them 10% at 256 MiB and gain the others ~4% at 16 MiB).
__host__ __device__ constexpr int unroll_for(size_t element_size) {
  return element_size == 1 ? 1 : 2;
}
constexpr long long kInt32Max = 0x7FFFFFFF;

// Everything one launch needs, passed by value (kernel parameter space; __grid_constant__ so that
// indexing the pointer arrays with a run-time index reads it in place).
struct KernelArgs {
  const void* srcs[kMaxPointers];
  void* dsts[kMaxPointers];
  unsigned long long count;  // elements
  unsigned long long head;   // elements before the vector body (the first 16-byte boundary)
  unsigned long long nvec;   // 16-byte vectors in the body
  long long divisor;         // kMean's divisor; 1: no division
  float divisor_f;           // the divisor as float and double, converted as the CPU does
  double divisor_d;
  int nsrc;
  int ndst;
  // float16 / bfloat16 chains (more sources than one launch takes) carry float32 partial results:
  // srcs[0] is float32 (acc_in), or the only destination is float32 and nothing is rounded
  // (acc_out).
  bool acc_in;
  bool acc_out;
};

// ---- element types and operators (device side) ------------------------------------------------

struct HalfTag {};
struct BFloat16Tag {};

template <typename T>
struct StorageOf {
  using type = T;
};
template <>
struct StorageOf<HalfTag> {
  using type = uint16_t;
};
template <>
struct StorageOf<BFloat16Tag> {
  using type = uint16_t;
};
template <typename T>
using Storage = typename StorageOf<T>::type;

template <typename T>
constexpr bool kIsHalfType = std::is_same<T, HalfTag>::value || std::is_same<T, BFloat16Tag>::value;

// Integer sums and products wrap in the unsigned type of the same width; min and max compare in
// the dtype itself. The half types accumulate in float.
template <typename T, typename Op, bool kWrapping = (std::is_integral<T>::value && Op::kWraps)>
struct AccOf {
  using type = T;
};
template <typename T, typename Op>
struct AccOf<T, Op, true> {
  using type = std::make_unsigned_t<T>;
};
template <typename Op>
struct AccOf<HalfTag, Op> {
  using type = float;
};
template <typename Op>
struct AccOf<BFloat16Tag, Op> {
  using type = float;
};
template <typename T, typename Op>
using Acc = typename AccOf<T, Op>::type;

struct SumOp {
  static constexpr bool kWraps = true;
  static constexpr bool kIsSum = true;
  __device__ __forceinline__ static float apply(float a, float b) { return __fadd_rn(a, b); }
  __device__ __forceinline__ static double apply(double a, double b) { return __dadd_rn(a, b); }
  template <typename U>
  __device__ __forceinline__ static U apply(U a, U b) {
    return static_cast<U>(a + b);
  }
};
struct ProdOp {
  static constexpr bool kWraps = true;
  static constexpr bool kIsSum = false;
  __device__ __forceinline__ static float apply(float a, float b) { return __fmul_rn(a, b); }
  __device__ __forceinline__ static double apply(double a, double b) { return __dmul_rn(a, b); }
  template <typename U>
  __device__ __forceinline__ static U apply(U a, U b) {
    return static_cast<U>(a * b);
  }
};
// As the CPU kernels: `a` when `a` is NaN, `b` when `b` is NaN (the comparison is false), and `b`
// when they compare equal (so min(+0, -0) is -0 on both).
struct MinOp {
  static constexpr bool kWraps = false;
  static constexpr bool kIsSum = false;
  template <typename A>
  __device__ __forceinline__ static A apply(A a, A b) {
    if constexpr (std::is_floating_point<A>::value) {
      return (a != a || a < b) ? a : b;
    } else {
      return b < a ? b : a;
    }
  }
};
struct MaxOp {
  static constexpr bool kWraps = false;
  static constexpr bool kIsSum = false;
  template <typename A>
  __device__ __forceinline__ static A apply(A a, A b) {
    if constexpr (std::is_floating_point<A>::value) {
      return (a != a || a > b) ? a : b;
    } else {
      return b > a ? b : a;
    }
  }
};

// Storage -> accumulator: exact for every type.
template <typename T, typename A>
__device__ __forceinline__ A to_acc(Storage<T> x) {
  if constexpr (std::is_same<T, HalfTag>::value) {
    return __half2float(__ushort_as_half(x));
  } else if constexpr (std::is_same<T, BFloat16Tag>::value) {
    return __uint_as_float(static_cast<uint32_t>(x) << 16);
  } else {
    return static_cast<A>(x);
  }
}

// Accumulator -> storage: round to nearest even for the half types, with NaN stored as
// float_to_half / float_to_bfloat16 (tributary/half.h) store it; integers narrow modulo 2^bits.
template <typename T, typename A>
__device__ __forceinline__ Storage<T> from_acc(A v) {
  if constexpr (std::is_same<T, HalfTag>::value) {
    const uint32_t w = __float_as_uint(v);
    const bool is_nan = (w & 0x7FFFFFFFu) > 0x7F800000u;
    return is_nan ? static_cast<uint16_t>(((w >> 16) & 0x8000u) | 0x7E00u)
                  : __half_as_ushort(__float2half_rn(v));
  } else if constexpr (std::is_same<T, BFloat16Tag>::value) {
    const uint32_t w = __float_as_uint(v);
    const uint32_t rounded = (w + 0x7FFFu + ((w >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (w >> 16) | 0x0040u;
    const bool is_nan = (w & 0x7FFFFFFFu) > 0x7F800000u;
    return static_cast<uint16_t>(is_nan ? quiet_nan : rounded);
  } else {
    return static_cast<Storage<T>>(v);
  }
}

// kMean's single division. Floating types divide in their accumulator type; integers divide the
// wrapped sum, read back in the dtype, truncating toward zero (in 32 bits where that is exact).
template <typename T, typename A>
__device__ __forceinline__ A divide(A v, const KernelArgs& a) {
  if constexpr (std::is_same<A, float>::value) {
    return __fdiv_rn(v, a.divisor_f);
  } else if constexpr (std::is_same<A, double>::value) {
    return __ddiv_rn(v, a.divisor_d);
  } else {
    const T s = static_cast<T>(v);
    if constexpr (sizeof(T) <= 4) {
      if (a.divisor <= kInt32Max) {
        return static_cast<A>(
            static_cast<T>(static_cast<int32_t>(s) / static_cast<int32_t>(a.divisor)));
      }
    }
    return static_cast<A>(static_cast<T>(static_cast<long long>(s) / a.divisor));
  }
}

// ---- the kernel ---------------------------------------------------------------------------------

// kU vectors at body index `first`, first + stride, ...: all sources, every destination.
template <typename T, typename Op, int kU>
__device__ __forceinline__ void reduce_vectors(const KernelArgs& a, size_t first, size_t stride,
                                               bool div) {
  using S = Storage<T>;
  using A = Acc<T, Op>;
  constexpr int kLanes = 16 / static_cast<int>(sizeof(S));
  A acc[kU][kLanes];
  bool loaded = false;
  if constexpr (kIsHalfType<T>) {
    if (a.acc_in) {
      const float* p = static_cast<const float*>(a.srcs[0]) + a.head;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
#pragma unroll
        for (int l = 0; l < kLanes; ++l) acc[u][l] = p[(first + u * stride) * kLanes + l];
      }
      loaded = true;
    }
  }
  if (!loaded) {
    const uint4* p = reinterpret_cast<const uint4*>(static_cast<const S*>(a.srcs[0]) + a.head);
    uint4 raw[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) raw[u] = p[first + u * stride];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      S x[kLanes];
      memcpy(x, &raw[u], 16);
#pragma unroll
      for (int l = 0; l < kLanes; ++l) acc[u][l] = to_acc<T, A>(x[l]);
    }
  }
  for (int s = 1; s < a.nsrc; ++s) {
    const uint4* p = reinterpret_cast<const uint4*>(static_cast<const S*>(a.srcs[s]) + a.head);
    uint4 raw[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) raw[u] = p[first + u * stride];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      S x[kLanes];
      memcpy(x, &raw[u], 16);
#pragma unroll
      for (int l = 0; l < kLanes; ++l) acc[u][l] = Op::apply(acc[u][l], to_acc<T, A>(x[l]));
    }
  }
  if constexpr (kIsHalfType<T>) {
    if (a.acc_out) {
      float* q = static_cast<float*>(a.dsts[0]) + a.head;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
#pragma unroll
        for (int l = 0; l < kLanes; ++l) q[(first + u * stride) * kLanes + l] = acc[u][l];
      }
      return;
    }
  }
  uint4 out[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    S y[kLanes];
#pragma unroll
    for (int l = 0; l < kLanes; ++l) {
      A v = acc[u][l];
      if constexpr (Op::kIsSum) {
        if (div) v = divide<T, A>(v, a);
      }
      y[l] = from_acc<T, A>(v);
    }
    memcpy(&out[u], y, 16);
  }
  for (int j = 0; j < a.ndst; ++j) {
    uint4* q = reinterpret_cast<uint4*>(static_cast<S*>(a.dsts[j]) + a.head);
#pragma unroll
    for (int u = 0; u < kU; ++u) q[first + u * stride] = out[u];
  }
}

template <typename T, typename Op>
__device__ __forceinline__ void reduce_element(const KernelArgs& a, size_t i, bool div) {
  using S = Storage<T>;
  using A = Acc<T, Op>;
  A v;
  if constexpr (kIsHalfType<T>) {
    v = a.acc_in ? static_cast<const float*>(a.srcs[0])[i]
                 : to_acc<T, A>(static_cast<const S*>(a.srcs[0])[i]);
  } else {
    v = to_acc<T, A>(static_cast<const S*>(a.srcs[0])[i]);
  }
  for (int s = 1; s < a.nsrc; ++s) {
    v = Op::apply(v, to_acc<T, A>(static_cast<const S*>(a.srcs[s])[i]));
  }
  if constexpr (kIsHalfType<T>) {
    if (a.acc_out) {
      static_cast<float*>(a.dsts[0])[i] = v;
      return;
    }
  }
  if constexpr (Op::kIsSum) {
    if (div) v = divide<T, A>(v, a);
  }
  const S y = from_acc<T, A>(v);
  for (int j = 0; j < a.ndst; ++j) static_cast<S*>(a.dsts[j])[i] = y;
}

template <typename T, typename Op>
__global__ void __launch_bounds__(kThreads) reduce_kernel(const __grid_constant__ KernelArgs a) {
  constexpr size_t kLanes = 16 / sizeof(Storage<T>);
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  const size_t tid = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
  const bool div = a.divisor != 1;
  constexpr int kUnroll = unroll_for(sizeof(Storage<T>));
  size_t i = tid;
  if constexpr (kUnroll > 1) {
    for (; i + (kUnroll - 1) * stride < a.nvec; i += kUnroll * stride) {
      reduce_vectors<T, Op, kUnroll>(a, i, stride, div);
    }
  }
  for (; i < a.nvec; i += stride) reduce_vectors<T, Op, 1>(a, i, stride, div);
  // The elements outside the vector body: the head, then the tail.
  const size_t body_end = a.head + a.nvec * kLanes;
  const size_t nscalar = a.head + (a.count - body_end);
  for (size_t t = tid; t < nscalar; t += stride) {
    reduce_element<T, Op>(a, t < a.head ? t : body_end + (t - a.head), div);
  }
}

// ---- host side ----------------------------------------------------------------------------------

// Operator kernels: kMean runs the sum kernel (with the division).
enum class KernelOp { kSum = 0, kMin = 1, kMax = 2, kProd = 3 };
constexpr int kKernelOps = 4;
constexpr int kDTypes = 8;

template <typename T>
const void* kernel_for_op(KernelOp op) {
  switch (op) {
    case KernelOp::kSum:
      return reinterpret_cast<const void*>(&reduce_kernel<T, SumOp>);
    case KernelOp::kMin:
      return reinterpret_cast<const void*>(&reduce_kernel<T, MinOp>);
    case KernelOp::kMax:
      return reinterpret_cast<const void*>(&reduce_kernel<T, MaxOp>);
    case KernelOp::kProd:
      return reinterpret_cast<const void*>(&reduce_kernel<T, ProdOp>);
  }
  return nullptr;
}

// What a dtype is to the host: its index (for kernel_for), name and size.
struct DTypeInfo {
  int index = -1;  // -1: not a DType
  const char* name = "unknown";
  size_t size = 0;
};

DTypeInfo dtype_info(DType dtype) {
  if (dtype == e::kFloat32) return {0, "float32", 4};
  if (dtype == e::kFloat64) return {1, "float64", 8};
  if (dtype == e::kFloat16) return {2, "float16", 2};
  if (dtype == e::kBFloat16) return {3, "bfloat16", 2};
  if (dtype == e::kInt32) return {4, "int32", 4};
  if (dtype == e::kInt64) return {5, "int64", 8};
  if (dtype == e::kInt8) return {6, "int8", 1};
  if (dtype == e::kUInt8) return {7, "uint8", 1};
  return {};
}

const void* kernel_for(int dtype_index, KernelOp op) {
  switch (dtype_index) {
    case 0:
      return kernel_for_op<float>(op);
    case 1:
      return kernel_for_op<double>(op);
    case 2:
      return kernel_for_op<HalfTag>(op);
    case 3:
      return kernel_for_op<BFloat16Tag>(op);
    case 4:
      return kernel_for_op<int32_t>(op);
    case 5:
      return kernel_for_op<int64_t>(op);
    case 6:
      return kernel_for_op<int8_t>(op);
    case 7:
      return kernel_for_op<uint8_t>(op);
  }
  return nullptr;
}

const char* op_name(ReduceOp op) {
  if (op == e::kSum) return "sum";
  if (op == e::kMean) return "mean";
  if (op == e::kMin) return "min";
  if (op == e::kMax) return "max";
  if (op == e::kProd) return "prod";
  return nullptr;
}

// "cudaLaunchKernel failed: cudaErrorInvalidDeviceFunction: invalid device function", under the
// call's context ("device_reduce(sum, float32, 3 sources) on GPU:0").
Status cuda_status(cudaError_t err, const std::string& context, const char* call) {
  if (err == cudaSuccess) return Status();
  const std::string text =
      context + ": " + call + " failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
  switch (err) {
    case cudaErrorMemoryAllocation:
      return resource_exhausted(text);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidResourceHandle:
      return invalid_argument(text);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return failed_precondition(text);
    default:
      return internal_error(text);
  }
}

// Returns the Status of a failed CUDA call, named `name`, from the enclosing function.
#define TRIBUTARY_CUDA_RETURN_IF_ERROR(context, name, call)                     \
  do {                                                                          \
    const cudaError_t _trib_err = (call);                                       \
    if (_trib_err != cudaSuccess) return cuda_status(_trib_err, context, name); \
  } while (0)

// Per-device launch sizes, looked up once: the SM count and how many blocks of each kernel an SM
// holds. 0: not looked up yet. Devices past the table are looked up on every call.
constexpr int kCachedDevices = 64;
std::atomic<int> g_sm_count[kCachedDevices];
std::atomic<int> g_blocks_per_sm[kCachedDevices][kDTypes][kKernelOps];

Status max_resident_blocks(int device, int dtype_index, KernelOp op, const void* kernel,
                           const std::string& context, int* blocks) {
  const bool cached = device < kCachedDevices;
  int sms = cached ? g_sm_count[device].load(std::memory_order_relaxed) : 0;
  if (sms == 0) {
    const cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) {
      return cuda_status(err, context, "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)");
    }
    if (cached) g_sm_count[device].store(sms, std::memory_order_relaxed);
  }
  const int op_index = static_cast<int>(op);
  int per_sm =
      cached ? g_blocks_per_sm[device][dtype_index][op_index].load(std::memory_order_relaxed) : 0;
  if (per_sm == 0) {
    const cudaError_t err =
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
    if (err != cudaSuccess) {
      return cuda_status(err, context, "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    }
    per_sm = std::max(per_sm, 1);
    if (cached) {
      g_blocks_per_sm[device][dtype_index][op_index].store(per_sm, std::memory_order_relaxed);
    }
  }
  *blocks = std::max(sms, 1) * per_sm;
  return Status();
}

// One launch: srcs (1..8) into dsts (1..8), dividing by `divisor` unless it is 1. acc_in / acc_out:
// srcs[0] / dsts[0] (then the only destination) hold float32 partial results (half types only).
Status launch(const std::string& context, int device, const DTypeInfo& dt, KernelOp op,
              const void* const* srcs, int nsrc, void* const* dsts, int ndst, size_t count,
              int64_t divisor, cudaStream_t stream, bool acc_in = false, bool acc_out = false) {
  KernelArgs a{};
  for (int s = 0; s < nsrc; ++s) a.srcs[s] = srcs[s];
  for (int j = 0; j < ndst; ++j) a.dsts[j] = dsts[j];
  a.nsrc = nsrc;
  a.ndst = ndst;
  a.count = count;
  a.divisor = divisor;
  a.divisor_f = static_cast<float>(divisor);
  a.divisor_d = static_cast<double>(divisor);
  a.acc_in = acc_in;
  a.acc_out = acc_out;
  // The vector body needs every pointer of the dtype at the same offset within 16 bytes (a multiple
  // of the element size, as pointers are element-aligned); the head brings them to a 16-byte
  // boundary. (float32 partial results are read and written element by element.)
  const int first_src = acc_in ? 1 : 0;
  const int first_dst = acc_out ? 1 : 0;
  const uintptr_t offset = reinterpret_cast<uintptr_t>(srcs[first_src]) & 15u;
  bool congruent = true;
  for (int s = first_src; s < nsrc; ++s) {
    congruent &= (reinterpret_cast<uintptr_t>(srcs[s]) & 15u) == offset;
  }
  for (int j = first_dst; j < ndst; ++j) {
    congruent &= (reinterpret_cast<uintptr_t>(dsts[j]) & 15u) == offset;
  }
  const size_t lanes = 16 / dt.size;
  if (congruent) {
    a.head = std::min<size_t>(count, ((16 - offset) & 15u) / dt.size);
    a.nvec = (count - a.head) / lanes;
  } else {
    a.head = count;
    a.nvec = 0;
  }
  const size_t nscalar = count - a.nvec * lanes;
  const size_t unroll = unroll_for(dt.size);
  const size_t items = std::max<size_t>((a.nvec + unroll - 1) / unroll, nscalar);
  const void* kernel = kernel_for(dt.index, op);
  int max_blocks = 0;
  TRIBUTARY_RETURN_IF_ERROR(
      max_resident_blocks(device, dt.index, op, kernel, context, &max_blocks));
  const size_t blocks =
      std::max<size_t>(1, std::min<size_t>((items + kThreads - 1) / kThreads, max_blocks));
  void* params[] = {&a};
  TRIBUTARY_CUDA_RETURN_IF_ERROR(context, "cudaLaunchKernel",
                                 cudaLaunchKernel(kernel, dim3(static_cast<unsigned>(blocks)),
                                                  dim3(kThreads), params, 0, stream));
  return Status();
}

// Makes `device` current for the call and restores the caller's device afterwards.
class DeviceScope {
 public:
  Status enter(int device, const std::string& context) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      previous_ = -1;
      (void)cudaGetLastError();  // reported below by cudaSetDevice, if it matters
    }
    if (previous_ == device) return Status();
    TRIBUTARY_CUDA_RETURN_IF_ERROR(context, "cudaSetDevice", cudaSetDevice(device));
    restore_ = previous_ >= 0;
    return Status();
  }
  ~DeviceScope() {
    if (restore_) (void)cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
  bool restore_ = false;
};

std::string device_text(int device) { return "GPU:" + std::to_string(device); }

// The checks every call makes on its pointers.
Status check_pointer(const std::string& context, const char* what, size_t index, const void* p,
                     size_t elem) {
  if (p == nullptr) {
    return invalid_argument(context + ": " + what + "[" + std::to_string(index) + "] is null");
  }
  if (reinterpret_cast<uintptr_t>(p) % elem != 0) {
    char address[32];
    std::snprintf(address, sizeof(address), "%p", p);
    return invalid_argument(context + ": " + what + "[" + std::to_string(index) + "] (" + address +
                            ") is not aligned to its " + std::to_string(elem) + "-byte elements");
  }
  return Status();
}

bool is_late_source(const void* p, const void* const* srcs, size_t nsrc) {
  for (size_t s = kDeviceReduceMaxPointers; s < nsrc; ++s) {
    if (srcs[s] == p) return true;
  }
  return false;
}

// The reduction once arguments are checked and the device is current.
Status reduce_on_device(const std::string& context, int device, const DTypeInfo& dt, KernelOp op,
                        const void* const* srcs, size_t nsrc, void* const* dsts, size_t ndst,
                        size_t count, int64_t divisor, cudaStream_t stream) {
  const size_t bytes = count * dt.size;
  if (nsrc == 1 && divisor == 1) {
    // Every op of one source is the identity: a copy, skipped where the destination is the source.
    for (size_t j = 0; j < ndst; ++j) {
      if (dsts[j] == srcs[0]) continue;
      TRIBUTARY_CUDA_RETURN_IF_ERROR(
          context, "cudaMemcpyAsync",
          cudaMemcpyAsync(dsts[j], srcs[0], bytes, cudaMemcpyDefault, stream));
    }
    return Status();
  }
  // The destinations the last launch writes (up to kMaxPointers); the others are copied from the
  // first of them afterwards.
  void* final_dsts[kMaxPointers];
  int nfinal = 0;
  if (nsrc <= kDeviceReduceMaxPointers) {
    for (; nfinal < kMaxPointers && static_cast<size_t>(nfinal) < ndst; ++nfinal) {
      final_dsts[nfinal] = dsts[nfinal];
    }
    TRIBUTARY_RETURN_IF_ERROR(launch(context, device, dt, op, srcs, static_cast<int>(nsrc),
                                     final_dsts, nfinal, count, divisor, stream));
  } else {
    // A chain of launches through an accumulator: srcs[0..8) into it, then the accumulator and
    // the next 7 sources into it, ...; the last launch divides and writes the destinations. The
    // accumulator is a destination that no later launch reads as a source, else scratch memory.
    // float16 and bfloat16 keep their float32 partial results in scratch memory: rounding them
    // to the dtype between launches would round more than once.
    const bool float_acc = dt.index == 2 || dt.index == 3;
    size_t acc_index = ndst;
    for (size_t j = 0; j < ndst && acc_index == ndst && !float_acc; ++j) {
      if (!is_late_source(dsts[j], srcs, nsrc)) acc_index = j;
    }
    const bool scratch = acc_index == ndst;
    void* acc = nullptr;
    if (scratch) {
      TRIBUTARY_CUDA_RETURN_IF_ERROR(
          context, "cudaMallocAsync",
          cudaMallocAsync(&acc, float_acc ? count * sizeof(float) : bytes, stream));
    } else {
      acc = dsts[acc_index];
    }
    Status status = launch(context, device, dt, op, srcs, kMaxPointers, &acc, 1, count,
                           /*divisor=*/1, stream, /*acc_in=*/false, /*acc_out=*/float_acc);
    size_t next = kDeviceReduceMaxPointers;
    const void* stage_srcs[kMaxPointers];
    stage_srcs[0] = acc;
    while (status.ok() && nsrc - next > kDeviceReduceMaxPointers - 1) {
      std::copy(srcs + next, srcs + next + kDeviceReduceMaxPointers - 1, stage_srcs + 1);
      status = launch(context, device, dt, op, stage_srcs, kMaxPointers, &acc, 1, count,
                      /*divisor=*/1, stream, /*acc_in=*/float_acc, /*acc_out=*/float_acc);
      next += kDeviceReduceMaxPointers - 1;
    }
    if (status.ok()) {
      // The last launch: the accumulator's destination (if it is one) first, written in place.
      std::copy(srcs + next, srcs + nsrc, stage_srcs + 1);
      if (!scratch) final_dsts[nfinal++] = acc;
      for (size_t j = 0; j < ndst && nfinal < kMaxPointers; ++j) {
        if (j != acc_index) final_dsts[nfinal++] = dsts[j];
      }
      status = launch(context, device, dt, op, stage_srcs, static_cast<int>(nsrc - next + 1),
                      final_dsts, nfinal, count, divisor, stream, /*acc_in=*/float_acc);
    }
    if (scratch) {
      const cudaError_t err = cudaFreeAsync(acc, stream);
      if (status.ok() && err != cudaSuccess) status = cuda_status(err, context, "cudaFreeAsync");
    }
    TRIBUTARY_RETURN_IF_ERROR(status);
  }
  // Destinations past what one launch writes: copies of the first written one.
  if (ndst > kDeviceReduceMaxPointers) {
    for (size_t j = 0; j < ndst; ++j) {
      if (std::find(final_dsts, final_dsts + nfinal, dsts[j]) != final_dsts + nfinal) continue;
      TRIBUTARY_CUDA_RETURN_IF_ERROR(
          context, "cudaMemcpyAsync",
          cudaMemcpyAsync(dsts[j], final_dsts[0], bytes, cudaMemcpyDefault, stream));
    }
  }
  return Status();
}

}  // namespace

bool device_kernels_built() { return true; }

Status device_reduce_n(ReduceOp op, DType dtype, const void* const* srcs, size_t nsrc,
                       void* const* dsts, size_t ndst, size_t count, int64_t mean_divisor,
                       int device, void* stream) {
  const DTypeInfo dt = dtype_info(dtype);
  const char* name = op_name(op);
  std::string context = std::string("device_reduce(") + (name ? name : "?") + ", " + dt.name +
                        ", " + std::to_string(nsrc) + (nsrc == 1 ? " source" : " sources") +
                        ") on " + device_text(device);
  if (name == nullptr) {
    return invalid_argument(context + ": unknown reduce op " +
                            std::to_string(static_cast<int>(op)));
  }
  if (dt.index < 0) {
    return invalid_argument(context + ": unknown dtype " + std::to_string(static_cast<int>(dtype)));
  }
  if (nsrc == 0) return invalid_argument(context + ": no source to reduce");
  if (op == e::kMean && mean_divisor < 1) {
    return invalid_argument(context + ": the mean's divisor is " + std::to_string(mean_divisor) +
                            "; it must be at least 1");
  }
  if (device < 0) return invalid_argument(context + ": no such device");
  if (count == 0 || ndst == 0) return Status();
  if (srcs == nullptr || dsts == nullptr) {
    return invalid_argument(context + ": the source or destination list is null");
  }
  if (count > std::numeric_limits<size_t>::max() / dt.size) {
    return invalid_argument(context + ": " + std::to_string(count) + " elements overflow size_t");
  }
  for (size_t s = 0; s < nsrc; ++s) {
    TRIBUTARY_RETURN_IF_ERROR(check_pointer(context, "srcs", s, srcs[s], dt.size));
  }
  for (size_t j = 0; j < ndst; ++j) {
    TRIBUTARY_RETURN_IF_ERROR(check_pointer(context, "dsts", j, dsts[j], dt.size));
  }
  DeviceScope scope;
  TRIBUTARY_RETURN_IF_ERROR(scope.enter(device, context));
  const KernelOp kop = op == e::kMin    ? KernelOp::kMin
                       : op == e::kMax  ? KernelOp::kMax
                       : op == e::kProd ? KernelOp::kProd
                                        : KernelOp::kSum;
  const int64_t divisor = op == e::kMean ? mean_divisor : 1;
  cudaStream_t s = stream == nullptr ? cudaStreamLegacy : static_cast<cudaStream_t>(stream);
  return reduce_on_device(context, device, dt, kop, srcs, nsrc, dsts, ndst, count, divisor, s);
}

Status device_divide(DType dtype, void* data, size_t count, int64_t divisor, int device,
                     void* stream) {
  const DTypeInfo dt = dtype_info(dtype);
  std::string context = std::string("device_divide(") + dt.name + ", divisor " +
                        std::to_string(divisor) + ") on " + device_text(device);
  if (dt.index < 0) {
    return invalid_argument(context + ": unknown dtype " + std::to_string(static_cast<int>(dtype)));
  }
  if (divisor < 1) return invalid_argument(context + ": the divisor must be at least 1");
  if (device < 0) return invalid_argument(context + ": no such device");
  if (count == 0 || divisor == 1) return Status();
  if (count > std::numeric_limits<size_t>::max() / dt.size) {
    return invalid_argument(context + ": " + std::to_string(count) + " elements overflow size_t");
  }
  TRIBUTARY_RETURN_IF_ERROR(check_pointer(context, "data", 0, data, dt.size));
  DeviceScope scope;
  TRIBUTARY_RETURN_IF_ERROR(scope.enter(device, context));
  cudaStream_t s = stream == nullptr ? cudaStreamLegacy : static_cast<cudaStream_t>(stream);
  const void* src = data;
  return launch(context, device, dt, KernelOp::kSum, &src, 1, &data, 1, count, divisor, s);
}

}  // namespace tributary::algorithms

// Tests of the CUDA reduction kernels (algorithms/device_reduce.h): every dtype and op, 1 to 9
// sources (9 takes a chain of launches), one or two destinations, counts around the vector width
// and past a million, misaligned and in-place buffers, and device_divide(), each compared byte for
// byte (NaN: both NaN) with the CPU kernel, reduce(), on the same inputs.
//
// Where tributary is built with CUDA but no device is visible, every test skips with the reason.
// Without CUDA, device_reduce() must say so (kUnimplemented).
#include "algorithms/device_reduce.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tributary/dtype.h"
#include "tributary/status.h"

#if defined(TRIBUTARY_HAVE_CUDA)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "algorithms/reduce_kernels.h"
#include "tributary/half.h"
#endif

namespace tributary::algorithms {
namespace {

TEST(DeviceKernelsTest, BuiltMatchesTheBuild) {
#if defined(TRIBUTARY_HAVE_CUDA)
  EXPECT_TRUE(device_kernels_built());
#else
  EXPECT_FALSE(device_kernels_built());
#endif
}

#if !defined(TRIBUTARY_HAVE_CUDA)

TEST(DeviceKernelsTest, UnimplementedWithoutCuda) {
  const std::string expected =
      "tributary was built without CUDA (configure with -DTRIBUTARY_WITH_CUDA=ON and the CUDA "
      "toolkit installed)";
  float a = 1, b = 2, c = 0;
  const void* srcs[] = {&a, &b};
  void* dsts[] = {&c};
  const Status reduced =
      device_reduce(ReduceOp::kSum, DType::kFloat32, srcs, dsts, 1, 1, /*device=*/0, nullptr);
  EXPECT_EQ(reduced.code(), StatusCode::kUnimplemented);
  EXPECT_EQ(reduced.message(), expected);
  const Status divided = device_divide(DType::kFloat32, &c, 1, 2, /*device=*/0, nullptr);
  EXPECT_EQ(divided.code(), StatusCode::kUnimplemented);
  EXPECT_EQ(divided.message(), expected);
}

#else  // TRIBUTARY_HAVE_CUDA

// ---- device plumbing ----------------------------------------------------------------------------

// Empty when a CUDA device is visible; otherwise why not.
std::string no_device_reason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err) + ": " +
           cudaGetErrorString(err);
  }
  if (n == 0) return "cudaGetDeviceCount found 0 devices";
  return "";
}

#define ASSERT_CUDA(call)                                                           \
  do {                                                                              \
    const cudaError_t _err = (call);                                                \
    ASSERT_EQ(_err, cudaSuccess) << #call << ": " << cudaGetErrorName(_err) << ": " \
                                 << cudaGetErrorString(_err);                       \
  } while (0)

// Owning device memory.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, std::max<size_t>(bytes, 1)) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
  std::byte* data() const { return static_cast<std::byte*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class DeviceReduceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = no_device_reason();
    if (!reason.empty()) GTEST_SKIP() << "no CUDA device is visible (" << reason << ")";
    ASSERT_CUDA(cudaSetDevice(0));
    ASSERT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }

  // Host -> device and device -> host on the test's stream, waited for.
  void upload(std::byte* dst, const std::byte* src, size_t bytes) {
    ASSERT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
  }
  void download(std::byte* dst, const std::byte* src, size_t bytes) {
    ASSERT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
  }
  void fill_guard(std::byte* dst, size_t bytes) {
    ASSERT_CUDA(cudaMemsetAsync(dst, kGuard, bytes, stream_));
  }
  void sync() { ASSERT_CUDA(cudaStreamSynchronize(stream_)); }

  static constexpr int kGuard = 0xA5;  // every destination byte before the kernel runs
  cudaStream_t stream_ = nullptr;
};

// ---- inputs and comparison ----------------------------------------------------------------------

enum class Pattern {
  kOrdinary,  // small values: sums round in the half types, products stay finite mostly
  kExtreme,   // integers that wrap; NaN, infinities, signed zeros and subnormals for floats
};

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb3f99e3b97f9ULL;
  x ^= x >> 33;
  return x;
}

// Element i of source s, as a double for dtype_store (which rounds, or wraps integers).
double pattern_value(DType dtype, Pattern pattern, size_t s, size_t i) {
  const uint64_t h = mix(i * 1315423911ULL + s * 2654435761ULL + 17);
  const double unit = static_cast<double>(h >> 11) * 0x1.0p-53;  // [0, 1)
  if (pattern == Pattern::kOrdinary) {
    if (dtype_is_floating(dtype)) return (unit - 0.5) * 6.0;  // [-3, 3): products of 9 stay finite
    return std::floor((unit - 0.5) * 200);
  }
  if (!dtype_is_floating(dtype)) {
    // Magnitudes near the top of the type: sums and products wrap. int64 takes doubles below
    // 2^63, which dtype_store converts exactly.
    const double top = dtype == DType::kInt64 ? 0x1.0p62
                       : dtype == DType::kInt32 ? 0x1.0p31
                       : dtype == DType::kInt8 ? 128.0
                                               : 256.0;
    const double v = std::floor(unit * 2 * top) - (dtype == DType::kUInt8 ? 0 : top);
    return v;
  }
  switch (h % 16) {
    case 0:
      return std::numeric_limits<double>::quiet_NaN();
    case 1:
      return std::numeric_limits<double>::infinity();
    case 2:
      return -std::numeric_limits<double>::infinity();
    case 3:
      return 0.0;
    case 4:
      return -0.0;
    case 5:
      return 0x1.0p-140 * (unit + 0.5);  // subnormal in float32, zero in the half types
    case 6:
      return 65504.0 * (unit + 0.5);  // near float16's largest
    case 7:
      return -0x1.0p-20 * unit;  // float16 subnormals
    default:
      return (unit - 0.5) * 1000.0;
  }
}

std::vector<std::byte> make_pattern(DType dtype, Pattern pattern, size_t s, size_t count) {
  std::vector<std::byte> bytes(count * dtype_size(dtype));
  for (size_t i = 0; i < count; ++i) {
    dtype_store(dtype, bytes.data(), static_cast<int64_t>(i), pattern_value(dtype, pattern, s, i));
  }
  return bytes;
}

bool element_is_nan(DType dtype, const std::byte* p) {
  switch (dtype) {
    case DType::kFloat32: {
      float v;
      std::memcpy(&v, p, 4);
      return std::isnan(v);
    }
    case DType::kFloat64: {
      double v;
      std::memcpy(&v, p, 8);
      return std::isnan(v);
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return std::isnan(dtype == DType::kFloat16 ? half_to_float(v) : bfloat16_to_float(v));
    }
    default:
      return false;
  }
}

std::string hex(const std::byte* p, size_t n) {
  std::ostringstream out;
  out << "0x";
  for (size_t k = n; k-- > 0;) {
    static const char kDigits[] = "0123456789abcdef";
    const auto b = static_cast<unsigned>(p[k]);
    out << kDigits[b >> 4] << kDigits[b & 15];
  }
  return out.str();
}

// Byte-for-byte equality of `count` elements, NaN matching any NaN. Reports the first mismatches.
::testing::AssertionResult same_elements(DType dtype, const std::byte* expected,
                                         const std::byte* actual, size_t count) {
  const size_t elem = dtype_size(dtype);
  size_t mismatches = 0;
  std::ostringstream first;
  for (size_t i = 0; i < count; ++i) {
    const std::byte* e = expected + i * elem;
    const std::byte* a = actual + i * elem;
    if (std::memcmp(e, a, elem) == 0) continue;
    if (element_is_nan(dtype, e) && element_is_nan(dtype, a)) continue;
    if (mismatches++ < 5) {
      first << "\n  [" << i << "] expected " << hex(e, elem) << " ("
            << dtype_load(dtype, expected, static_cast<int64_t>(i)) << "), got " << hex(a, elem)
            << " (" << dtype_load(dtype, actual, static_cast<int64_t>(i)) << ")";
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << mismatches << " of " << count << " elements differ:" << first.str();
}

::testing::AssertionResult bytes_are(const std::byte* p, size_t n, int value) {
  for (size_t k = 0; k < n; ++k) {
    if (static_cast<int>(p[k]) != value) {
      return ::testing::AssertionFailure() << "byte " << k << " past the output was overwritten";
    }
  }
  return ::testing::AssertionSuccess();
}

std::string case_name(ReduceOp op, DType dtype, size_t nsrc, size_t ndst, size_t count) {
  std::ostringstream out;
  out << reduce_op_name(op) << " " << dtype_name(dtype) << ", " << nsrc << " sources, " << ndst
      << " destinations, " << count << " elements";
  return out.str();
}

int64_t divisor_for(ReduceOp op, size_t nsrc) {
  if (op != ReduceOp::kMean) return 1;
  return nsrc == 1 ? 3 : static_cast<int64_t>(nsrc);
}

// ---- every dtype x op x sources x destinations x count -----------------------------------------

constexpr size_t kGuardElements = 16;  // untouched elements after each output

// Sources uploaded once per dtype and pattern (the largest count; cases use prefixes, at an
// element offset of `offset` within each buffer) and destinations with guard bytes.
struct Inputs {
  DType dtype;
  size_t max_count;
  std::vector<std::vector<std::byte> > host;  // per source
  std::vector<DeviceBuffer> device;           // per source
};

class DeviceReduceMatrixTest : public DeviceReduceTest {
 protected:
  void load(DType dtype, Pattern pattern, size_t nsrc, size_t max_count, size_t offset) {
    inputs_.dtype = dtype;
    inputs_.max_count = max_count;
    inputs_.host.clear();
    inputs_.device.clear();
    const size_t elem = dtype_size(dtype);
    for (size_t s = 0; s < nsrc; ++s) {
      inputs_.host.push_back(make_pattern(dtype, pattern, s, max_count + offset));
      inputs_.device.emplace_back((max_count + offset) * elem);
      ASSERT_NE(inputs_.device.back().data(), nullptr);
      upload(inputs_.device.back().data(), inputs_.host.back().data(), (max_count + offset) * elem);
    }
  }

  // Runs one case on sources [0, nsrc) at `src_offset` elements and `ndst` fresh destinations at
  // `dst_offset`, and compares with reduce() on the host copies.
  void run_case(ReduceOp op, size_t nsrc, size_t ndst, size_t count, size_t src_offset = 0,
                size_t dst_offset = 0) {
    const DType dtype = inputs_.dtype;
    const size_t elem = dtype_size(dtype);
    SCOPED_TRACE(case_name(op, dtype, nsrc, ndst, count) + ", offsets " +
                 std::to_string(src_offset) + "/" + std::to_string(dst_offset));
    const int64_t divisor = divisor_for(op, nsrc);
    const size_t dst_bytes = (dst_offset + count + kGuardElements) * elem;

    std::vector<const void*> host_srcs, dev_srcs;
    for (size_t s = 0; s < nsrc; ++s) {
      host_srcs.push_back(inputs_.host[s].data() + src_offset * elem);
      dev_srcs.push_back(inputs_.device[s].data() + src_offset * elem);
    }
    std::vector<std::byte> expected(std::max<size_t>(count * elem, 1));
    void* host_dst[] = {expected.data()};
    reduce(op, dtype, host_srcs, host_dst, count, divisor);

    std::vector<DeviceBuffer> outs;
    std::vector<void*> dev_dsts;
    for (size_t j = 0; j < ndst; ++j) {
      outs.emplace_back(dst_bytes);
      ASSERT_NE(outs.back().data(), nullptr);
      fill_guard(outs.back().data(), dst_bytes);
      dev_dsts.push_back(outs.back().data() + dst_offset * elem);
    }
    const Status status =
        device_reduce(op, dtype, dev_srcs, dev_dsts, count, divisor, /*device=*/0, stream_);
    ASSERT_TRUE(status.ok()) << status.to_string();
    sync();
    std::vector<std::byte> actual(dst_bytes);
    for (size_t j = 0; j < ndst; ++j) {
      download(actual.data(), outs[j].data(), dst_bytes);
      EXPECT_TRUE(bytes_are(actual.data(), dst_offset * elem, kGuard))
          << "before dsts[" << j << "]";
      EXPECT_TRUE(same_elements(dtype, expected.data(), actual.data() + dst_offset * elem, count))
          << "dsts[" << j << "]";
      EXPECT_TRUE(
          bytes_are(actual.data() + (dst_offset + count) * elem, kGuardElements * elem, kGuard))
          << "after dsts[" << j << "]";
    }
  }

  Inputs inputs_;
};

constexpr size_t kCounts[] = {0, 1, 7, 1000, 4099, (size_t{1} << 20) + 3};
constexpr size_t kSourceCounts[] = {1, 2, 3, 9};
constexpr size_t kMaxSources = 9;

TEST_F(DeviceReduceMatrixTest, EveryDTypeOpSourceCountAndLength) {
  for (DType dtype : all_dtypes()) {
    load(dtype, Pattern::kOrdinary, kMaxSources, kCounts[std::size(kCounts) - 1], 0);
    for (ReduceOp op : all_reduce_ops()) {
      for (size_t nsrc : kSourceCounts) {
        for (size_t ndst : {size_t{1}, size_t{2}}) {
          for (size_t count : kCounts) {
            run_case(op, nsrc, ndst, count);
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

TEST_F(DeviceReduceMatrixTest, WrappingIntegersAndNonFiniteFloats) {
  for (DType dtype : all_dtypes()) {
    load(dtype, Pattern::kExtreme, kMaxSources, 4099, 0);
    for (ReduceOp op : all_reduce_ops()) {
      for (size_t nsrc : kSourceCounts) {
        run_case(op, nsrc, 1, 4099);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Every pointer one element past a 16-byte boundary (the vector body starts after a head), and
// sources and destination at different offsets within 16 bytes (element by element throughout).
TEST_F(DeviceReduceMatrixTest, MisalignedPointers) {
  for (DType dtype : all_dtypes()) {
    load(dtype, Pattern::kOrdinary, kMaxSources, 4099, 1);
    for (ReduceOp op : all_reduce_ops()) {
      for (size_t nsrc : {size_t{2}, size_t{3}, size_t{9}}) {
        for (size_t count : {size_t{1}, size_t{7}, size_t{1000}, size_t{4099}}) {
          run_case(op, nsrc, 2, count, /*src_offset=*/1, /*dst_offset=*/1);
          run_case(op, nsrc, 1, count, /*src_offset=*/1, /*dst_offset=*/0);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// More destinations than one launch writes: the rest are copies.
TEST_F(DeviceReduceMatrixTest, ManyDestinations) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt8}) {
    load(dtype, Pattern::kOrdinary, kMaxSources, 4099, 0);
    for (size_t nsrc : kSourceCounts) {
      run_case(ReduceOp::kMean, nsrc, 10, 4099);
      run_case(ReduceOp::kMax, nsrc, 10, 1000);
      if (HasFatalFailure()) return;
    }
  }
}

// ---- in place -----------------------------------------------------------------------------------

// The destination is one of the sources: srcs[0], a middle one, or (with 9 sources) the last one,
// which a chained reduction reads only in its last launch. ndst 2 adds a separate destination.
TEST_F(DeviceReduceTest, InPlace) {
  const size_t count = 4099;
  for (DType dtype : all_dtypes()) {
    const size_t elem = dtype_size(dtype);
    for (ReduceOp op : all_reduce_ops()) {
      for (size_t nsrc : kSourceCounts) {
        std::vector<size_t> targets = {0, nsrc / 2, nsrc - 1};
        targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
        for (size_t target : targets) {
          for (size_t ndst : {size_t{1}, size_t{2}}) {
            SCOPED_TRACE(case_name(op, dtype, nsrc, ndst, count) + ", in place on srcs[" +
                         std::to_string(target) + "]");
            const int64_t divisor = divisor_for(op, nsrc);
            std::vector<std::vector<std::byte> > host;
            std::vector<DeviceBuffer> dev;
            std::vector<const void*> host_srcs, dev_srcs;
            for (size_t s = 0; s < nsrc; ++s) {
              host.push_back(make_pattern(dtype, Pattern::kOrdinary, s, count));
              dev.emplace_back(count * elem);
              ASSERT_NE(dev.back().data(), nullptr);
              upload(dev.back().data(), host.back().data(), count * elem);
            }
            for (size_t s = 0; s < nsrc; ++s) {
              host_srcs.push_back(host[s].data());
              dev_srcs.push_back(dev[s].data());
            }
            std::vector<std::byte> expected(count * elem);
            void* host_dst[] = {expected.data()};
            reduce(op, dtype, host_srcs, host_dst, count, divisor);

            DeviceBuffer other(count * elem);
            ASSERT_NE(other.data(), nullptr);
            std::vector<void*> dev_dsts = {dev[target].data()};
            if (ndst == 2) dev_dsts.insert(dev_dsts.begin(), other.data());
            const Status status =
                device_reduce(op, dtype, dev_srcs, dev_dsts, count, divisor, 0, stream_);
            ASSERT_TRUE(status.ok()) << status.to_string();
            sync();
            std::vector<std::byte> actual(count * elem);
            for (void* d : dev_dsts) {
              download(actual.data(), static_cast<std::byte*>(d), count * elem);
              EXPECT_TRUE(same_elements(dtype, expected.data(), actual.data(), count));
            }
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

// ---- device_divide ------------------------------------------------------------------------------

TEST_F(DeviceReduceTest, DivideMatchesTheCpuMean) {
  const size_t count = 4099;
  const int64_t divisors[] = {1, 2, 3, 7, 1000, int64_t{1} << 31, int64_t{1} << 40};
  for (DType dtype : all_dtypes()) {
    const size_t elem = dtype_size(dtype);
    for (Pattern pattern : {Pattern::kOrdinary, Pattern::kExtreme}) {
      const std::vector<std::byte> host = make_pattern(dtype, pattern, 0, count);
      for (int64_t divisor : divisors) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " / " + std::to_string(divisor));
        std::vector<std::byte> expected(count * elem);
        const void* host_src[] = {host.data()};
        void* host_dst[] = {expected.data()};
        reduce(ReduceOp::kMean, dtype, host_src, host_dst, count, divisor);
        // One element in: the body and both scalar parts.
        DeviceBuffer dev((count + 1) * elem);
        ASSERT_NE(dev.data(), nullptr);
        upload(dev.data() + elem, host.data(), count * elem);
        const Status status = device_divide(dtype, dev.data() + elem, count, divisor, 0, stream_);
        ASSERT_TRUE(status.ok()) << status.to_string();
        sync();
        std::vector<std::byte> actual(count * elem);
        download(actual.data(), dev.data() + elem, count * elem);
        EXPECT_TRUE(same_elements(dtype, expected.data(), actual.data(), count));
        if (HasFatalFailure()) return;
      }
    }
  }
}

// ---- arguments and errors -----------------------------------------------------------------------

TEST_F(DeviceReduceTest, RejectsBadArgumentsAndNamesTheCall) {
  DeviceBuffer a(64), b(64), c(64);
  ASSERT_NE(c.data(), nullptr);
  const void* srcs[] = {a.data(), b.data(), c.data()};
  void* dsts[] = {c.data()};

  Status s = device_reduce(ReduceOp::kSum, DType::kFloat32, std::span<const void* const>(), dsts, 4,
                           1, 0, stream_);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();

  s = device_reduce(ReduceOp::kMean, DType::kFloat32, srcs, dsts, 4, 0, 0, stream_);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();

  const void* misaligned[] = {a.data() + 2, b.data()};
  s = device_reduce(ReduceOp::kSum, DType::kFloat32, misaligned, dsts, 4, 1, 0, stream_);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("srcs[0]"), std::string::npos) << s.message();

  const void* with_null[] = {a.data(), nullptr};
  s = device_reduce(ReduceOp::kSum, DType::kFloat32, with_null, dsts, 4, 1, 0, stream_);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();

  // Nothing to do: OK without touching the (null) pointers.
  const void* nulls[] = {nullptr};
  void* null_dsts[] = {nullptr};
  EXPECT_TRUE(
      device_reduce(ReduceOp::kSum, DType::kFloat32, nulls, null_dsts, 0, 1, 0, stream_).ok());
  EXPECT_TRUE(device_divide(DType::kInt32, nullptr, 0, 4, 0, stream_).ok());
  EXPECT_EQ(device_divide(DType::kInt32, c.data(), 4, 0, 0, stream_).code(),
            StatusCode::kInvalidArgument);

  // A device that does not exist: the CUDA error, under the call's name.
  int n = 0;
  ASSERT_CUDA(cudaGetDeviceCount(&n));
  s = device_reduce(ReduceOp::kSum, DType::kFloat32, srcs, dsts, 4, 1, n, nullptr);
  EXPECT_FALSE(s.ok());
  const std::string prefix =
      "device_reduce(sum, float32, 3 sources) on GPU:" + std::to_string(n) + ": cudaSetDevice";
  EXPECT_EQ(s.message().rfind(prefix, 0), 0u) << s.message();
  int current = -1;
  ASSERT_CUDA(cudaGetDevice(&current));
  EXPECT_EQ(current, 0) << "the caller's device is restored";
}

// The legacy default stream (nullptr) works, and the call leaves the current device alone.
TEST_F(DeviceReduceTest, DefaultStream) {
  const size_t count = 1000;
  std::vector<float> x(count), y(count), out(count);
  for (size_t i = 0; i < count; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = 0.5f;
  }
  DeviceBuffer dx(count * 4), dy(count * 4);
  ASSERT_NE(dy.data(), nullptr);
  ASSERT_CUDA(cudaMemcpy(dx.data(), x.data(), count * 4, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(dy.data(), y.data(), count * 4, cudaMemcpyHostToDevice));
  const void* srcs[] = {dx.data(), dy.data()};
  void* dsts[] = {dy.data()};
  const Status s = device_reduce(ReduceOp::kSum, DType::kFloat32, srcs, dsts, count, 1, 0, nullptr);
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_CUDA(cudaMemcpy(out.data(), dy.data(), count * 4, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(out[i], static_cast<float>(i) + 0.5f) << i;
}

#endif  // TRIBUTARY_HAVE_CUDA

}  // namespace
}  // namespace tributary::algorithms

#include "algorithms/reduce_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tributary/dtype.h"

namespace tributary::algorithms {
namespace {

// ---- typed access to untyped buffers ------------------------------------------------------------

double load_value(DType dtype, const std::byte* p, size_t i) {
  switch (dtype) {
    case DType::kFloat32: {
      float v;
      std::memcpy(&v, p + i * 4, 4);
      return v;
    }
    case DType::kFloat64: {
      double v;
      std::memcpy(&v, p + i * 8, 8);
      return v;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      uint16_t v;
      std::memcpy(&v, p + i * 2, 2);
      return dtype == DType::kFloat16 ? half_to_float(v) : bfloat16_to_float(v);
    }
    case DType::kInt32: {
      int32_t v;
      std::memcpy(&v, p + i * 4, 4);
      return v;
    }
    case DType::kInt64: {
      int64_t v;
      std::memcpy(&v, p + i * 8, 8);
      return static_cast<double>(v);
    }
    case DType::kInt8:
      return static_cast<double>(static_cast<int8_t>(p[i]));
    case DType::kUInt8:
      return static_cast<double>(static_cast<uint8_t>(p[i]));
  }
  return 0;
}

int64_t load_int(DType dtype, const std::byte* p, size_t i) {
  switch (dtype) {
    case DType::kInt32: {
      int32_t v;
      std::memcpy(&v, p + i * 4, 4);
      return v;
    }
    case DType::kInt64: {
      int64_t v;
      std::memcpy(&v, p + i * 8, 8);
      return v;
    }
    case DType::kInt8:
      return static_cast<int8_t>(p[i]);
    case DType::kUInt8:
      return static_cast<uint8_t>(p[i]);
    default:
      ADD_FAILURE() << "load_int on " << dtype_name(dtype);
      return 0;
  }
}

// Stores `v` rounded to the dtype (floats) or converted modulo 2^bits (integers).
void store_value(DType dtype, std::byte* p, size_t i, double v) {
  switch (dtype) {
    case DType::kFloat32: {
      const float f = static_cast<float>(v);
      std::memcpy(p + i * 4, &f, 4);
      return;
    }
    case DType::kFloat64:
      std::memcpy(p + i * 8, &v, 8);
      return;
    case DType::kFloat16:
    case DType::kBFloat16: {
      const float f = static_cast<float>(v);
      const uint16_t h = dtype == DType::kFloat16 ? float_to_half(f) : float_to_bfloat16(f);
      std::memcpy(p + i * 2, &h, 2);
      return;
    }
    case DType::kInt32: {
      const auto x = static_cast<int32_t>(static_cast<int64_t>(v));
      std::memcpy(p + i * 4, &x, 4);
      return;
    }
    case DType::kInt64: {
      const auto x = static_cast<int64_t>(v);
      std::memcpy(p + i * 8, &x, 8);
      return;
    }
    case DType::kInt8:
      p[i] = static_cast<std::byte>(static_cast<int8_t>(static_cast<int64_t>(v)));
      return;
    case DType::kUInt8:
      p[i] = static_cast<std::byte>(static_cast<uint8_t>(static_cast<int64_t>(v)));
      return;
  }
}

// The value of `x` modulo 2^bits, read back in the integer dtype.
int64_t wrap_to(DType dtype, uint64_t x) {
  switch (dtype) {
    case DType::kInt32:
      return static_cast<int32_t>(x);
    case DType::kInt64:
      return static_cast<int64_t>(x);
    case DType::kInt8:
      return static_cast<int8_t>(x);
    case DType::kUInt8:
      return static_cast<uint8_t>(x);
    default:
      return 0;
  }
}

bool is_integer(DType dtype) { return !dtype_is_floating(dtype); }

// A buffer of `count` elements followed by guard bytes that the kernel must not touch.
constexpr size_t kGuardBytes = 64;
constexpr std::byte kGuardByte{0xA5};

struct TestBuffer {
  TestBuffer(DType dtype, size_t count)
      : dtype(dtype), count(count), bytes(count * dtype_size(dtype) + kGuardBytes, kGuardByte) {}
  std::byte* data() { return bytes.data(); }
  const std::byte* data() const { return bytes.data(); }
  double at(size_t i) const { return load_value(dtype, data(), i); }
  bool guard_intact() const {
    return std::all_of(bytes.end() - kGuardBytes, bytes.end(),
                       [](std::byte b) { return b == kGuardByte; });
  }
  DType dtype;
  size_t count;
  std::vector<std::byte> bytes;
};

// ---- references ---------------------------------------------------------------------------------

// Floating reference in float64, sources combined left to right; NaN-propagating min/max.
double reference_float(ReduceOp op, const std::vector<double>& in, int64_t divisor) {
  double acc = in[0];
  for (size_t k = 1; k < in.size(); ++k) {
    const double x = in[k];
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMean:
        acc += x;
        break;
      case ReduceOp::kProd:
        acc *= x;
        break;
      case ReduceOp::kMin:
        acc = (std::isnan(acc) || std::isnan(x)) ? NAN : std::min(acc, x);
        break;
      case ReduceOp::kMax:
        acc = (std::isnan(acc) || std::isnan(x)) ? NAN : std::max(acc, x);
        break;
    }
  }
  return op == ReduceOp::kMean ? acc / static_cast<double>(divisor) : acc;
}

// Integer reference: sums and products at full width modulo 2^64, wrapped once at the end.
int64_t reference_int(ReduceOp op, DType dtype, const std::vector<int64_t>& in, int64_t divisor) {
  if (op == ReduceOp::kMin) return *std::min_element(in.begin(), in.end());
  if (op == ReduceOp::kMax) return *std::max_element(in.begin(), in.end());
  uint64_t acc = static_cast<uint64_t>(in[0]);
  for (size_t k = 1; k < in.size(); ++k) {
    if (op == ReduceOp::kProd) {
      acc *= static_cast<uint64_t>(in[k]);
    } else {
      acc += static_cast<uint64_t>(in[k]);
    }
  }
  const int64_t wrapped = wrap_to(dtype, acc);
  return op == ReduceOp::kMean ? wrapped / divisor : wrapped;
}

// ---- the harness --------------------------------------------------------------------------------

enum class Placement {
  kOutOfPlace,       // one separate destination
  kThreeDsts,        // three separate destinations
  kInPlaceFirst,     // dst == srcs[0]
  kInPlaceLast,      // dst == srcs[nsrc - 1]
  kInPlaceAndOther,  // dsts = {srcs[0], a separate buffer}
  kOtherAndInPlace,  // dsts = {a separate buffer, srcs[nsrc - 1]}: the first is written first
  kNoDst,            // nothing to write
};
constexpr Placement kAllPlacements[] = {Placement::kOutOfPlace,       Placement::kThreeDsts,
                                        Placement::kInPlaceFirst,     Placement::kInPlaceLast,
                                        Placement::kInPlaceAndOther,  Placement::kOtherAndInPlace,
                                        Placement::kNoDst};

const char* placement_name(Placement p) {
  switch (p) {
    case Placement::kOutOfPlace:
      return "out_of_place";
    case Placement::kThreeDsts:
      return "three_dsts";
    case Placement::kInPlaceFirst:
      return "in_place_first";
    case Placement::kInPlaceLast:
      return "in_place_last";
    case Placement::kInPlaceAndOther:
      return "in_place_and_other";
    case Placement::kOtherAndInPlace:
      return "other_and_in_place";
    case Placement::kNoDst:
      return "no_dst";
  }
  return "?";
}

enum class Inputs { kSmallIntegers, kRandom };

using ReduceFn = void (*)(ReduceOp, DType, std::span<const void* const>, std::span<void* const>,
                          size_t, int64_t);

// Fills source k with values whose reduction is exact in every dtype (small integers), or with
// random values (floats in [-1, 1], [0.5, 2] for products; integers over their whole range).
void fill_source(TestBuffer& buf, ReduceOp op, Inputs inputs, std::mt19937_64& rng) {
  const DType dtype = buf.dtype;
  for (size_t i = 0; i < buf.count; ++i) {
    double v;
    if (inputs == Inputs::kSmallIntegers) {
      if (op == ReduceOp::kProd) {
        // Products of five of these stay within [-32, 32]; an occasional zero.
        static constexpr int kFactors[] = {-2, -1, 1, 2, 1, 2, 0, 1};
        v = kFactors[rng() % 8];
        if (dtype == DType::kUInt8) v = std::abs(v);
      } else {
        // Sums of five of these stay within int8 (and are exact in bfloat16).
        v = static_cast<double>(static_cast<int>(rng() % 41) - 20);
        if (dtype == DType::kUInt8) v += 20;
      }
    } else if (is_integer(dtype)) {
      const uint64_t bits = rng();
      std::memcpy(buf.data() + i * dtype_size(dtype), &bits, dtype_size(dtype));
      continue;
    } else {
      std::uniform_real_distribution<double> dist(op == ReduceOp::kProd ? 0.5 : -1.0,
                                                  op == ReduceOp::kProd ? 2.0 : 1.0);
      v = dist(rng);
    }
    store_value(dtype, buf.data(), i, v);
  }
}

// Allowed |result - reference| for random float inputs: the accumulation error (float32 for all
// but float64) plus one rounding of the result to the dtype.
double tolerance(DType dtype, ReduceOp op, const std::vector<double>& in, double ref,
                 int64_t divisor) {
  if (op == ReduceOp::kMin || op == ReduceOp::kMax) return 0;  // no rounding at all
  const double acc_eps = dtype == DType::kFloat64 ? 0x1p-53 : 0x1p-24;
  double out_eps = acc_eps;
  if (dtype == DType::kFloat16) out_eps = 0x1p-11;
  if (dtype == DType::kBFloat16) out_eps = 0x1p-8;
  double scale = 0;
  if (op == ReduceOp::kProd) {
    scale = std::abs(ref);
  } else {
    for (double x : in) scale += std::abs(x);
    if (op == ReduceOp::kMean) scale /= static_cast<double>(divisor);
  }
  const double n = static_cast<double>(in.size());
  // 0x1p-24: float16's smallest subnormal, twice its worst rounding error among subnormals.
  return 2 * n * acc_eps * scale + out_eps * std::abs(ref) +
         (dtype == DType::kFloat16 ? 0x1p-24 : 0);
}

struct Case {
  DType dtype;
  ReduceOp op;
  size_t count;
  size_t nsrc;
  Placement placement;
  Inputs inputs;
  ReduceFn fn;
  size_t dst_offset_elems = 0;  // shifts separate destinations off their 16-byte alignment
};

std::string describe(const Case& c) {
  return std::string(dtype_name(c.dtype)) + " " + std::string(reduce_op_name(c.op)) +
         " count=" + std::to_string(c.count) + " nsrc=" + std::to_string(c.nsrc) + " " +
         placement_name(c.placement) +
         (c.inputs == Inputs::kSmallIntegers ? " small-integers" : " random") +
         (c.fn == &reduce ? "" : " portable") + " dst_offset=" + std::to_string(c.dst_offset_elems);
}

// Runs one case and checks every element of every destination (the first few mismatches are
// reported), the guards, and that sources which are not destinations are unchanged.
void run_case(const Case& c) {
  SCOPED_TRACE(describe(c));
  std::mt19937_64 rng(c.count * 131 + c.nsrc * 7 + static_cast<size_t>(c.op) * 3 +
                      static_cast<size_t>(c.dtype));
  // The replica count, as MEAN uses it; 3 for one source so that the division is exercised.
  const int64_t divisor = c.nsrc == 1 ? 3 : static_cast<int64_t>(c.nsrc);
  std::vector<TestBuffer> srcs;
  for (size_t k = 0; k < c.nsrc; ++k) {
    srcs.emplace_back(c.dtype, c.count);
    fill_source(srcs.back(), c.op, c.inputs, rng);
  }
  const std::vector<TestBuffer> originals = srcs;

  std::vector<TestBuffer> separate;
  const size_t elem = dtype_size(c.dtype);
  size_t nseparate = 0;
  switch (c.placement) {
    case Placement::kOutOfPlace:
      nseparate = 1;
      break;
    case Placement::kThreeDsts:
      nseparate = 3;
      break;
    case Placement::kInPlaceAndOther:
    case Placement::kOtherAndInPlace:
      nseparate = 1;
      break;
    default:
      break;
  }
  for (size_t j = 0; j < nseparate; ++j)
    separate.emplace_back(c.dtype, c.count + c.dst_offset_elems);

  std::vector<const void*> src_ptrs;
  for (auto& s : srcs) src_ptrs.push_back(s.data());
  std::vector<void*> dst_ptrs;
  if (c.placement == Placement::kInPlaceFirst || c.placement == Placement::kInPlaceAndOther) {
    dst_ptrs.push_back(srcs.front().data());
  }
  if (c.placement == Placement::kInPlaceLast) dst_ptrs.push_back(srcs.back().data());
  for (auto& d : separate) dst_ptrs.push_back(d.data() + c.dst_offset_elems * elem);
  if (c.placement == Placement::kOtherAndInPlace) dst_ptrs.push_back(srcs.back().data());

  c.fn(c.op, c.dtype, src_ptrs, dst_ptrs, c.count, divisor);

  // Expected values, from the original sources.
  size_t mismatches = 0;
  std::vector<double> in(c.nsrc);
  std::vector<int64_t> in_int(c.nsrc);
  for (const void* dptr : dst_ptrs) {
    const auto* d = static_cast<const std::byte*>(dptr);
    for (size_t i = 0; i < c.count && mismatches < 5; ++i) {
      if (is_integer(c.dtype)) {
        for (size_t k = 0; k < c.nsrc; ++k) in_int[k] = load_int(c.dtype, originals[k].data(), i);
        const int64_t want = reference_int(c.op, c.dtype, in_int, divisor);
        const int64_t got = load_int(c.dtype, d, i);
        if (got != want) {
          ++mismatches;
          ADD_FAILURE() << "element " << i << ": got " << got << ", want " << want;
        }
        continue;
      }
      for (size_t k = 0; k < c.nsrc; ++k) in[k] = originals[k].at(i);
      const double ref = reference_float(c.op, in, divisor);
      const double got = load_value(c.dtype, d, i);
      bool ok;
      if (c.inputs == Inputs::kSmallIntegers) {
        // Exact: the reference rounded once to the dtype, as the kernel rounds once.
        std::vector<std::byte> rounded(8);
        store_value(c.dtype, rounded.data(), 0, ref);
        ok = got == load_value(c.dtype, rounded.data(), 0);
      } else {
        ok = std::abs(got - ref) <= tolerance(c.dtype, c.op, in, ref, divisor);
      }
      if (!ok) {
        ++mismatches;
        ADD_FAILURE() << "element " << i << ": got " << got << ", want " << ref;
      }
    }
  }
  for (size_t k = 0; k < c.nsrc; ++k) {
    EXPECT_TRUE(srcs[k].guard_intact()) << "source " << k << " written past its end";
    const bool is_dst =
        std::find(dst_ptrs.begin(), dst_ptrs.end(), srcs[k].data()) != dst_ptrs.end();
    if (!is_dst) {
      EXPECT_EQ(srcs[k].bytes, originals[k].bytes) << "source " << k << " modified";
    }
  }
  for (size_t j = 0; j < separate.size(); ++j) {
    EXPECT_TRUE(separate[j].guard_intact()) << "destination written past its end";
    const auto head_end = separate[j].bytes.begin() + c.dst_offset_elems * elem;
    EXPECT_TRUE(std::all_of(separate[j].bytes.begin(), head_end, [](std::byte b) {
      return b == kGuardByte;
    })) << "destination written before its start";
  }
}

std::vector<ReduceFn> implementations(DType dtype) {
  if (dtype == DType::kFloat16 || dtype == DType::kBFloat16) {
    return {&reduce, &reduce_portable_for_testing};
  }
  return {&reduce};
}

// ---- every dtype x op ---------------------------------------------------------------------------

class ReduceTest : public ::testing::TestWithParam<std::tuple<DType, ReduceOp>> {};

TEST_P(ReduceTest, SmallCountsEverySourceCountAndPlacement) {
  const auto [dtype, op] = GetParam();
  const size_t block = reduce_block_elements(dtype);
  for (ReduceFn fn : implementations(dtype)) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, block - 1, block, block + 1}) {
      for (size_t nsrc = 1; nsrc <= 5; ++nsrc) {
        for (Placement placement : kAllPlacements) {
          for (Inputs inputs : {Inputs::kSmallIntegers, Inputs::kRandom}) {
            run_case({dtype, op, count, nsrc, placement, inputs, fn});
          }
        }
      }
    }
  }
}

TEST_P(ReduceTest, LargeOddCount) {
  const auto [dtype, op] = GetParam();
  const size_t count = 3 * reduce_block_elements(dtype) + 100003;  // several blocks and a tail
  for (ReduceFn fn : implementations(dtype)) {
    for (size_t nsrc : {size_t{2}, size_t{5}}) {
      run_case({dtype, op, count, nsrc, Placement::kOutOfPlace, Inputs::kRandom, fn});
      run_case({dtype, op, count, nsrc, Placement::kInPlaceLast, Inputs::kSmallIntegers, fn});
    }
  }
}

TEST_P(ReduceTest, UnalignedDestinations) {
  const auto [dtype, op] = GetParam();
  for (ReduceFn fn : implementations(dtype)) {
    for (size_t offset : {size_t{1}, size_t{3}}) {
      Case c{dtype, op, 1001, 3, Placement::kThreeDsts, Inputs::kRandom, fn};
      c.dst_offset_elems = offset;
      run_case(c);
    }
  }
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<DType, ReduceOp>>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_" +
         std::string(reduce_op_name(std::get<1>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(AllDTypesAndOps, ReduceTest,
                         ::testing::Combine(::testing::ValuesIn(all_dtypes()),
                                            ::testing::ValuesIn(all_reduce_ops())),
                         param_name);

// Outputs of kStreamingStoreMinBytes or more take the non-temporal store path on x86-64.
TEST(ReduceStreamingTest, LargeOutputsMisalignedAndInPlace) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kInt8}) {
    const size_t count = kStreamingStoreMinBytes / dtype_size(dtype) + 13;
    for (size_t offset : {size_t{0}, size_t{1}}) {
      Case c{dtype,           ReduceOp::kSum, count, 2, Placement::kInPlaceAndOther,
             Inputs::kRandom, &reduce};
      c.dst_offset_elems = offset;
      run_case(c);
    }
    run_case({dtype, ReduceOp::kMax, count, 1, Placement::kThreeDsts, Inputs::kRandom, &reduce});
  }
}

// ---- specific semantics -------------------------------------------------------------------------

template <typename T>
std::vector<T> reduce_values(ReduceOp op, DType dtype, const std::vector<std::vector<T>>& srcs,
                             int64_t divisor = 1, ReduceFn fn = &reduce) {
  std::vector<const void*> ptrs;
  for (const auto& s : srcs) ptrs.push_back(s.data());
  std::vector<T> out(srcs[0].size());
  const std::vector<void*> dsts = {out.data()};
  fn(op, dtype, ptrs, dsts, out.size(), divisor);
  return out;
}

TEST(ReduceIntegerTest, SumAndProductWrapAround) {
  using I32 = std::numeric_limits<int32_t>;
  EXPECT_EQ(
      reduce_values<int32_t>(ReduceOp::kSum, DType::kInt32, {{I32::max(), -1}, {1, I32::min()}}),
      (std::vector<int32_t>{I32::min(), I32::max()}));
  EXPECT_EQ(
      reduce_values<int32_t>(ReduceOp::kProd, DType::kInt32, {{65536, -65536}, {65536, 32768}}),
      (std::vector<int32_t>{0, I32::min()}));
  using I64 = std::numeric_limits<int64_t>;
  EXPECT_EQ(reduce_values<int64_t>(ReduceOp::kSum, DType::kInt64, {{I64::max()}, {I64::max()}}),
            (std::vector<int64_t>{-2}));
  EXPECT_EQ(reduce_values<int64_t>(ReduceOp::kProd, DType::kInt64, {{I64::min()}, {-1}}),
            (std::vector<int64_t>{I64::min()}));
  EXPECT_EQ(reduce_values<int8_t>(ReduceOp::kSum, DType::kInt8, {{100, -128}, {100, -1}}),
            (std::vector<int8_t>{-56, 127}));
  EXPECT_EQ(reduce_values<int8_t>(ReduceOp::kProd, DType::kInt8, {{16, -128}, {16, -1}}),
            (std::vector<int8_t>{0, -128}));
  EXPECT_EQ(reduce_values<uint8_t>(ReduceOp::kSum, DType::kUInt8, {{200, 255}, {100, 1}}),
            (std::vector<uint8_t>{44, 0}));
  EXPECT_EQ(reduce_values<uint8_t>(ReduceOp::kProd, DType::kUInt8, {{16, 255}, {17, 255}}),
            (std::vector<uint8_t>{16, 1}));
}

TEST(ReduceIntegerTest, MeanTruncatesTowardZeroAfterWrapping) {
  EXPECT_EQ(reduce_values<int32_t>(ReduceOp::kMean, DType::kInt32, {{-7, 7, -1}, {0, 0, 0}}, 2),
            (std::vector<int32_t>{-3, 3, 0}));
  EXPECT_EQ(reduce_values<int64_t>(ReduceOp::kMean, DType::kInt64, {{-10, 10}, {1, 1}, {0, 0}}, 3),
            (std::vector<int64_t>{-3, 3}));
  // 100 + 100 wraps to -56 in int8; the mean divides that.
  EXPECT_EQ(reduce_values<int8_t>(ReduceOp::kMean, DType::kInt8, {{100, -5}, {100, 0}}, 2),
            (std::vector<int8_t>{-28, -2}));
  EXPECT_EQ(reduce_values<uint8_t>(ReduceOp::kMean, DType::kUInt8, {{255, 7}, {255, 0}}, 2),
            (std::vector<uint8_t>{127, 3}));
  // A large divisor, as after a sum over many replicas.
  EXPECT_EQ(reduce_values<int32_t>(ReduceOp::kMean, DType::kInt32, {{1000}}, 1000),
            (std::vector<int32_t>{1}));
}

// The kernel divides small integer types through floating point; it must match C++'s integer
// division for every value and divisor, including divisors that float cannot represent.
TEST(ReduceIntegerTest, MeanMatchesIntegerDivisionEverywhere) {
  std::vector<int8_t> all_int8(256);
  std::vector<uint8_t> all_uint8(256);
  for (int i = 0; i < 256; ++i) {
    all_int8[i] = static_cast<int8_t>(i - 128);
    all_uint8[i] = static_cast<uint8_t>(i);
  }
  std::vector<int64_t> divisors;
  for (int64_t d = 1; d <= 300; ++d) divisors.push_back(d);
  for (int64_t d : {(int64_t{1} << 24) + 1, (int64_t{1} << 31) - 1, int64_t{1} << 31,
                    (int64_t{1} << 53) + 1, std::numeric_limits<int64_t>::max()}) {
    divisors.push_back(d);
  }
  std::mt19937_64 rng(3);
  std::vector<int32_t> int32s = {std::numeric_limits<int32_t>::min(),
                                 std::numeric_limits<int32_t>::max(), -1, 0, 1};
  for (int i = 0; i < 1000; ++i) int32s.push_back(static_cast<int32_t>(rng()));
  for (int64_t d : divisors) {
    const auto i8 = reduce_values<int8_t>(ReduceOp::kMean, DType::kInt8, {all_int8}, d);
    const auto u8 = reduce_values<uint8_t>(ReduceOp::kMean, DType::kUInt8, {all_uint8}, d);
    const auto i32 = reduce_values<int32_t>(ReduceOp::kMean, DType::kInt32, {int32s}, d);
    for (size_t i = 0; i < 256; ++i) {
      ASSERT_EQ(i8[i], all_int8[i] / d) << int{all_int8[i]} << " / " << d;
      ASSERT_EQ(u8[i], all_uint8[i] / d) << int{all_uint8[i]} << " / " << d;
    }
    for (size_t i = 0; i < int32s.size(); ++i) {
      ASSERT_EQ(i32[i], int32s[i] / d) << int32s[i] << " / " << d;
    }
  }
}

TEST(ReduceIntegerTest, SignedMinMaxCompareSigned) {
  EXPECT_EQ(reduce_values<int8_t>(ReduceOp::kMin, DType::kInt8, {{-128, 127}, {127, -128}}),
            (std::vector<int8_t>{-128, -128}));
  EXPECT_EQ(reduce_values<int8_t>(ReduceOp::kMax, DType::kInt8, {{-128, 5}, {-1, -6}}),
            (std::vector<int8_t>{-1, 5}));
  EXPECT_EQ(reduce_values<uint8_t>(ReduceOp::kMax, DType::kUInt8, {{128, 0}, {127, 255}}),
            (std::vector<uint8_t>{128, 255}));
  EXPECT_EQ(reduce_values<int64_t>(ReduceOp::kMin, DType::kInt64,
                                   {{std::numeric_limits<int64_t>::min() + 1}, {-1}}),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::min() + 1}));
}

// Min and max propagate NaN from any source position, in every float dtype and implementation.
TEST(ReduceFloatTest, MinMaxPropagateNaN) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (ReduceFn fn : implementations(dtype)) {
      for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kSum}) {
        for (size_t nan_src = 0; nan_src < 5; ++nan_src) {
          // Element 0: NaN in source nan_src; element 1..: no NaN. 19 elements: vector and tail.
          constexpr size_t kCount = 19;
          std::vector<TestBuffer> srcs;
          for (size_t k = 0; k < 5; ++k) {
            srcs.emplace_back(dtype, kCount);
            for (size_t i = 0; i < kCount; ++i) {
              store_value(dtype, srcs[k].data(), i, static_cast<double>(k) - 2.0);
            }
            if (k == nan_src) {
              for (size_t i = 0; i < kCount; i += 2) store_value(dtype, srcs[k].data(), i, NAN);
            }
          }
          TestBuffer dst(dtype, kCount);
          std::vector<const void*> src_ptrs;
          for (auto& s : srcs) src_ptrs.push_back(s.data());
          const std::vector<void*> dsts = {dst.data()};
          fn(op, dtype, src_ptrs, dsts, kCount, 1);
          const double clean = op == ReduceOp::kMin ? -2.0 : op == ReduceOp::kMax ? 2.0 : 0.0;
          for (size_t i = 0; i < kCount; ++i) {
            if (i % 2 == 0) {
              EXPECT_TRUE(std::isnan(dst.at(i)))
                  << dtype_name(dtype) << " " << reduce_op_name(op) << " NaN in source " << nan_src
                  << ", element " << i << ": got " << dst.at(i);
            } else {
              EXPECT_EQ(dst.at(i), clean) << dtype_name(dtype) << " element " << i;
            }
          }
        }
      }
    }
  }
}

TEST(ReduceFloatTest, HalfTypesAccumulateInFloatAndRoundOnce) {
  // 2048 + 1 + 1 in float16: each partial sum rounded to float16 would stay at 2048 (ties to even);
  // accumulating in float32 gives 2050, which float16 represents.
  const uint16_t h2048 = float_to_half(2048.0f), h1 = float_to_half(1.0f);
  for (ReduceFn fn : implementations(DType::kFloat16)) {
    const auto out =
        reduce_values<uint16_t>(ReduceOp::kSum, DType::kFloat16, {{h2048}, {h1}, {h1}}, 1, fn);
    EXPECT_EQ(half_to_float(out[0]), 2050.0f);
  }
  // bfloat16: 256 + 1 + 1 = 258 (representable); step-wise rounding would give 256.
  const uint16_t b256 = float_to_bfloat16(256.0f), b1 = float_to_bfloat16(1.0f);
  for (ReduceFn fn : implementations(DType::kBFloat16)) {
    const auto out =
        reduce_values<uint16_t>(ReduceOp::kSum, DType::kBFloat16, {{b256}, {b1}, {b1}}, 1, fn);
    EXPECT_EQ(bfloat16_to_float(out[0]), 258.0f);
  }
  // Mean of float16 65504 + 65504 over 2: the float32 sum does not overflow.
  const uint16_t hmax = float_to_half(65504.0f);
  for (ReduceFn fn : implementations(DType::kFloat16)) {
    const auto out =
        reduce_values<uint16_t>(ReduceOp::kMean, DType::kFloat16, {{hmax}, {hmax}}, 2, fn);
    EXPECT_EQ(half_to_float(out[0]), 65504.0f);
  }
}

// The AVX2 and portable half-type loops agree bit for bit (for non-NaN data).
TEST(ReduceFloatTest, VectorAndPortableHalfPathsAgree) {
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    auto to_half = dtype == DType::kFloat16 ? float_to_half : float_to_bfloat16;
    for (ReduceOp op : all_reduce_ops()) {
      std::vector<std::vector<uint16_t>> srcs(4, std::vector<uint16_t>(4099));
      for (auto& s : srcs) {
        for (auto& v : s) v = to_half(op == ReduceOp::kProd ? dist(rng) / 64.0f : dist(rng));
      }
      EXPECT_EQ(reduce_values<uint16_t>(op, dtype, srcs, 3, &reduce),
                reduce_values<uint16_t>(op, dtype, srcs, 3, &reduce_portable_for_testing))
          << dtype_name(dtype) << " " << reduce_op_name(op);
    }
  }
}

TEST(ReduceBlockTest, BlockElements) {
  EXPECT_EQ(reduce_block_elements(DType::kFloat32), kReduceBlockBytes / 4);
  EXPECT_EQ(reduce_block_elements(DType::kFloat16), kReduceBlockBytes / 4);
  EXPECT_EQ(reduce_block_elements(DType::kFloat64), kReduceBlockBytes / 8);
  EXPECT_EQ(reduce_block_elements(DType::kInt8), kReduceBlockBytes);
}

// ---- float16 / bfloat16 conversions -------------------------------------------------------------

// binary16 decoded from its fields, independently of half_to_float.
double decode_half(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  double v;
  if (exponent == 0x1F) {
    v = mantissa ? std::numeric_limits<double>::quiet_NaN()
                 : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    v = std::ldexp(mantissa, -24);
  } else {
    v = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return sign ? -v : v;
}

TEST(HalfConversionTest, DecodesEveryBitPatternAndRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    const float f = half_to_float(h);
    const double want = decode_half(h);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << bits;
      const uint16_t back = float_to_half(f);
      EXPECT_EQ(back & 0x7C00, 0x7C00) << std::hex << bits;
      EXPECT_NE(back & 0x03FF, 0) << std::hex << bits;           // still a NaN
      EXPECT_EQ(back & 0x8000, h & 0x8000) << std::hex << bits;  // same sign
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), want) << std::hex << bits;
    ASSERT_EQ(std::signbit(f), (bits & 0x8000) != 0) << std::hex << bits;
    ASSERT_EQ(float_to_half(f), h) << std::hex << bits;
  }
}

// Every midpoint between adjacent binary16 values rounds to the even one, and anything just off the
// midpoint rounds to the nearer one.
TEST(HalfConversionTest, RoundsToNearestEven) {
  for (uint16_t lo = 0; lo < 0x7C00; ++lo) {  // positive finite, including subnormals
    const auto hi = static_cast<uint16_t>(lo + 1);
    const double mid = (decode_half(lo) + (hi == 0x7C00 ? 65536.0 : decode_half(hi))) / 2;
    const auto m = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(m), mid);  // exact in float32
    const uint16_t even = (lo & 1) == 0 ? lo : hi;
    ASSERT_EQ(float_to_half(m), even) << "midpoint above " << std::hex << lo;
    ASSERT_EQ(float_to_half(-m), even | 0x8000) << "midpoint above -" << std::hex << lo;
    ASSERT_EQ(float_to_half(std::nextafter(m, 0.0f)), lo) << std::hex << lo;
    ASSERT_EQ(float_to_half(std::nextafter(m, 1e9f)), hi) << std::hex << lo;
  }
}

TEST(HalfConversionTest, EdgeCases) {
  EXPECT_EQ(float_to_half(0.0f), 0x0000);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half(1.0f), 0x3C00);
  EXPECT_EQ(float_to_half(65504.0f), 0x7BFF);    // largest finite
  EXPECT_EQ(float_to_half(65519.996f), 0x7BFF);  // just below the midpoint
  EXPECT_EQ(float_to_half(65520.0f), 0x7C00);    // midpoint: ties to "even" inf
  EXPECT_EQ(float_to_half(1e10f), 0x7C00);       // overflow
  EXPECT_EQ(float_to_half(-1e10f), 0xFC00);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(float_to_half(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(float_to_half(0x1p-24f), 0x0001);         // smallest subnormal
  EXPECT_EQ(float_to_half(0x1p-25f), 0x0000);         // half of it: ties to 0
  EXPECT_EQ(float_to_half(0x1.000002p-25f), 0x0001);  // just above: rounds up
  EXPECT_EQ(float_to_half(0x1.8p-24f), 0x0002);       // 1.5 ulp: ties to even 2
  EXPECT_EQ(float_to_half(0x1p-14f), 0x0400);         // smallest normal
  EXPECT_EQ(float_to_half(0x1.ff8p-15f), 0x03FF);     // largest subnormal
  EXPECT_EQ(float_to_half(0x1.ffcp-15f), 0x0400);     // tie: up into the normals
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_half(-std::numeric_limits<float>::denorm_min()), 0x8000);
  const uint16_t nan = float_to_half(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
  const uint16_t neg_nan = float_to_half(-std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(neg_nan & 0x8000, 0x8000);
  EXPECT_TRUE(std::isnan(half_to_float(0x7C01)));  // signalling-NaN pattern
  EXPECT_EQ(half_to_float(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(half_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(half_to_float(0x3555), 0x1.554p-2f);
}

// Random float32 values against a rounding computed in float64 from the neighbouring halves.
TEST(HalfConversionTest, RandomFloatsMatchReferenceRounding) {
  std::mt19937 rng(7);
  for (int n = 0; n < 200000; ++n) {
    // Exponents from well below the subnormals to above the overflow threshold.
    const float f = std::ldexp(std::uniform_real_distribution<float>(1.0f, 2.0f)(rng),
                               static_cast<int>(rng() % 46) - 30) *
                    ((rng() & 1) ? 1.0f : -1.0f);
    const double a = std::abs(static_cast<double>(f));
    uint16_t want;
    if (a >= 65520.0) {
      want = 0x7C00;
    } else {
      // Largest magnitude pattern with decode_half(lo) <= a, by binary search.
      uint16_t lo = 0, hi = 0x7C00;
      while (hi - lo > 1) {
        const auto mid = static_cast<uint16_t>((lo + hi) / 2);
        (decode_half(mid) <= a ? lo : hi) = mid;
      }
      const double up = hi == 0x7C00 ? 65536.0 : decode_half(hi);
      const double dlo = a - decode_half(lo), dhi = up - a;
      want = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1) == 0 ? lo : hi);
    }
    if (f < 0) want |= 0x8000;
    ASSERT_EQ(float_to_half(f), want) << std::hexfloat << f;
  }
}

TEST(BFloat16ConversionTest, RoundTripsAndRoundsToNearestEven) {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const auto b = static_cast<uint16_t>(bits);
    const float f = bfloat16_to_float(b);
    ASSERT_EQ(std::bit_cast<uint32_t>(f), bits << 16);
    if (std::isnan(f)) {
      const uint16_t back = float_to_bfloat16(f);
      EXPECT_TRUE(std::isnan(bfloat16_to_float(back))) << std::hex << bits;
      EXPECT_EQ(back & 0x8000, b & 0x8000);
      continue;
    }
    ASSERT_EQ(float_to_bfloat16(f), b) << std::hex << bits;
    if ((bits & 0x7FFF) >= 0x7F80) continue;  // no finite value above infinity
    // The midpoint to the next pattern (same sign), and its neighbours.
    const uint32_t mid = (bits << 16) | 0x8000;
    const uint16_t even = (bits & 1) == 0 ? b : static_cast<uint16_t>(b + 1);
    ASSERT_EQ(float_to_bfloat16(std::bit_cast<float>(mid)), even) << std::hex << bits;
    ASSERT_EQ(float_to_bfloat16(std::bit_cast<float>(mid - 1)), b) << std::hex << bits;
    ASSERT_EQ(float_to_bfloat16(std::bit_cast<float>(mid + 1)), static_cast<uint16_t>(b + 1))
        << std::hex << bits;
  }
}

TEST(BFloat16ConversionTest, EdgeCases) {
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bfloat16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::max()), 0x7F80);  // rounds to inf
  EXPECT_EQ(float_to_bfloat16(-std::numeric_limits<float>::max()), 0xFF80);
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0x00018000u)), 0x0002);  // subnormal tie -> even
  // NaNs whose payload sits only in the low 16 bits must stay NaN (not round to infinity).
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0x7F800001u)), 0x7FC0);
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0xFFFFFFFFu)), 0xFFFF);
  EXPECT_EQ(bfloat16_to_float(0x4049), 3.140625f);
}

}  // namespace
}  // namespace tributary::algorithms

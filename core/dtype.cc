#include "tributary/dtype.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <string>

#include "core/strings.h"
#include "tributary/half.h"

namespace tributary {
namespace {

constexpr std::array<DType, 8> kAllDTypes = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                             DType::kBFloat16, DType::kInt32, DType::kInt64,
                                             DType::kInt8, DType::kUInt8};
constexpr std::array<ReduceOp, 5> kAllOps = {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMin,
                                             ReduceOp::kMax, ReduceOp::kProd};

struct Alias {
  std::string_view name;
  DType dtype;
};
constexpr Alias kDTypeAliases[] = {
    {"float32", DType::kFloat32},  {"f32", DType::kFloat32},     {"float", DType::kFloat32},
    {"fp32", DType::kFloat32},     {"float64", DType::kFloat64}, {"f64", DType::kFloat64},
    {"double", DType::kFloat64},   {"fp64", DType::kFloat64},    {"float16", DType::kFloat16},
    {"f16", DType::kFloat16},      {"half", DType::kFloat16},    {"fp16", DType::kFloat16},
    {"bfloat16", DType::kBFloat16}, {"bf16", DType::kBFloat16},  {"int32", DType::kInt32},
    {"i32", DType::kInt32},        {"int", DType::kInt32},       {"int64", DType::kInt64},
    {"i64", DType::kInt64},        {"long", DType::kInt64},      {"int8", DType::kInt8},
    {"i8", DType::kInt8},          {"char", DType::kInt8},       {"uint8", DType::kUInt8},
    {"u8", DType::kUInt8},         {"byte", DType::kUInt8},
};

}  // namespace

std::span<const DType> all_dtypes() { return kAllDTypes; }

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kInt8: return 1;
    case DType::kUInt8: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
  }
  return "unknown";
}

bool dtype_is_floating(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kFloat16 ||
         dtype == DType::kBFloat16;
}

StatusOr<DType> parse_dtype(std::string_view text) {
  std::string lower = internal::to_lower(internal::trim(text));
  for (const Alias& a : kDTypeAliases) {
    if (a.name == lower) return a.dtype;
  }
  std::vector<std::string> names;
  for (DType d : kAllDTypes) names.emplace_back(dtype_name(d));
  return invalid_argument("unknown dtype '" + std::string(text) +
                          "'; valid dtypes: " + internal::join(names, ", "));
}

double dtype_load(DType t, const void* p, int64_t i) {
  switch (t) {
    case DType::kFloat32: return static_cast<const float*>(p)[i];
    case DType::kFloat64: return static_cast<const double*>(p)[i];
    case DType::kFloat16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kBFloat16: return bfloat16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kInt32: return static_cast<const int32_t*>(p)[i];
    case DType::kInt64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::kInt8: return static_cast<const int8_t*>(p)[i];
    case DType::kUInt8: return static_cast<const uint8_t*>(p)[i];
  }
  return 0;
}

namespace {
// A double as an integer type: the value truncated toward zero, modulo 2^bits when out of range (as
// integer reductions wrap), 0 for NaN and infinities. A plain cast of an out-of-range double is
// undefined behaviour.
template <typename T>
T wrapped(double v) {
  if (!std::isfinite(v)) return 0;
  constexpr double kTwo64 = 18446744073709551616.0;
  const double m = std::fmod(std::trunc(v), kTwo64);  // an integer, |m| < 2^64
  const uint64_t u = m >= 0 ? static_cast<uint64_t>(m) : uint64_t{0} - static_cast<uint64_t>(-m);
  return static_cast<T>(u);  // modular since C++20
}
}  // namespace

void dtype_store(DType t, void* p, int64_t i, double v) {
  switch (t) {
    case DType::kFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::kFloat64: static_cast<double*>(p)[i] = v; break;
    // Via float: one more rounding, exact for every value a half type can hold.
    case DType::kFloat16: static_cast<uint16_t*>(p)[i] = float_to_half(static_cast<float>(v)); break;
    case DType::kBFloat16:
      static_cast<uint16_t*>(p)[i] = float_to_bfloat16(static_cast<float>(v));
      break;
    case DType::kInt32: static_cast<int32_t*>(p)[i] = wrapped<int32_t>(v); break;
    case DType::kInt64: static_cast<int64_t*>(p)[i] = wrapped<int64_t>(v); break;
    case DType::kInt8: static_cast<int8_t*>(p)[i] = wrapped<int8_t>(v); break;
    case DType::kUInt8: static_cast<uint8_t*>(p)[i] = wrapped<uint8_t>(v); break;
  }
}

double dtype_round(DType t, double v) {
  alignas(8) unsigned char buf[8];
  dtype_store(t, buf, 0, v);
  return dtype_load(t, buf, 0);
}

std::span<const ReduceOp> all_reduce_ops() { return kAllOps; }

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMean: return "mean";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProd: return "prod";
  }
  return "unknown";
}

StatusOr<ReduceOp> parse_reduce_op(std::string_view text) {
  std::string lower = internal::to_lower(internal::trim(text));
  for (ReduceOp op : kAllOps) {
    if (reduce_op_name(op) == lower) return op;
  }
  if (lower == "avg" || lower == "average") return ReduceOp::kMean;
  if (lower == "product") return ReduceOp::kProd;
  return invalid_argument("unknown reduce op '" + std::string(text) +
                          "'; valid ops: sum, mean, min, max, prod");
}

}  // namespace tributary

// DType: the element types tributary reduces, and ReduceOp: how it reduces them.
//
// Half types (float16, bfloat16) are reduced with float32 accumulation and rounded once when the
// result is written, as NCCL and PyTorch do on CPUs. MEAN is a sum divided once, after the sum, by the
// number of replicas in sync (integer types divide with truncation toward zero, as C++ does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "tributary/export.h"
#include "tributary/status.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

enum class DType : uint8_t {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt32,
  kInt64,
  kInt8,
  kUInt8,
};

// Every dtype, in declaration order.
std::span<const DType> all_dtypes();
// Bytes per element.
size_t dtype_size(DType dtype);
// Canonical name: "float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8".
std::string_view dtype_name(DType dtype);
bool dtype_is_floating(DType dtype);
// Accepts the canonical names and the usual aliases (f32, float, half, fp16, bf16, double, i32,
// int, long, i64, char, byte, ...), case-insensitively.
StatusOr<DType> parse_dtype(std::string_view text);

// Element access for filling and checking tensors of any dtype (not for hot loops): reads
// element `index` of `data` as a double; stores `value` rounded to the dtype (round to nearest even
// for floating types; integers are truncated toward zero and wrap modulo 2^bits when out of range,
// as integer reductions do, NaN and infinities giving 0); and rounds a value to what the dtype can
// hold.
double dtype_load(DType dtype, const void* data, int64_t index);
void dtype_store(DType dtype, void* data, int64_t index, double value);
double dtype_round(DType dtype, double value);

enum class ReduceOp : uint8_t { kSum, kMean, kMin, kMax, kProd };

std::span<const ReduceOp> all_reduce_ops();
// "sum", "mean", "min", "max", "prod".
std::string_view reduce_op_name(ReduceOp op);
// Case-insensitive, as tf.distribute accepts "SUM" and "sum"; also "avg"/"average", "product".
StatusOr<ReduceOp> parse_reduce_op(std::string_view text);

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API

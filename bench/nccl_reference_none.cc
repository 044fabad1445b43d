// tributary-bench without NCCL: the direct NCCL line is not built (see lines.h).
#include "bench/lines.h"

namespace tributary::bench {
bool nccl_reference_built() { return false; }
namespace internal {
StatusOr<std::unique_ptr<Line>> nccl_reference(const BackendSpec&, const BackendContext&, DType,
                                               ReduceOp) {
  return unimplemented("the direct NCCL line was not built (tributary was built without NCCL)");
}
}  // namespace internal
}  // namespace tributary::bench

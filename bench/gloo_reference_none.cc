// The direct Gloo line where the bench was built without Gloo (see lines.h).
#include "bench/lines.h"

namespace tributary::bench {

bool gloo_reference_built() { return false; }

namespace internal {
StatusOr<std::unique_ptr<Line>> gloo_reference(const BackendSpec&, const BackendContext&, DType,
                                               ReduceOp) {
  return unimplemented(
      "this tributary-bench was built without Gloo (Debian: libgloo-dev, then reconfigure)");
}
}  // namespace internal

}  // namespace tributary::bench

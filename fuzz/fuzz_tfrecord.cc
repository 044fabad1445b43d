// TFRecord files: arbitrary bytes must give records whose CRCs matched, or a DataLoss error naming
// the offset, never a crash or an allocation of a length the file does not hold.
#include <cstddef>
#include <cstdint>
#include <optional>

#include "fuzz/dataset_file.h"
#include "tributary/strategy/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = tributary::fuzz::write_input("tfrecord", data, size);
  auto it = tributary::Dataset::tfrecord({path}).make_iterator();
  if (!it.ok()) return 0;
  for (int i = 0; i < 100000; ++i) {
    auto next = (*it)->get_next();
    if (!next.ok() || !next->has_value()) break;
  }
  return 0;
}

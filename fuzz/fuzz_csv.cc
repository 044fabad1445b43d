// CSV files: arbitrary bytes, read as (int64, float32, string) rows with a header line, must give
// rows or an error naming file:line, never a crash. The first byte picks the column types.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "fuzz/dataset_file.h"
#include "tributary/strategy/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using tributary::DType;
  static const std::vector<DType> kChoices = {DType::kInt64, DType::kFloat32, DType::kFloat64,
                                              DType::kInt32, DType::kUInt8};
  std::vector<DType> types;
  for (int i = 0; i < 1 + data[0] % 4; ++i) types.push_back(kChoices[(data[0] >> (2 * i)) % 5]);
  const std::string path = tributary::fuzz::write_input("csv", data + 1, size - 1);
  auto it = tributary::Dataset::csv({path}, types, (data[0] & 0x80) != 0).make_iterator();
  if (!it.ok()) return 0;
  for (int i = 0; i < 100000; ++i) {
    auto next = (*it)->get_next();
    if (!next.ok() || !next->has_value()) break;
  }
  return 0;
}

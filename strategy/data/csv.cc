// CSV source (TF's CsvDataset without record defaults): one scalar per column. Fields follow RFC
// 4180 quoting within a line ("a ""quoted"" field"); a record may not span lines. Blank lines are
// skipped. Every error names file:line (1-based, counting the header), since a CSV file is fixed by
// opening it in an editor at that line.
#include <charconv>
#include <fstream>
#include <limits>
#include <utility>

#include "strategy/data/nodes.h"

namespace tributary::data_internal {

namespace {

// Splits one line into fields; false on an unterminated quote.
bool split_fields(const std::string& line, std::vector<std::string>* fields) {
  fields->clear();
  std::string field;
  bool quoted = false;
  bool was_quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c != '"') {
        field += c;
      } else if (i + 1 < line.size() && line[i + 1] == '"') {
        field += '"';
        ++i;
      } else {
        quoted = false;
      }
    } else if (c == '"' && field.empty() && !was_quoted) {
      quoted = was_quoted = true;
    } else if (c == ',') {
      fields->push_back(std::move(field));
      field.clear();
      was_quoted = false;
    } else {
      field += c;
    }
  }
  if (quoted) return false;
  fields->push_back(std::move(field));
  return true;
}

// Parses `text` as one value of `dtype`, or explains why not.
StatusOr<Array> parse_field(std::string_view text, DType dtype) {
  const char* begin = text.data();
  const char* end = begin + text.size();
  if (dtype_is_floating(dtype)) {
    double v = 0;
    auto [ptr, ec] = std::from_chars(begin, end, v);
    if (text.empty() || ec != std::errc() || ptr != end) {
      return invalid_argument("is not a valid " + std::string(dtype_name(dtype)));
    }
    TRIBUTARY_ASSIGN_OR_RETURN(Array a, Array::zeros(dtype, {}));
    dtype_store(dtype, a.mutable_data<void>(), 0, v);
    return a;
  }
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(begin, end, v);
  if (text.empty() || ec == std::errc::invalid_argument || ptr != end) {
    return invalid_argument("is not a valid " + std::string(dtype_name(dtype)));
  }
  int64_t lo = std::numeric_limits<int64_t>::min();
  int64_t hi = std::numeric_limits<int64_t>::max();
  switch (dtype) {
    case DType::kInt32:
      lo = INT32_MIN, hi = INT32_MAX;
      break;
    case DType::kInt8:
      lo = INT8_MIN, hi = INT8_MAX;
      break;
    case DType::kUInt8:
      lo = 0, hi = UINT8_MAX;
      break;
    default:
      break;
  }
  if (ec == std::errc::result_out_of_range || v < lo || v > hi) {
    return invalid_argument("is out of range for " + std::string(dtype_name(dtype)));
  }
  TRIBUTARY_ASSIGN_OR_RETURN(Array a, Array::zeros(dtype, {}));
  dtype_store(dtype, a.mutable_data<void>(), 0, static_cast<double>(v));
  if (dtype == DType::kInt64) *a.mutable_data<int64_t>() = v;  // doubles lose bits past 2^53
  return a;
}

class CsvIterator final : public IteratorBase {
 public:
  CsvIterator(std::vector<std::string> files, std::vector<DType> types, bool header)
      : files_(std::move(files)), types_(std::move(types)), header_(header) {}

  StatusOr<std::optional<Element>> next() override {
    std::string line;
    for (;;) {
      if (!in_.is_open()) {
        if (file_ >= files_.size()) return std::optional<Element>();
        in_.open(files_[file_]);
        if (!in_.is_open()) return not_found("csv: cannot open \"" + files_[file_] + "\"");
        line_ = 0;
      }
      if (!std::getline(in_, line)) {
        if (in_.bad()) return unavailable("csv: reading \"" + files_[file_] + "\" failed");
        in_.close();
        ++file_;
        continue;
      }
      ++line_;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if ((header_ && line_ == 1) || line.empty()) continue;
      return parse_line(line);
    }
  }

 private:
  StatusOr<std::optional<Element>> parse_line(const std::string& line) {
    const std::string where = "csv: " + files_[file_] + ":" + std::to_string(line_) + ": ";
    if (!split_fields(line, &fields_)) return invalid_argument(where + "unterminated quoted field");
    if (fields_.size() != types_.size()) {
      return invalid_argument(where + "expected " + std::to_string(types_.size()) +
                              " fields but found " + std::to_string(fields_.size()));
    }
    Element e;
    e.reserve(types_.size());
    for (size_t i = 0; i < types_.size(); ++i) {
      StatusOr<Array> v = parse_field(fields_[i], types_[i]);
      if (!v.ok()) {
        return invalid_argument(where + "field " + std::to_string(i) + " (\"" + fields_[i] +
                                "\") " + v.status().message());
      }
      e.push_back(std::move(*v));
    }
    return std::optional<Element>(std::move(e));
  }

  std::vector<std::string> files_;
  std::vector<DType> types_;
  bool header_;
  size_t file_ = 0;
  std::ifstream in_;
  int64_t line_ = 0;
  std::vector<std::string> fields_;
};

class CsvNode final : public FileReaderNode {
 public:
  CsvNode(std::vector<std::string> files, std::vector<DType> types, bool header)
      : FileReaderNode(std::move(files)), types_(std::move(types)), header_(header) {}
  std::string name() const override { return "CSVDataset"; }
  NodePtr with_files(std::vector<std::string> files) const override {
    return std::make_shared<CsvNode>(std::move(files), types_, header_);
  }
  ElementSpec element_spec() const override {
    ElementSpec spec;
    for (DType t : types_) spec.push_back(TensorSpec{t, {}});
    return spec;
  }
  const FileReaderNode* as_file_reader() const override { return this; }
  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    return std::unique_ptr<DatasetIterator>(
        std::make_unique<CsvIterator>(files(), types_, header_));
  }

 private:
  std::vector<DType> types_;
  bool header_;
};

}  // namespace

NodePtr csv_node(std::vector<std::string> files, std::vector<DType> column_types, bool header) {
  if (column_types.empty()) return invalid("csv: column_types must name at least one column.");
  return std::make_shared<CsvNode>(std::move(files), std::move(column_types), header);
}

}  // namespace tributary::data_internal

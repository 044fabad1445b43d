// Binary file sources: TFRecord (with TF's CRC checks) and fixed-length records, plus a TFRecord
// writer. Files are opened lazily, one at a time, by the iterator; an error names the file and the
// byte offset of the record at fault so that a damaged file can be found among thousands.
//
// TFRecord layout, little-endian: uint64 length, uint32 masked_crc32c(length bytes), data,
// uint32 masked_crc32c(data).
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include "strategy/data/crc32c.h"
#include "strategy/data/nodes.h"

namespace tributary::data_internal {

namespace {

uint64_t load_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void store_le(unsigned char* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

// Opens `path` for reading and returns its size, or a NotFound naming it.
StatusOr<uint64_t> open_file(const std::string& what, const std::string& path, std::ifstream* in) {
  in->open(path, std::ios::binary);
  if (!in->is_open()) {
    return not_found(what + ": cannot open \"" + path + "\": " + std::strerror(errno));
  }
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return not_found(what + ": cannot read the size of \"" + path + "\": " + ec.message());
  return static_cast<uint64_t>(size);
}

// Reads exactly n bytes; false on a short read.
bool read_exact(std::ifstream& in, void* dst, uint64_t n) {
  in.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
  return static_cast<uint64_t>(in.gcount()) == n;
}

// --- TFRecord ------------------------------------------------------------------------------------

class TfRecordIterator final : public IteratorBase {
 public:
  explicit TfRecordIterator(std::vector<std::string> files) : files_(std::move(files)) {}

  StatusOr<std::optional<Element>> next() override {
    for (;;) {
      if (!in_.is_open()) {
        if (file_ >= files_.size()) return std::optional<Element>();
        TRIBUTARY_ASSIGN_OR_RETURN(size_, open_file("tfrecord", files_[file_], &in_));
        offset_ = 0;
      }
      if (offset_ == size_) {
        in_.close();
        ++file_;
        continue;
      }
      return read_record();
    }
  }

 private:
  StatusOr<std::optional<Element>> read_record() {
    const std::string& path = files_[file_];
    auto at = [&](const std::string& what) {
      return "tfrecord: " + what + " at offset " + std::to_string(offset_) + " of \"" + path +
             "\" (record " + std::to_string(record_) + ")";
    };
    unsigned char header[12];
    if (size_ - offset_ < sizeof(header) || !read_exact(in_, header, sizeof(header))) {
      return data_loss(at("truncated record") +
                       ": the 12-byte header is cut short; the file "
                       "ends after " +
                       std::to_string(size_ - offset_) + " more byte(s)");
    }
    if (masked_crc32c(header, 8) != load_le(header + 8, 4)) {
      return data_loss(at("corrupted record") +
                       ": the CRC32C of the length does not match; "
                       "the file is damaged or not a TFRecord file");
    }
    const uint64_t length = load_le(header, 8);
    // Check against the bytes left before allocating: a damaged length field that happens to pass
    // its CRC must not make us allocate terabytes.
    if (length > size_ - offset_ - sizeof(header) ||
        size_ - offset_ - sizeof(header) - length < 4) {
      return data_loss(at("truncated record") + ": it declares " + std::to_string(length) +
                       " data bytes plus a 4-byte CRC but the file has " +
                       std::to_string(size_ - offset_ - sizeof(header)) + " left");
    }
    TRIBUTARY_ASSIGN_OR_RETURN(Array data,
                               Array::zeros(DType::kUInt8, {static_cast<int64_t>(length)}));
    unsigned char footer[4];
    if (!read_exact(in_, data.mutable_data<unsigned char>(), length) ||
        !read_exact(in_, footer, sizeof(footer))) {
      return data_loss(at("truncated record") + ": the file ended while reading it");
    }
    if (masked_crc32c(data.data<unsigned char>(), length) != load_le(footer, 4)) {
      return data_loss(at("corrupted record") + ": the CRC32C of the " + std::to_string(length) +
                       "-byte data does not match");
    }
    offset_ += sizeof(header) + length + sizeof(footer);
    ++record_;
    return std::optional<Element>(Element{std::move(data)});
  }

  std::vector<std::string> files_;
  size_t file_ = 0;
  std::ifstream in_;
  uint64_t size_ = 0;
  uint64_t offset_ = 0;
  int64_t record_ = 0;  // within the current file, for messages
};

class TfRecordNode final : public FileReaderNode {
 public:
  using FileReaderNode::FileReaderNode;
  std::string name() const override { return "TFRecordDataset"; }
  NodePtr with_files(std::vector<std::string> files) const override {
    return std::make_shared<TfRecordNode>(std::move(files));
  }
  ElementSpec element_spec() const override { return {TensorSpec{DType::kUInt8, {-1}}}; }
  const FileReaderNode* as_file_reader() const override { return this; }
  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    return std::unique_ptr<DatasetIterator>(std::make_unique<TfRecordIterator>(files()));
  }
};

// --- fixed-length records ------------------------------------------------------------------------

struct FixedLayout {
  int64_t record, header, footer;
};

class FixedLengthIterator final : public IteratorBase {
 public:
  FixedLengthIterator(std::vector<std::string> files, FixedLayout layout)
      : files_(std::move(files)), layout_(layout) {}

  StatusOr<std::optional<Element>> next() override {
    for (;;) {
      if (!in_.is_open()) {
        if (file_ >= files_.size()) return std::optional<Element>();
        TRIBUTARY_RETURN_IF_ERROR(open_next());
      }
      if (left_ == 0) {
        in_.close();
        ++file_;
        continue;
      }
      TRIBUTARY_ASSIGN_OR_RETURN(Array rec, Array::zeros(DType::kUInt8, {layout_.record}));
      if (!read_exact(in_, rec.mutable_data<unsigned char>(),
                      static_cast<uint64_t>(layout_.record))) {
        return data_loss("fixed_length_records: \"" + files_[file_] + "\" ended inside the " +
                         std::to_string(layout_.record) + "-byte record at offset " +
                         std::to_string(offset_) + "; was it changed while being read?");
      }
      offset_ += layout_.record;
      --left_;
      return std::optional<Element>(Element{std::move(rec)});
    }
  }

 private:
  Status open_next() {
    const std::string& path = files_[file_];
    TRIBUTARY_ASSIGN_OR_RETURN(uint64_t size, open_file("fixed_length_records", path, &in_));
    const auto fixed = static_cast<uint64_t>(layout_.header + layout_.footer);
    const int64_t body = size >= fixed ? static_cast<int64_t>(size - fixed) : -1;
    if (body < 0 || body % layout_.record != 0) {
      return invalid_argument(
          "Excluding the header (" + std::to_string(layout_.header) + " bytes) and footer (" +
          std::to_string(layout_.footer) + " bytes), input file \"" + path + "\" has body length " +
          std::to_string(body) + " bytes, which is not an exact multiple of the record length (" +
          std::to_string(layout_.record) + " bytes).");
    }
    in_.seekg(layout_.header);
    offset_ = layout_.header;
    left_ = body / layout_.record;
    return ok_status();
  }

  std::vector<std::string> files_;
  FixedLayout layout_;
  size_t file_ = 0;
  std::ifstream in_;
  int64_t offset_ = 0;
  int64_t left_ = 0;  // records left in the current file
};

class FixedLengthNode final : public FileReaderNode {
 public:
  FixedLengthNode(std::vector<std::string> files, FixedLayout layout)
      : FileReaderNode(std::move(files)), layout_(layout) {}
  std::string name() const override { return "FixedLengthRecordDataset"; }
  NodePtr with_files(std::vector<std::string> files) const override {
    return std::make_shared<FixedLengthNode>(std::move(files), layout_);
  }
  ElementSpec element_spec() const override {
    return {TensorSpec{DType::kUInt8, {layout_.record}}};
  }
  const FileReaderNode* as_file_reader() const override { return this; }
  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    return std::unique_ptr<DatasetIterator>(
        std::make_unique<FixedLengthIterator>(files(), layout_));
  }

 private:
  FixedLayout layout_;
};

}  // namespace

NodePtr tfrecord_node(std::vector<std::string> files) {
  return std::make_shared<TfRecordNode>(std::move(files));
}

NodePtr fixed_length_node(std::vector<std::string> files, int64_t record_bytes,
                          int64_t header_bytes, int64_t footer_bytes) {
  if (record_bytes <= 0) {
    return invalid("record_bytes must be greater than zero (currently record_bytes = " +
                   std::to_string(record_bytes) + ").");
  }
  if (header_bytes < 0 || footer_bytes < 0) {
    return invalid("header_bytes and footer_bytes must be >= 0 (currently " +
                   std::to_string(header_bytes) + " and " + std::to_string(footer_bytes) + ").");
  }
  return std::make_shared<FixedLengthNode>(std::move(files),
                                           FixedLayout{record_bytes, header_bytes, footer_bytes});
}

}  // namespace tributary::data_internal

namespace tributary {

Status write_tfrecord(const std::string& path, std::span<const std::string> records) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out.is_open()) {
    return not_found("write_tfrecord: cannot create \"" + path + "\": " + std::strerror(errno));
  }
  for (const std::string& r : records) {
    unsigned char header[12];
    unsigned char footer[4];
    data_internal::store_le(header, r.size(), 8);
    data_internal::store_le(header + 8, data_internal::masked_crc32c(header, 8), 4);
    data_internal::store_le(footer, data_internal::masked_crc32c(r.data(), r.size()), 4);
    out.write(reinterpret_cast<const char*>(header), sizeof(header));
    out.write(r.data(), static_cast<std::streamsize>(r.size()));
    out.write(reinterpret_cast<const char*>(footer), sizeof(footer));
  }
  out.close();
  if (!out) return unavailable("write_tfrecord: writing \"" + path + "\" failed (disk full?)");
  return ok_status();
}

}  // namespace tributary

// The checkpoint file, shared by the strategies' variables (checkpoint.cc) and the
// parameter-server variables (parameter_server.cc), so a file written by one layout of variables
// is read by any other (a sharded variable is saved whole).
//
// Layout (little-endian): magic "TRIBUTARY-CKPT-1\n", u64 count, then per variable: u32 name
// length, name, u8 dtype, u8 rank, i64 dims[rank], u64 bytes, data; then u64 FNV-1a of everything
// before it, so that a truncated or corrupted file is refused instead of restored.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tributary/status.h"
#include "tributary/strategy/array.h"

namespace tributary::checkpoint_internal {

// Named CPU arrays in the order given -> the file's bytes.
std::string encode(const std::vector<std::pair<std::string, Array>>& entries);
// The file's bytes -> its arrays by name; a corrupt or truncated file is kInvalidArgument naming
// `path`.
StatusOr<std::map<std::string, Array>> decode(const std::string& path, std::string_view data);
// Writes `bytes` to a temporary file beside `path`, then renames it over `path`.
Status write_atomically(const std::string& path, const std::string& bytes);
// The whole file; kNotFound when it cannot be opened.
StatusOr<std::string> read_file(const std::string& path);
// The saved array for `name`, checked against the variable's dtype and shape (kNotFound naming
// what the file has, or kInvalidArgument naming both shapes).
StatusOr<Array> find_entry(const std::string& path, const std::map<std::string, Array>& saved,
                           const std::string& name, DType dtype, const Shape& shape);

}  // namespace tributary::checkpoint_internal

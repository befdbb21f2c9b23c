// The safetensors format (Hugging Face): an 8-byte little-endian header length, a JSON header mapping each
// tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data that follows) plus an
// optional "__metadata__" of string pairs, then the tensor bytes.
// Writing is atomic (AtomicFileWriter); reading validates everything a corrupt or truncated file could get
// wrong — header length, JSON, dtype names, shapes against byte ranges, ranges against the file size — and
// errors name the file and the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/file.h"

namespace h2 {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;  // shape's element count x dtype_size bytes
};

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata = {});

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // throws Error(kIo) on any inconsistency

  // The tensor named `name`; throws Error(kNotFound) naming the file when it is absent.
  const SafetensorsEntry& at(const std::string& name) const;
  bool has(const std::string& name) const { return index_.count(name) > 0; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return file_.path(); }

 private:
  MappedFile file_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace h2

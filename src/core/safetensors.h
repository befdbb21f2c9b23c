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
#include <utility>
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

// A safetensors file written a tensor at a time, so that a writer holds one tensor, not all: the header from every
// entry's name, dtype and shape (their data unused), then each one's bytes in the entries' order (append), into a
// temporary file that commit() renames into place once every entry is in.
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                    const std::map<std::string, std::string>& metadata = {});
  void append(const void* data);  // the next entry's bytes
  void commit();

 private:
  AtomicFileWriter writer_;
  std::vector<std::pair<std::string, uint64_t>> entries_;  // name, bytes
  size_t next_ = 0;
};

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

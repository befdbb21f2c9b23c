// safetensors reading and writing.
#include "core/safetensors.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/error.h"

namespace h2 {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the format's own limit

// safetensors' dtype names for the dtypes H2 reads and writes.
constexpr std::pair<DType, const char*> kDtypeNames[] = {
    {DType::kF32, "F32"}, {DType::kBF16, "BF16"}, {DType::kF64, "F64"}, {DType::kI32, "I32"}};

const char* st_dtype_name(DType dtype) {
  for (const auto& [d, name] : kDtypeNames) {
    if (d == dtype) return name;
  }
  return "?";
}

}  // namespace

SafetensorsWriter::SafetensorsWriter(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                                     const std::map<std::string, std::string>& metadata)
    : writer_(path) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    int64_t n = 1;
    for (int64_t d : e.shape) n *= d;
    const uint64_t bytes = static_cast<uint64_t>(n) * dtype_size(e.dtype);
    header[e.name] = {
        {"dtype", st_dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    entries_.emplace_back(e.name, bytes);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // pad so tensor data starts 8-byte aligned
  const uint64_t length = text.size();
  writer_.write(&length, 8);
  writer_.write(text.data(), text.size());
}

void SafetensorsWriter::append(const void* data) {
  H2_CHECK(next_ < entries_.size()) << "more tensors appended than the header lists";
  writer_.write(data, entries_[next_++].second);
}

void SafetensorsWriter::commit() {
  H2_CHECK(next_ == entries_.size()) << "tensor '" << entries_[next_].first << "' of the header was never appended";
  writer_.commit();
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata) {
  SafetensorsWriter writer(path, entries, metadata);
  for (const SafetensorsEntry& e : entries) writer.append(e.data);
  writer.commit();
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  auto corrupt = [&](const std::string& what) {
    throw Error(ErrorCode::kIo, cat(path, ": not a valid safetensors file: ", what));
  };
  if (file_.size() < 8) corrupt(cat("only ", file_.size(), " bytes"));
  uint64_t length;
  std::memcpy(&length, file_.data(), 8);
  if (length > kMaxHeaderBytes || length > file_.size() - 8) {
    corrupt(cat("header length ", length, " does not fit the file's ", file_.size(), " bytes (truncated?)"));
  }
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(file_.data() + 8, file_.data() + 8 + length);
  } catch (const nlohmann::json::exception& e) {
    corrupt(cat("header is not JSON: ", e.what()));
  }
  if (!header.is_object()) corrupt("header is not a JSON object");
  const uint64_t data_size = file_.size() - 8 - length;
  const unsigned char* data = file_.data() + 8 + length;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) corrupt("__metadata__ is not an object");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) corrupt(cat("__metadata__['", k, "'] is not a string"));
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    try {
      const std::string dtype_text = value.at("dtype").get<std::string>();
      const auto* known = std::find_if(std::begin(kDtypeNames), std::end(kDtypeNames),
                                       [&](const auto& entry) { return dtype_text == entry.second; });
      if (known == std::end(kDtypeNames)) {
        corrupt(cat("tensor '", name, "' has dtype ", dtype_text, ", which H2 does not read"));
      }
      const DType dtype = known->first;
      const auto shape = value.at("shape").get<std::vector<int64_t>>();
      const auto offsets = value.at("data_offsets").get<std::vector<uint64_t>>();
      int64_t n = 1;
      for (int64_t d : shape) {
        if (d < 0) corrupt(cat("tensor '", name, "' has a negative dimension"));
        n *= d;
      }
      if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data_size) {
        corrupt(cat("tensor '", name, "' has byte range outside the file's ", data_size, " data bytes (truncated?)"));
      }
      if (offsets[1] - offsets[0] != static_cast<uint64_t>(n) * dtype_size(dtype)) {
        corrupt(cat("tensor '", name, "' holds ", offsets[1] - offsets[0], " bytes but its shape needs ",
                    static_cast<uint64_t>(n) * dtype_size(dtype)));
      }
      index_[name] = entries_.size();
      entries_.push_back({name, dtype, shape, data + offsets[0]});
    } catch (const nlohmann::json::exception& e) {
      corrupt(cat("tensor '", name, "': ", e.what()));
    }
  }
}

const SafetensorsEntry& SafetensorsFile::at(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) throw Error(ErrorCode::kNotFound, cat(path(), ": no tensor named '", name, "'"));
  return entries_[it->second];
}

}  // namespace h2

// Damaging a checkpoint's files on purpose, for the tests that check a damaged checkpoint is never loaded silently.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace h2::testing_util {

// Flips one bit of a file at `from_end` bytes from its end.
inline void flip_bit(const std::string& path, uintmax_t from_end) {
  const auto at = static_cast<std::streamoff>(std::filesystem::file_size(path) - from_end);
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekg(at);
  char byte = 0;
  f.read(&byte, 1);
  byte = static_cast<char>(byte ^ 0x40);  // an exponent bit of the last float's top byte, for from_end 1
  f.seekp(at);
  f.write(&byte, 1);
}

// Flips an exponent bit of the first value of safetensors file `path`'s tensor `name` (found through its header).
inline void flip_tensor_bit(const std::string& path, const std::string& name) {
  std::ifstream in(path, std::ios::binary);
  uint64_t length = 0;
  in.read(reinterpret_cast<char*>(&length), 8);
  std::string header(length, ' ');
  in.read(header.data(), static_cast<std::streamsize>(length));
  const uint64_t first = 8 + length + nlohmann::json::parse(header).at(name).at("data_offsets")[0].get<uint64_t>();
  in.close();
  flip_bit(path, std::filesystem::file_size(path) - first - 3);  // the first float's top byte
}

}  // namespace h2::testing_util

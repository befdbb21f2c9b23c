// YAML configuration access whose every error names the file, the line and the field (or the command line's
// --set that gave the value):
//   examples/chips.yaml:7:13: field 'devices[1].speed': expected a number, got 'fast'
//   --set train.steps=0: field 'train.steps': must be an integer in [1, 1099511627776], got 0
// A ConfigNode is a YAML node plus where it came from (file and field path). Readers ask for typed values,
// call allow_only() to turn a misspelt key into an error (with the closest valid key as a hint), and call
// fail() for their own range checks so that those errors carry the same location.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace h2 {

class ConfigNode {
 public:
  // Throws Error(kIo) when the file cannot be read and Error(kConfig) on a YAML syntax error.
  static ConfigNode load_file(const std::string& path);
  // `source_name` stands in for a file name in messages (e.g. "<built-in cluster>").
  static ConfigNode parse_string(const std::string& text, const std::string& source_name);

  bool has(const std::string& key) const;
  ConfigNode at(const std::string& key) const;  // a missing key is an error naming it
  std::optional<ConfigNode> find(const std::string& key) const;
  std::vector<ConfigNode> items() const;  // elements of a sequence; an error if this is not one

  double as_double() const;
  int64_t as_int() const;
  bool as_bool() const;
  std::string as_string() const;

  template <typename T>
  T get(const std::string& key) const;
  template <typename T>
  T get(const std::string& key, const T& fallback) const;

  // A field within [lo, hi], or `fallback` when absent; anything else is an error naming the range (no wrap into a
  // narrower type, no silent clamp, no infinity).
  int64_t int_in(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) const;
  int64_t int_in(const std::string& key, int64_t lo, int64_t hi) const;  // required: absent is an error
  double number_in(const std::string& key, double fallback, double lo, double hi) const;

  // Applies a command-line override "a.b.c=VALUE" (VALUE parsed as YAML) to this tree, creating mappings on
  // the way. Throws Error(kInvalidArgument) for a malformed assignment or a path through a non-mapping.
  void apply_override(const std::string& assignment);

  // Errors on any key not in `allowed`, suggesting the nearest allowed one.
  void allow_only(std::initializer_list<const char*> allowed) const;

  const std::string& file() const { return file_; }
  const std::string& field() const { return field_; }
  std::string where() const;  // "file:line:col"
  [[noreturn]] void fail(const std::string& message) const;

 private:
  using Overrides = std::map<std::string, std::string>;  // field path -> the --set assignment that gave it
  ConfigNode(YAML::Node node, std::string file, std::string field, std::shared_ptr<Overrides> overrides)
      : node_(std::move(node)), file_(std::move(file)), field_(std::move(field)), overrides_(std::move(overrides)) {}
  ConfigNode child(YAML::Node node, std::string field) const {
    return {std::move(node), file_, std::move(field), overrides_};
  }
  std::string child_field(const std::string& key) const;

  YAML::Node node_;
  std::string file_;
  std::string field_;
  std::shared_ptr<Overrides> overrides_;  // shared by the whole tree: where() names the --set, not the file
};

template <typename T>
T ConfigNode::get(const std::string& key) const {
  ConfigNode child = at(key);
  if constexpr (std::is_same_v<T, double>) {
    return child.as_double();
  } else if constexpr (std::is_same_v<T, int64_t>) {
    return child.as_int();
  } else if constexpr (std::is_same_v<T, bool>) {
    return child.as_bool();
  } else {
    static_assert(std::is_same_v<T, std::string>, "ConfigNode::get supports double, int64_t, bool, std::string");
    return child.as_string();
  }
}

template <typename T>
T ConfigNode::get(const std::string& key, const T& fallback) const {
  return has(key) ? get<T>(key) : fallback;
}

}  // namespace h2

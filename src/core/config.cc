// ConfigNode: yaml-cpp underneath, with file/line/field in every message.
#include "core/config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace h2 {
namespace {

// Levenshtein distance, for "did you mean" hints on misspelt keys.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

const char* node_kind(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "nothing";
    case YAML::NodeType::Scalar:
      return "a scalar";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    default:
      return "an undefined value";
  }
}

}  // namespace

ConfigNode ConfigNode::load_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorCode::kIo, cat(path, ": cannot open the file (does it exist and is it readable?)"));
  std::stringstream text;
  text << in.rdbuf();
  return parse_string(text.str(), path);
}

ConfigNode ConfigNode::parse_string(const std::string& text, const std::string& source_name) {
  try {
    return ConfigNode(YAML::Load(text), source_name, "", std::make_shared<Overrides>());
  } catch (const YAML::Exception& e) {
    // yaml-cpp marks are 0-based.
    throw Error(ErrorCode::kConfig,
                cat(source_name, ":", e.mark.line + 1, ":", e.mark.column + 1, ": YAML syntax error: ", e.msg));
  }
}

std::string ConfigNode::child_field(const std::string& key) const { return field_.empty() ? key : field_ + "." + key; }

std::string ConfigNode::where() const {
  // A value given on the command line (or inside one): the assignment, not a place in the file.
  for (const auto& [key, assignment] : *overrides_) {
    if (field_ == key || field_.starts_with(key + ".") || field_.starts_with(key + "[")) return "--set " + assignment;
  }
  const YAML::Mark mark = node_.Mark();
  if (mark.is_null()) return file_;
  return cat(file_, ":", mark.line + 1, ":", mark.column + 1);
}

void ConfigNode::fail(const std::string& message) const {
  if (field_.empty()) throw Error(ErrorCode::kConfig, cat(where(), ": ", message));
  throw Error(ErrorCode::kConfig, cat(where(), ": field '", field_, "': ", message));
}

bool ConfigNode::has(const std::string& key) const { return node_.IsMap() && node_[key].IsDefined(); }

std::optional<ConfigNode> ConfigNode::find(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return child(node_[key], child_field(key));
}

ConfigNode ConfigNode::at(const std::string& key) const {
  if (!node_.IsMap()) fail(cat("expected a mapping with the key '", key, "', got ", node_kind(node_)));
  if (!node_[key].IsDefined()) {
    if (field_.empty()) throw Error(ErrorCode::kConfig, cat(where(), ": missing required field '", key, "'"));
    fail(cat("missing required field '", key, "'"));
  }
  return child(node_[key], child_field(key));
}

std::vector<ConfigNode> ConfigNode::items() const {
  if (!node_.IsSequence()) fail(cat("expected a list, got ", node_kind(node_)));
  std::vector<ConfigNode> out;
  for (size_t i = 0; i < node_.size(); ++i) out.push_back(child(node_[i], cat(field_, "[", i, "]")));
  return out;
}

double ConfigNode::as_double() const {
  if (!node_.IsScalar()) fail(cat("expected a number, got ", node_kind(node_)));
  try {
    return node_.as<double>();
  } catch (const YAML::Exception&) {
    fail(cat("expected a number, got '", node_.Scalar(), "'"));
  }
}

int64_t ConfigNode::as_int() const {
  if (!node_.IsScalar()) fail(cat("expected an integer, got ", node_kind(node_)));
  try {
    return node_.as<int64_t>();
  } catch (const YAML::Exception&) {
    fail(cat("expected an integer, got '", node_.Scalar(), "'"));
  }
}

int64_t ConfigNode::int_in(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) const {
  return has(key) ? int_in(key, lo, hi) : fallback;
}

int64_t ConfigNode::int_in(const std::string& key, int64_t lo, int64_t hi) const {
  const ConfigNode n = at(key);
  const int64_t v = n.as_int();
  if (v < lo || v > hi) n.fail(cat("must be an integer in [", lo, ", ", hi, "], got ", v));
  return v;
}

double ConfigNode::number_in(const std::string& key, double fallback, double lo, double hi) const {
  if (!has(key)) return fallback;
  const ConfigNode n = at(key);
  const double v = n.as_double();
  if (!(v >= lo && v <= hi)) n.fail(cat("must be in [", lo, ", ", hi, "], got ", v));
  return v;
}

bool ConfigNode::as_bool() const {
  if (!node_.IsScalar()) fail(cat("expected true or false, got ", node_kind(node_)));
  try {
    return node_.as<bool>();
  } catch (const YAML::Exception&) {
    fail(cat("expected true or false, got '", node_.Scalar(), "'"));
  }
}

std::string ConfigNode::as_string() const {
  if (!node_.IsScalar()) fail(cat("expected a string, got ", node_kind(node_)));
  return node_.Scalar();
}

void ConfigNode::apply_override(const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("--set expects KEY=VALUE (e.g. train.steps=20), got '", assignment, "'"));
  }
  const std::string key = assignment.substr(0, eq);
  YAML::Node value;
  try {
    value = YAML::Load(assignment.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    throw Error(ErrorCode::kInvalidArgument, cat("--set ", key, ": the value is not valid YAML: ", e.msg));
  }
  if (!node_.IsMap() && !node_.IsNull()) {
    throw Error(ErrorCode::kInvalidArgument, cat("--set ", key, ": ", file_, " is not a mapping"));
  }
  YAML::Node cur = node_;  // yaml-cpp nodes are references; reset() rebinds, operator= would overwrite
  std::stringstream parts(key);
  std::string part, path;
  std::vector<std::string> keys;
  while (std::getline(parts, part, '.')) keys.push_back(part);
  for (size_t i = 0; i + 1 < keys.size(); ++i) {
    path += (path.empty() ? "" : ".") + keys[i];
    YAML::Node next = cur[keys[i]];
    if (!next.IsDefined() || next.IsNull()) {
      cur[keys[i]] = YAML::Node(YAML::NodeType::Map);
      next.reset(cur[keys[i]]);
    } else if (!next.IsMap()) {
      throw Error(ErrorCode::kInvalidArgument, cat("--set ", key, ": '", path, "' in ", file_, " is not a mapping"));
    }
    cur.reset(next);
  }
  cur[keys.back()] = value;
  (*overrides_)[key] = assignment;
}

void ConfigNode::allow_only(std::initializer_list<const char*> allowed) const {
  if (!node_.IsMap()) fail(cat("expected a mapping, got ", node_kind(node_)));
  for (const auto& kv : node_) {
    if (!kv.first.IsScalar()) {  // e.g. "{a: 1}: 2": a mapping used as a key (found by h2_fuzz)
      child(kv.first, field_).fail(cat("a key must be a plain name, got ", node_kind(kv.first)));
    }
    const std::string key = kv.first.Scalar();
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    std::string best;
    size_t best_distance = 3;  // suggest only near misses
    for (const char* candidate : allowed) {
      size_t d = edit_distance(key, candidate);
      if (d < best_distance) best_distance = d, best = candidate;
    }
    std::string valid;
    for (const char* candidate : allowed) valid += (valid.empty() ? "" : ", ") + std::string(candidate);
    // Located at the key, where the typo is.
    child(kv.first, child_field(key))
        .fail(best.empty() ? cat("unknown field; valid fields here: ", valid)
                           : cat("unknown field; did you mean '", best, "'?"));
  }
}

}  // namespace h2

// Loading the chip catalog and building clusters from it.
#include "planner/catalog.h"

#include <cstdlib>
#include <filesystem>
#include <limits>
#include <regex>

#include "core/error.h"

namespace h2 {

const CatalogChip* ChipCatalog::find(const std::string& name) const {
  for (const CatalogChip& c : chips) {
    if (c.chip.name == name) return &c;
  }
  return nullptr;
}

std::string ChipCatalog::names() const {
  std::string out;
  for (const CatalogChip& c : chips) out += (out.empty() ? "" : ", ") + c.chip.name;
  return out;
}

namespace {

// The node figures of a catalog entry (or the catalog's defaults, `d`).
NodeGroup load_node(const ConfigNode& n, const NodeGroup& d) {
  NodeGroup g = d;
  if (n.has("chips_per_node")) {
    const int64_t v = n.get<int64_t>("chips_per_node");
    if (v <= 0 || v > 1024) n.at("chips_per_node").fail(cat("must be in 1..1024, got ", v));
    g.chips_per_node = static_cast<int>(v);
  }
  g.intra_node_gbps = positive_number(n, "intra_node_gbps", d.intra_node_gbps);
  g.intra_node_latency_us = non_negative_number(n, "intra_node_latency_us", d.intra_node_latency_us);
  g.nic_gbps = positive_number(n, "nic_gbps", d.nic_gbps);
  g.nic_latency_us = non_negative_number(n, "nic_latency_us", d.nic_latency_us);
  return g;
}

}  // namespace

ChipCatalog load_catalog(const ConfigNode& root) {
  root.allow_only({"defaults", "chips"});
  ChipCatalog c;
  c.file = root.file();
  // Defaults: 8 chips a node; one 400 Gb/s NIC per chip; between vendors, host-staged transfers at 25 GB/s.
  NodeGroup node{
      .chips_per_node = 8, .intra_node_gbps = 100, .intra_node_latency_us = 3, .nic_gbps = 50, .nic_latency_us = 5};
  c.between_types = GroupLink{.bandwidth_gbps = 25, .latency_us = 10, .device_direct = false};
  if (auto d = root.find("defaults")) {
    d->allow_only({"chips_per_node", "intra_node_gbps", "intra_node_latency_us", "nic_gbps", "nic_latency_us",
                   "between_types_gbps", "between_types_latency_us"});
    node = load_node(*d, node);
    c.between_types.bandwidth_gbps = positive_number(*d, "between_types_gbps", c.between_types.bandwidth_gbps);
    c.between_types.latency_us = non_negative_number(*d, "between_types_latency_us", c.between_types.latency_us);
  }
  for (const ConfigNode& n : root.at("chips").items()) {
    n.allow_only({"name", "vendor", "source", "peak_tflops", "peak_tflops_f32", "efficiency", "matmul_element_ns",
                  "attention_efficiency", "attention_forward_efficiency", "memory_gib", "memory_bandwidth_gbps",
                  "memory_efficiency", "kernel_overhead_us", "host_link_gbps", "chips_per_node", "intra_node_gbps",
                  "intra_node_latency_us", "nic_gbps", "nic_latency_us"});
    CatalogChip entry{.chip = load_chip(n), .node = load_node(n, node), .source = n.get<std::string>("source")};
    if (c.find(entry.chip.name)) n.at("name").fail(cat("chip '", entry.chip.name, "' is listed twice"));
    c.chips.push_back(std::move(entry));
  }
  if (c.chips.empty()) root.at("chips").fail("lists no chip");
  return c;
}

std::string default_catalog_path() {
  const char* env = std::getenv("H2_CHIP_CATALOG");
  return env && *env ? env : "examples/chips.yaml";
}

bool is_cluster_spec(const std::string& text) {
  static const std::regex spec(R"([A-Za-z0-9_.\-]+:[0-9]+(,[A-Za-z0-9_.\-]+:[0-9]+)*)");
  return std::regex_match(text, spec);
}

Cluster cluster_from_spec(const std::string& spec, const ChipCatalog& catalog) {
  if (!is_cluster_spec(spec)) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("cluster spec '", spec, "': expected NAME:COUNT[,NAME:COUNT]..., e.g. H100:64,MI300X:32"));
  }
  Cluster c;
  c.name = spec;
  size_t start = 0;
  while (start < spec.size()) {
    const size_t end = std::min(spec.find(',', start), spec.size());
    const std::string item = spec.substr(start, end - start);
    start = end + 1;
    const size_t colon = item.find(':');
    const std::string name = item.substr(0, colon), digits = item.substr(colon + 1);
    const CatalogChip* entry = catalog.find(name);
    if (!entry) {
      throw Error(ErrorCode::kInvalidArgument, cat("cluster spec '", spec, "': no chip '", name, "' in ", catalog.file,
                                                   "; it has ", catalog.names()));
    }
    if (c.chip_index(name) >= 0) {
      throw Error(ErrorCode::kInvalidArgument, cat("cluster spec '", spec, "': ", name, " is listed twice"));
    }
    const long long count = digits.size() > 7 ? std::numeric_limits<long long>::max() : std::stoll(digits);
    if (count <= 0 || count > 1'000'000) {
      throw Error(ErrorCode::kInvalidArgument,
                  cat("cluster spec '", spec, "': ", item, ": the count must be in 1..1000000"));
    }
    NodeGroup g = entry->node;
    g.chip = static_cast<int>(c.chips.size());
    if (count < g.chips_per_node) {
      g.chips_per_node = static_cast<int>(count);
      g.nodes = 1;
    } else if (count % g.chips_per_node != 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  cat("cluster spec '", spec, "': ", item, " is not whole nodes of ", g.chips_per_node, " ", name,
                      "; use a multiple of ", g.chips_per_node, " (or fewer than one node)"));
    } else {
      g.nodes = static_cast<int>(count / g.chips_per_node);
    }
    c.chips.push_back(entry->chip);
    c.groups.push_back(g);
  }
  for (int a = 0; a < static_cast<int>(c.chips.size()); ++a) {
    for (int b = a + 1; b < static_cast<int>(c.chips.size()); ++b) {
      GroupLink l = catalog.between_types;
      l.a = a;
      l.b = b;
      c.links.push_back(l);
    }
  }
  return c;
}

Cluster load_cluster_arg(const std::string& file_or_spec) {
  std::error_code ec;
  const std::string extension = std::filesystem::path(file_or_spec).extension().string();
  // No such file, and written as a spec would be ("H100:8x", "H100:-8", "H100:8,"): the spec's error, not the file's.
  const bool spec_like = file_or_spec.find(':') != std::string::npos && file_or_spec.find('/') == std::string::npos &&
                         extension != ".yaml" && extension != ".yml";
  if (std::filesystem::exists(file_or_spec, ec) || !(is_cluster_spec(file_or_spec) || spec_like)) {
    return load_cluster(ConfigNode::load_file(file_or_spec));
  }
  if (!is_cluster_spec(file_or_spec)) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("--cluster '", file_or_spec,
                    "' is no file, nor a cluster spec: expected NAME:COUNT[,NAME:COUNT]... with COUNT a positive "
                    "whole number, e.g. H100:64,MI300X:32"));
  }
  return cluster_from_spec(file_or_spec, load_catalog(ConfigNode::load_file(default_catalog_path())));
}

std::string path_beside(const std::string& file, const std::string& relative) {
  const std::filesystem::path p(relative);
  if (p.is_absolute()) return relative;
  return (std::filesystem::path(file).parent_path() / p).string();
}

}  // namespace h2

// Loading and checking cluster, model and training files.
#include "planner/spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>

#include "core/error.h"
#include "planner/catalog.h"

namespace h2 {

double positive_number(const ConfigNode& node, const char* key, std::optional<double> fallback) {
  if (fallback && !node.has(key)) return *fallback;
  const double v = node.get<double>(key);
  if (!(v > 0) || !std::isfinite(v)) node.at(key).fail(cat("must be a positive finite number, got ", v));
  return v;
}

double non_negative_number(const ConfigNode& node, const char* key, double fallback) {
  const double v = node.get<double>(key, fallback);
  if (!(v >= 0) || !std::isfinite(v)) node.at(key).fail(cat("must be a finite number >= 0, got ", v));
  return v;
}

namespace {

int64_t positive_int(const ConfigNode& node, const char* key) {
  const int64_t v = node.get<int64_t>(key);
  if (v <= 0) node.at(key).fail(cat("must be a positive integer, got ", v));
  return v;
}

int positive_int32(const ConfigNode& node, const char* key) {
  const int64_t v = positive_int(node, key);
  if (v > std::numeric_limits<int>::max()) node.at(key).fail(cat("must be at most ", std::numeric_limits<int>::max()));
  return static_cast<int>(v);
}

// A list of exactly N finite numbers, each > 0 (>= 0 with `zero_allowed`); `shape` says what the list is when its
// length is wrong.
template <size_t N>
std::array<double, N> number_list(const ConfigNode& node, const char* shape, bool zero_allowed) {
  const std::vector<ConfigNode> v = node.items();
  if (v.size() != N) node.fail(shape);
  std::array<double, N> x{};
  for (size_t i = 0; i < N; ++i) {
    x[i] = v[i].as_double();
    if (!(zero_allowed ? x[i] >= 0 : x[i] > 0) || !std::isfinite(x[i]))
      v[i].fail(cat("must be a finite number ", zero_allowed ? ">= 0" : "> 0", ", got ", x[i]));
  }
  return x;
}

// Linear in rows between the nearest entries at or under `rows` and over it among those `matches` takes, held beyond
// them; 1 without any.
template <typename Entry, typename Matches, typename Value>
double interpolated_in_rows(const std::vector<Entry>& entries, double rows, Matches matches, Value value) {
  const Entry* below = nullptr;
  const Entry* above = nullptr;
  for (const Entry& e : entries) {
    if (!matches(e)) continue;
    if (e.rows <= rows && (!below || e.rows > below->rows)) below = &e;
    if (e.rows > rows && (!above || e.rows < above->rows)) above = &e;
  }
  if (!below || !above) return below ? value(*below) : above ? value(*above) : 1.0;
  return value(*below) + (value(*above) - value(*below)) * (rows - below->rows) / (above->rows - below->rows);
}

}  // namespace

int Cluster::chip_index(const std::string& n) const {
  for (size_t i = 0; i < chips.size(); ++i) {
    if (chips[i].name == n) return static_cast<int>(i);
  }
  return -1;
}

const NodeGroup& Cluster::group_of(int chip) const {
  for (const NodeGroup& g : groups) {
    if (g.chip == chip) return g;
  }
  throw Error(ErrorCode::kNotFound,
              cat("cluster ", name, ": no node group of chip type '", chips[static_cast<size_t>(chip)].name, "'"));
}

int Cluster::devices_of(int chip) const {
  int n = 0;
  for (const NodeGroup& g : groups) n += g.chip == chip ? g.devices() : 0;
  return n;
}

GroupLink Cluster::link(int a, int b) const {
  if (a == b) {
    const NodeGroup& g = group_of(a);
    return GroupLink{a, a, g.nic_gbps, g.nic_latency_us, true};
  }
  for (const GroupLink& l : links) {
    if ((l.a == a && l.b == b) || (l.a == b && l.b == a)) return l;
  }
  throw Error(ErrorCode::kNotFound,
              cat("cluster ", name, ": no link between chip types '", chips[static_cast<size_t>(a)].name, "' and '",
                  chips[static_cast<size_t>(b)].name, "'"));
}

Cluster Cluster::only(int chip) const {
  Cluster c = *this;
  c.name = name + "/" + chips[static_cast<size_t>(chip)].name;
  c.groups.clear();
  for (const NodeGroup& g : groups) {
    if (g.chip == chip) c.groups.push_back(g);
  }
  return c;
}

Cluster Cluster::with_emulation_kept() const {
  Cluster c = *this;
  for (ChipType& t : c.chips) t.emulation_tflops = t.emulation_flops() / 1e12;
  return c;
}

Cluster Cluster::without_device(int chip) const {
  Cluster c = *this;
  for (auto g = c.groups.begin(); g != c.groups.end(); ++g) {
    if (g->chip != chip) continue;
    if (g->nodes == 1) {
      --g->chips_per_node;
    } else {
      --g->nodes;
    }
    if (g->devices() == 0) c.groups.erase(g);
    return c;
  }
  throw Error(ErrorCode::kNotFound, cat("cluster ", name, ": no device of chip type '",
                                        chips[static_cast<size_t>(chip)].name, "' to take out"));
}

double ChipType::gemm_correction(double rows, double k, double n) const {
  return interpolated_in_rows(
      matmul_corrections, rows,
      // the cost model's V / tp is not whole
      [&](const GemmCorrection& c) { return std::abs(c.k - k) < 1 && std::abs(c.n - n) < 1; },
      [](const GemmCorrection& c) { return c.ratio; });
}

double ChipType::part_correction(int tp, double rows, bool head, bool backward) const {
  return interpolated_in_rows(
      part_corrections, rows, [&](const PartCorrection& c) { return c.tp == tp; },
      [&](const PartCorrection& c) {
        return head ? (backward ? c.head_backward : c.head_forward) : (backward ? c.block_backward : c.block_forward);
      });
}

// Written with yaml-cpp's emitter, which quotes what needs quoting (a vendor named "Acme, Inc."), in the flow
// style of the shipped examples: one line per chip, group and link.
const char* figures_name(Figures f) {
  switch (f) {
    case Figures::kDatasheet:
      return "datasheet";
    case Figures::kProfiled:
      return "profiled";
    case Figures::kCalibrated:
      return "calibrated";
  }
  return "?";
}

std::string cluster_to_yaml(const Cluster& c) {
  YAML::Emitter y;
  y.SetDoublePrecision(6);
  y << YAML::BeginMap << YAML::Key << "name" << YAML::Value << c.name;
  y << YAML::Key << "figures" << YAML::Value << figures_name(c.figures);
  y << YAML::Key << "chips" << YAML::Value << YAML::BeginSeq;
  for (const ChipType& t : c.chips) {
    y << YAML::Flow << YAML::BeginMap << YAML::Key << "name" << YAML::Value << t.name << YAML::Key << "vendor"
      << YAML::Value << t.vendor << YAML::Key << "peak_tflops" << YAML::Value << t.peak_tflops;
    if (t.peak_tflops_f32 > 0) y << YAML::Key << "peak_tflops_f32" << YAML::Value << t.peak_tflops_f32;
    y << YAML::Key << "efficiency" << YAML::Value << t.efficiency;
    if (t.matmul_element_ns != std::array<double, 3>{}) {
      y << YAML::Key << "matmul_element_ns" << YAML::Value << YAML::Flow << YAML::BeginSeq;
      for (double ns : t.matmul_element_ns) y << ns;
      y << YAML::EndSeq;
    }
    if (t.matmul_forward_speedup != 1) {
      y << YAML::Key << "matmul_forward_speedup" << YAML::Value << t.matmul_forward_speedup;
    }
    if (!t.matmul_corrections.empty()) {
      y << YAML::Key << "matmul_corrections" << YAML::Value << YAML::Flow << YAML::BeginSeq;
      for (const ChipType::GemmCorrection& g : t.matmul_corrections)
        y << YAML::Flow << YAML::BeginSeq << g.rows << g.k << g.n << g.ratio << YAML::EndSeq;
      y << YAML::EndSeq;
    }
    if (!t.part_corrections.empty()) {
      y << YAML::Key << "part_corrections" << YAML::Value << YAML::Flow << YAML::BeginSeq;
      for (const ChipType::PartCorrection& p : t.part_corrections)
        y << YAML::Flow << YAML::BeginSeq << p.tp << p.rows << p.block_forward << p.block_backward << p.head_forward
          << p.head_backward << YAML::EndSeq;
      y << YAML::EndSeq;
    }
    if (t.attention_efficiency > 0) y << YAML::Key << "attention_efficiency" << YAML::Value << t.attention_efficiency;
    if (t.attention_forward_efficiency > 0) {
      y << YAML::Key << "attention_forward_efficiency" << YAML::Value << t.attention_forward_efficiency;
    }
    y << YAML::Key << "memory_gib" << YAML::Value << t.memory_gib << YAML::Key << "memory_bandwidth_gbps" << YAML::Value
      << t.memory_bandwidth_gbps << YAML::Key << "memory_efficiency" << YAML::Value << t.memory_efficiency << YAML::Key
      << "kernel_overhead_us" << YAML::Value << t.kernel_overhead_us << YAML::Key << "host_link_gbps" << YAML::Value
      << t.host_link_gbps;
    if (t.elementwise_gbps > 0) y << YAML::Key << "elementwise_gbps" << YAML::Value << t.elementwise_gbps;
    if (t.run_kernel_us > 0) y << YAML::Key << "run_kernel_us" << YAML::Value << t.run_kernel_us;
    if (t.backend != "emu") y << YAML::Key << "backend" << YAML::Value << t.backend;
    if (t.emulation_tflops > 0) y << YAML::Key << "emulation_tflops" << YAML::Value << t.emulation_tflops;
    y << YAML::EndMap;
  }
  y << YAML::EndSeq << YAML::Key << "groups" << YAML::Value << YAML::BeginSeq;
  for (const NodeGroup& g : c.groups) {
    y << YAML::Flow << YAML::BeginMap << YAML::Key << "chip" << YAML::Value << c.chips[static_cast<size_t>(g.chip)].name
      << YAML::Key << "nodes" << YAML::Value << g.nodes << YAML::Key << "chips_per_node" << YAML::Value
      << g.chips_per_node << YAML::Key << "intra_node_gbps" << YAML::Value << g.intra_node_gbps << YAML::Key
      << "intra_node_latency_us" << YAML::Value << g.intra_node_latency_us << YAML::Key << "nic_gbps" << YAML::Value
      << g.nic_gbps << YAML::Key << "nic_latency_us" << YAML::Value << g.nic_latency_us << YAML::EndMap;
  }
  y << YAML::EndSeq;
  if (!c.links.empty()) {
    y << YAML::Key << "links" << YAML::Value << YAML::BeginSeq;
    for (const GroupLink& l : c.links) {
      y << YAML::Flow << YAML::BeginMap << YAML::Key << "between" << YAML::Value << YAML::Flow << YAML::BeginSeq
        << c.chips[static_cast<size_t>(l.a)].name << c.chips[static_cast<size_t>(l.b)].name << YAML::EndSeq << YAML::Key
        << "bandwidth_gbps" << YAML::Value << l.bandwidth_gbps << YAML::Key << "latency_us" << YAML::Value
        << l.latency_us << YAML::Key << "device_direct" << YAML::Value << l.device_direct << YAML::EndMap;
    }
    y << YAML::EndSeq;
  }
  const bool profiled_here =
      std::any_of(c.chips.begin(), c.chips.end(), [](const ChipType& t) { return !t.kernel_work.empty(); });
  if (profiled_here) {
    y << YAML::Key << "kernel_work" << YAML::Value << YAML::BeginSeq;
    for (const ChipType& t : c.chips) {
      if (t.kernel_work.empty()) continue;
      y << YAML::BeginMap << YAML::Key << "chip" << YAML::Value << t.name << YAML::Key << "work" << YAML::Value
        << YAML::BeginSeq;
      for (const auto& [key, seconds] : t.kernel_work) {
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(key));
        y << YAML::Flow << YAML::BeginSeq << hex << seconds << YAML::EndSeq;
      }
      y << YAML::EndSeq << YAML::EndMap;
    }
    y << YAML::EndSeq;
  }
  y << YAML::EndMap;
  return std::string(y.c_str()) + "\n";
}

ChipType load_chip(const ConfigNode& n, const ChipType* base) {
  ChipType t = base ? *base : ChipType{};
  const auto number = [&](const char* key, double& field, bool required) {
    field = positive_number(n, key, required ? std::nullopt : std::optional<double>(field));
  };
  const auto fraction = [&](const char* key, double& field) {
    if (!n.has(key)) return;
    field = n.get<double>(key);
    if (!(field > 0 && field <= 1)) n.at(key).fail(cat("must be in (0, 1], got ", field));
  };
  if (!base || n.has("name")) t.name = n.get<std::string>("name");
  t.vendor = n.get<std::string>("vendor", base ? t.vendor : "unknown");
  number("peak_tflops", t.peak_tflops, !base);
  number("peak_tflops_f32", t.peak_tflops_f32, false);
  fraction("efficiency", t.efficiency);
  fraction("attention_efficiency", t.attention_efficiency);
  fraction("attention_forward_efficiency", t.attention_forward_efficiency);
  if (n.has("matmul_forward_speedup")) {
    t.matmul_forward_speedup = n.get<double>("matmul_forward_speedup");
    if (!(t.matmul_forward_speedup > 1.0 / 3 && t.matmul_forward_speedup <= 3)) {
      n.at("matmul_forward_speedup")
          .fail(cat("must be in (1/3, 3], got ", t.matmul_forward_speedup,
                    " (a GEMM forward's rate over the forward and backward's together; 1 = alike)"));
    }
  }
  if (auto old = n.find("matmul_curve")) {
    old->fail(
        "GEMM efficiency by size was replaced by matmul_element_ns (a GEMM's cost per element of its input, "
        "weight and output); profile the cluster again with h2 profile");
  }
  if (auto ns = n.find("matmul_element_ns")) {
    t.matmul_element_ns =
        number_list<3>(*ns, "is [input, weight, output]: nanoseconds per element of each, per GEMM pass", true);
  }
  if (auto list = n.find("matmul_corrections")) {
    t.matmul_corrections.clear();
    for (const ConfigNode& e : list->items()) {
      const auto x = number_list<4>(
          e, "is [rows, k, n, ratio]: a GEMM shape h2 profile timed, and its time over the fit's", false);
      t.matmul_corrections.push_back({x[0], x[1], x[2], x[3]});
    }
  }
  if (auto list = n.find("part_corrections")) {
    t.part_corrections.clear();
    for (const ConfigNode& e : list->items()) {
      constexpr const char* kShape =
          "is [tp, rows, block forward, block backward, head forward, head backward] (or [tp, rows, block, head]): a "
          "TP degree and rows h2 profile timed a block and the head at, and their times over their kernels' composed";
      if (e.items().size() == 4) {
        const auto x = number_list<4>(e, kShape, false);
        t.part_corrections.push_back({x[0], x[1], x[2], x[2], x[3], x[3]});
      } else {
        const auto x = number_list<6>(e, kShape, false);
        t.part_corrections.push_back({x[0], x[1], x[2], x[3], x[4], x[5]});
      }
      if (t.part_corrections.back().tp != std::floor(t.part_corrections.back().tp)) {
        e.items()[0].fail(cat("must be a whole TP degree, got ", t.part_corrections.back().tp));
      }
    }
  }
  number("memory_gib", t.memory_gib, !base);
  number("memory_bandwidth_gbps", t.memory_bandwidth_gbps, !base);
  fraction("memory_efficiency", t.memory_efficiency);
  t.elementwise_gbps = non_negative_number(n, "elementwise_gbps", t.elementwise_gbps);
  t.kernel_overhead_us = non_negative_number(n, "kernel_overhead_us", t.kernel_overhead_us);
  t.run_kernel_us = non_negative_number(n, "run_kernel_us", t.run_kernel_us);
  number("host_link_gbps", t.host_link_gbps, false);
  t.emulation_tflops = non_negative_number(n, "emulation_tflops", t.emulation_tflops);
  if (auto b = n.find("backend")) {
    t.backend = b->as_string();
    if (t.backend != "emu" && t.backend != "cpu" && t.backend != "cuda") {
      b->fail(cat("'", t.backend, "' is not a backend a chip type can run on; use emu, cpu or cuda"));
    }
  }
  return t;
}

Cluster load_cluster(const ConfigNode& root) {
  root.allow_only({"name", "figures", "catalog", "chips", "groups", "links", "kernel_work"});
  Cluster c;
  c.name = root.get<std::string>("name", root.file());
  if (auto f = root.find("figures")) {
    const std::string v = f->as_string();
    bool known = false;
    for (Figures k : {Figures::kDatasheet, Figures::kProfiled, Figures::kCalibrated}) {
      if (v == figures_name(k)) {
        c.figures = k;
        known = true;
      }
    }
    if (!known) f->fail(cat("'", v, "' is not a source of figures; use datasheet, profiled or calibrated"));
  }
  // Chips may come from a catalog (examples/chips.yaml), named relative to this file.
  std::optional<ChipCatalog> catalog;
  if (auto f = root.find("catalog"))
    catalog = load_catalog(ConfigNode::load_file(path_beside(root.file(), f->as_string())));
  std::vector<const CatalogChip*> from_catalog;  // per chip type: its catalog entry, or null
  for (const ConfigNode& n : root.at("chips").items()) {
    n.allow_only({"catalog",
                  "name",
                  "vendor",
                  "peak_tflops",
                  "peak_tflops_f32",
                  "efficiency",
                  "matmul_curve",
                  "matmul_element_ns",
                  "matmul_forward_speedup",
                  "matmul_corrections",
                  "part_corrections",
                  "attention_efficiency",
                  "attention_forward_efficiency",
                  "memory_gib",
                  "memory_bandwidth_gbps",
                  "memory_efficiency",
                  "elementwise_gbps",
                  "kernel_overhead_us",
                  "run_kernel_us",
                  "host_link_gbps",
                  "backend",
                  "emulation_tflops"});
    const CatalogChip* entry = nullptr;
    if (auto name = n.find("catalog")) {
      if (!catalog) name->fail("names a catalog chip, but the file names no catalog; add catalog: chips.yaml");
      entry = catalog->find(name->as_string());
      if (!entry)
        name->fail(cat("no chip '", name->as_string(), "' in ", catalog->file, "; it has ", catalog->names()));
    }
    const ChipType t = load_chip(n, entry ? &entry->chip : nullptr);
    if (c.chip_index(t.name) >= 0) n.fail(cat("chip type '", t.name, "' is defined twice"));
    c.chips.push_back(t);
    from_catalog.push_back(entry);
  }
  if (c.chips.empty()) root.at("chips").fail("lists no chip types; a cluster needs at least one");
  for (const ConfigNode& n : root.at("groups").items()) {
    n.allow_only(
        {"chip", "nodes", "chips_per_node", "intra_node_gbps", "intra_node_latency_us", "nic_gbps", "nic_latency_us"});
    NodeGroup g;
    const std::string chip = n.get<std::string>("chip");
    g.chip = c.chip_index(chip);
    if (g.chip < 0) n.at("chip").fail(cat("unknown chip type '", chip, "'; the file defines it under chips: first"));
    for (const NodeGroup& other : c.groups) {
      if (other.chip == g.chip) n.at("chip").fail(cat("chip type '", chip, "' has two node groups; merge them"));
    }
    const CatalogChip* entry = from_catalog[static_cast<size_t>(g.chip)];
    g.nodes = positive_int32(n, "nodes");
    if (entry) {  // the catalog's node as the default of every figure
      const NodeGroup d = entry->node;
      g.chips_per_node = n.has("chips_per_node") ? positive_int32(n, "chips_per_node") : d.chips_per_node;
      g.intra_node_gbps = positive_number(n, "intra_node_gbps", d.intra_node_gbps);
      g.intra_node_latency_us = non_negative_number(n, "intra_node_latency_us", d.intra_node_latency_us);
      g.nic_gbps = positive_number(n, "nic_gbps", d.nic_gbps);
      g.nic_latency_us = non_negative_number(n, "nic_latency_us", d.nic_latency_us);
    } else {
      g.chips_per_node = positive_int32(n, "chips_per_node");
      g.intra_node_gbps =
          g.chips_per_node > 1 ? positive_number(n, "intra_node_gbps") : n.get<double>("intra_node_gbps", 0);
      g.intra_node_latency_us = non_negative_number(n, "intra_node_latency_us", 2);
      g.nic_gbps = positive_number(n, "nic_gbps");
      g.nic_latency_us = non_negative_number(n, "nic_latency_us", g.nic_latency_us);
    }
    c.groups.push_back(g);
  }
  if (c.groups.empty()) root.at("groups").fail("lists no node groups: the cluster has no devices");
  if (auto links = root.find("links")) {
    for (const ConfigNode& n : links->items()) {
      n.allow_only({"between", "bandwidth_gbps", "latency_us", "device_direct"});
      const std::vector<ConfigNode> ends = n.at("between").items();
      if (ends.size() != 2) n.at("between").fail("must name two chip types");
      GroupLink l;
      int* idx[2] = {&l.a, &l.b};
      for (size_t i = 0; i < 2; ++i) {
        *idx[i] = c.chip_index(ends[i].as_string());
        if (*idx[i] < 0) ends[i].fail(cat("unknown chip type '", ends[i].as_string(), "'"));
      }
      if (l.a == l.b) n.at("between").fail("a link joins two different chip types (within a type the NICs are used)");
      l.bandwidth_gbps = positive_number(n, "bandwidth_gbps");
      l.latency_us = non_negative_number(n, "latency_us", 10);
      l.device_direct = n.get<bool>("device_direct", false);
      c.links.push_back(l);
    }
  }
  // Every pair of chip types needs a link: the catalog's default between types, or an error naming the pair.
  for (int a = 0; a < static_cast<int>(c.chips.size()); ++a) {
    for (int b = a + 1; b < static_cast<int>(c.chips.size()); ++b) {
      const bool linked = std::any_of(c.links.begin(), c.links.end(), [&](const GroupLink& l) {
        return (l.a == a && l.b == b) || (l.a == b && l.b == a);
      });
      if (linked) continue;
      if (!catalog) {
        root.at("chips").fail(cat("no link between chip types '", c.chips[static_cast<size_t>(a)].name, "' and '",
                                  c.chips[static_cast<size_t>(b)].name, "'; add {between: [",
                                  c.chips[static_cast<size_t>(a)].name, ", ", c.chips[static_cast<size_t>(b)].name,
                                  "], bandwidth_gbps: ..., latency_us: ...} under links:"));
      }
      c.links.push_back(GroupLink{a, b, catalog->between_types.bandwidth_gbps, catalog->between_types.latency_us,
                                  catalog->between_types.device_direct});
    }
  }
  if (auto work = root.find("kernel_work")) {
    for (const ConfigNode& entry : work->items()) {
      entry.allow_only({"chip", "work"});
      const int chip = c.chip_index(entry.get<std::string>("chip"));
      if (chip < 0) entry.at("chip").fail(cat("unknown chip type '", entry.get<std::string>("chip"), "'"));
      std::map<uint64_t, double>& into = c.chips[static_cast<size_t>(chip)].kernel_work;
      if (!into.empty()) entry.at("chip").fail("is listed twice");
      for (const ConfigNode& n : entry.at("work").items()) {
        const std::vector<ConfigNode> pair = n.items();
        if (pair.size() != 2) n.fail("must be [shape key in 16 hex digits, seconds] (h2 profile writes it)");
        const std::string hex = pair[0].as_string();
        if (hex.size() != 16 || hex.find_first_not_of("0123456789abcdef") != std::string::npos) {
          pair[0].fail(cat("'", hex, "' is not a shape key of 16 lower-case hex digits (h2 profile writes them)"));
        }
        const double seconds = pair[1].as_double();
        if (!(seconds > 0 && std::isfinite(seconds))) pair[1].fail("must be a positive number of seconds");
        into[std::stoull(hex, nullptr, 16)] = seconds;
      }
    }
  }
  return c;
}

TransformerShape load_model(const ConfigNode& root) {
  root.allow_only({"name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len", "tied_embeddings"});
  TransformerShape s;
  s.layers = positive_int(root, "layers");
  s.hidden = positive_int(root, "hidden");
  s.heads = positive_int(root, "heads");
  s.kv_heads = root.has("kv_heads") ? positive_int(root, "kv_heads") : s.heads;
  s.ffn = root.has("ffn") ? positive_int(root, "ffn") : 4 * s.hidden;
  s.vocab = positive_int(root, "vocab");
  s.seq_len = positive_int(root, "seq_len");
  s.tied_embeddings = root.get<bool>("tied_embeddings", true);
  if (s.hidden % s.heads != 0) root.at("heads").fail(cat(s.heads, " heads do not divide hidden = ", s.hidden));
  if (s.heads % s.kv_heads != 0) root.at("kv_heads").fail(cat(s.kv_heads, " kv_heads do not divide heads = ", s.heads));
  return s;
}

TrainSetup load_train_setup(const ConfigNode& root) {
  root.allow_only({"global_batch", "precision", "h2_runtime", "recompute", "partial_recompute", "zero_bubble", "zero1",
                   "micro_batches", "max_tp"});
  TrainSetup t;
  t.global_batch = root.int_in("global_batch", 1, int64_t{1} << 32);
  if (auto p = root.find("precision")) {
    const std::optional<Precision> v = parse_precision(p->as_string());
    if (!v) p->fail("must be bf16 (bf16 compute, fp32 master weights and Adam) or f32 (all f32)");
    t.precision = *v;
  }
  if (auto r = root.find("recompute")) {
    t.allowed_recompute.clear();
    for (const ConfigNode& item : r->items()) {
      const std::optional<Recompute> v = parse_recompute(item.as_string());
      if (!v) item.fail(cat("unknown recomputation '", item.as_string(), "'; use none, selective or full"));
      t.allowed_recompute.push_back(*v);
    }
    if (t.allowed_recompute.empty()) r->fail("allows no recomputation choice; list at least 'none'");
  }
  t.h2_runtime = root.get<bool>("h2_runtime", t.h2_runtime);
  t.partial_recompute = root.get<bool>("partial_recompute", t.partial_recompute);
  t.zero_bubble = root.get<bool>("zero_bubble", t.zero_bubble);
  t.zero1 = root.get<bool>("zero1", t.zero1);
  t.max_tp = static_cast<int>(root.get<int64_t>("max_tp", 0));
  if (t.max_tp < 0) root.at("max_tp").fail("must be >= 0 (0 = any tensor-parallel degree)");
  if (auto mb = root.find("micro_batches")) {
    t.micro_batches.clear();
    for (const ConfigNode& item : mb->items()) {
      const int64_t v = item.as_int();
      if (v <= 0) item.fail("micro-batch sizes must be positive");
      t.micro_batches.push_back(static_cast<int>(v));
    }
    if (t.micro_batches.empty()) mb->fail("lists no micro-batch size");
  }
  return t;
}

PlanningInputs load_planning_inputs(const std::string& cluster_file, const std::string& model_file,
                                    const std::string& train_file) {
  PlanningInputs in;
  in.cluster = load_cluster_arg(cluster_file);
  const ConfigNode model = ConfigNode::load_file(model_file);
  in.model = load_model(model);
  in.model_name = model.get<std::string>("name", model_file);
  in.train = load_train_setup(ConfigNode::load_file(train_file));
  return in;
}

}  // namespace h2

// The chip catalog (examples/chips.yaml): public datasheet figures of real accelerators, each with its source, and
// the node each usually comes in. Cluster files name catalog chips (`catalog: chips.yaml` and chips entries
// `{catalog: H100}`, any figure overridable), and a cluster can be written as a spec, "H100:64,MI300X:32,910B:128":
// that many chips of each type, in nodes of the catalog's size, linked between types by the catalog's default.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"
#include "planner/spec.h"

namespace h2 {

struct CatalogChip {
  ChipType chip;
  NodeGroup node;      // chips_per_node, intra-node and NIC figures (nodes and chip unset)
  std::string source;  // where the figures come from
};

struct ChipCatalog {
  std::string file;
  std::vector<CatalogChip> chips;
  GroupLink between_types;  // the default link between two chip types (a, b unset)

  const CatalogChip* find(const std::string& name) const;  // null when absent
  std::string names() const;                               // "A100, H100, ..." for messages
};

ChipCatalog load_catalog(const ConfigNode& root);

// $H2_CHIP_CATALOG, else examples/chips.yaml (relative to the working directory, as the examples are).
std::string default_catalog_path();

// Whether `text` is a cluster spec: NAME:COUNT[,NAME:COUNT]... (COUNT a positive integer).
bool is_cluster_spec(const std::string& text);
// The cluster a spec describes; each COUNT a multiple of its chip's node size, or less than one node (one node of
// COUNT chips). Errors name the item and the catalog's chips.
Cluster cluster_from_spec(const std::string& spec, const ChipCatalog& catalog);

// What a --cluster argument names: a cluster file when one exists at that path, else a spec built from the
// default catalog; an error says which it tried.
Cluster load_cluster_arg(const std::string& file_or_spec);

// `relative` read beside `file` (relative to file's folder unless absolute).
std::string path_beside(const std::string& file, const std::string& relative);

}  // namespace h2

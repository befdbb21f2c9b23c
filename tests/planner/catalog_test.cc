// The chip catalog: its figures as the datasheets give them, clusters from "NAME:COUNT" specs and from cluster files
// that name catalog chips, and the errors of each.
#include "planner/catalog.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "planner/fixtures.h"
#include "test_util.h"

namespace h2 {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing_util::cluster_of;
using testing_util::error_of;

const std::string kExamples = std::string(H2_SOURCE_DIR) + "/examples/";

ChipCatalog shipped() { return load_catalog(ConfigNode::load_file(kExamples + "chips.yaml")); }

TEST(Catalog, ShippedChipsCarryTheirDatasheetFiguresAndSources) {
  const ChipCatalog c = shipped();
  for (const char* name : {"A100", "H100", "H20", "L40S", "MI300X", "Gaudi2", "Gaudi3", "910B"}) {
    const CatalogChip* chip = c.find(name);
    ASSERT_NE(chip, nullptr) << name;
    EXPECT_FALSE(chip->source.empty()) << name;
    EXPECT_EQ(chip->node.chips_per_node, 8) << name;
  }
  // From the datasheets: H100 SXM 989 TF dense bf16, 80 GB at 3.35 TB/s, NVLink 900 GB/s both ways.
  const CatalogChip& h100 = *c.find("H100");
  EXPECT_EQ(h100.chip.peak_tflops, 989);
  EXPECT_EQ(h100.chip.memory_gib, 80);
  EXPECT_EQ(h100.chip.memory_bandwidth_gbps, 3350);
  EXPECT_EQ(h100.node.intra_node_gbps, 450);
  EXPECT_EQ(h100.node.nic_gbps, 50);  // the catalog's default: one 400 Gb/s NIC per chip
  // MI300X: 1,307 TF bf16, 192 GB; Gaudi 2 names no TF32 rate, so f32 is half its bf16 peak.
  EXPECT_EQ(c.find("MI300X")->chip.memory_gib, 192);
  EXPECT_EQ(c.find("Gaudi2")->chip.peak_flops(false), 216e12);
  EXPECT_EQ(c.between_types.bandwidth_gbps, 25);
}

TEST(Catalog, ASpecBuildsWholeNodesOfEachChip) {
  const Cluster c = cluster_from_spec("H100:64,MI300X:32,910B:4", shipped());
  ASSERT_EQ(c.chips.size(), 3u);
  EXPECT_EQ(c.chips[1].name, "MI300X");
  EXPECT_EQ(c.devices_of(0), 64);
  EXPECT_EQ(c.group_of(0).nodes, 8);
  EXPECT_EQ(c.group_of(1).nodes, 4);
  // Fewer than a node's chips: one node of them.
  EXPECT_EQ(c.group_of(2).nodes, 1);
  EXPECT_EQ(c.group_of(2).chips_per_node, 4);
  EXPECT_EQ(c.group_of(0).intra_node_gbps, 450);
  EXPECT_EQ(c.group_of(2).nic_gbps, 25);
  ASSERT_EQ(c.links.size(), 3u);  // every pair of types, host-staged
  EXPECT_EQ(c.link(1, 2).bandwidth_gbps, 25);
  EXPECT_FALSE(c.link(0, 2).device_direct);
}

TEST(Catalog, BadSpecsNameTheItemAndTheFix) {
  const ChipCatalog c = shipped();
  const auto error = [&](const std::string& spec) {
    return error_of([&] { cluster_from_spec(spec, c); }, ErrorCode::kInvalidArgument);
  };
  EXPECT_THAT(error("B200:8"), HasSubstr("no chip 'B200' in " + kExamples + "chips.yaml; it has A100, H100"));
  EXPECT_THAT(error("H100:12"), HasSubstr("H100:12 is not whole nodes of 8 H100; use a multiple of 8"));
  EXPECT_THAT(error("H100:0"), HasSubstr("the count must be in 1..1000000"));
  EXPECT_THAT(error("H100:99999999999999999999"), HasSubstr("the count must be in 1..1000000"));
  EXPECT_THAT(error("H100:8,H100:8"), HasSubstr("H100 is listed twice"));
  EXPECT_THAT(error("H100=8"), HasSubstr("expected NAME:COUNT[,NAME:COUNT]..."));
  EXPECT_FALSE(is_cluster_spec("examples/cluster_local.yaml"));
  EXPECT_TRUE(is_cluster_spec("910B:128"));
}

// A cluster file naming catalog chips takes their figures, nodes and links, overriding what it states.
TEST(Catalog, ClusterFilesNameCatalogChips) {
  const Cluster shipped1024 = load_cluster_arg(kExamples + "cluster_catalog1024.yaml");
  int total = 0;
  for (size_t k = 0; k < shipped1024.chips.size(); ++k) total += shipped1024.devices_of(static_cast<int>(k));
  EXPECT_EQ(total, 1024);
  EXPECT_EQ(shipped1024.link(0, 3).bandwidth_gbps, 25);  // stated
  EXPECT_TRUE(shipped1024.link(0, 3).device_direct);
  EXPECT_FALSE(shipped1024.link(1, 2).device_direct);  // the catalog's default

  const std::string yaml = "catalog: " + kExamples +
                           "chips.yaml\n"
                           "chips:\n  - {catalog: A100, efficiency: 0.4}\n"
                           "  - {name: mine, peak_tflops: 10, memory_gib: 8, memory_bandwidth_gbps: 100}\n"
                           "groups:\n  - {chip: A100, nodes: 2, nic_gbps: 12.5}\n"
                           "  - {chip: mine, nodes: 1, chips_per_node: 1, nic_gbps: 1}\n";
  const Cluster c = cluster_of(yaml);
  EXPECT_EQ(c.chips[0].name, "A100");
  EXPECT_EQ(c.chips[0].peak_tflops, 312);
  EXPECT_EQ(c.chips[0].efficiency, 0.4);
  EXPECT_EQ(c.devices_of(0), 16);
  EXPECT_EQ(c.group_of(0).intra_node_gbps, 300);
  EXPECT_EQ(c.group_of(0).nic_gbps, 12.5);
  EXPECT_EQ(c.link(0, 1).bandwidth_gbps, 25);

  EXPECT_THAT(error_of([&] { cluster_of("catalog: " + kExamples + "chips.yaml\nchips:\n  - {catalog: TPU}\n"); },
                       ErrorCode::kConfig),
              HasSubstr("c.yaml:3:15: field 'chips[0].catalog': no chip 'TPU' in"));
  EXPECT_THAT(error_of([&] { cluster_of("chips:\n  - {catalog: A100}\n"); }, ErrorCode::kConfig),
              HasSubstr("the file names no catalog; add catalog: chips.yaml"));
}

// Without a catalog, two chip types need a link (the planner used to throw inside its worker threads), and
// figures must be finite.
TEST(Catalog, ClustersWithoutACatalogStateEveryLinkAndFiniteFigures) {
  const std::string two =
      "chips:\n  - {name: X, peak_tflops: 1, memory_gib: 1, memory_bandwidth_gbps: 1}\n"
      "  - {name: Y, peak_tflops: 1, memory_gib: 1, memory_bandwidth_gbps: 1}\n"
      "groups:\n  - {chip: X, nodes: 1, chips_per_node: 1, nic_gbps: 1}\n"
      "  - {chip: Y, nodes: 1, chips_per_node: 1, nic_gbps: 1}\n";
  EXPECT_THAT(error_of([&] { cluster_of(two); }, ErrorCode::kConfig),
              HasSubstr("no link between chip types 'X' and 'Y'; add {between: [X, Y], bandwidth_gbps: ..."));
  EXPECT_EQ(cluster_of(two + "links:\n  - {between: [Y, X], bandwidth_gbps: 3}\n").link(0, 1).bandwidth_gbps, 3);
  EXPECT_THAT(error_of(
                  [] {
                    cluster_of(
                        "chips:\n  - {name: X, peak_tflops: .inf, memory_gib: 1, memory_bandwidth_gbps: 1}\n"
                        "groups: []\n");
                  },
                  ErrorCode::kConfig),
              HasSubstr("field 'chips[0].peak_tflops': must be a positive finite number, got inf"));
  EXPECT_THAT(error_of(
                  [] {
                    cluster_of(
                        "chips:\n  - {name: X, peak_tflops: 1, memory_gib: 1, memory_bandwidth_gbps: 1}\n"
                        "groups:\n  - {chip: X, nodes: 4294967298, chips_per_node: 1, nic_gbps: 1}\n");
                  },
                  ErrorCode::kConfig),
              HasSubstr("field 'groups[0].nodes': must be at most 2147483647"));
}

// --cluster takes a file when one exists, else a spec from $H2_CHIP_CATALOG (default examples/chips.yaml).
TEST(Catalog, TheClusterArgumentIsAFileOrASpec) {
  ::setenv("H2_CHIP_CATALOG", (kExamples + "chips.yaml").c_str(), 1);
  EXPECT_EQ(load_cluster_arg("L40S:16,Gaudi3:8").devices_of(1), 8);
  EXPECT_EQ(load_cluster_arg(kExamples + "cluster_local.yaml").name, "local-emu");
  ::unsetenv("H2_CHIP_CATALOG");
  EXPECT_THAT(error_of([] { load_cluster_arg("no/such/cluster.yaml"); }, ErrorCode::kIo),
              HasSubstr("no/such/cluster.yaml"));
  // Neither a file nor a spec, but written as a spec: the spec's form, not "cannot open the file".
  for (const char* bad : {"H100:-8", "H100:abc", "H100:8,", ":8", "H100:8,MI300X"}) {
    EXPECT_THAT(error_of([&] { load_cluster_arg(bad); }, ErrorCode::kInvalidArgument),
                AllOf(HasSubstr(cat("--cluster '", bad, "' is no file, nor a cluster spec")),
                      HasSubstr("NAME:COUNT[,NAME:COUNT]")));
  }
}

}  // namespace
}  // namespace h2

// Planner inputs shared by the planner's and the simulator's tests: a small three-type cluster where memory
// binds, a small model, the shipped examples (load_example) and the 1,024-chip one as a fixture.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "planner/spec.h"

namespace h2::testing_util {

inline Cluster cluster_of(const std::string& yaml) { return load_cluster(ConfigNode::parse_string(yaml, "c.yaml")); }

// Two chip types: X fast with little memory, Y slow with much. Sizes chosen so memory binds.
inline const char* kSmallCluster = R"(
name: small
chips:
  - {name: X, peak_tflops: 100, efficiency: 0.5, memory_gib: 2, memory_bandwidth_gbps: 1000}
  - {name: Y, peak_tflops: 40, efficiency: 0.5, memory_gib: 8, memory_bandwidth_gbps: 500}
  - {name: Z, peak_tflops: 60, efficiency: 0.5, memory_gib: 4, memory_bandwidth_gbps: 800}
groups:
  - {chip: X, nodes: 1, chips_per_node: 2, intra_node_gbps: 100, nic_gbps: 10}
  - {chip: Y, nodes: 2, chips_per_node: 2, intra_node_gbps: 50, nic_gbps: 10}
  - {chip: Z, nodes: 1, chips_per_node: 2, intra_node_gbps: 80, nic_gbps: 20}
links:
  - {between: [X, Y], bandwidth_gbps: 5, latency_us: 10, device_direct: false}
  - {between: [X, Z], bandwidth_gbps: 10, latency_us: 10, device_direct: true}
  - {between: [Y, Z], bandwidth_gbps: 5, latency_us: 10, device_direct: false}
)";

inline TransformerShape small_model(int64_t layers) {
  return TransformerShape{.layers = layers,
                          .hidden = 2048,
                          .heads = 16,
                          .kv_heads = 16,
                          .ffn = 8192,
                          .vocab = 32000,
                          .seq_len = 1024,
                          .tied_embeddings = true};
}

// A shipped example: its cluster, model and training setup, loaded from examples/.
struct Example {
  Cluster cluster;
  TransformerShape model;
  TrainSetup train;
};
inline Example load_example(const std::string& cluster, const std::string& model, const std::string& train) {
  const std::string dir = std::string(H2_SOURCE_DIR) + "/examples/";
  return Example{load_cluster(ConfigNode::load_file(dir + cluster)), load_model(ConfigNode::load_file(dir + model)),
                 load_train_setup(ConfigNode::load_file(dir + train))};
}

class Hetero1024 : public ::testing::Test {
 protected:
  void SetUp() override {
    Example e = load_example("cluster_hetero1024.yaml", "model_100b.yaml", "train_100b.yaml");
    cluster_ = std::move(e.cluster);
    model_ = e.model;
    train_ = std::move(e.train);
  }
  Cluster cluster_;
  TransformerShape model_;
  TrainSetup train_;
};

}  // namespace h2::testing_util

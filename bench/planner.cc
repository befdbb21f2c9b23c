// bench_planner: how long HeteroAuto's search takes on large clusters, beside its greedy tier alone (the quick
// alternative) in the same run: 1,024 chips of 4 types and 4,096 chips of 8 types, planning the 100B model.
// Prints search time, layouts generated / pruned / costed, the tier reached, and the plans' predicted
// throughput. Goals: 1,024 x 4 under 1 s, 4,096 x 8 under 10 s (2 cores). The budget is 10 s (the goal).
#include "planner/planner.h"

#include <cstdio>
#include <string>

#include "core/config.h"

namespace {

// 4,096 chips of eight types, 512 each, spread over compute, memory and network so that none dominates.
h2::Cluster cluster_4096x8() {
  std::string yaml = "name: hetero-4096x8\nchips:\n";
  const double tflops[] = {800, 300, 400, 150, 600, 250, 500, 200};
  const double mem[] = {24, 128, 48, 32, 40, 96, 64, 80};
  const double bw[] = {3000, 2000, 1600, 1000, 2400, 1800, 2000, 1200};
  const double nic[] = {25, 25, 100, 12.5, 50, 25, 50, 12.5};
  for (int i = 0; i < 8; ++i) {
    yaml += "  - {name: T" + std::to_string(i) + ", peak_tflops: " + std::to_string(tflops[i]) +
            ", memory_gib: " + std::to_string(mem[i]) + ", memory_bandwidth_gbps: " + std::to_string(bw[i]) + "}\n";
  }
  yaml += "groups:\n";
  for (int i = 0; i < 8; ++i) {
    yaml += "  - {chip: T" + std::to_string(i) +
            ", nodes: 64, chips_per_node: 8, intra_node_gbps: 200, nic_gbps: " + std::to_string(nic[i]) + "}\n";
  }
  yaml += "links:\n";
  for (int i = 0; i < 8; ++i) {
    for (int j = i + 1; j < 8; ++j) {
      yaml += "  - {between: [T" + std::to_string(i) + ", T" + std::to_string(j) + "], bandwidth_gbps: 12.5}\n";
    }
  }
  return h2::load_cluster(h2::ConfigNode::parse_string(yaml, "<4096x8>"));
}

void run(const char* name, const h2::CostModel& costs, const std::string& finest) {
  h2::SearchStats stats;
  const h2::Plan plan =
      h2::plan_training(costs, h2::PlannerOptions{.time_budget_s = 10, .finest_tier = finest}, &stats);
  std::printf("%-12s %-22s %9.3f %10lld %10lld %10lld %10lld %-11s %12.0f %7d\n", name, ("search to " + finest).c_str(),
              stats.seconds, static_cast<long long>(stats.layouts), static_cast<long long>(stats.pruned_memory),
              static_cast<long long>(stats.pruned_bound), static_cast<long long>(stats.evaluated),
              (stats.tier + (stats.budget_exhausted ? "*" : "")).c_str(), plan.tokens_per_s, plan.devices_used);
}

}  // namespace

int main() {
  const std::string dir = H2_SOURCE_DIR "/examples/";
  const h2::TransformerShape model = h2::load_model(h2::ConfigNode::load_file(dir + "model_100b.yaml"));
  const h2::TrainSetup train = h2::load_train_setup(h2::ConfigNode::load_file(dir + "train_100b.yaml"));
  const h2::Cluster c1024 = h2::load_cluster(h2::ConfigNode::load_file(dir + "cluster_hetero1024.yaml"));
  const h2::Cluster c4096 = cluster_4096x8();
  std::printf("# bench_planner: the 100B model (examples/model_100b.yaml, train_100b.yaml); * = budget exhausted\n");
  std::printf("%-12s %-22s %9s %10s %10s %10s %10s %-11s %12s %7s\n", "cluster", "search", "seconds", "layouts",
              "pruned mem", "pruned LB", "costed", "tier", "tokens/s", "devices");
  for (const auto& [name, cluster] : {std::pair{"1024 x 4", &c1024}, std::pair{"4096 x 8", &c4096}}) {
    const h2::CostModel costs(*cluster, model, train);
    run(name, costs, "greedy");
    run(name, costs, "exhaustive");
  }
  return 0;
}

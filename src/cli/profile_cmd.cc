// `h2 profile --cluster C --model M [--train T] --out F`: measures each chip type and the link on this host
// (pipeline/profile.h) and writes the cluster file with the measured figures. The measuring ranks are processes
// of this same command (`--rank`, started with h2 launch's machinery), one per device of the cluster.
#include <omp.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/commands.h"
#include "comm/job.h"
#include "comm/launch.h"
#include "core/config.h"
#include "core/file.h"
#include "pipeline/hetero_train.h"
#include "pipeline/profile.h"

namespace h2::cli {

namespace {

// The chip type of each measuring rank: one per device of the cluster, at most kMaxRanks (then every type
// keeps its share of them, at least one).
constexpr int kMaxRanks = 8;
std::vector<std::string> rank_chips(const Cluster& cluster) {
  int devices = 0;
  for (const NodeGroup& g : cluster.groups) devices += g.devices();
  std::vector<std::string> out;
  for (const NodeGroup& g : cluster.groups) {
    const int n = devices <= kMaxRanks ? g.devices() : std::max(1, g.devices() * kMaxRanks / devices);
    for (int i = 0; i < n; ++i) out.push_back(cluster.chips[static_cast<size_t>(g.chip)].name);
  }
  return out;
}

// The cores each rank of `h2 train --cluster` gets on this host.
int threads_per_rank(const Cluster& cluster) {
  int devices = 0;
  for (const NodeGroup& g : cluster.groups) devices += g.devices();
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, devices));
}

// One measuring rank: its chip type's measurements while every other rank measures its own (emulated chips
// share this host's cores and memory as the training ranks will), then the link; rank 0 writes what all found.
void profile_rank(const std::string& cluster_file, const TransformerShape& shape, int micro_batch,
                  const std::string& out) {
  const Cluster cluster = load_cluster(ConfigNode::load_file(cluster_file));
  const std::vector<std::string> chips = rank_chips(cluster);
  auto job = join_job(job_env());
  Communicator& world = *job->world;
  omp_set_num_threads(threads_per_rank(cluster));
  world.barrier();
  // Every rank measures for the same few seconds at least, so the host stays as loaded as in training until the
  // slowest chip's rounds are done.
  const ChipMeasurement m =
      measure_chip(cluster, chips[static_cast<size_t>(world.rank())], shape, micro_batch, /*min_seconds=*/8.0);
  world.barrier();
  const LinkMeasurement link = measure_link(world);
  const float mine[3] = {static_cast<float>(m.layer_s), static_cast<float>(m.head_s),
                         static_cast<float>(m.optimizer_gbps)};
  std::vector<float> all(3 * static_cast<size_t>(world.size()));
  world.all_gather(all.data(), mine, 3, DType::kF32);
  if (world.rank() == 0) {
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < world.size(); ++r) {
      const float* x = &all[3 * static_cast<size_t>(r)];
      ranks.push_back(
          {{"chip", chips[static_cast<size_t>(r)]}, {"layer_s", x[0]}, {"head_s", x[1]}, {"optimizer_gbps", x[2]}});
    }
    write_file_atomic(
        out, nlohmann::json{{"bandwidth_gbps", link.bandwidth_gbps}, {"latency_us", link.latency_us}, {"ranks", ranks}}
                 .dump());
  }
  world.barrier();
}

}  // namespace

void profile_to_file(const std::string& cluster_file, const TransformerShape& shape, const std::string& model_label,
                     int micro_batch, const std::string& out) {
  const Cluster cluster = load_cluster(ConfigNode::load_file(cluster_file));
  const std::vector<std::string> ranks = rank_chips(cluster);
  std::printf(
      "profiling %zu chip type(s) of %s at the shapes of %s, micro-batch %d: %zu processes at once (one per "
      "device), %d thread(s) each\n",
      cluster.chips.size(), cluster_file.c_str(), model_label.c_str(), micro_batch, ranks.size(),
      threads_per_rank(cluster));
  const std::string part = out + ".ranks.json", model_file = out + ".model.yaml";
  write_file_atomic(model_file, cat("name: measured\nlayers: ", shape.layers, "\nhidden: ", shape.hidden,
                                    "\nheads: ", shape.heads, "\nkv_heads: ", shape.kv_heads, "\nffn: ", shape.ffn,
                                    "\nvocab: ", shape.vocab, "\nseq_len: ", shape.seq_len, "\n"));
  LaunchOptions options;
  options.ranks = std::max<int>(2, static_cast<int>(ranks.size()));
  const LaunchResult r =
      launch({std::filesystem::read_symlink("/proc/self/exe").string(), "profile", "--rank", "--cluster", cluster_file,
              "--model", model_file, "--micro-batch", std::to_string(micro_batch), "--out", part},
             options);
  std::filesystem::remove(model_file);
  if (r.exit_code != 0) throw Error(ErrorCode::kInternal, cat("the measurement failed: ", r.message));
  const nlohmann::json j = nlohmann::json::parse(read_file(part));
  std::filesystem::remove(part);
  // Each chip type: the mean over its ranks.
  std::printf("%-10s %6s %12s %12s %14s %10s\n", "chip", "speed", "block ms", "head ms", "achieved GF/s", "optim GB/s");
  std::vector<ChipMeasurement> chips;
  for (const ChipType& t : cluster.chips) {
    ChipMeasurement m{.chip = t.name, .speed = emu_profile_of(cluster, t.name).speed};
    int n = 0;
    for (const auto& x : j["ranks"]) {
      if (x["chip"] != t.name) continue;
      m.layer_s += x["layer_s"].get<double>();
      m.head_s += x["head_s"].get<double>();
      m.optimizer_gbps += x["optimizer_gbps"].get<double>();
      ++n;
    }
    if (n == 0) continue;
    m.layer_s /= n;
    m.head_s /= n;
    m.optimizer_gbps /= n;
    m.flops_per_second = achieved_flops_per_second(shape, micro_batch, m.layer_s, m.head_s);
    chips.push_back(m);
    std::printf("%-10s %6.2f %12.2f %12.2f %14.2f %10.2f\n", m.chip.c_str(), m.speed, m.layer_s * 1e3, m.head_s * 1e3,
                m.flops_per_second / 1e9, m.optimizer_gbps);
  }
  const LinkMeasurement link{j["bandwidth_gbps"].get<double>(), j["latency_us"].get<double>()};
  std::printf("link (DiComm over UCX, %d processes, pairs all-reducing at once): %.2f GB/s, %.1f us\n", options.ranks,
              link.bandwidth_gbps, link.latency_us);
  write_file_atomic(out, "# Measured by h2 profile from " + cluster_file + " at the shapes of " + model_label + "\n" +
                             cluster_to_yaml(profiled_cluster(cluster, chips, link)));
}

void register_profile(CLI::App& app, Command& selected) {
  CLI::App* pr = app.add_subcommand("profile", "Measure this cluster's chips and links; write a profiled cluster file");
  struct ProfileCmd {
    std::string cluster = "examples/cluster_local.yaml", model = "examples/model_small.yaml", out;
    int micro_batch = 1;
    bool rank = false;
  };
  auto o = std::make_shared<ProfileCmd>();
  pr->add_option("--cluster", o->cluster, "the cluster file to measure")->capture_default_str();
  pr->add_option("--model", o->model, "the model whose shapes are measured")->capture_default_str();
  pr->add_option("--micro-batch", o->micro_batch, "sequences per micro-batch")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  pr->add_option("--out", o->out, "write the profiled cluster here (YAML, for h2 plan / h2 train --cluster)")
      ->required();
  pr->add_flag("--rank", o->rank, "internal: one rank of the measurement")->group("");
  pr->callback([o, &selected] {
    selected = [o] {
      const TransformerShape shape = load_model(ConfigNode::load_file(o->model));
      if (o->rank) {  // one of the measuring ranks; rank 0 writes what they found to --out
        profile_rank(o->cluster, shape, o->micro_batch, o->out);
        return 0;
      }
      profile_to_file(o->cluster, shape, o->model, o->micro_batch, o->out);
      std::printf("wrote %s\n", o->out.c_str());
      return 0;
    };
  });
}

}  // namespace h2::cli

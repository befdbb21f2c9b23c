// `h2 profile --cluster C --model M [--train T] --out F`: measures each chip type and the link on this host
// (pipeline/profile.h) and writes the cluster file with the measured figures. The link is measured by two ranks
// of this same command (`--link-rank`, started with h2 launch's machinery).
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
#include "pipeline/profile.h"

namespace h2::cli {

void profile_to_file(const std::string& cluster_file, const TransformerShape& shape, const std::string& model_label,
                     int micro_batch, const std::string& out) {
  const Cluster cluster = load_cluster(ConfigNode::load_file(cluster_file));
  int devices = 0;
  for (const NodeGroup& g : cluster.groups) devices += g.devices();
  // Measure with the cores each rank of `h2 train --cluster` gets on this host.
  const int share = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, devices));
  omp_set_num_threads(share);
  std::printf("profiling %zu chip type(s) of %s at the shapes of %s, micro-batch %d, %d thread(s) each\n",
              cluster.chips.size(), cluster_file.c_str(), model_label.c_str(), micro_batch, share);
  std::printf("%-10s %6s %12s %12s %14s %10s\n", "chip", "speed", "block ms", "head ms", "achieved GF/s", "optim GB/s");
  std::vector<ChipMeasurement> chips;
  for (const ChipType& t : cluster.chips) {
    chips.push_back(measure_chip(cluster, t.name, shape, micro_batch));
    const ChipMeasurement& m = chips.back();
    std::printf("%-10s %6.2f %12.2f %12.2f %14.2f %10.2f\n", m.chip.c_str(), m.speed, m.layer_s * 1e3, m.head_s * 1e3,
                m.flops_per_second / 1e9, m.optimizer_gbps);
  }
  const std::string link_file = out + ".link.json";
  LaunchOptions options;
  options.ranks = std::max(2, devices);
  const LaunchResult r =
      launch({std::filesystem::read_symlink("/proc/self/exe").string(), "profile", "--link-rank", "--out", link_file},
             options);
  if (r.exit_code != 0) throw Error(ErrorCode::kInternal, cat("link measurement failed: ", r.message));
  const nlohmann::json lj = nlohmann::json::parse(read_file(link_file));
  std::filesystem::remove(link_file);
  const LinkMeasurement link{lj["bandwidth_gbps"].get<double>(), lj["latency_us"].get<double>()};
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
    bool link_rank = false;
  };
  auto o = std::make_shared<ProfileCmd>();
  pr->add_option("--cluster", o->cluster, "the cluster file to measure")->capture_default_str();
  pr->add_option("--model", o->model, "the model whose shapes are measured")->capture_default_str();
  pr->add_option("--micro-batch", o->micro_batch, "sequences per micro-batch")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  pr->add_option("--out", o->out, "write the profiled cluster here (YAML, for h2 plan / h2 train --cluster)")
      ->required();
  pr->add_flag("--link-rank", o->link_rank, "internal: one rank of the link measurement")->group("");
  pr->callback([o, &selected] {
    selected = [o] {
      if (o->link_rank) {  // one of the two ranks; rank 0 writes the result to --out
        auto job = join_job(job_env());
        const LinkMeasurement link = measure_link(*job->world);
        if (job->world->rank() == 0) {
          write_file_atomic(
              o->out, nlohmann::json{{"bandwidth_gbps", link.bandwidth_gbps}, {"latency_us", link.latency_us}}.dump());
        }
        job->world->barrier();
        return 0;
      }
      profile_to_file(o->cluster, load_model(ConfigNode::load_file(o->model)), o->model, o->micro_batch, o->out);
      std::printf("wrote %s\n", o->out.c_str());
      return 0;
    };
  });
}

}  // namespace h2::cli

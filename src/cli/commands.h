// The `h2` command's subcommands. Each registers itself on the app and returns a function that runs it;
// main.cc turns an h2::Error from that function into a message and a non-zero exit status.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "planner/plan.h"

namespace h2::cli {

using Command = std::function<int()>;

// A number above 0; its error says so with the value given (CLI11's PositiveNumber prints the range of a double).
inline const CLI::Validator kPositive(
    [](std::string& text) {
      try {
        size_t used = 0;
        if (std::stod(text, &used) > 0 && used == text.size()) return std::string();
      } catch (const std::exception&) {
      }
      return "must be a number above 0, got '" + text + "'";
    },
    "POSITIVE");

// `h2 check ops`: the conformance matrix; `h2 devices`: the backends and chip profiles.
void register_check(CLI::App& app, Command& selected);
void register_devices(CLI::App& app, Command& selected);
// `h2 align`: where two devices' numerics part (model/align.h).
void register_align(CLI::App& app, Command& selected);
// `h2 data prepare`, `h2 train`, `h2 sample`.
void register_train(CLI::App& app, Command& selected);
// `h2 plan`, `h2 simulate`, `h2 calibrate`.
void register_plan(CLI::App& app, Command& selected);
// `h2 train --cluster`: the driver or one rank (pipeline/cluster_job.h); hetero_train_cmd.cc.
struct HeteroTrainCmd {
  std::string config, cluster, model, train, plan;
  std::vector<std::string> overrides;
  bool quiet = false;
  bool resume = false;
  bool profile = false;  // measure the cluster first and plan with the measured figures
  bool as_rank = false;  // internal: this process is one rank of the job the driver launched
  bool elastic = false;  // re-plan on the devices left when a rank dies, and go on
};
int run_hetero_train(const HeteroTrainCmd& cmd);
// `h2 launch`.
void register_launch(CLI::App& app, Command& selected);
// `h2 profile`; profile_rank_command is the argv of one measuring rank (also for h2 train --profile).
void register_profile(CLI::App& app, Command& selected);
std::vector<std::string> profile_rank_command(const std::string& cluster_file, const std::string& model_file,
                                              int micro_batch, int max_rows, Precision precision,
                                              const std::string& raw_out);
// `h2 bench comm`.
void register_bench(CLI::App& app, Command& selected);

}  // namespace h2::cli

// `h2 profile --cluster C --model M --out F`: measures each chip type and the link on this host
// (pipeline/profile.h) and writes the cluster file with the measured figures. The measuring ranks are processes
// of this same command (`--rank`, started with h2 launch's machinery), one per device of the cluster.
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "core/config.h"
#include "pipeline/profile.h"

namespace h2::cli {

std::vector<std::string> profile_rank_command(const std::string& cluster_file, const std::string& model_file,
                                              int micro_batch, int max_rows, Precision precision,
                                              const std::string& raw_out) {
  return {std::filesystem::read_symlink("/proc/self/exe").string(),
          "profile",
          "--rank",
          "--cluster",
          cluster_file,
          "--model",
          model_file,
          "--micro-batch",
          std::to_string(micro_batch),
          "--max-rows",
          std::to_string(max_rows),
          "--precision",
          precision_name(precision),
          "--out",
          raw_out};
}

void register_profile(CLI::App& app, Command& selected) {
  CLI::App* pr = app.add_subcommand("profile", "Measure this cluster's chips and links; write a profiled cluster file");
  struct ProfileCmd {
    std::string cluster = "examples/cluster_local.yaml", model = "examples/model_small.yaml", out;
    int micro_batch = 1, max_rows = 0;
    std::string precision = "f32";
    bool rank = false;
  };
  auto o = std::make_shared<ProfileCmd>();
  pr->add_option("--cluster", o->cluster, "the cluster file to measure")->capture_default_str();
  pr->add_option("--model", o->model, "the model whose shapes are measured")->capture_default_str();
  pr->add_option("--micro-batch", o->micro_batch, "sequences per micro-batch")->capture_default_str()->check(kPositive);
  pr->add_option("--max-rows", o->max_rows,
                 "the most sequences a replica may run at once in training (the global batch): an emulated chip "
                 "also learns its kernels' work at 2, 4, ... times the micro-batch up to them, to pace them as "
                 "profiled (0: the micro-batch only)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  pr->add_option("--precision", o->precision, "the precision training will run in (bf16 or f32)")
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "f32"}));
  pr->add_option("--out", o->out, "write the profiled cluster here (YAML, for h2 plan / h2 train --cluster)")
      ->required();
  pr->add_flag("--rank", o->rank, "internal: one rank of the measurement")->group("");
  pr->callback([o, &selected] {
    selected = [o] {
      const TransformerShape shape = load_model(ConfigNode::load_file(o->model));
      const Precision precision = *parse_precision(o->precision);  // checked by the option
      if (o->rank) {  // one of the measuring ranks; rank 0 writes what they found to --out
        profile_rank(o->cluster, shape, o->micro_batch, o->max_rows, precision, o->out);
        return 0;
      }
      const int stopped = profile_cluster(ProfileJob{o->cluster, shape, o->model, o->micro_batch, o->max_rows,
                                                     precision, o->out, profile_rank_command});
      if (stopped != 0) return stopped;
      std::printf("wrote %s\n", o->out.c_str());
      return 0;
    };
  });
}

}  // namespace h2::cli

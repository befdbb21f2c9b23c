// `h2 train --cluster C [--model M] [--train T] [--plan P]`: the driver (pipeline/cluster_job.h) with the command
// line of one rank of the job (`h2 train ... --as-rank`), or, with --as-rank or under mpirun / srun, one rank.
#include <filesystem>

#include "cli/commands.h"
#include "comm/job.h"
#include "pipeline/cluster_job.h"

namespace h2::cli {
namespace {

ClusterJobFiles files_of(const HeteroTrainCmd& cmd) {
  return ClusterJobFiles{cmd.config, cmd.cluster, cmd.model, cmd.train, cmd.plan, cmd.overrides};
}

std::vector<std::string> rank_command(const HeteroTrainCmd& cmd, const std::string& plan_path,
                                      const std::string& cluster_path, bool resume) {
  std::vector<std::string> out = {std::filesystem::read_symlink("/proc/self/exe").string(),
                                  "train",
                                  "--as-rank",
                                  "--config",
                                  cmd.config,
                                  "--cluster",
                                  cluster_path,
                                  "--plan",
                                  plan_path};
  if (!cmd.model.empty()) out.insert(out.end(), {"--model", cmd.model});
  if (!cmd.train.empty()) out.insert(out.end(), {"--train", cmd.train});
  for (const std::string& o : cmd.overrides) out.insert(out.end(), {"--set", o});
  if (cmd.quiet) out.push_back("--quiet");
  if (resume) out.push_back("--resume");
  return out;
}

}  // namespace

int run_hetero_train(const HeteroTrainCmd& cmd) {
  // Started by mpirun or srun (across hosts): this process is one rank of a plan every rank loads from one file.
  const std::string source = job_env().source;
  const bool external = !cmd.as_rank && (source == "mpirun" || source == "srun");
  if (cmd.as_rank || external) return run_cluster_rank(files_of(cmd), cmd.resume, cmd.quiet, external);
  return drive_cluster_job(
      files_of(cmd), cmd.resume,
      DriverOptions{.profile = cmd.profile,
                    .quiet = cmd.quiet,
                    .elastic = cmd.elastic,
                    .rank_command = [&](const std::string& plan, const std::string& cluster,
                                        bool resume) { return rank_command(cmd, plan, cluster, resume); },
                    .profile_rank_command = profile_rank_command});
}

}  // namespace h2::cli

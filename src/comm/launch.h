// Local job launcher (`h2 launch -n N -- CMD ...`): starts N copies of a command as the ranks of one job, with
// the rendezvous variables set (H2_RANK, H2_WORLD_SIZE, H2_MASTER_ADDR, H2_MASTER_PORT, H2_JOB_TOKEN, as
// torchrun does), forwards SIGINT and SIGTERM to them (each rank starts with both at their default, whatever this
// process ignores: started in the background of a script, ranks ignored the Ctrl-C they were passed until the grace
// period ended in SIGKILL), and when any rank fails, ends the others and reports which rank failed and how. Across
// hosts, use the cluster's launcher (mpirun, srun) instead; the ranks read its variables (comm/store.h, job_env()).
#pragma once

#include <string>
#include <vector>

namespace h2 {

struct LaunchOptions {
  int ranks = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;       // 0: a free port
  double grace_seconds = 5;  // after a failure, how long the others get to exit before SIGKILL
};

struct LaunchResult {
  // 0 when every rank succeeded; else the first failed rank's code (128 + signal), or 128 + the signal that stopped
  // the job (stopped_by).
  int exit_code = 0;
  int failed_rank = -1;  // the first rank that failed; -1 when none did before the job was stopped
  // SIGINT or SIGTERM that the launcher received and passed on to every rank (a user's Ctrl-C): the ranks' ends
  // after it are no failures (h2 train --elastic does not re-plan on them); 0 when none came.
  int stopped_by = 0;
  std::string message;  // e.g. "rank 1 exited with status 3; stopped the other 2 ranks"
};

// Throws Error(kInvalidArgument) for an empty command or a rank count below 1.
LaunchResult launch(const std::vector<std::string>& command, const LaunchOptions& options);

}  // namespace h2

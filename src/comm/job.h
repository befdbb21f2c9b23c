// Joining a job (docs/architecture.md, "comm"): from the launcher's environment (job_env()), rank 0 starts the
// rendezvous store, every rank connects to it, brings up the UCX transport and gets the world communicator.
// A job of one rank needs no store: it gets an in-process transport. H2_COMM_TIMEOUT_MS overrides the
// communication timeout (every blocking wait; default 30 s), H2_COMM_WINDOW_BYTES the size of each rank's
// shared window (default 2 MiB; 0: none, all-reduces within a host go by messages).
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/store.h"

namespace h2 {

struct Job {
  // Rank 0 keeps the store up until the other ranks have left or died (at most the communication timeout).
  ~Job();
  JobEnv env;
  std::unique_ptr<StoreServer> server;  // rank 0 only
  std::shared_ptr<StoreClient> store;   // null in a job of one rank
  std::unique_ptr<Communicator> world;
  std::string host;  // this rank's host id: H2_HOST_ID, else the hostname
};

// Throws CommError naming the store's address when rank 0 cannot be reached within options.timeout.
std::unique_ptr<Job> join_job(const JobEnv& env, CommOptions options = {});

}  // namespace h2

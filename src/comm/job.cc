// join_job: store, transport, world communicator.
#include "comm/job.h"

#include <unistd.h>

#include <cstdlib>

#include "comm/transport/inproc/transport.h"
#include "comm/transport/ucx/transport.h"

namespace h2 {

Job::~Job() {
  const std::chrono::milliseconds timeout = world ? world->options().timeout : std::chrono::milliseconds(0);
  world.reset();
  store.reset();
  if (server) server->wait_for_clients_to_leave(timeout);
}

std::unique_ptr<Job> join_job(const JobEnv& env, CommOptions options) {
  if (const char* t = std::getenv("H2_COMM_TIMEOUT_MS")) {
    char* end = nullptr;
    const long ms = std::strtol(t, &end, 10);
    if (end == t || *end != '\0' || ms <= 0) {
      throw Error(ErrorCode::kConfig,
                  cat("environment variable H2_COMM_TIMEOUT_MS='", t, "' is not a positive integer"));
    }
    options.timeout = std::chrono::milliseconds(ms);
  }
  auto job = std::make_unique<Job>();
  job->env = env;
  if (const char* id = std::getenv("H2_HOST_ID")) {
    job->host = id;
  } else {
    char name[256] = {};
    ::gethostname(name, sizeof(name) - 1);
    job->host = name;
  }
  if (env.world_size == 1) {
    job->world = std::make_unique<Communicator>(make_inproc_transports(1)[0], options);
    return job;
  }
  if (env.rank == 0) job->server = std::make_unique<StoreServer>(env.master_addr, env.master_port, env.token);
  job->store = std::make_shared<StoreClient>(env.master_addr, env.master_port, env.token, options.timeout);
  job->world = std::make_unique<Communicator>(make_ucx_transport(env.rank, env.world_size, job->store), options);
  return job;
}

}  // namespace h2

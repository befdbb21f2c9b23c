// join_job: store, transport, world communicator.
#include "comm/job.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <optional>

#include "comm/transport/inproc/transport.h"
#include "comm/transport/ucx/transport.h"

namespace h2 {

Job::~Job() {
  const std::chrono::milliseconds timeout = world ? world->options().timeout : std::chrono::milliseconds(0);
  world.reset();
  store.reset();
  if (server) server->wait_for_clients_to_leave(timeout);
}

namespace {

// The integer in environment variable `name`, if set; in [least, most], or a kConfig error naming it (no wrap).
std::optional<long long> integer_env(const char* name, long long least, long long most) {
  const char* text = std::getenv(name);
  if (text == nullptr) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || errno == ERANGE || value < least || value > most) {
    throw Error(ErrorCode::kConfig,
                cat("environment variable ", name, "='", text, "' is not an integer in [", least, ", ", most, "]"));
  }
  return value;
}

}  // namespace

std::unique_ptr<Job> join_job(const JobEnv& env, CommOptions options) {
  // Started by h2 launch: stop (SIGTERM: checkpoint and exit) when the launcher dies, even by SIGKILL, instead of
  // training on unsupervised.
  if (const auto launcher = integer_env("H2_LAUNCHER_PID", 1, 1 << 30)) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != static_cast<pid_t>(*launcher)) {
      throw CommError(cat("the launcher (pid ", *launcher, ") has already exited; not starting rank ", env.rank));
    }
  }
  if (const auto ms = integer_env("H2_COMM_TIMEOUT_MS", 1, 86400000)) options.timeout = std::chrono::milliseconds(*ms);
  UcxOptions ucx;
  if (const auto bytes = integer_env("H2_COMM_WINDOW_BYTES", 0, int64_t{1} << 30))
    ucx.window_bytes = static_cast<size_t>(*bytes);
  ucx.loopback_only = env.master_addr == "localhost" || env.master_addr.starts_with("127.");
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
  job->world = std::make_unique<Communicator>(make_ucx_transport(env.rank, env.world_size, job->store, ucx), options);
  return job;
}

}  // namespace h2

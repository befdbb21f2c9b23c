// The local launcher: fork/exec the ranks, watch them, stop them together.
#include "comm/launch.h"

#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <thread>

#include "core/error.h"

extern char** environ;

namespace h2 {
namespace {

std::atomic<int> g_forward_signal{0};
extern "C" void remember_signal(int sig) { g_forward_signal = sig; }

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return 29500;
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

// 128 random bits as hex: the job token every rank must present to the rendezvous store.
std::string random_token() {
  unsigned char bytes[16] = {};
  if (::getrandom(bytes, sizeof(bytes), 0) != static_cast<ssize_t>(sizeof(bytes))) {
    throw Error(ErrorCode::kIo, cat("launch: cannot read 16 random bytes for the job token: ", std::strerror(errno)));
  }
  std::string hex;
  char buf[3];
  for (unsigned char b : bytes) {
    std::snprintf(buf, sizeof(buf), "%02x", b);
    hex += buf;
  }
  return hex;
}

std::string describe(int status) {
  if (WIFEXITED(status)) return cat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return cat("was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  return "ended";
}

int code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

LaunchResult launch(const std::vector<std::string>& command, const LaunchOptions& options) {
  if (command.empty()) throw Error(ErrorCode::kInvalidArgument, "launch: no command given (h2 launch -n N -- CMD ...)");
  if (options.ranks < 1) throw Error(ErrorCode::kInvalidArgument, cat("launch: -n must be >= 1, got ", options.ranks));
  const int port = options.master_port > 0 ? options.master_port : free_port();
  const std::string token = random_token();
  // Each rank's environment is prepared here and handed to posix_spawnp (nothing runs between fork and exec in a
  // threaded parent); H2_LAUNCHER_PID lets a rank ask to be stopped when the launcher dies (comm/job.cc).
  std::vector<std::string> inherited;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view v(*e);
    bool ours = false;
    for (const char* name :
         {"H2_RANK=", "H2_WORLD_SIZE=", "H2_MASTER_ADDR=", "H2_MASTER_PORT=", "H2_JOB_TOKEN=", "H2_LAUNCHER_PID="}) {
      ours = ours || v.starts_with(name);
    }
    if (!ours) inherited.emplace_back(v);
  }
  std::vector<char*> argv;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // The ranks take SIGINT and SIGTERM at their default (or install their own handlers), not as ignored here.
  posix_spawnattr_t attributes;
  ::posix_spawnattr_init(&attributes);
  sigset_t defaults;
  ::sigemptyset(&defaults);
  ::sigaddset(&defaults, SIGINT);
  ::sigaddset(&defaults, SIGTERM);
  ::posix_spawnattr_setsigdefault(&attributes, &defaults);
  ::posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGDEF);
  std::vector<pid_t> pids;
  for (int r = 0; r < options.ranks; ++r) {
    std::vector<std::string> env = inherited;
    env.push_back(cat("H2_RANK=", r));
    env.push_back(cat("H2_WORLD_SIZE=", options.ranks));
    env.push_back(cat("H2_MASTER_ADDR=", options.master_addr));
    env.push_back(cat("H2_MASTER_PORT=", port));
    env.push_back(cat("H2_JOB_TOKEN=", token));
    env.push_back(cat("H2_LAUNCHER_PID=", ::getpid()));
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_t pid = -1;
    const int rc = ::posix_spawnp(&pid, argv[0], nullptr, &attributes, argv.data(), envp.data());
    if (rc != 0) {
      ::posix_spawnattr_destroy(&attributes);
      for (pid_t p : pids) ::kill(p, SIGTERM);
      throw Error(ErrorCode::kIo,
                  cat("launch: cannot start rank ", r, " (", command.front(), "): ", std::strerror(rc)));
    }
    pids.push_back(pid);
  }
  ::posix_spawnattr_destroy(&attributes);
  struct sigaction sa {
  }, old_int{}, old_term{};
  sa.sa_handler = remember_signal;
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);

  LaunchResult result;
  int alive = options.ranks;
  std::chrono::steady_clock::time_point kill_at{};
  bool stopping = false;
  const auto grace = std::chrono::milliseconds(static_cast<int64_t>(options.grace_seconds * 1000));
  auto begin_stopping = [&] {
    if (stopping) return;
    stopping = true;
    kill_at = std::chrono::steady_clock::now() + grace;
  };
  auto stop_all = [&](int sig) {
    for (pid_t p : pids) {
      if (p > 0) ::kill(p, sig);
    }
  };
  while (alive > 0) {
    if (const int sig = g_forward_signal.exchange(0); sig != 0) {
      stop_all(sig);  // the user's Ctrl-C reaches every rank (each checkpoints and exits)
      begin_stopping();
      if (result.failed_rank < 0 && result.stopped_by == 0) {
        result.stopped_by = sig;
        result.exit_code = 128 + sig;
        result.message = cat("stopped by signal ", sig, " (", strsignal(sig), "), passed on to every rank");
        std::fprintf(stderr, "h2 launch: %s\n", result.message.c_str());
      }
    }
    int status = 0;
    const pid_t done = ::waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      for (int r = 0; r < options.ranks; ++r) {
        if (pids[static_cast<size_t>(r)] != done) continue;
        pids[static_cast<size_t>(r)] = -1;
        --alive;
        if (code_of(status) != 0 && result.failed_rank < 0 && result.stopped_by == 0) {
          result.failed_rank = r;
          result.exit_code = code_of(status);
          result.message = cat("rank ", r, " ", describe(status), "; stopping the other ", alive, " rank(s)");
          std::fprintf(stderr, "h2 launch: %s\n", result.message.c_str());
          stop_all(SIGTERM);
          begin_stopping();
        }
      }
      continue;
    }
    if (stopping && std::chrono::steady_clock::now() > kill_at) stop_all(SIGKILL);  // the grace period is over
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  return result;
}

}  // namespace h2

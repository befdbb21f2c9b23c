// One rank of a multi-process DiComm test (tests/comm/process_test.cc and tests/comm/two_hosts.sh start it):
// joins the job from the environment (H2_RANK, ... as h2 launch sets them) and runs one scenario.
//   comm_worker collectives  every collective and reduction (collective_checks.h), counts 0, 1, odd, 1 MiB,
//                            4 MiB + 12 B, against closed forms; then tagged
//                            p2p; prints "ok" and the algorithm of the large all-reduce. With H2_HOST_ID set,
//                            hierarchical.
//   comm_worker busy         a large message reaches its receiver while the sender only calls progress (busy()).
//   comm_worker kill         all-reduces in a loop; rank 1 kills itself in the third. The others must fail with
//                            an error naming rank 1: exit 3 when they do, 4 when the error names no rank 1.
// Exit 1 on a wrong value, with the first mismatch on stderr.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "comm/collective_checks.h"
#include "comm/job.h"
#include "core/clock.h"

namespace {

using h2::DType;
using h2::ReduceOp;

float value(int rank, size_t i) { return static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1)); }

#define EXPECT_VALUE(got, want, what)                                                                    \
  do {                                                                                                   \
    if ((got) != (want)) {                                                                               \
      std::fprintf(stderr, "rank %d: %s: got %g, want %g\n", c.rank(), what, double(got), double(want)); \
      return 1;                                                                                          \
    }                                                                                                    \
  } while (0)

int collectives(h2::Job& job) {
  h2::Communicator& c = *job.world;
  if (std::getenv("H2_HOST_ID") != nullptr) c.set_hosts(job.host);
  const int n = c.size();
  const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
  std::string large_algorithm;
  // Every reduction of all_reduce and reduce_scatter (collective_checks.h), then the data-moving collectives.
  const std::vector<size_t> counts = {0, 1, 1001, size_t{1} << 18, (size_t{1} << 20) + 3};
  if (const std::string e = h2::testing_util::check_every_reduction(c, counts); !e.empty()) {
    std::fprintf(stderr, "%s\n", e.c_str());
    return 1;
  }
  for (size_t count : counts) {
    std::vector<float> sum(count);
    for (size_t i = 0; i < count; ++i) sum[i] = value(c.rank(), i);
    c.all_reduce(sum.data(), count, DType::kF32, ReduceOp::kSum);
    if (count > 1001) large_algorithm = c.last_algorithm();
    for (size_t i = 0; i < count; ++i) EXPECT_VALUE(sum[i], ranks_sum * static_cast<float>(i % 7 + 1), "all_reduce");
    std::vector<float> all(count * static_cast<size_t>(n));
    std::vector<float> mine(count);
    for (size_t i = 0; i < count; ++i) mine[i] = value(c.rank(), i);
    c.all_gather(all.data(), mine.data(), count, DType::kF32);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i)
        EXPECT_VALUE(all[static_cast<size_t>(r) * count + i], value(r, i), "all_gather");
    }
    std::vector<float> b(count, c.rank() == n - 1 ? 3.0f : -1.0f);
    c.broadcast(b.data(), count, DType::kF32, n - 1);
    for (float x : b) EXPECT_VALUE(x, 3.0f, "broadcast");
  }
  // Tagged point-to-point around the ring, two tags posted in reverse order: matching is by tag.
  float out_a = static_cast<float>(c.rank()), out_b = static_cast<float>(100 + c.rank()), in_a = -1, in_b = -1;
  const int right = (c.rank() + 1) % n, left = (c.rank() + n - 1) % n;
  auto rb = c.irecv(&in_b, 4, left, 2);
  auto ra = c.irecv(&in_a, 4, left, 1);
  auto sa = c.isend(&out_a, 4, right, 1);
  auto sb = c.isend(&out_b, 4, right, 2);
  for (auto* r : {&ra, &rb, &sa, &sb}) (*r)->wait(c.options().timeout);
  EXPECT_VALUE(in_a, static_cast<float>(left), "p2p tag 1");
  EXPECT_VALUE(in_b, static_cast<float>(100 + left), "p2p tag 2");
  c.barrier();
  std::printf("ok rank %d of %d, large all-reduce: %s\n", c.rank(), n, large_algorithm.c_str());
  return 0;
}

int kill(h2::Job& job) {
  h2::Communicator& c = *job.world;
  std::vector<float> v(1 << 18, 1.0f);
  try {
    for (int i = 0; i < 1000; ++i) {
      if (i == 3 && c.rank() == 1) std::raise(SIGKILL);
      c.all_reduce(v.data(), v.size(), DType::kF32, ReduceOp::kSum);
    }
  } catch (const h2::CommError& e) {
    std::fprintf(stderr, "rank %d: %s\n", c.rank(), e.what());
    return std::string(e.what()).find("rank 1 died") != std::string::npos ? 3 : 4;
  }
  return 0;
}

// Prints "listen <address>" for every TCP socket this process listens on (from /proc), after one all-reduce.
int listening(h2::Job& job) {
  float x = 1.0f;
  job.world->all_reduce(&x, 1, h2::DType::kF32, h2::ReduceOp::kSum);
  std::set<std::string> mine;  // socket inodes of this process
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (target.starts_with("socket:[")) mine.insert(target.substr(8, target.size() - 9));
  }
  for (const char* table : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      f >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
      if (state == "0A" && mine.count(inode)) std::printf("listen %s\n", local.c_str());
    }
  }
  job.world->barrier();
  return 0;
}

// Two ranks: rank 0 sends 1 MiB (UCX's rendezvous) to rank 1, then is busy for 500 ms, calling only
// Communicator::progress every millisecond (what a device's pacing does between its sleeps); then it tells rank 1
// when it stopped. Rank 1 notes when the message arrived (the host's monotonic clock, the same in both processes):
// before rank 0 stopped, or exit 5.
int busy(h2::Job& job) {
  h2::Communicator& c = *job.world;
  const auto now = h2::monotonic_seconds;
  std::vector<char> data(size_t{1} << 20, 1);
  double stopped = 0;
  if (c.rank() == 0) {
    c.barrier();
    std::unique_ptr<h2::Request> s = c.isend(data.data(), data.size(), 1, 5);
    for (const double end = now() + 0.5; now() < end;) {
      c.progress();
      ::usleep(1000);
    }
    stopped = now();
    c.wait_request(*s, "busy: the large send", 1);
    std::unique_ptr<h2::Request> t = c.isend(&stopped, sizeof stopped, 1, 6);
    c.wait_request(*t, "busy: when it stopped", 1);
    return 0;
  }
  std::unique_ptr<h2::Request> r = c.irecv(data.data(), data.size(), 0, 5);
  c.barrier();
  c.wait_request(*r, "busy: the large message", 0);
  const double arrived = now();
  std::unique_ptr<h2::Request> t = c.irecv(&stopped, sizeof stopped, 0, 6);
  c.wait_request(*t, "busy: when rank 0 stopped", 0);
  std::printf("arrived %.1f ms before the sender stopped\n", 1e3 * (stopped - arrived));
  return arrived < stopped ? 0 : 5;
}

// Writes <dir>/ready_<rank> holding this process's id, then idles for at most a minute.
int idle(h2::Job& job, const std::string& dir) {
  std::ofstream(dir + "/ready_" + std::to_string(job.world->rank())) << ::getpid() << "\n";
  for (int i = 0; i < 600; ++i) ::usleep(100000);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    auto job = h2::join_job(h2::job_env());
    if (mode == "collectives") return collectives(*job);
    if (mode == "kill") return kill(*job);
    if (mode == "listening") return listening(*job);
    if (mode == "busy") return busy(*job);
    if (mode == "idle" && argc > 2) return idle(*job, argv[2]);
    std::fprintf(stderr, "usage: comm_worker collectives|kill|listening|busy|idle DIR\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_worker: %s\n", e.what());
    return 1;
  }
}

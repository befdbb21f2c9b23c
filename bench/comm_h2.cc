// DiComm's side of `h2 bench comm`: one rank (started by h2 launch); rank 0 appends CSV lines to argv[1].
#include <cstdio>
#include <exception>

#include "comm/job.h"
#include "comm_loop.h"

namespace {

struct H2Ops {
  h2::Communicator& c;
  int rank() const { return c.rank(); }
  int size() const { return c.size(); }
  void barrier() { c.barrier(); }
  double max(double x) {
    float v = static_cast<float>(x);
    c.all_reduce(&v, 1, h2::DType::kF32, h2::ReduceOp::kMax);
    return v;
  }
  void run(const std::string& op, float* a, float* b, size_t count) {
    if (op == "all_reduce") {
      c.all_reduce(a, count, h2::DType::kF32, h2::ReduceOp::kSum);
    } else if (op == "all_gather") {
      c.all_gather(b, a, count, h2::DType::kF32);
    } else if (op == "reduce_scatter") {
      c.reduce_scatter(b, a, count, h2::DType::kF32, h2::ReduceOp::kSum);
    } else {
      const int n = c.size();
      auto r = c.irecv(b, count * 4, (c.rank() + n - 1) % n, 1);
      auto s = c.isend(a, count * 4, (c.rank() + 1) % n, 1);
      c.wait_request(*r, "send_recv", (c.rank() + n - 1) % n);
      c.wait_request(*s, "send_recv", (c.rank() + 1) % n);
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  try {
    auto job = h2::join_job(h2::job_env());
    if (std::getenv("H2_HOST_ID") != nullptr) job->world->set_hosts(job->host);
    FILE* out = job->world->rank() == 0 && argc > 1 ? std::fopen(argv[1], "a") : nullptr;
    H2Ops ops{*job->world};
    h2::bench::comm_loop(ops, "h2", out);
    if (out != nullptr) std::fclose(out);
    job->world->barrier();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_comm_h2: %s\n", e.what());
    return 1;
  }
}

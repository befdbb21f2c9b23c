// The measurement loop shared by DiComm's and Open MPI's sides of `h2 bench comm`, so both are timed the same way: 500
// small all-reduces to warm up, then for each operation and size, a tenth of `iterations` (at least 2) warm-up calls,
// then `iterations` calls between two barriers; the time is the slowest rank's average. Bandwidths follow nccl-tests
// (doc/PERFORMANCE.md there): algbw = bytes / time; busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather
// and reduce-scatter (bytes = the whole gathered/scattered buffer), x 1 for send/recv (each rank sends `bytes` to the
// next and receives from the previous). Rank 0 writes one CSV line per measurement:
// impl,op,ranks,bytes,seconds,algbw_GBps,busbw_GBps.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace h2::bench {

inline std::vector<size_t> comm_sizes() {
  std::vector<size_t> out;
  for (size_t b = 4 << 10; b <= size_t{64} << 20; b *= 4) out.push_back(b);
  return out;
}

inline int comm_iterations(size_t bytes) {
  return static_cast<int>(std::clamp<size_t>((size_t{512} << 20) / bytes, 5, 200));
}

// Ops: rank(), size(), barrier(), max(double) -> double, and run(op, float* send, float* recv, count_per_rank)
// for op in all_reduce (count = whole buffer), all_gather / reduce_scatter (count = one rank's block),
// send_recv (count = the message).
template <typename Ops>
void comm_loop(Ops& ops, const std::string& impl, FILE* out) {
  const int n = ops.size();
  const double ring = static_cast<double>(n - 1) / n;
  const std::vector<std::pair<std::string, double>> kinds = {
      {"all_reduce", 2 * ring}, {"all_gather", ring}, {"reduce_scatter", ring}, {"send_recv", 1.0}};
  const size_t largest = comm_sizes().back();
  std::vector<float> a(largest / 4 + static_cast<size_t>(n), 1.0f), b(largest / 4 + static_cast<size_t>(n), 0.0f);
  // The first milliseconds of a job are slow for both sides (connections finishing their set-up): warm up first.
  for (int i = 0; i < 500; ++i) ops.run("all_reduce", a.data(), b.data(), 1024);
  for (const auto& [op, factor] : kinds) {
    for (size_t bytes : comm_sizes()) {
      const size_t total = bytes / 4;  // elements of the whole buffer
      const size_t count = op == "all_gather" || op == "reduce_scatter" ? total / static_cast<size_t>(n) : total;
      const int iterations = comm_iterations(bytes);
      for (int i = 0; i < std::max(2, iterations / 10); ++i) ops.run(op, a.data(), b.data(), count);
      ops.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iterations; ++i) ops.run(op, a.data(), b.data(), count);
      const double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iterations;
      const double seconds = ops.max(mine);
      const double algbw = static_cast<double>(bytes) / seconds / 1e9;
      if (ops.rank() == 0 && out != nullptr) {
        std::fprintf(out, "%s,%s,%d,%zu,%.9f,%.4f,%.4f\n", impl.c_str(), op.c_str(), n, bytes, seconds, algbw,
                     algbw * factor);
        std::fflush(out);
      }
    }
  }
}

}  // namespace h2::bench

// The DiComm-vs-Open MPI benchmark driver (see bench.h).
#include "comm/bench.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "comm/launch.h"
#include "core/error.h"
#include "core/file.h"

namespace h2 {
namespace {

namespace fs = std::filesystem;

std::string human_bytes(size_t b) { return b >= (1u << 20) ? cat(b >> 20, " MiB") : cat(b >> 10, " KiB"); }

}  // namespace

std::map<std::string, std::map<CommBenchKey, CommBenchRow>> best_comm_rows(const std::string& csv_text) {
  std::map<std::string, std::map<CommBenchKey, CommBenchRow>> out;  // impl -> rows
  std::istringstream in(csv_text);
  std::string line;
  while (std::getline(in, line)) {
    std::stringstream ss(line);
    std::string field;
    std::vector<std::string> f;
    while (std::getline(ss, field, ',')) f.push_back(field);
    if (f.size() != 7) continue;
    const CommBenchRow row{std::stod(f[4]), std::stod(f[5]), std::stod(f[6])};
    auto [it, fresh] = out[f[0]].try_emplace({f[1], std::stoi(f[2]), std::stoull(f[3])}, row);
    if (!fresh && row.seconds < it->second.seconds) it->second = row;  // the best of the repeats
  }
  return out;
}

std::string comm_bench_table(const std::map<std::string, std::map<CommBenchKey, CommBenchRow>>& rows) {
  std::ostringstream table;
  table << "| op | ranks | size | DiComm time (us) | DiComm algbw (GB/s) | DiComm busbw (GB/s) | Open MPI time (us) "
           "| Open MPI busbw (GB/s) | busbw DiComm / Open MPI |\n|---|---|---|---|---|---|---|---|---|\n";
  const auto h2 = rows.find("h2"), mpi = rows.find("openmpi");
  if (h2 == rows.end()) return table.str();
  for (const auto& [key, h] : h2->second) {
    const auto& [op, n, bytes] = key;
    table << "| " << op << " | " << n << " | " << human_bytes(bytes) << " | " << cat(h.seconds * 1e6) << " | "
          << h.algbw << " | " << h.busbw << " | ";
    const CommBenchRow* m = nullptr;
    if (mpi != rows.end()) {
      const auto it = mpi->second.find(key);
      if (it != mpi->second.end()) m = &it->second;
    }
    if (m == nullptr) {
      table << "n/a | n/a | n/a |\n";
    } else {
      table << m->seconds * 1e6 << " | " << m->busbw << " | " << h.busbw / m->busbw << " |\n";
    }
  }
  return table.str();
}

std::string bench_comm(const CommBenchOptions& o) {
  const fs::path h2_rank = fs::path(o.bench_dir) / "bench_comm_h2", mpi_rank = fs::path(o.bench_dir) / "bench_comm_mpi";
  if (!fs::exists(h2_rank)) {
    throw Error(ErrorCode::kNotFound, cat(h2_rank.string(), " is missing: build the bench_comm_h2 target"));
  }
  const bool with_mpi = fs::exists(mpi_rank);
  if (!with_mpi) {
    std::fprintf(stderr,
                 "note: %s is not built (Open MPI was not found when cmake ran); install openmpi-bin "
                 "libopenmpi-dev and re-run cmake (bench/run_comm.sh does both) for the comparison\n",
                 mpi_rank.c_str());
  }
  const fs::path csv = fs::temp_directory_path() / cat("h2_bench_comm_", ::getpid(), ".csv");
  for (int repeat = 0; repeat < o.repeats; ++repeat) {
    for (int n : o.ranks) {
      std::fprintf(stderr, "h2 bench comm: DiComm over UCX, %d ranks (run %d of %d)...\n", n, repeat + 1, o.repeats);
      LaunchOptions options;
      options.ranks = n;
      const LaunchResult r = launch({h2_rank.string(), csv.string()}, options);
      if (r.exit_code != 0) throw Error(ErrorCode::kInternal, cat("DiComm benchmark failed: ", r.message));
      if (with_mpi) {
        std::fprintf(stderr, "h2 bench comm: Open MPI, %d ranks...\n", n);
        const std::string cmd = cat("mpirun ", ::geteuid() == 0 ? "--allow-run-as-root " : "", "--oversubscribe -n ", n,
                                    " '", mpi_rank.string(), "' '", csv.string(), "'");
        if (std::system(cmd.c_str()) != 0) throw Error(ErrorCode::kInternal, cat("Open MPI benchmark failed: ", cmd));
      }
    }
  }
  const std::string text = read_file(csv.string());
  fs::remove(csv);
  return comm_bench_table(best_comm_rows(text));
}

}  // namespace h2

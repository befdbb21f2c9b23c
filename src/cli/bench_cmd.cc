// `h2 bench comm`: DiComm's collectives against Open MPI's, in the same run, on 2 and 4 local ranks.
// The ranks are build/bench/bench_comm_h2 (started with h2 launch) and build/bench/bench_comm_mpi (started with
// mpirun, when Open MPI was found at build time); both time the same loop (bench/comm_loop.h) and append CSV.
// The table keeps each size's best time over --repeats runs, for both sides alike.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "cli/commands.h"
#include "comm/launch.h"
#include "core/error.h"
#include "core/file.h"

namespace h2::cli {
namespace {

namespace fs = std::filesystem;

struct Row {
  double seconds = 0, algbw = 0, busbw = 0;
};
using Key = std::tuple<std::string, int, size_t>;  // op, ranks, bytes

std::map<std::string, std::map<Key, Row>> read_csv(const fs::path& path) {
  std::map<std::string, std::map<Key, Row>> out;  // impl -> rows
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::stringstream ss(line);
    std::string impl, op, field;
    std::vector<std::string> f;
    while (std::getline(ss, field, ',')) f.push_back(field);
    if (f.size() != 7) continue;
    const Row row{std::stod(f[4]), std::stod(f[5]), std::stod(f[6])};
    auto [it, fresh] = out[f[0]].try_emplace({f[1], std::stoi(f[2]), std::stoull(f[3])}, row);
    if (!fresh && row.seconds < it->second.seconds) it->second = row;  // the best of the repeats
  }
  return out;
}

std::string human_bytes(size_t b) { return b >= (1u << 20) ? cat(b >> 20, " MiB") : cat(b >> 10, " KiB"); }

int bench_comm(const std::vector<int>& ranks, int repeats, const std::string& markdown) {
  const fs::path bench_dir = fs::read_symlink("/proc/self/exe").parent_path() / "bench";
  const fs::path h2_rank = bench_dir / "bench_comm_h2", mpi_rank = bench_dir / "bench_comm_mpi";
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
  // Repeats alternate the two implementations, so a noisy stretch of this shared machine hits both alike.
  for (int repeat = 0; repeat < repeats; ++repeat) {
    for (int n : ranks) {
      std::fprintf(stderr, "h2 bench comm: DiComm over UCX, %d ranks (run %d of %d)...\n", n, repeat + 1, repeats);
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
  auto rows = read_csv(csv);
  fs::remove(csv);
  std::ostringstream table;
  table << "| op | ranks | size | DiComm time (us) | DiComm algbw (GB/s) | DiComm busbw (GB/s) | Open MPI time (us) "
           "| Open MPI busbw (GB/s) | busbw DiComm / Open MPI |\n|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& [key, h] : rows["h2"]) {
    const auto& [op, n, bytes] = key;
    table << "| " << op << " | " << n << " | " << human_bytes(bytes) << " | " << cat(h.seconds * 1e6) << " | "
          << h.algbw << " | " << h.busbw << " | ";
    auto m = rows["openmpi"].find(key);
    if (m == rows["openmpi"].end()) {
      table << "n/a | n/a | n/a |\n";
    } else {
      table << m->second.seconds * 1e6 << " | " << m->second.busbw << " | " << h.busbw / m->second.busbw << " |\n";
    }
  }
  std::printf("%s", table.str().c_str());
  if (!markdown.empty()) write_file_atomic(markdown, table.str());
  return 0;
}

}  // namespace

void register_bench(CLI::App& app, Command& selected) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks that need several processes");
  bench->require_subcommand(1);
  CLI::App* comm = bench->add_subcommand("comm", "DiComm collectives vs Open MPI, 4 KiB - 64 MiB, on local ranks");
  auto ranks = std::make_shared<std::vector<int>>(std::vector<int>{2, 4});
  auto markdown = std::make_shared<std::string>();
  auto repeats = std::make_shared<int>(3);
  comm->add_option("--repeats", *repeats, "runs of each side; the table keeps each size's best time")
      ->capture_default_str()
      ->check(CLI::Range(1, 20));
  comm->add_option("-n,--ranks", *ranks, "rank counts to measure")->capture_default_str()->check(CLI::Range(2, 64));
  comm->add_option("--markdown", *markdown, "also write the table to this file");
  comm->callback([ranks, repeats, markdown, &selected] {
    selected = [ranks, repeats, markdown] { return bench_comm(*ranks, *repeats, *markdown); };
  });
}

}  // namespace h2::cli

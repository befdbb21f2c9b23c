// `h2 bench comm`: DiComm's collectives against Open MPI's, in the same run (comm/bench.h).
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "comm/bench.h"
#include "core/file.h"

namespace h2::cli {

void register_bench(CLI::App& app, Command& selected) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks that need several processes");
  bench->require_subcommand(1);
  CLI::App* comm = bench->add_subcommand("comm", "DiComm collectives vs Open MPI, 4 KiB - 64 MiB, on local ranks");
  auto options = std::make_shared<CommBenchOptions>();
  auto markdown = std::make_shared<std::string>();
  comm->add_option("--repeats", options->repeats, "runs of each side; the table keeps each size's best time")
      ->capture_default_str()
      ->check(CLI::Range(1, 20));
  comm->add_option("-n,--ranks", options->ranks, "rank counts to measure")
      ->capture_default_str()
      ->check(CLI::Range(2, 64));
  comm->add_option("--markdown", *markdown, "also write the table to this file");
  comm->callback([options, markdown, &selected] {
    selected = [options, markdown] {
      options->bench_dir = (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "bench").string();
      const std::string table = bench_comm(*options);
      std::printf("%s", table.c_str());
      if (!markdown->empty()) write_file_atomic(*markdown, table);
      return 0;
    };
  });
}

}  // namespace h2::cli

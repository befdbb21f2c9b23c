// The `h2` command: one executable, one subcommand per job. Errors print as "h2: error: ..." with exit 1;
// usage errors print CLI11's message with exit 2 (CLI11's convention for a parse error is 105 — we map to 2).
#include <omp.h>

#include <cstdio>
#include <exception>
#include <new>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"

namespace {

// Prints an error the command threw as "h2: error: ..." and returns the exit status, 1.
int report_error(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const h2::Error& e) {
    std::fprintf(stderr, "h2: error: %s\n", e.what());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "h2: error: out of host memory. Hint: a smaller model, batch, sequence or --chunks, or fewer ranks "
                 "on this host\n");
  } catch (const std::exception& e) {  // a defect: every input error should be an h2::Error naming its cause
    std::fprintf(stderr, "h2: error: %s (unexpected; please report it with the command that caused it)\n", e.what());
  } catch (...) {
    std::fprintf(stderr,
                 "h2: error: an unknown exception (unexpected; please report it with the command that caused it)\n");
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "H2: train large language models on clusters that mix chip types and vendors.\n"
      "Plans the split of a model over a mixed cluster, simulates it, and runs it.",
      "h2"};
  app.set_version_flag("--version", std::string("h2 ") + H2_VERSION);
  app.require_subcommand(1);
  int threads = 0;
  app.add_option("--threads", threads, "CPU threads for kernels (default: all cores, or OMP_NUM_THREADS)")
      ->check(h2::cli::kPositive);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "log debug messages");

  h2::cli::Command selected;
  h2::cli::register_check(app, selected);
  h2::cli::register_devices(app, selected);
  h2::cli::register_align(app, selected);
  h2::cli::register_train(app, selected);
  h2::cli::register_plan(app, selected);
  h2::cli::register_launch(app, selected);
  h2::cli::register_bench(app, selected);
  h2::cli::register_profile(app, selected);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (threads > 0) omp_set_num_threads(threads);
  if (verbose) h2::set_log_level(h2::LogLevel::kDebug);
  try {
    return selected ? selected() : 0;
  } catch (...) {
    std::fflush(stdout);  // what the command printed comes before its error where both go to one pipe
    return report_error(std::current_exception());
  }
}

// SIGINT / SIGTERM to a flag (see signals.h).
#include "core/signals.h"

#include <csignal>

namespace h2 {
namespace {

std::atomic<bool> g_stop{false};
extern "C" void h2_request_stop(int) { g_stop = true; }

}  // namespace

const std::atomic<bool>& stop_on_signals() {
  std::signal(SIGINT, h2_request_stop);
  std::signal(SIGTERM, h2_request_stop);
  return g_stop;
}

void default_signals() {
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
}

}  // namespace h2

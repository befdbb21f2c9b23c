// A graceful stop on SIGINT / SIGTERM: the handler only sets a flag, which a long loop (a training run) checks at
// a safe point — after a step, with a checkpoint — before it returns.
#pragma once

#include <atomic>

namespace h2 {

// Installs the handlers (once per process) and returns the flag they set.
const std::atomic<bool>& stop_on_signals();
// Back to the default action (the process ends at the next signal).
void default_signals();

}  // namespace h2

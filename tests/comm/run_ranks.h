// Ranks as threads over the in-process transport, for tests of anything that talks through a Communicator.
#pragma once

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/transport/inproc/transport.h"

namespace h2::testing_util {

// Runs fn(comm) on `n` ranks as threads, each with a shared window of `window_bytes` (0: none, so all-reduces go
// by messages); returns each rank's error message ("" when it succeeded).
inline std::vector<std::string> run_ranks(int n, const std::function<void(Communicator&)>& fn, CommOptions options = {},
                                          size_t window_bytes = size_t{1} << 20) {
  auto transports = make_inproc_transports(n, window_bytes);
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        Communicator c(transports[static_cast<size_t>(r)], options);
        fn(c);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace h2::testing_util

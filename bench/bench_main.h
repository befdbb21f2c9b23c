// The main() of a benchmark program: runs it and turns an h2::Error into a message and exit status 1.
#pragma once

#include <cstdio>

#include "core/error.h"

namespace h2 {

inline int bench_main(const char* program, int argc, char** argv, int (*run)(int, char**)) {
  try {
    return run(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace h2

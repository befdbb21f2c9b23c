// The abort path of H2_CHECK.
#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace h2 {

namespace detail {
void check_failed(const char* file, int line, const char* condition, const std::string& message) {
  std::fprintf(stderr, "%s:%d: H2_CHECK(%s) failed%s%s\n", file, line, condition, message.empty() ? "" : ": ",
               message.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail

}  // namespace h2

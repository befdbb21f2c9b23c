// Error-code names and the abort path of H2_CHECK.
#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace h2 {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kConfig:
      return "config error";
    case ErrorCode::kNotFound:
      return "not found";
    case ErrorCode::kOutOfMemory:
      return "out of memory";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kIo:
      return "I/O error";
    case ErrorCode::kInternal:
      return "internal error";
  }
  return "error";
}

namespace detail {
void check_failed(const char* file, int line, const char* condition, const std::string& message) {
  std::fprintf(stderr, "%s:%d: H2_CHECK(%s) failed%s%s\n", file, line, condition, message.empty() ? "" : ": ",
               message.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail

}  // namespace h2

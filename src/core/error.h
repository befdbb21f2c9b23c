// Errors in two tiers.
//  - Programmer mistakes: H2_CHECK aborts with file:line and the failed condition.
//  - Runtime failures (bad input, out of memory, a peer that died): h2::Error, an exception that carries a code
//    and a message naming the file, field, rank or device, plus a hint where one helps.
// Library code never calls exit(); the CLI turns an Error into a message and a non-zero exit status.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace h2 {

enum class ErrorCode {
  kInvalidArgument,  // a value the caller passed is wrong (shape, dtype, option)
  kConfig,           // a configuration file is malformed or has a bad field
  kNotFound,         // a named thing (backend, file, chip type) does not exist
  kOutOfMemory,      // a device refused an allocation past its capacity
  kUnsupported,      // no backend implements what was asked
  kIo,               // reading or writing a file failed
  kInternal,         // a failure that is not the caller's fault
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

// Concatenates values with operator<< into one message: throw Error(ErrorCode::kConfig, cat(file, ": bad x"));
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream stream;
  (stream << ... << args);
  return stream.str();
}

namespace detail {
[[noreturn]] void check_failed(const char* file, int line, const char* condition, const std::string& message);

class CheckMessage {
 public:
  CheckMessage(const char* file, int line, const char* condition) : file_(file), line_(line), condition_(condition) {}
  CheckMessage(const CheckMessage&) = delete;
  CheckMessage& operator=(const CheckMessage&) = delete;
  [[noreturn]] ~CheckMessage() { check_failed(file_, line_, condition_, stream_.str()); }
  template <typename T>
  CheckMessage& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  const char* file_;
  int line_;
  const char* condition_;
  std::ostringstream stream_;
};
}  // namespace detail

}  // namespace h2

// Aborts with file:line when an internal invariant does not hold. Not for user input: use H2_THROW.
#define H2_CHECK(condition) \
  if (condition) {          \
  } else                    \
    ::h2::detail::CheckMessage(__FILE__, __LINE__, #condition)

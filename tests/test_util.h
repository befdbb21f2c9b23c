// Helpers shared by the tests: catching an h2::Error and checking its code and message; a free TCP port.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "core/error.h"

namespace h2::testing_util {

// Runs `fn`, expects an h2::Error with `code`, and returns its message ("" and a test failure otherwise).
template <typename Fn>
std::string error_of(Fn&& fn, ErrorCode code) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no h2::Error was raised";
  return "";
}

// A TCP port on 127.0.0.1 that nothing listens on now: the kernel's choice for a socket bound to port 0. (A port
// picked from the process id could fall in the ephemeral range and be taken by another test's connection.)
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  const bool ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  if (fd >= 0) ::close(fd);
  EXPECT_TRUE(ok) << "no free TCP port on 127.0.0.1";
  return ntohs(a.sin_port);
}

}  // namespace h2::testing_util

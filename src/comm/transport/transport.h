// The transport interface of DiComm (Gloo's layout: algorithms see only a communicator; each concrete
// transport lives in a subfolder of transport/ with the same file names). A transport moves bytes between
// the ranks of one job: tagged, asynchronous point-to-point messages. Matching is by (peer, tag), in order.
// Deliberately not here: collectives (comm/algorithms.cc builds them from point-to-point), device memory.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/error.h"

namespace h2 {

// A communication failure: a peer that timed out or died, or a message that does not match what was posted.
// The message names the operation and the peer rank.
class CommError : public Error {
 public:
  explicit CommError(const std::string& message) : Error(ErrorCode::kInternal, message) {}
};

// An operation in flight. wait() returns when it has completed or throws CommError after `timeout`.
class Request {
 public:
  virtual ~Request() = default;
  virtual void wait(std::chrono::milliseconds timeout) = 0;
  virtual bool test() = 0;  // true once complete; never blocks
};

// Tags are below 2^kTagBits, so that a transport whose matching ignores the source (UCX) can put the source
// rank in the bits above.
inline constexpr int kTagBits = 48;

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;
  // The buffer must stay valid until the request completes. A receive must post exactly the sent size.
  virtual std::unique_ptr<Request> isend(int peer, uint64_t tag, const void* data, size_t bytes) = 0;
  virtual std::unique_ptr<Request> irecv(int peer, uint64_t tag, void* data, size_t bytes) = 0;
};

}  // namespace h2

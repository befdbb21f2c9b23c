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
#include <utility>
#include <vector>

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

// Memory that each rank shares with the ranks of its host, so that collectives read a peer's data in place
// instead of receiving a copy (comm/algorithms.cc, WindowUse). Each rank owns one window of bytes();
// peers only read it. Optional: a transport without shared memory has none.
class SharedWindow {
 public:
  virtual ~SharedWindow() = default;
  virtual size_t bytes() const = 0;
  virtual char* local() = 0;
  // Rank `peer`'s window mapped into this process (waits until the peer has made it), or nullptr where it
  // cannot be mapped (another host). Every rank that calls this has made its own window first (local()).
  virtual const char* peer(int peer) = 0;

  // Kept for the algorithms across calls and communicators (one window per rank serves all of them): the half
  // of the window the next use writes (halves alternate, so a use never waits for the peers still reading the
  // one before), and per half the requests that complete once each peer has finished reading it.
  struct PendingRead {
    std::unique_ptr<Request> request;
    int peer;  // the transport rank
  };
  int next_half() { return turn_++ & 1; }
  std::vector<PendingRead>& pending(int half) { return pending_[half]; }

 private:
  int turn_ = 0;
  std::vector<PendingRead> pending_[2];
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;
  // The buffer must stay valid until the request completes. A receive must post exactly the sent size.
  virtual std::unique_ptr<Request> isend(int peer, uint64_t tag, const void* data, size_t bytes) = 0;
  virtual std::unique_ptr<Request> irecv(int peer, uint64_t tag, void* data, size_t bytes) = 0;
  // This rank's shared window (made on the first call), or nullptr when the transport has none.
  virtual SharedWindow* window() { return nullptr; }
  // Moves messages in flight along without waiting for any (a transport whose large messages need the sender's
  // attention - UCX's rendezvous - delivers them only while the sender progresses); never blocks.
  virtual void progress() {}
};

}  // namespace h2

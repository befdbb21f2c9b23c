// DiComm's communicator (docs/architecture.md, "comm"): rank and size within a group, sub-groups by colour and key,
// asynchronous tagged point-to-point, and collectives built from point-to-point over any transport.
// Every blocking wait has a timeout; its CommError names the operation and the peer it waited for.
//
// Algorithms (comm/algorithms.cc) see only the communicator: for large all-reduces, the transport's shared windows
// when every rank of the group can map every other's (ranks of one host: each byte crosses once, read in place,
// two signals per piece), else recursive halving-doubling (a power of two of ranks) or ring reduce-scatter +
// all-gather (bandwidth-optimal: each rank sends 2 (n-1)/n of the data); for small ones, recursive doubling (log2 n
// exchanges) on a power of two of ranks, else binomial-tree reduce + broadcast (2 log2 n steps). bf16 reductions
// accumulate in f32: the data is widened, reduced and rounded once at the end. Transports: comm/transport/inproc
// (threads) and comm/transport/ucx (processes, hosts); comm/job.h joins a job.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/transport/transport.h"
#include "core/dtype.h"

namespace h2 {

enum class ReduceOp { kSum, kAvg, kMax };

struct CommOptions {
  std::chrono::milliseconds timeout{30000};  // every blocking wait
  size_t small_message_bytes = 64 << 10;     // all-reduces up to this size go by latency, larger by bandwidth
};

class Communicator {
 public:
  // The whole job: every rank of the transport.
  Communicator(std::shared_ptr<Transport> transport, CommOptions options = {});

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(members_.size()); }
  const CommOptions& options() const { return options_; }
  // Sets the timeout of every blocking wait from now on and returns the one before (WaitLonger sets it for a scope).
  std::chrono::milliseconds set_timeout(std::chrono::milliseconds timeout) {
    return std::exchange(options_.timeout, timeout);
  }

  // Collective over this group: ranks with the same colour form a sub-group, ordered by key then rank.
  Communicator split(int color, int key);

  // Point-to-point within the group; user tags must be below kMaxUserTag.
  static constexpr uint32_t kMaxUserTag = 1u << 22;
  std::unique_ptr<Request> isend(const void* data, size_t bytes, int peer, uint32_t tag);
  std::unique_ptr<Request> irecv(void* data, size_t bytes, int peer, uint32_t tag);
  // Waits with this communicator's timeout; the CommError names `op`, this rank, `peer` and the step.
  void wait_request(Request& request, const char* op, int peer, int step = 0) { wait(request, op, peer, step); }
  // Moves this rank's messages in flight along (Transport::progress); for a rank busy with other work, e.g. between
  // a device's kernels (Device::set_while_busy). Never blocks.
  void progress() { transport_->progress(); }

  // Collectives (every rank of the group calls them in the same order). Counts are elements of `dtype`
  // (f32 or bf16). all_reduce works in place.
  void all_reduce(void* data, size_t count, DType dtype, ReduceOp op);
  // in: size() x count elements; out: this rank's reduced block of count elements.
  void reduce_scatter(void* out, const void* in, size_t count, DType dtype, ReduceOp op);
  // in: count elements (may be this rank's block of out: in place); out: size() x count elements, rank r's block at r x
  // count.
  void all_gather(void* out, const void* in, size_t count, DType dtype);
  void broadcast(void* data, size_t count, DType dtype, int root);
  void barrier();

  // Collective: tells the communicator which host each rank is on (ranks on one host share memory, ranks on
  // different hosts a slower network). When ranks span hosts and every host has the same number of them,
  // large all-reduces become hierarchical: ring reduce-scatter within each host, all-reduce across hosts,
  // ring all-gather within each host. With one host, or uneven hosts, the flat ring stays.
  void set_hosts(const std::string& host);
  bool hierarchical() const { return local_ != nullptr; }

  // The algorithm the last all_reduce used ("shared-window", "ring", "halving-doubling", "recursive-doubling",
  // "tree", "hierarchical", "none"), for benchmarks and tests.
  const char* last_algorithm() const { return last_algorithm_; }
  // Times a persistent work buffer had to grow: once per new largest size, then never (tests check reuse).
  int64_t buffer_growths() const { return buffer_growths_; }

  // --- for algorithms: a blocking step with this communicator's timeout and a named operation ---
  void send_recv(const void* send_data, size_t send_bytes, int to, void* recv_data, size_t recv_bytes, int from,
                 const char* op, int step);
  // The same exchange in messages of at most `chunk` bytes (both sides must use the same chunk; exchanges under
  // 4 chunks go whole), every receive posted at once; `arrived(offset, bytes)` runs for each received chunk as
  // soon as it is in, in order, so its bytes are used while still in cache.
  void send_recv_chunked(const void* send_data, size_t send_bytes, int to, void* recv_data, size_t recv_bytes, int from,
                         size_t chunk, const char* op, int step, const std::function<void(size_t, size_t)>& arrived);
  void send(const void* data, size_t bytes, int peer, const char* op, int step);
  void recv(void* data, size_t bytes, int peer, const char* op, int step);
  // Asynchronous steps of the current collective, for algorithms that keep several in flight.
  std::unique_ptr<Request> isend_step(const void* data, size_t bytes, int peer, int step);
  std::unique_ptr<Request> irecv_step(void* data, size_t bytes, int peer, int step);
  uint64_t next_sequence() { return ++sequence_; }
  int job_rank(int peer) const { return members_[static_cast<size_t>(peer)]; }
  // The transport's shared window when every member of this group can read every other's (ranks of one host),
  // else nullptr. Collective on the first call, which decides it for the group; later calls only look.
  SharedWindow* shared_window();
  // Persistent f32 work buffer `which` (0 or 1) of at least `count` elements, grown only when too small.
  float* scratch(int which, size_t count);

 private:
  Communicator(std::shared_ptr<Transport> transport, std::vector<int> members, uint64_t group_id, CommOptions options);
  uint64_t tag(uint64_t sequence, int step) const;
  uint64_t user_tag(uint32_t tag, const char* op) const;
  void wait(Request& request, const char* op, int peer, int step);

  std::shared_ptr<Transport> transport_;
  std::vector<int> members_;  // transport ranks of this group's ranks
  int rank_ = 0;
  uint64_t group_id_ = 0;
  CommOptions options_;
  uint64_t sequence_ = 0;  // collective calls so far: keeps their messages apart
  const char* last_algorithm_ = "none";
  enum class WindowUse { kUndecided, kYes, kNo } window_use_ = WindowUse::kUndecided;
  std::vector<float> scratch_[2];
  int64_t buffer_growths_ = 0;
  std::unique_ptr<Communicator> local_, cross_;  // set by set_hosts when hierarchical all-reduce applies
};

// While it lives, `comm`'s waits time out after `timeout` (at least the communicator's own): for waits known to be
// long, such as ranks waiting while others write or read a checkpoint.
class WaitLonger {
 public:
  WaitLonger(Communicator& comm, std::chrono::milliseconds timeout)
      : comm_(comm), before_(comm.set_timeout(std::max(timeout, comm.options().timeout))) {}
  ~WaitLonger() { comm_.set_timeout(before_); }
  WaitLonger(const WaitLonger&) = delete;
  WaitLonger& operator=(const WaitLonger&) = delete;

 private:
  Communicator& comm_;
  std::chrono::milliseconds before_;
};

}  // namespace h2

// A pool of host staging buffers (Device::host_staging). Page-locked memory is slow to allocate and to free
// (cudaHostAlloc maps and pins every page: milliseconds for megabytes), and the runtime stages every pipeline send
// through a buffer of its own that lives until the send completes — so a GPU device takes its staging buffers from
// here. A buffer whose last owner lets go returns to the pool and is handed out again for a request of its size
// class (a power of two: requests that grow by a little reuse it); buffers in use are never handed out twice.
// The pool keeps at most `reserve_bytes` of free buffers and frees the rest; it may be destroyed while buffers are
// out (they are freed when let go). Thread-safe.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

namespace h2 {

class StagingPool {
 public:
  using Allocate = std::function<char*(size_t bytes)>;
  using Free = std::function<void(char*)>;
  StagingPool(Allocate allocate, Free free, size_t reserve_bytes);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // At least `bytes` (its size class), from the free buffers when one of that class is there.
  std::shared_ptr<char> take(size_t bytes);
  static size_t size_class(size_t bytes);  // the least power of two >= bytes (and >= 1)
  size_t free_bytes() const;               // held in reserve now

 private:
  struct State;
  std::shared_ptr<State> state_;  // shared with the buffers' deleters, which may outlive the pool
};

}  // namespace h2

// StagingPool: free host staging buffers by size class, reused until the reserve is full.
#include "device/staging_pool.h"

#include <algorithm>
#include <bit>
#include <map>
#include <mutex>
#include <utility>

#include "core/error.h"

namespace h2 {

struct StagingPool::State {
  Allocate allocate;
  Free free;
  size_t reserve_bytes = 0;
  std::mutex mutex;
  std::multimap<size_t, char*> free_buffers;  // size class -> buffer
  size_t free_bytes = 0;
  bool closed = false;  // the pool is gone: buffers let go are freed

  // A buffer let go: kept for the next request of its class while the reserve has room, else freed.
  void give_back(char* p, size_t bytes) {
    {
      std::lock_guard lock(mutex);
      if (!closed && free_bytes + bytes <= reserve_bytes) {
        free_buffers.emplace(bytes, p);
        free_bytes += bytes;
        return;
      }
    }
    free(p);
  }
};

StagingPool::StagingPool(Allocate allocate, Free free, size_t reserve_bytes) : state_(std::make_shared<State>()) {
  H2_CHECK(allocate && free) << "a staging pool needs an allocator and its free";
  state_->allocate = std::move(allocate);
  state_->free = std::move(free);
  state_->reserve_bytes = reserve_bytes;
}

StagingPool::~StagingPool() {
  std::multimap<size_t, char*> buffers;
  {
    std::lock_guard lock(state_->mutex);
    state_->closed = true;
    buffers.swap(state_->free_buffers);
    state_->free_bytes = 0;
  }
  for (auto& [bytes, p] : buffers) state_->free(p);
}

size_t StagingPool::size_class(size_t bytes) { return std::bit_ceil(std::max<size_t>(bytes, 1)); }

std::shared_ptr<char> StagingPool::take(size_t bytes) {
  const size_t n = size_class(bytes);
  char* p = nullptr;
  {
    std::lock_guard lock(state_->mutex);
    if (auto it = state_->free_buffers.find(n); it != state_->free_buffers.end()) {
      p = it->second;
      state_->free_buffers.erase(it);
      state_->free_bytes -= n;
    }
  }
  if (p == nullptr) p = state_->allocate(n);
  return std::shared_ptr<char>(p, [state = state_, n](char* q) { state->give_back(q, n); });
}

size_t StagingPool::free_bytes() const {
  std::lock_guard lock(state_->mutex);
  return state_->free_bytes;
}

}  // namespace h2

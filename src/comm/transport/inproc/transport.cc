// The in-process transport's mailboxes.
#include "comm/transport/inproc/transport.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>

namespace h2 {

class InprocFabric {
 public:
  InprocFabric(int size, size_t window_bytes) : size_(size), window_bytes_(window_bytes) {}
  int size() const { return size_; }
  size_t window_bytes() const { return window_bytes_; }

  // Rank r's shared window: every rank's is made on the first call (threads share all memory).
  char* window(int r) {
    std::lock_guard<std::mutex> lock(mu_);
    if (windows_.empty()) windows_.assign(static_cast<size_t>(size_), std::vector<char>(window_bytes_));
    return windows_[static_cast<size_t>(r)].data();
  }

  void deliver(int src, int dst, uint64_t tag, const void* data, size_t bytes) {
    std::vector<char> message(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      boxes_[{src, dst, tag}].push_back(std::move(message));
    }
    cv_.notify_all();
  }

  // Takes the next message from src to dst with tag; false when none arrives in time.
  bool take(int src, int dst, uint64_t tag, std::vector<char>& out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    auto& box = boxes_[{src, dst, tag}];
    if (!cv_.wait_for(lock, timeout, [&] { return !box.empty(); })) return false;
    out = std::move(box.front());
    box.pop_front();
    return true;
  }

  bool poll(int src, int dst, uint64_t tag) {
    std::lock_guard<std::mutex> lock(mu_);
    return !boxes_[{src, dst, tag}].empty();
  }

 private:
  int size_;
  size_t window_bytes_;
  std::vector<std::vector<char>> windows_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::tuple<int, int, uint64_t>, std::deque<std::vector<char>>> boxes_;
};

namespace {

class DoneRequest final : public Request {
 public:
  void wait(std::chrono::milliseconds) override {}
  bool test() override { return true; }
};

class RecvRequest final : public Request {
 public:
  RecvRequest(std::shared_ptr<InprocFabric> fabric, int src, int dst, uint64_t tag, void* data, size_t bytes)
      : fabric_(std::move(fabric)), src_(src), dst_(dst), tag_(tag), data_(data), bytes_(bytes) {}

  void wait(std::chrono::milliseconds timeout) override {
    if (done_) return;
    std::vector<char> message;
    if (!fabric_->take(src_, dst_, tag_, message, timeout)) {
      throw CommError(cat("rank ", dst_, ": receive from rank ", src_, " timed out after ", timeout.count(),
                          " ms (tag ", tag_, "); is rank ", src_, " alive and in the same operation?"));
    }
    if (message.size() != bytes_) {
      throw CommError(cat("rank ", dst_, ": rank ", src_, " sent ", message.size(), " bytes where ", bytes_,
                          " were expected (tag ", tag_, "); the ranks disagree on the operation's size"));
    }
    if (bytes_ > 0) std::memcpy(data_, message.data(), bytes_);
    done_ = true;
  }
  bool test() override {
    if (!done_ && fabric_->poll(src_, dst_, tag_)) wait(std::chrono::milliseconds(0));
    return done_;
  }

 private:
  std::shared_ptr<InprocFabric> fabric_;
  int src_, dst_;
  uint64_t tag_;
  void* data_;
  size_t bytes_;
  bool done_ = false;
};

class InprocWindow final : public SharedWindow {
 public:
  InprocWindow(std::shared_ptr<InprocFabric> fabric, int rank) : fabric_(std::move(fabric)), rank_(rank) {}
  size_t bytes() const override { return fabric_->window_bytes(); }
  char* local() override { return fabric_->window(rank_); }
  const char* peer(int peer) override { return fabric_->window(peer); }

 private:
  std::shared_ptr<InprocFabric> fabric_;
  int rank_;
};

class InprocTransport final : public Transport {
 public:
  InprocTransport(std::shared_ptr<InprocFabric> fabric, int rank)
      : fabric_(std::move(fabric)), rank_(rank), window_(fabric_, rank) {}
  int rank() const override { return rank_; }
  int size() const override { return fabric_->size(); }
  const char* name() const override { return "inproc"; }
  std::unique_ptr<Request> isend(int peer, uint64_t tag, const void* data, size_t bytes) override {
    check_peer(peer);
    fabric_->deliver(rank_, peer, tag, data, bytes);
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<Request> irecv(int peer, uint64_t tag, void* data, size_t bytes) override {
    check_peer(peer);
    return std::make_unique<RecvRequest>(fabric_, peer, rank_, tag, data, bytes);
  }
  SharedWindow* window() override { return window_.bytes() > 0 ? &window_ : nullptr; }

 private:
  void check_peer(int peer) const {
    if (peer < 0 || peer >= size()) {
      throw Error(ErrorCode::kInvalidArgument, cat("rank ", rank_, ": peer ", peer, " is outside [0, ", size(), ")"));
    }
  }
  std::shared_ptr<InprocFabric> fabric_;
  int rank_;
  InprocWindow window_;
};

}  // namespace

std::vector<std::shared_ptr<Transport>> make_inproc_transports(int size, size_t window_bytes) {
  auto fabric = std::make_shared<InprocFabric>(size, window_bytes);
  std::vector<std::shared_ptr<Transport>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_shared<InprocTransport>(fabric, r));
  return out;
}

}  // namespace h2

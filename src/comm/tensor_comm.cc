// TensorComm: direct or staged communication of device tensors.
#include "comm/tensor_comm.h"

#include "core/error.h"
#include "device/device.h"

namespace h2 {
namespace {

// A send from a host copy of a device tensor: the copy lives as long as the request.
class StagedSend final : public Request {
 public:
  StagedSend(std::shared_ptr<char> copy, std::unique_ptr<Request> send)
      : copy_(std::move(copy)), send_(std::move(send)) {}
  void wait(std::chrono::milliseconds timeout) override { send_->wait(timeout); }
  bool test() override { return send_->test(); }

 private:
  std::shared_ptr<char> copy_;
  std::unique_ptr<Request> send_;
};

}  // namespace

void* TensorComm::host_view(const Tensor& t, bool fill) {
  if (t.device().props().host_addressable) return t.data();
  if (staging_bytes_ < t.bytes()) {
    staging_ = t.device().host_staging(t.bytes());
    staging_bytes_ = t.bytes();
  }
  if (fill) {
    t.device().copy_d2h(staging_.get(), t.data(), t.bytes());
    t.device().synchronize();
    staged_bytes_ += static_cast<int64_t>(t.bytes());
  }
  return staging_.get();
}

void TensorComm::write_back(const Tensor& t, void* host) {
  if (host == t.data()) return;
  t.device().copy_h2d(t.data(), host, t.bytes());
  t.device().synchronize();
  staged_bytes_ += static_cast<int64_t>(t.bytes());
}

void TensorComm::all_reduce(const Tensor& t, ReduceOp op) {
  t.device().synchronize();  // the kernels that produced t have finished
  void* host = host_view(t, true);
  comm_.all_reduce(host, static_cast<size_t>(t.numel()), t.dtype(), op);
  write_back(t, host);
}

void TensorComm::all_gather(const Tensor& whole, const Tensor& mine) {
  whole.device().synchronize();
  const size_t count = static_cast<size_t>(mine.numel());
  H2_CHECK(whole.numel() == mine.numel() * comm_.size())
      << "all_gather of " << mine.numel() << " into " << whole.numel();
  if (whole.device().props().host_addressable && mine.device().props().host_addressable) {
    comm_.all_gather(whole.data(), mine.data(), count, whole.dtype());
    return;
  }
  // Staged: this rank's block in place in the host copy, gathered there, written back.
  void* host = host_view(whole, false);
  char* block = static_cast<char*>(host) + mine.bytes() * static_cast<size_t>(comm_.rank());
  mine.device().copy_d2h(block, mine.data(), mine.bytes());
  mine.device().synchronize();
  comm_.all_gather(host, block, count, whole.dtype());
  write_back(whole, host);
}

void TensorComm::send(const Tensor& t, int peer, uint32_t tag) {
  t.device().synchronize();
  auto request = comm_.isend(host_view(t, true), t.bytes(), peer, tag);
  comm_.wait_request(*request, "send", peer);
}

std::unique_ptr<Request> TensorComm::isend(const Tensor& t, int peer, uint32_t tag) {
  t.device().synchronize();
  if (t.device().props().host_addressable) return comm_.isend(t.data(), t.bytes(), peer, tag);
  // A copy of its own, not the shared staging buffer: the next call may reuse that before this send completes,
  // and a send that waited here could wait for a peer that is itself sending to us (1F1B's crossing messages).
  std::shared_ptr<char> copy = t.device().host_staging(t.bytes());
  t.device().copy_d2h(copy.get(), t.data(), t.bytes());
  staged_bytes_ += static_cast<int64_t>(t.bytes());
  std::unique_ptr<Request> send = comm_.isend(copy.get(), t.bytes(), peer, tag);
  return std::make_unique<StagedSend>(std::move(copy), std::move(send));
}

void TensorComm::recv(const Tensor& t, int peer, uint32_t tag) {
  void* host = host_view(t, false);
  auto request = comm_.irecv(host, t.bytes(), peer, tag);
  comm_.wait_request(*request, "recv", peer);
  write_back(t, host);
}

}  // namespace h2

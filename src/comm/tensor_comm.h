// Tensors through a communicator, whatever device holds them (docs/architecture.md, "comm"). A device whose memory the
// host can address (ref, cpu, emu) is sent from and received into directly. Any other device's tensor is
// staged: copied into a persistent host buffer (the device's host_staging(), pinned on a GPU; grown, never
// allocated per call), moved, and copied back; a staged isend copies into a buffer of its own, which lives as
// long as the request, so that it returns at once like any isend. The staged bytes are counted so that a
// benchmark or a log can report the staging traffic.
#pragma once

#include <cstdint>
#include <memory>

#include "comm/communicator.h"
#include "core/tensor.h"

namespace h2 {

class TensorComm {
 public:
  explicit TensorComm(Communicator& comm) : comm_(comm) {}
  Communicator& comm() { return comm_; }

  // f32 or bf16, in place.
  void all_reduce(const Tensor& t, ReduceOp op);
  // `whole` is size() blocks of `mine`'s size, and `mine` is this rank's block of it (in place) or another tensor:
  // every rank ends with every rank's block.
  void all_gather(const Tensor& whole, const Tensor& mine);
  // Point-to-point with the communicator's timeout; the receiving tensor has the sent size. isend returns the
  // request to wait on; the tensor may change once it returns when it was staged, not before the wait otherwise.
  void send(const Tensor& t, int peer, uint32_t tag);
  std::unique_ptr<Request> isend(const Tensor& t, int peer, uint32_t tag);
  void recv(const Tensor& t, int peer, uint32_t tag);

  int64_t staged_bytes() const { return staged_bytes_; }  // device <-> host staging traffic so far

 private:
  // The host address to communicate `t` from: its own memory, or the staging buffer filled from it.
  void* host_view(const Tensor& t, bool fill);
  void write_back(const Tensor& t, void* host);

  Communicator& comm_;
  std::shared_ptr<char> staging_;
  size_t staging_bytes_ = 0;
  int64_t staged_bytes_ = 0;
};

}  // namespace h2

// The device runtime interface (docs/architecture.md, "device + ops"): what every chip backend provides.
//
// Memory: allocations are counted against a hard capacity, as on a real chip; one past it is an
// Error(kOutOfMemory) naming the device and the sizes. The peak is tracked for the memory model to be checked.
//
// Synchronisation model: each device has one in-order queue. launch() enqueues a kernel; kernels and copies
// on one device run in the order they were issued; synchronize() returns when everything issued has finished.
// The CPU backends (ref, cpu, emu) run each kernel to completion on the calling thread, so for them the queue
// is the call itself and synchronize() has nothing to wait for; a GPU backend maps the queue to a stream.
//
// Host memory for staging (host_staging): page-locked on a GPU, so that copies to and from the device go by DMA.
//
// Deliberately not here: multiple streams per device, events. A backend keeps what it needs of them inside.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "core/format.h"
#include "core/tensor.h"

namespace h2 {

class Kernels;

struct DeviceProps {
  std::string name;                 // unique in a process, e.g. "cpu:0", "emu:1"
  std::string backend;              // registry name: "ref", "cpu", "emu"
  std::string chip;                 // the chip this device is or emulates, e.g. "host", "small-fast"
  size_t mem_capacity_bytes = 0;    // allocations past this fail
  double compute_speed = 1.0;       // relative to this host's cpu backend
  double mem_bandwidth_gbps = 0.0;  // modelled copy bandwidth; 0 = not modelled (host speed)
  bool host_addressable = true;     // the host can read and write this device's memory directly
  bool emulated = false;            // an emulation of another chip, not the chip itself
};

class Device {
 public:
  explicit Device(DeviceProps props) : props_(std::move(props)) {}
  // Every tensor allocated on a device must be gone before the device is (checked).
  virtual ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const DeviceProps& props() const { return props_; }
  const std::string& name() const { return props_.name; }

  // --- memory ---
  // A new tensor on this device; its contents are unspecified. Throws Error(kOutOfMemory).
  Tensor empty(DType dtype, Shape shape);
  Tensor zeros(DType dtype, Shape shape);
  size_t mem_used_bytes() const;
  size_t mem_peak_bytes() const;
  void reset_mem_peak();

  // --- copies (bytes, between raw addresses; the Tensor-level copy() below checks shapes) ---
  virtual void copy_h2d(void* dst, const void* src, size_t bytes);
  virtual void copy_d2h(void* dst, const void* src, size_t bytes);
  virtual void copy_d2d(void* dst, const void* src, size_t bytes);
  // Sets `bytes` bytes of device memory to zero.
  virtual void fill_zero(void* dst, size_t bytes);
  virtual void synchronize() {}
  // Synchronises and starts an interval to be timed on its own: an emulated chip forgets the time it slept beyond
  // what it owed, which later kernels would otherwise get back (measurements, not training).
  virtual void start_interval() { synchronize(); }
  // `bytes` of host memory this device copies to and from fastest (pinned on a GPU; plain memory by default), for
  // buffers that stage its tensors; freed when the last owner lets go.
  virtual std::shared_ptr<char> host_staging(size_t bytes);

  // --- kernels ---
  virtual const Kernels& kernels() const = 0;
  // Runs one kernel on this device's queue. `op_name` is for tracing and error messages; calls with the same
  // `shape_key` (the op, its arguments' shapes and dtypes) do the same work, which an emulated chip paces alike.
  virtual void launch(const char* op_name, uint64_t shape_key, const std::function<void()>& kernel);
  // Kernels that every rank of a job runs in the same stretch at the end of a step — the optimizer step (the
  // gradient norm, then, once its all-reduce returns, clipping and AdamW) and the bf16 weight refresh after it — run
  // while an AllRanksAtOnce of their device is alive, so that a backend sharing one host among ranks (emu) can tell
  // them from the rest.
  class AllRanksAtOnce {
   public:
    explicit AllRanksAtOnce(Device& device) : device_(device) { ++device_.all_ranks_at_once_; }
    ~AllRanksAtOnce() { --device_.all_ranks_at_once_; }
    AllRanksAtOnce(const AllRanksAtOnce&) = delete;
    AllRanksAtOnce& operator=(const AllRanksAtOnce&) = delete;

   private:
    Device& device_;
  };
  bool all_ranks_at_once() const { return all_ranks_at_once_ > 0; }

  // Work for the launching thread while the device computes and the thread would otherwise only wait: a
  // communicator's progress, so that a message already sent moves on while the chip computes, as the host thread
  // beside an accelerator is free to do. A backend that waits for its kernels (an emulated chip's pacing sleeps)
  // runs it about every millisecond of the wait; empty: none.
  void set_while_busy(std::function<void()> work) { while_busy_ = std::move(work); }

 protected:
  const std::function<void()>& while_busy() const { return while_busy_; }

  // Backends whose memory is not host memory override these two.
  virtual void* raw_allocate(size_t bytes);
  virtual void raw_free(void* ptr);

 private:
  void release(void* ptr, size_t bytes);

  DeviceProps props_;
  mutable std::mutex mem_mutex_;
  size_t mem_used_bytes_ = 0;
  size_t mem_peak_bytes_ = 0;
  int all_ranks_at_once_ = 0;  // AllRanksAtOnce scopes alive
  std::function<void()> while_busy_;
};

// Copies between tensors of the same dtype and element count, on the same or different devices.
void copy(const Tensor& dst, const Tensor& src);
void copy_from_host(const Tensor& dst, const void* src);
void copy_to_host(void* dst, const Tensor& src);

}  // namespace h2

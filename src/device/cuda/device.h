// The `cuda` device: an NVIDIA GPU through the CUDA runtime (docs/devices.md, "The cuda backend"). Built only when
// CMake finds the CUDA toolkit (H2_CUDA); its memory is not host memory (props().host_addressable is false), so
// tensors reach the host through copies, and other devices' through host staging (device.h's copy()).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "device/device.h"

namespace h2 {

struct CudaDeviceInfo {
  int ordinal = 0;
  std::string name;  // e.g. "NVIDIA H200"
  size_t memory_bytes = 0;
  int compute_major = 0, compute_minor = 0;
};

// The GPUs this process can use; empty when there are none or no driver. `why_none` (when not null) says why.
std::vector<CudaDeviceInfo> cuda_devices(std::string* why_none = nullptr);

// Device `ordinal`; its capacity is the GPU's memory unless mem_capacity_bytes is smaller. Throws Error(kNotFound)
// naming the reason when there is no such GPU.
std::unique_ptr<Device> make_cuda_device(int ordinal, size_t mem_capacity_bytes);

}  // namespace h2

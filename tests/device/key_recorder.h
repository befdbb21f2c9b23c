// A device for tests: this host's cpu kernels, recording the shape key of every kernel launched on it (what an
// emulated chip paces by: device/emu/device.h).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "device/device.h"
#include "ops/cpu/kernels.h"

namespace h2 {

class KeyRecorder final : public Device {
 public:
  explicit KeyRecorder(size_t capacity_bytes = size_t{1} << 20)
      : Device(DeviceProps{.name = "keys:0", .backend = "cpu", .mem_capacity_bytes = capacity_bytes}) {}
  const Kernels& kernels() const override { return cpu_kernels(); }
  void launch(const char*, uint64_t shape_key, const std::function<void()>& kernel) override {
    keys.push_back(shape_key);
    kernel();
  }
  std::vector<uint64_t> keys;
};

}  // namespace h2

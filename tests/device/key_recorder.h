// A device for tests: this host's cpu kernels, recording the op, the shape key (what an emulated chip paces by:
// device/emu/device.h) and whether all ranks launch it at once (Device::AllRanksAtOnce) of every kernel launched on
// it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "device/device.h"
#include "ops/cpu/kernels.h"

namespace h2 {

class KeyRecorder final : public Device {
 public:
  explicit KeyRecorder(size_t capacity_bytes = size_t{1} << 20)
      : Device(DeviceProps{.name = "keys:0", .backend = "cpu", .mem_capacity_bytes = capacity_bytes}) {}
  const Kernels& kernels() const override { return cpu_kernels(); }
  void launch(const char* op_name, uint64_t shape_key, const std::function<void()>& kernel) override {
    launches.push_back({op_name, shape_key, all_ranks_at_once()});
    kernel();
  }
  struct Launch {
    std::string op;
    uint64_t key = 0;
    bool all_ranks_at_once = false;
  };
  std::vector<Launch> launches;  // in order
  std::vector<uint64_t> keys() const {
    std::vector<uint64_t> out;
    for (const Launch& l : launches) out.push_back(l.key);
    return out;
  }
};

}  // namespace h2

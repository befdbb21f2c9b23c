// The `cpu` device.
#include "device/cpu/device.h"

#include "core/error.h"
#include "ops/cpu/kernels.h"

namespace h2 {
namespace {

class CpuDevice final : public Device {
 public:
  CpuDevice(int index, size_t mem_capacity_bytes)
      : Device(DeviceProps{
            .name = cat("cpu:", index), .backend = "cpu", .chip = "host", .mem_capacity_bytes = mem_capacity_bytes}) {}
  const Kernels& kernels() const override { return cpu_kernels(); }
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(int index, size_t mem_capacity_bytes) {
  return std::make_unique<CpuDevice>(index, mem_capacity_bytes);
}

}  // namespace h2

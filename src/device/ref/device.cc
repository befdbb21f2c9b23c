// The `ref` device.
#include "device/ref/device.h"

#include "core/error.h"
#include "ops/ref/kernels.h"

namespace h2 {
namespace {

class RefDevice final : public Device {
 public:
  RefDevice(int index, size_t mem_capacity_bytes)
      : Device(DeviceProps{
            .name = cat("ref:", index), .backend = "ref", .chip = "host", .mem_capacity_bytes = mem_capacity_bytes}) {}
  const Kernels& kernels() const override { return ref_kernels(); }
};

}  // namespace

std::unique_ptr<Device> make_ref_device(int index, size_t mem_capacity_bytes) {
  return std::make_unique<RefDevice>(index, mem_capacity_bytes);
}

}  // namespace h2

// The `cpu` device: host memory and the fast CPU kernels (ops/cpu).
#pragma once

#include <memory>

#include "device/device.h"

namespace h2 {

std::unique_ptr<Device> make_cpu_device(int index, size_t mem_capacity_bytes);

}  // namespace h2

// The `ref` device: host memory and the reference kernels (ops/ref). The golden reference, not a fast path.
#pragma once

#include <memory>

#include "device/device.h"

namespace h2 {

std::unique_ptr<Device> make_ref_device(int index, size_t mem_capacity_bytes);

}  // namespace h2

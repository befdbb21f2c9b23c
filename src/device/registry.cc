// The backend registry: the only place that names every backend.
#include "device/registry.h"

#include <unistd.h>

#include "core/error.h"
#include "device/cpu/device.h"
#include "device/ref/device.h"

namespace h2 {

const std::vector<BackendInfo>& backends() {
  static const std::vector<BackendInfo> list = {
      {"ref", "reference loops in double precision; the golden reference, slow"},
      {"cpu", "fast CPU path: OpenBLAS sgemm, vectorised kernels, OpenMP"},
      {"emu", "an emulated chip: cpu kernels paced and memory-capped to a chip profile"},
  };
  return list;
}

EmuProfile default_emu_profile() {
  return EmuProfile{
      .chip = "emu-default", .speed = 1.0, .mem_capacity_bytes = size_t{4} << 30, .mem_bandwidth_gbps = 0};
}

size_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : size_t{1} << 34;
}

std::unique_ptr<Device> create_device(const DeviceSpec& spec) {
  const size_t capacity = spec.mem_capacity_bytes.value_or(host_memory_bytes());
  if (spec.backend == "ref") return make_ref_device(spec.index, capacity);
  if (spec.backend == "cpu") return make_cpu_device(spec.index, capacity);
  if (spec.backend == "emu") {
    EmuProfile profile = spec.emu.value_or(default_emu_profile());
    if (spec.mem_capacity_bytes) profile.mem_capacity_bytes = *spec.mem_capacity_bytes;
    return make_emu_device(spec.index, profile);
  }
  std::string known;
  for (const BackendInfo& b : backends()) known += (known.empty() ? "" : ", ") + std::string(b.name);
  throw Error(ErrorCode::kNotFound, cat("unknown backend '", spec.backend, "'; built backends: ", known));
}

}  // namespace h2

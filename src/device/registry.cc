// The backend registry: the only place that names every backend.
#include "device/registry.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <limits>
#include <string>

#include "core/error.h"
#include "core/format.h"
#include "device/cpu/device.h"
#include "device/ref/device.h"
#ifdef H2_HAVE_CUDA
#include "device/cuda/device.h"
#endif

namespace h2 {

const std::vector<BackendInfo>& backends() {
  static const std::vector<BackendInfo> list = {
      {"ref", "reference loops in double precision; the golden reference, slow"},
      {"cpu", "fast CPU path: OpenBLAS sgemm, vectorised kernels, OpenMP"},
      {"emu", "an emulated chip: cpu kernels paced and memory-capped to a chip profile"},
#ifdef H2_HAVE_CUDA
      {"cuda", "an NVIDIA GPU: cuBLAS matmuls and CUDA kernels (built with the CUDA toolkit)"},
#endif
  };
  return list;
}

EmuProfile default_emu_profile() {
  return EmuProfile{
      .chip = "emu-default", .speed = 1.0, .mem_capacity_bytes = size_t{4} << 30, .mem_bandwidth_gbps = 0};
}

std::vector<std::string> hardware_lines() {
  std::vector<std::string> lines;
#ifdef H2_HAVE_CUDA
  std::string why;
  for (const CudaDeviceInfo& g : cuda_devices(&why)) {
    lines.push_back(cat("cuda:", g.ordinal, "  ", g.name, "  ", format_bytes(g.memory_bytes), "  compute capability ",
                        g.compute_major, ".", g.compute_minor));
  }
  if (lines.empty()) lines.push_back(cat("cuda: no CUDA device (", why, ")"));
#endif
  return lines;
}

size_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : size_t{1} << 34;
}

size_t available_host_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  size_t kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") return kib << 10;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return host_memory_bytes();
}

size_t peak_resident_bytes() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<size_t>(usage.ru_maxrss) << 10;  // KiB on Linux
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
#ifdef H2_HAVE_CUDA
  if (spec.backend == "cuda") return make_cuda_device(spec.index, spec.mem_capacity_bytes.value_or(SIZE_MAX));
#endif
  std::string known;
  for (const BackendInfo& b : backends()) known += (known.empty() ? "" : ", ") + std::string(b.name);
  throw Error(ErrorCode::kNotFound, cat("unknown backend '", spec.backend, "'; built backends: ", known));
}

}  // namespace h2

// The device runtime: capacity, peak counter, copies, the registry.
#include "device/device.h"

#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "device/registry.h"
#include "test_util.h"

namespace h2 {
namespace {

using ::testing::HasSubstr;
using testing_util::error_of;

TEST(Registry, ListsBackendsInOrder) {
  std::vector<std::string> names;
  for (const BackendInfo& b : backends()) names.push_back(b.name);
#ifdef H2_HAVE_CUDA
  EXPECT_EQ(names, (std::vector<std::string>{"ref", "cpu", "emu", "cuda"}));
  names.pop_back();  // a GPU may be absent: tests/device/cuda_test.cc creates it
#else
  EXPECT_EQ(names, (std::vector<std::string>{"ref", "cpu", "emu"}));
#endif
  for (const std::string& name : names) {
    auto dev = create_device(DeviceSpec{.backend = name, .index = 2});
    EXPECT_EQ(dev->props().backend, name);
    EXPECT_EQ(dev->name(), name + ":2");
  }
}

TEST(Registry, UnknownBackendListsTheKnownOnes) {
  const std::string msg = error_of([] { create_device(DeviceSpec{.backend = "tpu"}); }, ErrorCode::kNotFound);
  EXPECT_THAT(msg, HasSubstr("unknown backend 'tpu'"));
  EXPECT_THAT(msg, HasSubstr("ref, cpu, emu"));
}

// What the host can give (h2 train --cluster checks its ranks against it): /proc/meminfo's MemAvailable, at most
// the host's memory and, as it counts the page cache the kernel can drop besides what is free, not much less than
// what is free (read in KiB, not bytes).
TEST(Registry, AvailableHostMemoryIsBetweenTheFreeAndTheWholeMemory) {
  const double available = static_cast<double>(available_host_memory_bytes());
  const double free_bytes =
      static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  EXPECT_LE(available, static_cast<double>(host_memory_bytes()));
  EXPECT_GT(available, 0.5 * free_bytes);
}

// The process's peak resident memory (h2 train --cluster reports each rank's beside the host memory it counted for
// it): at least what is resident now, as /proc/self/status says (VmRSS, in KiB), and it rises with 64 MiB written.
TEST(Registry, PeakResidentMemoryHoldsWhatTheProcessTouched) {
  const auto resident = [] {
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) * 1024;
    }
    ADD_FAILURE() << "no VmRSS in /proc/self/status";
    return 0.0;
  };
  const double before = resident();
  constexpr size_t kBytes = size_t{64} << 20;
  std::vector<char> touched(kBytes, 1);
  const double now = resident();
  EXPECT_GE(now - before, 0.9 * static_cast<double>(kBytes));
  EXPECT_GE(static_cast<double>(peak_resident_bytes()), now - 1024 * 1024);  // the counters may lag by pages
  EXPECT_LE(static_cast<double>(peak_resident_bytes()), static_cast<double>(host_memory_bytes()));
  EXPECT_EQ(touched[kBytes / 2], 1);
}

TEST(Device, AllocationPastCapacityIsOutOfMemory) {
  for (const char* backend : {"ref", "cpu", "emu"}) {
    auto dev = create_device(DeviceSpec{.backend = backend, .mem_capacity_bytes = 1000});
    Tensor a = dev->empty(DType::kF32, {200});  // 800 bytes
    const std::string msg = error_of([&] { dev->empty(DType::kF32, {100}); }, ErrorCode::kOutOfMemory);
    EXPECT_THAT(msg, HasSubstr(dev->name()));
    EXPECT_THAT(msg, HasSubstr("requested 400 B"));
    EXPECT_THAT(msg, HasSubstr("800 B of 1000 B already in use"));
    EXPECT_EQ(dev->mem_used_bytes(), 800u);  // the failed allocation left nothing behind
  }
}

TEST(Device, TracksUseAndPeak) {
  auto dev = create_device(DeviceSpec{.backend = "cpu", .mem_capacity_bytes = 1 << 20});
  {
    Tensor a = dev->empty(DType::kF32, {100});
    {
      Tensor b = dev->empty(DType::kBF16, {100});
      EXPECT_EQ(dev->mem_used_bytes(), 600u);
    }
    EXPECT_EQ(dev->mem_used_bytes(), 400u);
    Tensor view = a.slice(0, 10);  // a view keeps the storage alive, and costs nothing
    EXPECT_EQ(dev->mem_used_bytes(), 400u);
  }
  EXPECT_EQ(dev->mem_used_bytes(), 0u);
  EXPECT_EQ(dev->mem_peak_bytes(), 600u);
  dev->reset_mem_peak();
  EXPECT_EQ(dev->mem_peak_bytes(), 0u);
}

TEST(Device, CopiesRoundTripAcrossDevices) {
  auto cpu = create_device(DeviceSpec{.backend = "cpu"});
  auto emu = create_device(DeviceSpec{.backend = "emu"});
  const std::vector<float> host = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f};
  Tensor a = cpu->empty(DType::kF32, {5});
  Tensor b = emu->empty(DType::kF32, {5});
  copy_from_host(a, host.data());
  copy(b, a);
  std::vector<float> back(5);
  copy_to_host(back.data(), b);
  EXPECT_EQ(back, host);
  Tensor zero = cpu->zeros(DType::kF32, {3});
  EXPECT_EQ(zero.data_as<float>()[2], 0.0f);
  EXPECT_THAT(error_of([&] { copy(cpu->empty(DType::kF32, {4}), a); }, ErrorCode::kInvalidArgument),
              HasSubstr("element count must match"));
}

TEST(Device, ZeroSizedTensorsAreValid) {
  auto dev = create_device(DeviceSpec{.backend = "cpu"});
  Tensor t = dev->empty(DType::kF32, {0, 8});
  EXPECT_EQ(t.numel(), 0);
  EXPECT_NE(t.data(), nullptr);
}

}  // namespace
}  // namespace h2

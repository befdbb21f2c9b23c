// The cuda backend (built when CMake finds the CUDA toolkit). Without a GPU every test that needs one reports
// itself skipped ("no CUDA device"), which CTest shows as Skipped, never as a pass; the error a user gets without
// one is checked here either way.
#include <cstring>
#include <numeric>
#include <vector>

#include "device/cuda/device.h"
#include "device/registry.h"
#include "ops/conformance.h"
#include "ops/kernels.h"
#include "test_util.h"

namespace h2 {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing_util::error_of;

// Skips the calling test unless a GPU is present.
#define H2_REQUIRE_GPU()                                                       \
  do {                                                                         \
    std::string why;                                                           \
    if (cuda_devices(&why).empty()) GTEST_SKIP() << "no CUDA device: " << why; \
  } while (0)

TEST(Cuda, WithoutAGpuCreatingOneIsAClearError) {
  std::string why;
  if (!cuda_devices(&why).empty()) GTEST_SKIP() << "this machine has a GPU";
  const std::string msg = error_of([] { create_device(DeviceSpec{.backend = "cuda"}); }, ErrorCode::kNotFound);
  EXPECT_THAT(msg, HasSubstr("no CUDA device"));
  EXPECT_THAT(msg, HasSubstr("--backend cpu"));
  const std::vector<std::string> lines = hardware_lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], StartsWith("cuda: no CUDA device ("));
}

TEST(Cuda, ListsEachGpu) {
  H2_REQUIRE_GPU();
  const std::vector<CudaDeviceInfo> gpus = cuda_devices();
  const std::vector<std::string> lines = hardware_lines();
  ASSERT_EQ(lines.size(), gpus.size());
  EXPECT_THAT(lines[0], StartsWith("cuda:0  " + gpus[0].name));
  EXPECT_THAT(lines[0], HasSubstr("compute capability"));
  EXPECT_GT(gpus[0].memory_bytes, size_t{1} << 30);
}

TEST(Cuda, CountsMemoryAndCopiesBothWays) {
  H2_REQUIRE_GPU();
  auto gpu = create_device(DeviceSpec{.backend = "cuda"});
  auto cpu = create_device(DeviceSpec{.backend = "cpu"});
  EXPECT_FALSE(gpu->props().host_addressable);
  EXPECT_EQ(gpu->mem_used_bytes(), 0u);
  std::vector<float> host(1000);
  std::iota(host.begin(), host.end(), 1.0f);
  {
    Tensor a = gpu->empty(DType::kF32, Shape{1000});
    Tensor b = gpu->zeros(DType::kF32, Shape{1000});
    EXPECT_EQ(gpu->mem_used_bytes(), 8000u);
    copy_from_host(a, host.data());
    std::vector<float> back(1000, -1.0f);
    copy_to_host(back.data(), b);
    EXPECT_EQ(back, std::vector<float>(1000, 0.0f));  // zeros() zeroed it
    copy(b, a);                                       // device to device
    copy_to_host(back.data(), b);
    EXPECT_EQ(back, host);
    Tensor c = cpu->empty(DType::kF32, Shape{1000});
    copy(c, b);  // GPU to CPU, staged through the host
    EXPECT_EQ(std::memcmp(c.data(), host.data(), 4000), 0);
  }
  EXPECT_EQ(gpu->mem_used_bytes(), 0u);
  EXPECT_EQ(gpu->mem_peak_bytes(), 12000u);
}

TEST(Cuda, AllocationsPastTheCapacityFail) {
  H2_REQUIRE_GPU();
  auto gpu = create_device(DeviceSpec{.backend = "cuda", .mem_capacity_bytes = size_t{1} << 20});
  EXPECT_EQ(gpu->props().mem_capacity_bytes, size_t{1} << 20);
  Tensor ok = gpu->empty(DType::kF32, Shape{1 << 17});  // 512 KiB
  EXPECT_THAT(error_of([&] { gpu->empty(DType::kF32, Shape{1 << 18}); }, ErrorCode::kOutOfMemory),
              HasSubstr("out of memory on device cuda:0"));
}

// The conformance suite of `h2 check ops`: every op in f32 and bf16 against the ref backend, with its tolerances.
TEST(Cuda, EveryOpMatchesRef) {
  H2_REQUIRE_GPU();
  auto reference = create_device(DeviceSpec{.backend = "ref"});
  auto gpu = create_device(DeviceSpec{.backend = "cuda"});
  const std::vector<CaseResult> results = run_conformance(*gpu, *reference, {});
  ASSERT_FALSE(results.empty());
  for (const CaseResult& r : results) {
    EXPECT_EQ(r.status, CaseStatus::kPass)
        << op_name(r.op) << " " << dtype_name(r.dtype) << " " << r.shape << ": " << r.detail;
  }
}

}  // namespace
}  // namespace h2

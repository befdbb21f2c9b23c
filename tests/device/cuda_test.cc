// The cuda backend (built when CMake finds the CUDA toolkit). Without a GPU every test that needs one reports
// itself skipped ("no CUDA device"), which CTest shows as Skipped, never as a pass; the error a user gets without
// one is checked here either way.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/rng.h"
#include "device/cuda/device.h"
#include "device/registry.h"
#include "ops/conformance.h"
#include "ops/kernels.h"
#include "ops/ops.h"
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

// Copies to the GPU return before the stream has run them (staged through pinned buffers, released by events): the
// host overwrites its buffer at once, 50 times, and each copy is added on the GPU; the sum is the host's, by hand.
TEST(Cuda, CopiesToTheGpuMayReuseTheHostBufferAtOnce) {
  H2_REQUIRE_GPU();
  auto gpu = create_device(DeviceSpec{.backend = "cuda"});
  const int64_t n = 4096;
  Tensor sum = gpu->zeros(DType::kF32, Shape{n}), x = gpu->empty(DType::kF32, Shape{n});
  std::vector<float> host(static_cast<size_t>(n));
  for (int k = 1; k <= 50; ++k) {
    std::fill(host.begin(), host.end(), static_cast<float>(k));
    copy_from_host(x, host.data());
    ops::residual_forward(sum, sum, x);
  }
  std::vector<float> back(static_cast<size_t>(n));
  copy_to_host(back.data(), sum);
  EXPECT_EQ(back, std::vector<float>(static_cast<size_t>(n), 1275.0f));  // 1 + 2 + ... + 50
}

TEST(Cuda, AllocationsPastTheCapacityFail) {
  H2_REQUIRE_GPU();
  auto gpu = create_device(DeviceSpec{.backend = "cuda", .mem_capacity_bytes = size_t{1} << 20});
  EXPECT_EQ(gpu->props().mem_capacity_bytes, size_t{1} << 20);
  Tensor ok = gpu->empty(DType::kF32, Shape{1 << 17});  // 512 KiB
  EXPECT_THAT(error_of([&] { gpu->empty(DType::kF32, Shape{1 << 18}); }, ErrorCode::kOutOfMemory),
              HasSubstr("out of memory on device cuda:0"));
}

// The bias goes into cuBLASLt's epilogue when it is 16-byte aligned and is added by a kernel otherwise (a view one
// element into its buffer); f32 and bf16, both against the ref backend's out = inp W^T + bias.
TEST(Cuda, MatmulAddsAnAlignedOrUnalignedBias) {
  H2_REQUIRE_GPU();
  auto reference = create_device(DeviceSpec{.backend = "ref"});
  auto gpu = create_device(DeviceSpec{.backend = "cuda"});
  const int64_t N = 33, C = 64, OC = 48;
  Rng rng(5);
  const auto random = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = static_cast<float>(rng.normal());
    return v;
  };
  const std::vector<float> inp = random(N * C), weight = random(OC * C), bias = random(OC + 1);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t first : {0, 1}) {
      std::vector<float> want(static_cast<size_t>(N * OC)), got(want.size());
      for (auto [device, result] : {std::pair{reference.get(), &want}, {gpu.get(), &got}}) {
        Tensor x = device->empty(DType::kF32, Shape{N, C}), w = device->empty(DType::kF32, Shape{OC, C});
        Tensor b = device->empty(DType::kF32, Shape{OC + 1}), out = device->empty(DType::kF32, Shape{N, OC});
        copy_from_host(x, inp.data());
        copy_from_host(w, weight.data());
        copy_from_host(b, bias.data());
        Tensor xd = device->empty(dtype, Shape{N, C}), wd = device->empty(dtype, Shape{OC, C});
        ops::convert(xd, x);
        ops::convert(wd, w);
        ops::matmul_forward(out, xd, wd, b.slice(first, first + OC));
        copy_to_host(result->data(), out);
      }
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-4 * (1 + std::abs(want[i]))) << dtype_name(dtype) << ", bias from " << first;
      }
    }
  }
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

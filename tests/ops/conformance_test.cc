// The conformance suite on every built backend, and proof that it catches the faults it claims to catch.
#include "ops/conformance.h"

#include "device/registry.h"
#include "ops/cpu/kernels.h"
#include "ops/ops.h"
#include "ops/ref/kernels.h"
#include "test_util.h"

namespace h2 {
namespace {

using ::testing::HasSubstr;
using testing_util::error_of;

// Every backend but the reference itself, which gradcheck_test.cc anchors (comparing ref with ref proves nothing,
// and is refused).
TEST(Conformance, EveryBackendMatchesRef) {
  auto reference = create_device(DeviceSpec{.backend = "ref"});
  EXPECT_THAT(error_of([&] { run_conformance(*reference, *reference, {}); }, ErrorCode::kInvalidArgument),
              HasSubstr("comparing them with themselves proves nothing"));
  for (const BackendInfo& b : backends()) {
    if (std::string(b.name) == "ref") continue;
    if (std::string(b.name) == "cuda") continue;  // tests/device/cuda_test.cc, where a GPU is present
    auto dev = create_device(DeviceSpec{.backend = b.name});
    const auto results = run_conformance(*dev, *reference, {});
    ASSERT_FALSE(results.empty());
    for (const CaseResult& r : results) {
      EXPECT_EQ(r.status, CaseStatus::kPass)
          << b.name << " " << op_name(r.op) << " " << dtype_name(r.dtype) << " " << r.shape << ": " << r.detail;
    }
  }
}

TEST(Conformance, CoversEveryOpInF32) {
  auto reference = create_device(DeviceSpec{.backend = "ref"}), cpu = create_device(DeviceSpec{.backend = "cpu"});
  const auto results = run_conformance(*cpu, *reference, {});
  for (Op op : kAllOps) {
    int cases = 0;
    for (const CaseResult& r : results) cases += (r.op == op && r.dtype == DType::kF32);
    EXPECT_GE(cases, 3) << op_name(op);
  }
}

// A backend with three planted faults, and nothing else implemented.
class FaultyKernels final : public Kernels {
 public:
  const char* name() const override { return "faulty"; }
  bool supports(Op op, DType dtype) const override {
    return dtype == DType::kF32 && (op == Op::kGeluForward || op == Op::kGeluBackward || op == Op::kResidualForward);
  }
  // A wrong value: the first element is off by one.
  void gelu_forward(void* out, const void* inp, DType dtype, int64_t N) const override {
    cpu_kernels().gelu_forward(out, inp, dtype, N);
    static_cast<float*>(out)[0] += 1.0f;
  }
  // Writes its input.
  void gelu_backward(float* dinp, const void* inp, const float* dout, DType dtype, int64_t N) const override {
    cpu_kernels().gelu_backward(dinp, inp, dout, dtype, N);
    const_cast<float*>(static_cast<const float*>(inp))[N - 1] = 0.0f;
  }
  // Forgets the last element.
  void residual_forward(void* out, const void* a, const void* b, DType dtype, int64_t N) const override {
    cpu_kernels().residual_forward(out, a, b, dtype, N - 1);
  }
};

class FaultyDevice final : public Device {
 public:
  FaultyDevice() : Device(DeviceProps{.name = "faulty:0", .backend = "faulty", .mem_capacity_bytes = 1 << 30}) {}
  const Kernels& kernels() const override { return kernels_; }

 private:
  FaultyKernels kernels_;
};

TEST(Conformance, CatchesWrongValuesUnwrittenOutputsAndModifiedInputs) {
  auto reference = create_device(DeviceSpec{.backend = "ref"});
  FaultyDevice faulty;
  const auto results = run_conformance(faulty, *reference, {});
  EXPECT_FALSE(all_passed(results));
  auto find = [&](Op op) {
    for (const CaseResult& r : results) {
      if (r.op == op && r.dtype == DType::kF32) return r;
    }
    return CaseResult{};
  };
  EXPECT_EQ(find(Op::kGeluForward).status, CaseStatus::kFail);
  EXPECT_THAT(find(Op::kGeluForward).detail, HasSubstr("output 'out' is off by"));
  EXPECT_EQ(find(Op::kGeluBackward).status, CaseStatus::kFail);
  EXPECT_THAT(find(Op::kGeluBackward).detail, HasSubstr("modified its input 'inp'"));
  EXPECT_EQ(find(Op::kResidualForward).status, CaseStatus::kFail);
  EXPECT_THAT(find(Op::kResidualForward).detail, HasSubstr("unwritten"));
  // What the backend does not claim is reported as unsupported, never as a pass.
  EXPECT_EQ(find(Op::kMatmulForward).status, CaseStatus::kUnsupported);
  const std::string matrix = format_conformance_matrix({{"faulty", results}});
  EXPECT_THAT(matrix, HasSubstr("FAIL"));
  EXPECT_THAT(matrix, HasSubstr("n/a"));
  EXPECT_THAT(matrix, HasSubstr("failures:"));
}

TEST(Dispatch, FallsBackToCpuAndSaysSoOnce) {
  FaultyDevice faulty;  // has no matmul
  Tensor inp = faulty.empty(DType::kF32, {2, 3});
  Tensor w = faulty.empty(DType::kF32, {4, 3});
  Tensor out = faulty.empty(DType::kF32, {2, 4});
  for (int i = 0; i < 6; ++i) inp.data_as<float>()[i] = static_cast<float>(i);
  for (int i = 0; i < 12; ++i) w.data_as<float>()[i] = i == 0 ? 1.0f : 0.0f;  // out[:, 0] = inp[:, 0]
  ::testing::internal::CaptureStderr();
  ops::matmul_forward(out, inp, w, Tensor());
  ops::matmul_forward(out, inp, w, Tensor());
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(out.data_as<float>()[4], 3.0f);
  EXPECT_EQ(out.data_as<float>()[5], 0.0f);
  EXPECT_THAT(log, HasSubstr("faulty:0 (backend 'faulty') has no matmul_forward for f32; running the cpu backend"));
  EXPECT_EQ(log.find("has no"), log.rfind("has no")) << "the fallback must be logged once: " << log;
}

TEST(Dispatch, UnsupportedEverywhereIsAnError) {
  auto dev = create_device(DeviceSpec{.backend = "cpu"});
  Tensor x = dev->empty(DType::kBF16, {4});
  // LayerNorm's backward has no bf16 kernel in any backend (LayerNorm runs in f32 in bf16 training too).
  EXPECT_THAT(testing_util::error_of([&] { ops::select_kernels(*dev, Op::kLayernormBackward, DType::kBF16); },
                                     ErrorCode::kUnsupported),
              HasSubstr("layernorm_backward in bf16 is not supported on device cpu:0"));
}

}  // namespace
}  // namespace h2

// The emulated chip: pacing arithmetic against a fake clock, profiles and their errors.
#include <set>

#include "core/clock.h"
#include "device/emu/device.h"
#include "device/key_recorder.h"
#include "device/registry.h"
#include "ops/cpu/kernels.h"
#include "ops/ops.h"
#include "test_util.h"

namespace h2 {
namespace {

using ::testing::HasSubstr;
using testing_util::error_of;

constexpr uint64_t kKey = 7;  // a kernel's shape key

// A clock that only moves when the pacer sleeps; `oversleep` is added to every sleep, as a real OS does.
struct FakeTime {
  double now = 0.0;
  double oversleep = 0.0;
  std::vector<double> sleeps;
  Pacer make(double speed, double bandwidth_gbps, std::shared_ptr<const KernelWork> reference = nullptr) {
    return Pacer(
        speed, bandwidth_gbps, [this] { return now; },
        [this](double s) {
          sleeps.push_back(s);
          now += s + oversleep;
        },
        std::move(reference));
  }
};

TEST(Pacer, HalfSpeedDoublesKernelTime) {
  FakeTime time;
  Pacer pacer = time.make(0.5, 0.0);
  pacer.after_kernel(kKey, 0.010, 0.010);  // a 10 ms kernel on the host should take 20 ms on a half-speed chip
  ASSERT_EQ(time.sleeps.size(), 1u);
  EXPECT_DOUBLE_EQ(time.sleeps[0], 0.010);
  EXPECT_DOUBLE_EQ(pacer.debt_seconds(), 0.0);
}

TEST(Pacer, SmallDebtsWaitForTheThresholdThenFlush) {
  FakeTime time;
  Pacer pacer = time.make(0.25, 0.0);
  pacer.after_kernel(kKey, 20e-6, 20e-6);  // owes 60 us: below the threshold, no sleep yet
  EXPECT_TRUE(time.sleeps.empty());
  EXPECT_NEAR(pacer.debt_seconds(), 60e-6, 1e-12);
  pacer.flush();
  ASSERT_EQ(time.sleeps.size(), 1u);
  EXPECT_NEAR(time.sleeps[0], 60e-6, 1e-12);
}

TEST(Pacer, OversleepIsPaidBackByLaterKernels) {
  FakeTime time;
  time.oversleep = 0.001;
  Pacer pacer = time.make(0.5, 0.0);
  pacer.after_kernel(kKey, 0.002, 0.002);  // owes 2 ms, sleeps 3 ms: 1 ms ahead
  EXPECT_NEAR(pacer.debt_seconds(), -0.001, 1e-12);
  pacer.after_kernel(kKey, 0.0005, 0.0005);  // owes 0.5 ms more: still ahead, no sleep
  EXPECT_EQ(time.sleeps.size(), 1u);
  EXPECT_NEAR(pacer.debt_seconds(), -0.0005, 1e-12);
}

// A measurement starts without the credit of the sleep before it: the 0.5 ms kernel, which owes 0.5 ms, sleeps it
// in full instead of taking it from the 1 ms the previous sleep overran (h2 profile's intervals; training keeps it).
TEST(Pacer, AnIntervalTimedOnItsOwnForgetsTheCredit) {
  FakeTime time;
  time.oversleep = 0.001;
  Pacer pacer = time.make(0.5, 0.0);
  pacer.after_kernel(kKey, 0.002, 0.002);
  EXPECT_NEAR(pacer.debt_seconds(), -0.001, 1e-12);
  pacer.forget_credit();
  EXPECT_EQ(pacer.debt_seconds(), 0.0);
  pacer.after_kernel(kKey + 1, 0.0005, 0.0005);
  pacer.flush();
  ASSERT_EQ(time.sleeps.size(), 2u);
  EXPECT_NEAR(time.sleeps[1], 0.0005, 1e-12);
  // A debt is not forgotten.
  pacer.forget_credit();
  pacer.after_kernel(kKey + 2, 0.00005, 0.00005);  // owes 50 us, below the threshold: no sleep
  pacer.forget_credit();
  EXPECT_NEAR(pacer.debt_seconds(), 0.00005, 1e-12);
}

// A loaded host: the kernel's 10 ms of work took 15 ms of wall time because other ranks shared its core. A
// half-speed chip takes 20 ms for it, so 5 ms remain to sleep, not 10: the kernel's time does not grow with the load.
TEST(Pacer, TimeSlicesGivenToOtherRanksCountTowardTheChipsTime) {
  FakeTime time;
  Pacer pacer = time.make(0.5, 0.0);
  pacer.after_kernel(kKey, 0.010, 0.015);
  ASSERT_EQ(time.sleeps.size(), 1u);
  EXPECT_NEAR(time.sleeps[0], 0.005, 1e-12);
  // Slowed beyond the chip's 20 ms (30 ms of wall time): nothing owed, and no credit taken to the next kernel,
  // which sleeps its own 10 ms.
  pacer.after_kernel(kKey, 0.010, 0.030);
  EXPECT_EQ(time.sleeps.size(), 1u);
  EXPECT_DOUBLE_EQ(pacer.debt_seconds(), 0.0);
  pacer.after_kernel(kKey, 0.010, 0.010);
  ASSERT_EQ(time.sleeps.size(), 2u);
  EXPECT_NEAR(time.sleeps[1], 0.010, 1e-12);
}

// Another rank in the caches: the same kernel (same shape key) did 15 ms of work where it once did 10. The chip
// would not see that rank, so it counts 10 ms of work: 20 ms at half speed, 5 ms to sleep. A kernel of another
// key is paced by its own work.
TEST(Pacer, AKernelsWorkIsTheLeastItsShapesHaveDone) {
  FakeTime time;
  Pacer pacer = time.make(0.5, 0.0);
  pacer.after_kernel(1, 0.010, 0.010);
  pacer.after_kernel(1, 0.015, 0.015);
  pacer.after_kernel(2, 0.015, 0.015);
  ASSERT_EQ(time.sleeps.size(), 3u);
  EXPECT_NEAR(time.sleeps[0], 0.010, 1e-12);
  EXPECT_NEAR(time.sleeps[1], 0.005, 1e-12);
  EXPECT_NEAR(time.sleeps[2], 0.015, 1e-12);
}

// A reference of kernel work (h2 profile's) fixes the work of the kernels it lists: key 1 did 10 ms in the profile;
// on a host slowed since (12 ms of work now, all its wall time) the half-speed chip still takes 20 ms — 8 ms to
// sleep —, and on one faster since (8 ms) too — 12 ms to sleep. Key 2, not listed, counts its own 15 ms times the
// drift, 10 / 8: 18.75 ms, 37.5 ms at half speed, 22.5 to sleep. least_work() reports what was measured (8 ms for
// key 1), not the reference.
TEST(Pacer, AReferenceFixesTheWorkOfTheKernelsItLists) {
  FakeTime time;
  Pacer pacer = time.make(0.5, 0.0, std::make_shared<const KernelWork>(KernelWork{{1, 0.010}}));
  pacer.after_kernel(1, 0.012, 0.012);
  pacer.after_kernel(1, 0.008, 0.008);
  pacer.after_kernel(2, 0.015, 0.015);
  ASSERT_EQ(time.sleeps.size(), 3u);
  EXPECT_NEAR(time.sleeps[0], 0.008, 1e-12);
  EXPECT_NEAR(time.sleeps[1], 0.012, 1e-12);
  EXPECT_NEAR(time.sleeps[2], 0.0225, 1e-12);
  EXPECT_EQ(pacer.least_work(), (KernelWork{{1, 0.008}, {2, 0.015}}));
}

// A kernel over which the thread's CPU clock did not advance (zero work: seen on a 2-core VM for kernels of up to
// 17 us) counts its wall time, 2 ms: 4 ms at half speed, 2 ms to sleep; its least work is 2 ms, not zero, which
// would pace it as free and which a cluster file's kernel_work refuses.
TEST(Pacer, AKernelWithNoCpuTimeCountsItsWallTime) {
  FakeTime time;
  Pacer pacer = time.make(0.5, 0.0);
  pacer.after_kernel(1, 0.0, 0.002);
  ASSERT_EQ(time.sleeps.size(), 1u);
  EXPECT_NEAR(time.sleeps[0], 0.002, 1e-12);
  EXPECT_EQ(pacer.least_work(), (KernelWork{{1, 0.002}}));
}

// What the reference does not list keeps its proportion to what it lists: key 1, listed at 10 ms, did 20 ms here
// (the host at half the profile's speed: drift 0.5), so key 2's 30 ms count 15 — 60 ms at quarter speed, 30 ms to
// sleep. Key 1 at 16 ms later moves the drift to 10 / 16: key 2 then counts 18.75 ms, 75 ms at quarter speed.
TEST(Pacer, KernelsTheReferenceDoesNotListFollowTheDriftOfThoseItDoes) {
  FakeTime time;
  Pacer pacer = time.make(0.25, 0.0, std::make_shared<const KernelWork>(KernelWork{{1, 0.010}}));
  EXPECT_DOUBLE_EQ(pacer.drift(), 1.0);
  pacer.after_kernel(1, 0.020, 0.020);
  EXPECT_DOUBLE_EQ(pacer.drift(), 0.5);
  pacer.after_kernel(2, 0.030, 0.030);
  ASSERT_EQ(time.sleeps.size(), 2u);
  EXPECT_NEAR(time.sleeps[0], 0.020, 1e-12);  // key 1: 40 ms at quarter speed, 20 taken
  EXPECT_NEAR(time.sleeps[1], 0.030, 1e-12);
  pacer.after_kernel(1, 0.016, 0.016);  // 40 ms again: 24 to sleep
  EXPECT_DOUBLE_EQ(pacer.drift(), 0.625);
  pacer.after_kernel(2, 0.030, 0.030);
  ASSERT_EQ(time.sleeps.size(), 4u);
  EXPECT_NEAR(time.sleeps[3], 0.045, 1e-12);
  // Without a reference there is no drift: key 2 counts its own 30 ms.
  FakeTime plain_time;
  Pacer plain = plain_time.make(0.25, 0.0);
  plain.after_kernel(2, 0.030, 0.030);
  EXPECT_DOUBLE_EQ(plain.drift(), 1.0);
  EXPECT_NEAR(plain_time.sleeps[0], 0.090, 1e-12);
}

// A listed kernel that every rank runs at once (the optimizer step's) counts its reference work but leaves the drift
// alone: its least work beside the other ranks' streams says nothing of the host's speed. Key 3 listed at 20 ms,
// run together in 40 ms: 80 ms at quarter speed, 40 to sleep, drift still 1; key 1 (10 ms listed, 20 done) then sets
// it to 0.5, and the unlisted key 2's 30 ms counts 15: 60 ms, 30 to sleep.
TEST(Pacer, KernelsRunTogetherDoNotMoveTheDrift) {
  FakeTime time;
  Pacer pacer = time.make(0.25, 0.0, std::make_shared<const KernelWork>(KernelWork{{1, 0.010}, {3, 0.020}}));
  pacer.after_kernel(3, 0.040, 0.040, /*together=*/true);
  EXPECT_DOUBLE_EQ(pacer.drift(), 1.0);
  pacer.after_kernel(1, 0.020, 0.020);
  EXPECT_DOUBLE_EQ(pacer.drift(), 0.5);
  pacer.after_kernel(2, 0.030, 0.030);
  ASSERT_EQ(time.sleeps.size(), 3u);
  EXPECT_NEAR(time.sleeps[0], 0.040, 1e-12);
  EXPECT_NEAR(time.sleeps[1], 0.020, 1e-12);
  EXPECT_NEAR(time.sleeps[2], 0.030, 1e-12);
  // Key 3 run apart from the others (10 ms, its least now) counts from then on: (10 + 20) / (20 + 10).
  pacer.after_kernel(3, 0.010, 0.010);
  EXPECT_DOUBLE_EQ(pacer.drift(), 1.0);
}

// An emulated device reports the least work of the kernels it ran, one entry per shape key; another backend none.
TEST(EmuDevice, ReportsTheLeastWorkOfItsKernels) {
  EmuProfile profile;
  profile.speed = 1.0;
  profile.mem_capacity_bytes = size_t{64} << 20;
  auto emu = make_emu_device(0, profile);
  const Tensor a = emu->zeros(DType::kF32, {64, 64}), b = emu->zeros(DType::kF32, {64, 64});
  const Tensor out = emu->empty(DType::kF32, {64, 64});
  ops::matmul_forward(out, a, b, Tensor());
  ops::matmul_forward(out, a, b, Tensor());
  const KernelWork work = emu_least_work(*emu);
  ASSERT_EQ(work.size(), 1u);
  EXPECT_GT(work.begin()->second, 0.0);
  auto cpu = create_device(DeviceSpec{.backend = "cpu"});
  EXPECT_TRUE(emu_least_work(*cpu).empty());
}

// One 64 x 64 matmul on `dev`: the kernel the pacing tests below list in a reference.
void one_matmul(Device& dev) {
  const Tensor a = dev.zeros(DType::kF32, {64, 64}), b = dev.zeros(DType::kF32, {64, 64});
  ops::matmul_forward(dev.empty(DType::kF32, {64, 64}), a, b, Tensor());
}

// `profile` with a reference that lists one_matmul's kernel at `seconds` of work (its key found on a probe device).
EmuProfile listing_one_matmul(EmuProfile profile, double seconds) {
  auto probe = make_emu_device(0, profile);
  one_matmul(*probe);
  const KernelWork work = emu_least_work(*probe);
  EXPECT_EQ(work.size(), 1u);
  if (!work.empty())
    profile.reference_work = std::make_shared<const KernelWork>(KernelWork{{work.begin()->first, seconds}});
  return profile;
}

// A kernel launched all ranks at once (Device::AllRanksAtOnce: the optimizer step's) leaves the device's drift
// alone; launched otherwise, a kernel its reference lists at a nanosecond moves it to a nanosecond over its least
// work here (far below 1). Without a reference the drift stays 1; a device that is not emulated has none.
TEST(EmuDevice, KernelsLaunchedAllRanksAtOnceLeaveTheDriftAlone) {
  EmuProfile profile;
  profile.mem_capacity_bytes = size_t{64} << 20;
  auto unlisted = make_emu_device(0, profile);
  one_matmul(*unlisted);
  EXPECT_EQ(emu_drift(*unlisted), 1.0);
  auto listed = make_emu_device(1, listing_one_matmul(profile, 1e-9));
  {
    const Device::AllRanksAtOnce together(*listed);
    one_matmul(*listed);
  }
  EXPECT_EQ(emu_drift(*listed), 1.0);
  one_matmul(*listed);
  EXPECT_LT(emu_drift(*listed), 1e-3);
  EXPECT_EQ(emu_drift(*create_device(DeviceSpec{.backend = "cpu"})), 1.0);
}

// While it sleeps to pace a kernel, an emulated chip runs the launching thread's work (Device::set_while_busy: a
// communicator's progress) about every millisecond: a kernel listed at 20 ms of work on a half-speed chip sleeps
// about 40 ms, in slices with the work between them, and still takes its 40 ms.
TEST(EmuDevice, RunsTheThreadsWorkWhileItSleeps) {
  EmuProfile profile;
  profile.speed = 0.5;
  profile.mem_capacity_bytes = size_t{64} << 20;
  auto dev = make_emu_device(1, listing_one_matmul(profile, 0.020));
  int calls = 0;
  dev->set_while_busy([&calls] { ++calls; });
  const Tensor a = dev->zeros(DType::kF32, {64, 64}), b = dev->zeros(DType::kF32, {64, 64});
  const Tensor out = dev->empty(DType::kF32, {64, 64});
  const int before = calls;  // the zeros' copies may have slept a little
  const double t0 = monotonic_seconds();
  ops::matmul_forward(out, a, b, Tensor());
  dev->synchronize();
  EXPECT_GE(monotonic_seconds() - t0, 0.039);
  EXPECT_GE(calls - before, 5);
}

// What the pacing's least work is kept by: the same op on the same shapes has one key; another shape, another op or
// another dtype has its own.
TEST(ShapeKey, NamesTheOpItsShapesAndItsDtype) {
  KeyRecorder dev;
  {
    const Tensor a = dev.zeros(DType::kF32, {4, 8}), b = dev.zeros(DType::kF32, {4, 8});
    const Tensor c = dev.zeros(DType::kF32, {8, 4}), h = dev.zeros(DType::kBF16, {4, 8});
    ops::scale(a, 2.0f);
    ops::scale(b, 3.0f);             // same op, same shape: same key
    ops::scale(c, 2.0f);             // same elements, another shape
    ops::residual_forward(a, b, a);  // another op on the first shapes
    ops::convert(h, a);              // another op, a bf16 argument
    ops::convert(a, h);              // the dtypes the other way round
  }
  const std::vector<uint64_t> keys = dev.keys();
  ASSERT_EQ(keys.size(), 6u);
  EXPECT_EQ(keys[0], keys[1]);
  EXPECT_EQ(std::set<uint64_t>({keys[0], keys[2], keys[3], keys[4], keys[5]}).size(), 5u);
}

TEST(Pacer, CopiesFollowTheBandwidth) {
  FakeTime time;
  Pacer pacer = time.make(1.0, 2.0);    // 2 GB/s
  pacer.after_copy(4'000'000, 0.0005);  // 4 MB should take 2 ms; the host took 0.5 ms
  ASSERT_EQ(time.sleeps.size(), 1u);
  EXPECT_NEAR(time.sleeps[0], 0.0015, 1e-12);
  pacer.after_copy(1000, 0.001);  // the host was slower than the chip: nothing owed
  EXPECT_EQ(time.sleeps.size(), 1u);
}

TEST(EmuProfiles, LoadsTheShippedExample) {
  const auto profiles =
      load_emu_profiles(ConfigNode::load_file(std::string(H2_SOURCE_DIR) + "/examples/emu_chips.yaml"));
  ASSERT_EQ(profiles.size(), 4u);
  EXPECT_EQ(profiles[0].numerics, Numerics::kExact);
  EXPECT_EQ(profiles[2].numerics, Numerics::kBf16Matmul);
  EXPECT_EQ(profiles[3].numerics, Numerics::kBf16Accumulate);
  EXPECT_EQ(profiles[1].chip, "slow-big");
  EXPECT_DOUBLE_EQ(profiles[1].speed, 0.5);
  EXPECT_EQ(profiles[1].mem_capacity_bytes, size_t{1024} << 20);
  EXPECT_EQ(find_emu_profile(profiles, "fast-small", "f").chip, "fast-small");
  EXPECT_THAT(
      error_of([&] { find_emu_profile(profiles, "tpu", "chips.yaml"); }, ErrorCode::kNotFound),
      HasSubstr("chips.yaml: no chip named 'tpu'; the file defines: fast-small, slow-big, bf16-vendor, faulty"));
}

TEST(EmuProfiles, BadFieldsAreNamed) {
  auto load = [](const std::string& text) { return load_emu_profiles(ConfigNode::parse_string(text, "c.yaml")); };
  EXPECT_THAT(error_of([&] { load("chips:\n  - {name: a, speed: 2.0, memory_mib: 1}\n"); }, ErrorCode::kConfig),
              HasSubstr("field 'chips[0].speed': must be in (0, 1]"));
  EXPECT_THAT(error_of([&] { load("chips:\n  - {name: a, speed: 1, memory_mib: -4}\n"); }, ErrorCode::kConfig),
              HasSubstr("field 'chips[0].memory_mib': must be an integer in [1, 1073741824], got -4"));
  EXPECT_THAT(
      error_of([&] { load("chips:\n  - {name: a, speed: 1, memory_mib: 4, numerics: fp8}\n"); }, ErrorCode::kConfig),
      HasSubstr("field 'chips[0].numerics': must be exact, bf16_matmul, bf16_accumulate or softmax_without_max"));
  EXPECT_THAT(error_of([&] { load("chips:\n  - {name: a, sped: 1, memory_mib: 4}\n"); }, ErrorCode::kConfig),
              HasSubstr("did you mean 'speed'"));
  EXPECT_THAT(error_of(
                  [&] {
                    load(
                        "chips:\n  - {name: a, speed: 1, memory_mib: 4}\n  - {name: a, speed: 1, "
                        "memory_mib: 4}\n");
                  },
                  ErrorCode::kConfig),
              HasSubstr("defined twice"));
  EXPECT_THAT(error_of([&] { load("chips: []\n"); }, ErrorCode::kConfig), HasSubstr("lists no chips"));
}

TEST(EmuDevice, TakesItsPropertiesFromTheProfile) {
  EmuProfile p{.chip = "small", .speed = 0.5, .mem_capacity_bytes = 4096, .mem_bandwidth_gbps = 3.0};
  auto dev = create_device(DeviceSpec{.backend = "emu", .index = 1, .emu = p});
  EXPECT_TRUE(dev->props().emulated);
  EXPECT_EQ(dev->props().chip, "small");
  EXPECT_EQ(dev->props().mem_capacity_bytes, 4096u);
  EXPECT_THAT(error_of([&] { dev->empty(DType::kF32, {2048}); }, ErrorCode::kOutOfMemory),
              HasSubstr("emu:1 (chip 'small')"));
}

}  // namespace
}  // namespace h2

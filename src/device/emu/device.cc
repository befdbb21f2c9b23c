// The `emu` device and its pacer (see device.h for how pacing works and where it is not faithful).
#include "device/emu/device.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <thread>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"

namespace h2 {
namespace {

void sleep_seconds(double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }

// CPU seconds of the calling thread.
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

class EmuDevice final : public Device {
 public:
  EmuDevice(int index, const EmuProfile& profile)
      : Device(DeviceProps{.name = cat("emu:", index),
                           .backend = "emu",
                           .chip = profile.chip,
                           .mem_capacity_bytes = profile.mem_capacity_bytes,
                           .compute_speed = profile.speed,
                           .mem_bandwidth_gbps = profile.mem_bandwidth_gbps,
                           .emulated = true}),
        pacer_(
            profile.speed, profile.mem_bandwidth_gbps, monotonic_seconds, [this](double s) { idle(s); },
            profile.reference_work),
        kernels_(cpu_kernels_with(profile.numerics)) {
    if (!profile.announce) return;
    log_warn("device ", name(), " is an EMULATED '", profile.chip, "' chip running on this host's CPU: speed ",
             profile.speed, "x the host, memory capped at ", format_bytes(profile.mem_capacity_bytes),
             profile.mem_bandwidth_gbps > 0 ? cat(", copies at ", profile.mem_bandwidth_gbps, " GB/s") : "",
             ". Timings follow the profile, not real hardware.");
  }

  const Kernels& kernels() const override { return kernels_; }

  // A kernel that runs on this thread alone is timed by the thread's CPU time, so time slices given to other
  // ranks sharing its core do not count as the emulated chip's work; a multi-threaded kernel by the wall clock.
  // Kernels launched all ranks at once (the optimizer step's) are Pacer::after_kernel's `together`.
  void launch(const char* /*op_name*/, uint64_t shape_key, const std::function<void()>& kernel) override {
    const bool one_thread = omp_get_max_threads() == 1;
    const double w0 = monotonic_seconds(), c0 = one_thread ? thread_cpu_seconds() : w0;
    kernel();
    const double wall = monotonic_seconds() - w0;
    pacer_.after_kernel(shape_key, one_thread ? thread_cpu_seconds() - c0 : wall, wall, all_ranks_at_once());
  }
  void copy_h2d(void* dst, const void* src, size_t bytes) override {
    timed_copy(bytes, [&] { Device::copy_h2d(dst, src, bytes); });
  }
  void copy_d2h(void* dst, const void* src, size_t bytes) override {
    timed_copy(bytes, [&] { Device::copy_d2h(dst, src, bytes); });
  }
  void copy_d2d(void* dst, const void* src, size_t bytes) override {
    timed_copy(bytes, [&] { Device::copy_d2d(dst, src, bytes); });
  }
  void fill_zero(void* dst, size_t bytes) override {
    timed_copy(bytes, [&] { Device::fill_zero(dst, bytes); });
  }
  void synchronize() override { pacer_.flush(); }
  void start_interval() override {
    pacer_.flush();
    pacer_.forget_credit();
  }
  const Pacer& pacer() const { return pacer_; }

 private:
  // The pacer's sleep: in slices of a millisecond with while_busy()'s work between them, when there is any
  // (2026-12-07: without it, a stage's activations of 256 KiB, sent by UCX's rendezvous, reached the next stage
  // only when the sender next waited on a message — after its following micro-batch's forward, 100-200 ms later).
  void idle(double seconds) {
    const std::function<void()>& work = while_busy();
    if (!work) return sleep_seconds(seconds);
    constexpr double kSlice = 1e-3;
    const double end = monotonic_seconds() + seconds;
    for (double left = seconds; left > 0; left = end - monotonic_seconds()) {
      work();
      sleep_seconds(std::min(left, kSlice));
    }
  }

  template <typename Fn>
  void timed_copy(size_t bytes, Fn&& fn) {
    const double t0 = monotonic_seconds();
    fn();
    pacer_.after_copy(bytes, monotonic_seconds() - t0);
  }

  Pacer pacer_;
  const Kernels& kernels_;
};

}  // namespace

Pacer::Pacer(double speed, double bandwidth_gbps, Clock clock, Sleep sleep, std::shared_ptr<const KernelWork> reference)
    : speed_(speed),
      bandwidth_gbps_(bandwidth_gbps),
      clock_(std::move(clock)),
      sleep_(std::move(sleep)),
      reference_(std::move(reference)) {
  H2_CHECK(speed > 0.0 && speed <= 1.0) << "speed " << speed;
}

// The kernel's wall time beyond its work (time slices given to other threads) pays for its idle time first; a
// kernel slowed beyond its chip's time may cancel debt still unpaid but does not put the chip ahead.
void Pacer::after_kernel(uint64_t shape_key, double work_seconds, double wall_seconds, bool together) {
  // A thread's CPU clock may not advance over a kernel of several microseconds (seen on a 2-core VM: zero in most
  // profiles, for kernels of up to 17 us wall): such a kernel counts its wall time. A least work of zero would pace
  // it as free, and h2 profile would write a kernel work that cluster files refuse.
  if (!(work_seconds > 0.0)) work_seconds = wall_seconds;
  Least& least = least_work_.try_emplace(shape_key, Least{.work = work_seconds}).first->second;
  least.work = std::min(least.work, work_seconds);
  double work = least.work * drift();
  if (reference_) {
    if (const auto listed = reference_->find(shape_key); listed != reference_->end()) {
      work = listed->second;
      if (!together) {
        if (least.in_drift < 0) listed_reference_ += listed->second;
        listed_least_ += least.work - std::max(least.in_drift, 0.0);
        least.in_drift = least.work;
      }
    }
  }
  const double owed = work / speed_ - wall_seconds;
  debt_seconds_ = std::max(debt_seconds_ + owed, std::min(debt_seconds_, 0.0));
  pay(kMinSleepSeconds);
}

KernelWork Pacer::least_work() const {
  KernelWork out;
  for (const auto& [key, least] : least_work_) out.emplace(key, least.work);
  return out;
}

void Pacer::after_copy(size_t bytes, double host_seconds) {
  if (bandwidth_gbps_ > 0.0) {
    const double target = static_cast<double>(bytes) / (bandwidth_gbps_ * 1e9);
    if (target > host_seconds) debt_seconds_ += target - host_seconds;
  }
  pay(kMinSleepSeconds);
}

void Pacer::flush() { pay(0.0); }

void Pacer::pay(double threshold_seconds) {
  if (debt_seconds_ <= threshold_seconds || debt_seconds_ <= 0.0) return;
  const double t0 = clock_();
  sleep_(debt_seconds_);
  debt_seconds_ -= clock_() - t0;
}

std::vector<EmuProfile> load_emu_profiles(const ConfigNode& root) {
  root.allow_only({"chips"});
  std::vector<EmuProfile> profiles;
  for (const ConfigNode& chip : root.at("chips").items()) {
    chip.allow_only({"name", "speed", "memory_mib", "memory_bandwidth_gbps", "numerics"});
    EmuProfile p;
    p.chip = chip.get<std::string>("name");
    if (p.chip.empty()) chip.at("name").fail("must not be empty");
    for (const EmuProfile& other : profiles) {
      if (other.chip == p.chip) chip.at("name").fail(cat("chip '", p.chip, "' is defined twice"));
    }
    p.speed = chip.get<double>("speed");
    if (!(p.speed > 0.0 && p.speed <= 1.0)) {
      chip.at("speed").fail(cat("must be in (0, 1], got ", p.speed,
                                ". Speeds are relative to this host: scale all chips so the fastest is 1.0"));
    }
    p.mem_capacity_bytes = static_cast<size_t>(chip.int_in("memory_mib", 1, int64_t{1} << 30)) << 20;
    p.mem_bandwidth_gbps = chip.number_in("memory_bandwidth_gbps", 0.0, 0.0, 1e6);  // 0: host speed
    if (auto n = chip.find("numerics")) {
      const std::optional<Numerics> v = parse_numerics(n->as_string());
      if (!v) n->fail("must be exact, bf16_matmul, bf16_accumulate or softmax_without_max");
      p.numerics = *v;
    }
    profiles.push_back(p);
  }
  if (profiles.empty()) root.at("chips").fail("lists no chips");
  return profiles;
}

EmuProfile find_emu_profile(const std::vector<EmuProfile>& profiles, const std::string& chip, const std::string& file) {
  std::string known;
  for (const EmuProfile& p : profiles) {
    if (p.chip == chip) return p;
    known += (known.empty() ? "" : ", ") + p.chip;
  }
  throw Error(ErrorCode::kNotFound, cat(file, ": no chip named '", chip, "'; the file defines: ", known));
}

std::unique_ptr<Device> make_emu_device(int index, const EmuProfile& profile) {
  return std::make_unique<EmuDevice>(index, profile);
}

KernelWork emu_least_work(const Device& device) {
  const auto* emu = dynamic_cast<const EmuDevice*>(&device);
  return emu ? emu->pacer().least_work() : KernelWork{};
}

double emu_drift(const Device& device) {
  const auto* emu = dynamic_cast<const EmuDevice*>(&device);
  return emu ? emu->pacer().drift() : 1.0;
}

}  // namespace h2

// The `emu` device: an emulated chip. It runs the cpu backend's kernels on this host, refuses allocations
// past the capacity of the chip it emulates, and paces its work so that op times follow the chip's profile.
// This is how a heterogeneous cluster is reproduced on one machine (docs/architecture.md); it is an emulation and says
// so.
//
// How pacing works. A profile gives the chip's speed relative to this host's cpu backend (0 < speed <= 1) and
// optionally its copy bandwidth. After each kernel the device measures the kernel's work t (the calling thread's
// CPU time when kernels run single-threaded, OMP_NUM_THREADS=1, else wall time; but at most the least work this
// device has seen a kernel with the same shape key do — ranks sharing the host's caches and memory bandwidth make
// the CPU time itself longer, which a chip of its own would not see) and the wall time w it took: the chip would
// have taken t / speed, so it owes t / speed - w seconds of idle time — time slices the host gave to other ranks
// meanwhile (w > t) count toward it, so a kernel's time does not depend on how loaded the host is while
// w <= t / speed (a kernel slowed beyond that owes nothing, and takes no credit from later kernels). After
// each copy of n bytes that took t, it owes max(0, n / bandwidth - t). The debt is paid by sleeping (never by
// spinning, so idle emulated chips leave the cores to the others) once it exceeds kMinSleepSeconds, and what the
// sleep really took is subtracted, so oversleeping is paid back by later kernels. synchronize() pays the whole
// debt, so time measured between two synchronize() calls follows the profile.
//
// Where it stops being faithful:
//  - Speeds above 1.0 cannot be emulated (the host cannot run faster than itself); profiles are normalised so
//    the fastest chip is 1.0, and loading a profile with speed > 1 is an error.
//  - Every kernel is slowed by the same factor. A real chip's ratio differs per op (compute- vs memory-bound).
//  - Contention is absorbed only up to a slowdown of 1 / speed, and only once a kernel of the same shapes has run
//    alone: the first calls, and a kernel that never runs without contention, are paced as measured. A
//    multi-threaded kernel's work is its wall time, which grows with the load. Keep (busy ranks x threads per
//    rank) <= cores for faithful ratios; sleeping ranks do not count as busy.
//  - Sleeps are paid in slices of at least kMinSleepSeconds: single ops shorter than that are timed only on
//    aggregate, over many ops.
//
// A reference of kernel work (EmuProfile::reference_work: what `h2 profile` measured on this host, carried in the
// profiled cluster file) fixes t for the kernels it lists: a kernel of a listed key counts the listed work, however
// long it took now, so a run paces those kernels as the profile measured them even when the host has slowed or sped
// up since (shared hosts drift by up to 9% within an hour: docs/pipeline.md). A kernel it does not list counts its
// least work times the listed kernels' reference work over their least work here (Pacer::drift: the host now, other
// ranks in its caches included, against the profile), so that it keeps its proportion to the listed ones.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/config.h"
#include "device/device.h"
#include "ops/cpu/variants.h"

namespace h2 {

// Host seconds of work per kernel shape key (Device::launch's key): what a kernel of that key does on this host.
using KernelWork = std::map<uint64_t, double>;

struct EmuProfile {
  std::string chip = "emu";                          // the chip type this emulates
  double speed = 1.0;                                // compute speed relative to this host's cpu backend, in (0, 1]
  size_t mem_capacity_bytes = 0;                     // the chip's memory
  double mem_bandwidth_gbps = 0;                     // copy bandwidth; 0 = as fast as the host copies
  Numerics numerics = Numerics::kExact;              // how its kernels round (ops/cpu/variants.h)
  std::shared_ptr<const KernelWork> reference_work;  // the work its listed kernels count (see above); null: none
  bool announce = true;  // warn at creation that it is emulated (off for h2 profile's devices: the profile says so)
};

// Reads `chips:` from a chip-profile file (see examples/emu_chips.yaml); errors name the file, line and field.
std::vector<EmuProfile> load_emu_profiles(const ConfigNode& root);
EmuProfile find_emu_profile(const std::vector<EmuProfile>& profiles, const std::string& chip, const std::string& file);

// Turns measured host times into the idle time an emulated chip owes, and pays it by sleeping.
class Pacer {
 public:
  static constexpr double kMinSleepSeconds = 200e-6;
  using Clock = std::function<double()>;      // seconds on a monotonic clock
  using Sleep = std::function<void(double)>;  // sleep about this many seconds
  Pacer(double speed, double bandwidth_gbps, Clock clock, Sleep sleep,
        std::shared_ptr<const KernelWork> reference = nullptr);

  // A kernel of `shape_key` did `work_seconds` of work on the host (its CPU time; when that is zero, its wall time)
  // in `wall_seconds`; its work counts as the reference's for that key, else as the least a kernel of that key has
  // done times drift(). A kernel that every rank runs at once (`together`: the optimizer step's, which start
  // together after the gradient norm's all-reduce) does not count toward drift(): its least work here is its work
  // beside the other ranks' streams, not the host's speed.
  void after_kernel(uint64_t shape_key, double work_seconds, double wall_seconds, bool together = false);
  // The listed kernels' reference work over their least work here, each listed key counted once it has run apart
  // from the other ranks (not `together`); 1 before any has, or without a reference.
  double drift() const { return listed_least_ > 0.0 ? listed_reference_ / listed_least_ : 1.0; }
  // A copy of `bytes` took `host_seconds` on the host.
  void after_copy(size_t bytes, double host_seconds);
  // Pays the whole debt now.
  void flush();
  // Drops any credit (time slept beyond the debt, which later kernels would otherwise get back).
  void forget_credit() { debt_seconds_ = std::max(debt_seconds_, 0.0); }
  double debt_seconds() const { return debt_seconds_; }
  // The least work each key's kernels have done here (measured, whatever the reference says).
  KernelWork least_work() const;

 private:
  void pay(double threshold_seconds);

  double speed_;
  double bandwidth_gbps_;
  Clock clock_;
  Sleep sleep_;
  double debt_seconds_ = 0.0;
  std::shared_ptr<const KernelWork> reference_;
  struct Least {
    double work = 0;       // the least work a kernel of the key has done here
    double in_drift = -1;  // what drift()'s sums hold of it; -1 until it runs apart from the other ranks
  };
  std::unordered_map<uint64_t, Least> least_work_;      // per shape key
  double listed_reference_ = 0.0, listed_least_ = 0.0;  // over the listed keys that have run: drift()'s sums
};

std::unique_ptr<Device> make_emu_device(int index, const EmuProfile& profile);
// The least work each kernel shape has done on `device` so far (Pacer::least_work); empty for a device that is
// not emulated.
KernelWork emu_least_work(const Device& device);
// How the host runs the kernels `device`'s reference lists against when they were profiled (Pacer::drift: their
// reference work over their least work here; above 1, the host is faster now); 1 for a device that is not emulated,
// has no reference or has run none of its kernels.
double emu_drift(const Device& device);

}  // namespace h2

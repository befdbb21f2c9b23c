// The conformance suite: the promise that the same program gives the same numbers on every chip.
// It runs every op x dtype x several shapes (odd sizes, 1-sized dimensions) on a device and on the `ref`
// device, on the same fresh random inputs, and for each case checks that
//   - every element of every assigned output was written (outputs are poisoned with NaN first),
//   - no input was modified,
//   - every output (assigned, accumulated or updated in place) is within the op's tolerance of ref, by
//     normalised error ||out - ref|| / ||ref|| (tolerances: one table, conformance.cc).
// An op the backend does not support is reported as such, never as a pass. This is what a chip vendor runs
// on a new backend: `h2 check ops --backend NAME`.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "device/device.h"
#include "device/emu/device.h"
#include "ops/kernels.h"

namespace h2 {

enum class CaseStatus { kPass, kFail, kUnsupported };

struct CaseResult {
  Op op;
  DType dtype;
  std::string shape;  // "N=17 C=65"
  CaseStatus status;
  double error = 0.0;  // worst normalised error over the case's outputs
  double tolerance = 0.0;
  std::string detail;  // why it failed
};

struct ConformanceOptions {
  uint64_t seed = 1234;
};

// Runs every case on `device`, with `reference` (a ref device) computing the expected values. Error(kInvalidArgument)
// when `device` runs the reference's own kernels: the reference is anchored by gradient checks, not by itself.
std::vector<CaseResult> run_conformance(Device& device, Device& reference, const ConformanceOptions& options);

// The tolerance on normalised error for an op in a dtype.
double conformance_tolerance(Op op, DType dtype);

// One row per (op, dtype) and one column per device: "pass 3.1e-08", "FAIL 2.0e-03", "n/a".
struct ConformanceColumn {
  std::string backend;
  std::vector<CaseResult> results;
};
std::string format_conformance_matrix(const std::vector<ConformanceColumn>& columns);
bool all_passed(const std::vector<CaseResult>& results);

// `h2 check ops`: one column per named backend (emu devices emulate `emu`; the default profile when absent),
// each against a ref device. `ref` itself is skipped with a note on `log`, which also hears which device is being
// checked. Returns the columns; the matrix passes when every column does.
std::vector<ConformanceColumn> check_backends(const std::vector<std::string>& backends,
                                              const std::optional<EmuProfile>& emu, const ConformanceOptions& options,
                                              const std::function<void(const std::string&)>& log);

}  // namespace h2

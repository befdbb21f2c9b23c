// Precision alignment (`h2 align`): the same batch through the same weights on two devices — two backends, two
// emulated chip types, or an emulated chip with other numerics (ops/cpu/variants.h) — comparing every operator's
// forward output, layer by layer, and every parameter's gradient, by normalised error ||a - b|| / ||b|| (the
// conformance suite's metric) against that operator's tolerance (ops/conformance.h's one table). The first row
// over its tolerance and well over the error it inherited, in the order the operators ran, is where the two devices
// part.
#pragma once

#include <string>
#include <vector>

#include "device/device.h"
#include "model/gpt.h"

namespace h2 {

struct AlignRow {
  std::string name;  // e.g. "h.0.attn.c_attn (forward)", "h.1.mlp.c_fc.weight (gradient)"
  std::string op;    // the operator that produced it, e.g. "matmul_forward"
  double error = 0;  // normalised error of device a's value against device b's
  double tolerance = 0;
  double inherited = 0;  // the largest error of the rows before it: what reached this operator through its inputs
  // Over its tolerance and not merely inherited (more than kGrowth times what came in): an operator is named for
  // error it adds, not for its inputs' (a residual sum of two inputs that differ by 1e-7 differs by about that).
  static constexpr double kGrowth = 10;
  bool exceeds() const { return !(error <= tolerance) && !(error <= kGrowth * inherited); }  // NaN exceeds
};

struct AlignReport {
  std::vector<AlignRow> rows;  // forward outputs in execution order, then gradients in the order backward made them
  int first_divergence = -1;   // the first row over its tolerance, or -1
  float loss_a = 0, loss_b = 0;
};

// Builds the model on both devices with the weights of `seed`, runs one forward and backward on B x T tokens
// drawn from `seed` in `precision` (both sides: chips compared in the precision training runs in), and compares.
// An output kept in bf16 (an activation inside a block, gpt.h) may differ by one bf16 rounding of inputs that differ in
// f32's last bits: its tolerance is at least kBf16Storage.
inline constexpr double kBf16Storage = 1.0 / 256;  // 2^-8: one bf16 ulp, relative
AlignReport align_devices(const GptConfig& config, Device& a, Device& b, int B, int T, uint64_t seed,
                          Precision precision = Precision::kF32);

// The table h2 align prints, naming the first operator and layer that exceeds its tolerance (or saying none does).
std::string format_alignment(const AlignReport& report, const std::string& a, const std::string& b);

}  // namespace h2

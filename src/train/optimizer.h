// The optimizer step, written once for every trainer (single device, pipeline stage, h2 profile's measurement):
// the global gradient norm, clipping (Pascanu et al. 2013) and AdamW with decoupled weight decay on matrices only
// (Loshchilov & Hutter 2019; GPT-2 / nanoGPT leave biases and LayerNorm parameters undecayed).
//
// A distributed trainer passes the part of the flat parameters it updates (ZeRO-1: its shard), which gradients
// its norm counts (each tensor once over all ranks), and the sum of the squared norm over its ranks.
#pragma once

#include <cstdint>
#include <functional>

#include "core/tensor.h"
#include "model/gpt.h"
#include "ops/kernels.h"

namespace h2 {

// The AdamW moments, laid out like the flat parameters (or the part of them a rank updates).
struct OptimizerState {
  Tensor m, v;
};

struct OptimizerStepOptions {
  double max_norm = 1.0;    // clip the global gradient norm to this; 0 = no clipping
  int64_t lo = 0, hi = -1;  // the flat parameter range to update, [lo, hi); hi = -1: to the end
  // Which gradients the norm counts (all when null); only their part within [lo, hi) is read here.
  std::function<bool(const Gpt::Param&)> counted;
  // Sums the local squared norm over the ranks that share the model (none: this rank alone).
  std::function<double(double)> sum_over_ranks;
};

// One step: the norm of the counted gradients in [lo, hi) summed over the ranks, the clip factor applied to the
// gradients in [lo, hi), AdamW on that range with `state` holding its moments. Returns the global norm; throws
// Error(kInternal) naming the fix when it is not finite. `acc` is one f32 on the model's device (scratch).
double optimizer_step(Gpt& model, const OptimizerState& state, const AdamwParams& hp, const Tensor& acc,
                      const OptimizerStepOptions& options = {});

// The step's two halves, for a rank that holds several models (interleaved pipeline chunks) and sums their norms
// before one reduction over the ranks: the squared norm of `model`'s counted gradients in [lo, hi) (this rank's
// share, not summed), and, given the global norm, clipping and AdamW on [lo, hi) (Error(kInternal) when the
// norm is not finite). optimizer_step is the first, options.sum_over_ranks, then the second.
double local_norm_squared(Gpt& model, const Tensor& acc, const OptimizerStepOptions& options = {});
void clip_and_update(Gpt& model, const OptimizerState& state, const AdamwParams& hp, double norm,
                     const OptimizerStepOptions& options = {});

}  // namespace h2

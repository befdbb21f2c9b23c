// The optimizer step (see optimizer.h).
#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "device/device.h"
#include "ops/ops.h"

namespace h2 {

namespace {

int64_t end_of(Gpt& model, const OptimizerStepOptions& o) { return o.hi < 0 ? model.num_params() : o.hi; }

// Each parameter's part within [lo, hi), as a flat range.
void for_each_part(Gpt& model, const OptimizerStepOptions& o,
                   const std::function<void(const Gpt::Param&, int64_t, int64_t)>& fn) {
  const int64_t lo = o.lo, hi = end_of(model, o);
  H2_CHECK(0 <= lo && lo <= hi && hi <= model.num_params()) << "range [" << lo << ", " << hi << ")";
  int64_t offset = 0;
  for (const Gpt::Param& p : model.params()) {
    const int64_t a = std::max(offset, lo), b = std::min(offset + p.value.numel(), hi);
    if (a < b) fn(p, a, b);
    offset += p.value.numel();
  }
}

}  // namespace

double local_norm_squared(Gpt& model, const Tensor& acc, const OptimizerStepOptions& o) {
  const Tensor& grads = model.flat_grads();
  const float zero = 0.0f;
  copy_from_host(acc, &zero);
  const Device::AllRanksAtOnce together(acc.device());
  for_each_part(model, o, [&](const Gpt::Param& p, int64_t a, int64_t b) {
    if (!o.counted || o.counted(p)) ops::global_norm_squared(acc, grads.slice(a, b));
  });
  float local = 0;
  copy_to_host(&local, acc);
  return local;
}

void clip_and_update(Gpt& model, const OptimizerState& state, const AdamwParams& hp, double norm,
                     const OptimizerStepOptions& o) {
  if (!std::isfinite(norm)) {
    throw Error(ErrorCode::kInternal,
                cat("the gradient norm is not finite (", norm, "); lower optim.lr or set optim.grad_clip"));
  }
  const Tensor& params = model.flat_params();
  const Tensor& grads = model.flat_grads();
  const int64_t lo = o.lo, hi = end_of(model, o);
  H2_CHECK(state.m.numel() >= hi - lo) << "moments hold " << state.m.numel() << " of " << hi - lo;
  const Device::AllRanksAtOnce together(params.device());
  if (o.max_norm > 0 && norm > o.max_norm && hi > lo) {
    ops::scale(grads.slice(lo, hi), static_cast<float>(o.max_norm / norm));
  }
  // AdamW, decaying matrices only.
  for_each_part(model, o, [&](const Gpt::Param& p, int64_t a, int64_t b) {
    AdamwParams param_hp = hp;
    if (!p.weight_decay) param_hp.weight_decay = 0.0f;
    ops::adamw_update(params.slice(a, b), state.m.slice(a - lo, b - lo), state.v.slice(a - lo, b - lo),
                      grads.slice(a, b), param_hp);
  });
  model.parameters_changed();
}

double optimizer_step(Gpt& model, const OptimizerState& state, const AdamwParams& hp, const Tensor& acc,
                      const OptimizerStepOptions& o) {
  const double local = local_norm_squared(model, acc, o);
  const double norm = std::sqrt(o.sum_over_ranks ? o.sum_over_ranks(local) : local);
  clip_and_update(model, state, hp, norm, o);
  return norm;
}

}  // namespace h2

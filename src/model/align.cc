// h2 align (see align.h).
#include "model/align.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "core/rng.h"
#include "ops/conformance.h"

namespace h2 {
namespace {

std::vector<float> host(const Tensor& t) {
  if (t.dtype() == DType::kBF16) {  // an activation kept in bf16 (gpt.h)
    std::vector<bf16_t> low(static_cast<size_t>(t.numel()));
    copy_to_host(low.data(), t);
    return widen_bf16(low.data(), t.numel());
  }
  std::vector<float> out(static_cast<size_t>(t.numel()));
  copy_to_host(out.data(), t);
  return out;
}

// ||a - b|| / ||b|| (in double); 0 when both are zero.
double normalised_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    diff += d * d;
    ref += static_cast<double>(b[i]) * b[i];
  }
  if (diff == 0) return 0;
  return std::sqrt(diff) / std::max(std::sqrt(ref), 1e-30);
}

// The operator whose backward computes a parameter's gradient.
Op gradient_op(const std::string& name) {
  if (name.find("ln_") != std::string::npos) return Op::kLayernormBackward;
  if (name == "wte.weight" || name == "wpe.weight") return Op::kEncoderBackward;
  return Op::kMatmulBackward;
}

}  // namespace

AlignReport align_devices(const GptConfig& config, Device& a, Device& b, int B, int T, uint64_t seed,
                          Precision precision) {
  Rng rng(seed);
  std::vector<int32_t> tokens(static_cast<size_t>(B) * T), targets(tokens.size());
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(config.vocab_size)));
  for (int32_t& t : targets) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(config.vocab_size)));
  struct Side {
    Gpt& model;
    std::vector<std::vector<float>> outputs, grads;
    float loss = 0;
  };
  const auto run = [&](Device& dev, Side& side) {
    side.model.init(seed);
    Tensor in = dev.empty(DType::kI32, {B, T}), tgt = dev.empty(DType::kI32, {B, T});
    copy_from_host(in, tokens.data());
    copy_from_host(tgt, targets.data());
    side.model.zero_grads();
    side.model.forward(in);
    for (const Gpt::NamedOutput& o : side.model.forward_outputs()) side.outputs.push_back(host(o.value));
    side.loss = side.model.loss(tgt);
    side.model.backward();
    for (const Gpt::Param& p : side.model.params()) side.grads.push_back(host(p.grad));
  };
  const ActivationPolicy policy{.precision = precision};
  Gpt model_a(config, a, GptRange::whole(config), B, T, {}, policy),
      model_b(config, b, GptRange::whole(config), B, T, {}, policy);
  Side sa{model_a, {}, {}, 0}, sb{model_b, {}, {}, 0};
  run(a, sa);
  run(b, sb);
  AlignReport report;
  report.loss_a = sa.loss;
  report.loss_b = sb.loss;
  const std::vector<Gpt::NamedOutput> names = sa.model.forward_outputs();
  for (size_t i = 0; i < names.size(); ++i) {
    const double tolerance = conformance_tolerance(names[i].op, DType::kF32);
    report.rows.push_back({names[i].name + " (forward)", op_name(names[i].op),
                           normalised_error(sa.outputs[i], sb.outputs[i]),
                           names[i].value.dtype() == DType::kBF16 ? std::max(tolerance, kBf16Storage) : tolerance});
  }
  // Backward makes the gradients from the last parameter to the first.
  const std::vector<Gpt::Param>& params = sa.model.params();
  for (size_t i = params.size(); i-- > 0;) {
    const Op op = gradient_op(params[i].name);
    report.rows.push_back({params[i].name + " (gradient)", op_name(op), normalised_error(sa.grads[i], sb.grads[i]),
                           conformance_tolerance(op, DType::kF32)});
  }
  double upstream = 0;
  for (size_t i = 0; i < report.rows.size(); ++i) {
    report.rows[i].inherited = upstream;
    upstream = std::max(upstream, report.rows[i].error);
    if (report.first_divergence < 0 && report.rows[i].exceeds()) report.first_divergence = static_cast<int>(i);
  }
  return report;
}

std::string format_alignment(const AlignReport& r, const std::string& a, const std::string& b) {
  std::string out = cat("alignment of ", a, " against ", b, ": loss ", r.loss_a, " vs ", r.loss_b, "\n");
  char line[256];
  std::snprintf(line, sizeof(line), "%-34s %-22s %12s %10s %10s\n", "output", "operator", "norm. error", "tolerance",
                "inherited");
  out += line;
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const AlignRow& row = r.rows[i];
    std::snprintf(line, sizeof(line), "%-34s %-22s %12.3e %10.1e %10.1e%s\n", row.name.c_str(), row.op.c_str(),
                  row.error, row.tolerance, row.inherited, row.exceeds() ? "  <- diverges" : "");
    out += line;
  }
  if (r.first_divergence < 0) {
    out += "no divergence: every output and gradient is within its operator's tolerance or what it inherited\n";
  } else {
    const AlignRow& row = r.rows[static_cast<size_t>(r.first_divergence)];
    out += cat("first divergence: ", row.name, " (", row.op, "), normalised error ", row.error, " > tolerance ",
               row.tolerance, "\n");
  }
  return out;
}

}  // namespace h2

// The conformance harness (see conformance.h): case tables per op, the poison/compare machinery, the matrix.
#include "ops/conformance.h"

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>

#include "core/error.h"
#include "core/rng.h"
#include "device/registry.h"
#include "ops/ops.h"

namespace h2 {
namespace {

// Normalised-error tolerances, one row per op; `bf16` applies to ops that take bf16 tensors.
// f32 rows: the cpu kernels accumulate in f32 over at most a few thousand terms, so relative errors stay
// near sqrt(terms) * 6e-8; 1e-5 leaves a margin without hiding a wrong formula (those err by > 1e-2).
// bf16 rows: one rounding to an 8-bit mantissa (relative 2^-9 = 2e-3 at worst, less on average).
struct ToleranceRow {
  Op op;
  double f32;
  double bf16;
};
constexpr ToleranceRow kTolerances[] = {
    {Op::kEncoderForward, 1e-6, 0},        // one addition per element
    {Op::kEncoderBackward, 1e-6, 0},       // sums over repeated tokens
    {Op::kLayernormForward, 1e-5, 0},      //
    {Op::kLayernormBackward, 1e-5, 0},     // dweight/dbias sum over rows
    {Op::kMatmulForward, 1e-5, 1e-5},      // sgemm blocking changes the summation order; bf16: exact products, f32 sums
    {Op::kMatmulBackward, 1e-5, 1e-5},     // bf16: dout rounded alike on both sides, so the same exact products
    {Op::kAttentionForward, 1e-5, 5e-4},   // vectorised exp: ~1 ulp; bf16: an output's rounding may differ by one
                                           // ulp (2^-8) here and there; P V from unrounded P is off by 2.5e-3
    {Op::kAttentionBackward, 1e-5, 1e-5},  // bf16: the same bf16 inputs on both sides, f32 gradients
    {Op::kGeluForward, 1e-5, 4e-3},        // vectorised tanh: absolute error ~1e-7
    {Op::kGeluBackward, 1e-5, 1e-5},       // bf16: a bf16 input, f32 gradients
    {Op::kResidualForward, 1e-7, 4e-3},    // f32: exact; bf16: a double rounding can differ by one ulp
    {Op::kCrossentropyForwardBackward, 1e-5, 0},
    {Op::kCrossentropyStats, 1e-5, 0},     // vectorised exp: ~1 ulp
    {Op::kCrossentropyBackward, 1e-5, 0},  //
    {Op::kAdamwUpdate, 1e-5, 0},           // a division by sqrt(v): relative error grows where v is small
    {Op::kGlobalNormSquared, 1e-6, 0},     //
    {Op::kScale, 1e-7, 0},                 // exact
    {Op::kConvert, 0, 0},                  // both round to nearest even: bitwise equal
};

enum class Role { kIn, kOut, kAccum, kInOut };
enum class Fill { kNormal, kPositive, kTokens, kTargets, kCausalProbs };

struct ArgSpec {
  std::string name;
  Role role;
  DType dtype;
  Shape shape;
  Fill fill = Fill::kNormal;
  int64_t token_limit = 0;  // kTokens, kTargets: values in [0, token_limit)
};

struct Case {
  std::string shape;
  std::vector<ArgSpec> args;
  std::function<void(const std::vector<Tensor>&)> run;
};

struct OpCases {
  Op op;
  std::function<std::vector<Case>(DType)> make;
};

ArgSpec in(std::string name, Shape shape, Fill fill = Fill::kNormal) {
  return {std::move(name), Role::kIn, DType::kF32, shape, fill};
}
ArgSpec out(std::string name, Shape shape) { return {std::move(name), Role::kOut, DType::kF32, shape}; }
ArgSpec accum(std::string name, Shape shape) { return {std::move(name), Role::kAccum, DType::kF32, shape}; }
ArgSpec inout(std::string name, Shape shape, Fill fill = Fill::kNormal) {
  return {std::move(name), Role::kInOut, DType::kF32, shape, fill};
}
ArgSpec tokens(std::string name, Shape shape, int64_t limit, Fill fill = Fill::kTokens) {
  return {std::move(name), Role::kIn, DType::kI32, shape, fill, limit};
}
ArgSpec with_dtype(ArgSpec a, DType dtype) {
  a.dtype = dtype;
  return a;
}

// The cases of every op. Shapes include 1-sized and odd dimensions, and attention lengths past one tile.
const std::vector<OpCases>& op_cases() {
  static const std::vector<OpCases> table = {
      // The whole table, and a vocabulary-parallel shard (rows [V/3, V/3 + V/2) of V, no positions: another TP rank
      // of the group adds them).
      {Op::kEncoderForward,
       [](DType) {
         std::vector<Case> cases;
         for (auto [B, T, C, V] : {std::array<int64_t, 4>{1, 1, 1, 3}, {2, 5, 7, 11}, {3, 17, 33, 50}}) {
           cases.push_back(
               {cat("B=", B, " T=", T, " C=", C, " V=", V),
                {out("out", {B, T, C}), tokens("tokens", {B, T}, V), in("wte", {V, C}), in("wpe", {T + 1, C})},
                [](auto& t) { ops::encoder_forward(t[0], t[1], t[2], t[3]); }});
           const int64_t lo = V / 3, rows = std::max<int64_t>(1, V / 2);
           cases.push_back({cat("B=", B, " T=", T, " C=", C, " V=", V, " shard [", lo, ", ", lo + rows, ")"),
                            {out("out", {B, T, C}), tokens("tokens", {B, T}, V), in("wte", {rows, C})},
                            [lo, V](auto& t) { ops::encoder_forward(t[0], t[1], t[2], Tensor(), lo, V); }});
         }
         return cases;
       }},
      {Op::kEncoderBackward,
       [](DType) {
         std::vector<Case> cases;
         for (auto [B, T, C, V] : {std::array<int64_t, 4>{1, 1, 1, 3}, {2, 5, 7, 4}, {3, 17, 33, 50}}) {
           cases.push_back(
               {cat("B=", B, " T=", T, " C=", C, " V=", V),
                {accum("dwte", {V, C}), accum("dwpe", {T, C}), in("dout", {B, T, C}), tokens("tokens", {B, T}, V)},
                [](auto& t) { ops::encoder_backward(t[0], t[1], t[2], t[3]); }});
           const int64_t lo = V / 3, rows = std::max<int64_t>(1, V / 2);
           cases.push_back({cat("B=", B, " T=", T, " C=", C, " V=", V, " shard [", lo, ", ", lo + rows, ")"),
                            {accum("dwte", {rows, C}), in("dout", {B, T, C}), tokens("tokens", {B, T}, V)},
                            [lo, V](auto& t) { ops::encoder_backward(t[0], Tensor(), t[1], t[2], lo, V); }});
         }
         return cases;
       }},
      {Op::kLayernormForward,
       [](DType) {
         std::vector<Case> cases;
         for (auto [N, C] : {std::array<int64_t, 2>{1, 1}, {3, 7}, {17, 65}, {64, 768}}) {
           cases.push_back({cat("N=", N, " C=", C),
                            {out("out", {N, C}), out("mean", {N}), out("rstd", {N}), in("inp", {N, C}),
                             in("weight", {C}), in("bias", {C})},
                            [](auto& t) { ops::layernorm_forward(t[0], t[1], t[2], t[3], t[4], t[5]); }});
         }
         return cases;
       }},
      {Op::kLayernormBackward,
       [](DType) {
         std::vector<Case> cases;
         for (auto [N, C] : {std::array<int64_t, 2>{1, 1}, {3, 7}, {17, 65}, {64, 768}}) {
           cases.push_back({cat("N=", N, " C=", C),
                            {out("dinp", {N, C}), accum("dweight", {C}), accum("dbias", {C}), in("dout", {N, C}),
                             in("inp", {N, C}), in("weight", {C}), in("mean", {N}), in("rstd", {N}, Fill::kPositive)},
                            [](auto& t) { ops::layernorm_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]); }});
         }
         return cases;
       }},
      // bf16: inp and weight in bf16, out and bias f32; odd C, a reduction of several 768-element blocks, and
      // tails past the kernel's 8 x 48 tiles.
      {Op::kMatmulForward,
       [](DType dtype) {
         std::vector<Case> cases;
         for (auto [N, C, OC, bias] : {std::array<int64_t, 4>{1, 1, 1, 1},
                                       {3, 5, 7, 0},
                                       {17, 33, 65, 1},
                                       {64, 128, 96, 1},
                                       {41, 1537, 100, 1}}) {
           std::vector<ArgSpec> args = {out("out", {N, OC}), with_dtype(in("inp", {N, C}), dtype),
                                        with_dtype(in("weight", {OC, C}), dtype)};
           if (bias) args.push_back(in("bias", {OC}));
           cases.push_back({cat("N=", N, " C=", C, " OC=", OC, bias ? "" : " no-bias"), args,
                            [](auto& t) { ops::matmul_forward(t[0], t[1], t[2], t.size() > 3 ? t[3] : Tensor()); }});
         }
         return cases;
       }},
      // bf16: inp and weight in bf16, the gradients f32. The last two cases reduce over several stretches of the
      // bf16 kernel's pairs (dweight over N = 801 rows, dinp over OC = 4100 channels) and give dweight more rows
      // than the kernel packs at once (4,100 > 4,096).
      {Op::kMatmulBackward,
       [](DType dtype) {
         std::vector<Case> cases;
         for (auto [N, C, OC, bias] : {std::array<int64_t, 4>{1, 1, 1, 1},
                                       {3, 5, 7, 0},
                                       {17, 33, 65, 1},
                                       {64, 128, 96, 1},
                                       {801, 21, 50, 1},
                                       {9, 10, 4100, 1}}) {
           std::vector<ArgSpec> args = {out("dinp", {N, C}), accum("dweight", {OC, C}), in("dout", {N, OC}),
                                        with_dtype(in("inp", {N, C}), dtype), with_dtype(in("weight", {OC, C}), dtype)};
           if (bias) args.push_back(accum("dbias", {OC}));
           cases.push_back({cat("N=", N, " C=", C, " OC=", OC, bias ? "" : " no-bias"), args, [](auto& t) {
                              ops::matmul_backward(t[0], t[1], t.size() > 5 ? t[5] : Tensor(), t[2], t[3], t[4]);
                            }});
         }
         // A backward split into its two products (zero-bubble schedules): the input gradient alone, then the
         // weight's and the bias's alone.
         for (auto [N, C, OC] : {std::array<int64_t, 3>{3, 5, 7}, {801, 21, 50}}) {
           cases.push_back({cat("N=", N, " C=", C, " OC=", OC, " dinp only"),
                            {out("dinp", {N, C}), in("dout", {N, OC}), with_dtype(in("inp", {N, C}), dtype),
                             with_dtype(in("weight", {OC, C}), dtype)},
                            [](auto& t) { ops::matmul_backward(t[0], Tensor(), Tensor(), t[1], t[2], t[3]); }});
           cases.push_back({cat("N=", N, " C=", C, " OC=", OC, " dweight only"),
                            {accum("dweight", {OC, C}), accum("dbias", {OC}), in("dout", {N, OC}),
                             with_dtype(in("inp", {N, C}), dtype), with_dtype(in("weight", {OC, C}), dtype)},
                            [](auto& t) { ops::matmul_backward(Tensor(), t[0], t[1], t[2], t[3], t[4]); }});
         }
         return cases;
       }},
      // bf16: qkv, att and out in bf16 (dqkv and dout stay f32).
      {Op::kAttentionForward,
       [](DType dtype) {
         std::vector<Case> cases;
         for (auto [B, T, C, NH] :
              {std::array<int64_t, 4>{1, 1, 4, 1}, {2, 5, 12, 3}, {1, 67, 32, 4}, {2, 130, 16, 2}}) {
           cases.push_back({cat("B=", B, " T=", T, " C=", C, " NH=", NH),
                            {with_dtype(out("out", {B, T, C}), dtype), with_dtype(out("att", {B, NH, T, T}), dtype),
                             with_dtype(in("qkv", {B, T, 3 * C}), dtype)},
                            [NH](auto& t) { ops::attention_forward(t[0], t[1], t[2], static_cast<int>(NH)); }});
         }
         return cases;
       }},
      {Op::kAttentionBackward,
       [](DType dtype) {
         std::vector<Case> cases;
         for (auto [B, T, C, NH] :
              {std::array<int64_t, 4>{1, 1, 4, 1}, {2, 5, 12, 3}, {1, 67, 32, 4}, {2, 130, 16, 2}}) {
           cases.push_back(
               {cat("B=", B, " T=", T, " C=", C, " NH=", NH),
                {out("dqkv", {B, T, 3 * C}), in("dout", {B, T, C}), with_dtype(in("qkv", {B, T, 3 * C}), dtype),
                 with_dtype(in("att", {B, NH, T, T}, Fill::kCausalProbs), dtype)},
                [NH](auto& t) { ops::attention_backward(t[0], t[1], t[2], t[3], static_cast<int>(NH)); }});
         }
         return cases;
       }},
      {Op::kGeluForward,
       [](DType dtype) {
         std::vector<Case> cases;
         for (int64_t N : {1, 7, 1000, 4099}) {
           cases.push_back({cat("N=", N),
                            {with_dtype(out("out", {N}), dtype), with_dtype(in("inp", {N}), dtype)},
                            [](auto& t) { ops::gelu_forward(t[0], t[1]); }});
         }
         return cases;
       }},
      {Op::kGeluBackward,
       [](DType dtype) {
         std::vector<Case> cases;
         for (int64_t N : {1, 7, 1000, 4099}) {
           cases.push_back({cat("N=", N),
                            {out("dinp", {N}), with_dtype(in("inp", {N}), dtype), in("dout", {N})},
                            [](auto& t) { ops::gelu_backward(t[0], t[1], t[2]); }});
         }
         return cases;
       }},
      {Op::kResidualForward,
       [](DType dtype) {
         std::vector<Case> cases;
         for (int64_t N : {1, 7, 1000, 4099}) {
           cases.push_back({cat("N=", N),
                            {with_dtype(out("out", {N}), dtype), with_dtype(in("inp1", {N}), dtype),
                             with_dtype(in("inp2", {N}), dtype)},
                            [](auto& t) { ops::residual_forward(t[0], t[1], t[2]); }});
         }
         return cases;
       }},
      {Op::kCrossentropyForwardBackward,
       [](DType) {
         std::vector<Case> cases;
         for (auto [N, V] : {std::array<int64_t, 2>{1, 1}, {3, 7}, {9, 1000}, {4, 5003}}) {
           cases.push_back({cat("N=", N, " V=", V),
                            {out("losses", {N}), out("dlogits", {N, V}), in("logits", {N, V}),
                             tokens("targets", {N}, V, Fill::kTargets)},
                            [N](auto& t) { ops::crossentropy_forward_backward(t[0], t[1], t[2], t[3], 1.0f / N); }});
         }
         return cases;
       }},
      // A shard of rows [V/4, V/4 + Vr) of a vocabulary of V, and the whole vocabulary.
      {Op::kCrossentropyStats,
       [](DType) {
         std::vector<Case> cases;
         for (auto [N, V, Vr] : {std::array<int64_t, 3>{1, 1, 1}, {3, 7, 7}, {9, 1000, 500}, {4, 5003, 1251}}) {
           const int64_t lo = std::min(V / 4, V - Vr);
           cases.push_back({cat("N=", N, " V=", V, " rows [", lo, ", ", lo + Vr, ")"),
                            {out("maxes", {N}), out("sums", {N}), out("target_logits", {N}), in("logits", {N, Vr}),
                             tokens("targets", {N}, V, Fill::kTargets)},
                            [lo, V](auto& t) { ops::crossentropy_stats(t[0], t[1], t[2], t[3], t[4], lo, V); }});
         }
         return cases;
       }},
      {Op::kCrossentropyBackward,
       [](DType) {
         std::vector<Case> cases;
         for (auto [N, V, Vr] : {std::array<int64_t, 3>{1, 1, 1}, {3, 7, 7}, {9, 1000, 500}, {4, 5003, 1251}}) {
           const int64_t lo = std::min(V / 4, V - Vr);
           cases.push_back(
               {cat("N=", N, " V=", V, " rows [", lo, ", ", lo + Vr, ")"),
                {out("dlogits", {N, Vr}), in("logits", {N, Vr}), in("maxes", {N}), in("sums", {N}, Fill::kPositive),
                 tokens("targets", {N}, V, Fill::kTargets)},
                [lo, V, N](auto& t) { ops::crossentropy_backward(t[0], t[1], t[2], t[3], t[4], lo, V, 1.0f / N); }});
         }
         return cases;
       }},
      {Op::kAdamwUpdate,
       [](DType) {
         std::vector<Case> cases;
         for (int64_t N : {1, 7, 1000, 5003}) {
           cases.push_back({cat("N=", N),
                            {inout("params", {N}), inout("m", {N}), inout("v", {N}, Fill::kPositive), in("grads", {N})},
                            [](auto& t) {
                              AdamwParams hp{.lr = 1e-3f, .weight_decay = 0.1f, .step = 3};
                              ops::adamw_update(t[0], t[1], t[2], t[3], hp);
                            }});
         }
         return cases;
       }},
      {Op::kGlobalNormSquared,
       [](DType) {
         std::vector<Case> cases;
         for (int64_t N : {1, 7, 1000, 5003}) {
           cases.push_back({cat("N=", N), {accum("out", {1}), in("inp", {N})}, [](auto& t) {
                              ops::global_norm_squared(t[0], t[1]);
                            }});
         }
         return cases;
       }},
      {Op::kScale,
       [](DType) {
         std::vector<Case> cases;
         for (int64_t N : {1, 7, 1000, 5003}) {
           cases.push_back({cat("N=", N), {inout("x", {N})}, [](auto& t) { ops::scale(t[0], 0.37f); }});
         }
         return cases;
       }},
      {Op::kConvert,
       [](DType dtype) {
         std::vector<Case> cases;
         for (int64_t N : {1, 7, 1000, 5003}) {
           cases.push_back({cat("N=", N, " f32->", dtype_name(dtype)),
                            {with_dtype(out("out", {N}), dtype), in("inp", {N})},
                            [](auto& t) { ops::convert(t[0], t[1]); }});
           if (dtype != DType::kF32) {
             cases.push_back({cat("N=", N, " ", dtype_name(dtype), "->f32"),
                              {out("out", {N}), with_dtype(in("inp", {N}), dtype)},
                              [](auto& t) { ops::convert(t[0], t[1]); }});
           }
         }
         return cases;
       }},
  };
  return table;
}

// Host copies of a case's arguments, made once from the seed and used for both devices.
std::vector<std::vector<unsigned char>> make_inputs(const std::vector<ArgSpec>& args, uint64_t seed) {
  std::vector<std::vector<unsigned char>> data;
  for (size_t i = 0; i < args.size(); ++i) {
    const ArgSpec& a = args[i];
    Rng rng(seed * 1000003u + i);
    const int64_t n = a.shape.numel();
    std::vector<double> values(static_cast<size_t>(n));
    if (a.fill == Fill::kCausalProbs) {  // rows of causal softmax probabilities over the last two dimensions
      const int64_t T = a.shape[a.shape.rank() - 1];
      for (int64_t r = 0; r < n / T; ++r) {
        const int64_t t = r % T;
        double sum = 0.0;
        for (int64_t t2 = 0; t2 <= t; ++t2) sum += (values[static_cast<size_t>(r * T + t2)] = rng.uniform() + 0.1);
        for (int64_t t2 = 0; t2 <= t; ++t2) values[static_cast<size_t>(r * T + t2)] /= sum;
      }
    } else {
      for (double& v : values) {
        switch (a.fill) {
          case Fill::kNormal:
            v = rng.normal();
            break;
          case Fill::kPositive:
            v = 0.5 + rng.uniform() * 1.5;
            break;
          case Fill::kTokens:
            v = static_cast<double>(rng.below(static_cast<uint64_t>(a.token_limit)));
            break;
          case Fill::kTargets:  // about one in eight positions ignored
            v = rng.below(8) == 0 ? -1.0 : static_cast<double>(rng.below(static_cast<uint64_t>(a.token_limit)));
            break;
          case Fill::kCausalProbs:
            break;
        }
      }
    }
    std::vector<unsigned char> bytes(static_cast<size_t>(n) * dtype_size(a.dtype));
    for (int64_t j = 0; j < n; ++j) {
      const double v = values[static_cast<size_t>(j)];
      switch (a.dtype) {
        case DType::kF32: {
          const float f = static_cast<float>(v);
          std::memcpy(bytes.data() + j * 4, &f, 4);
          break;
        }
        case DType::kBF16: {
          const bf16_t h = f32_to_bf16(static_cast<float>(v));
          std::memcpy(bytes.data() + j * 2, &h, 2);
          break;
        }
        case DType::kI32: {
          const int32_t k = static_cast<int32_t>(v);
          std::memcpy(bytes.data() + j * 4, &k, 4);
          break;
        }
        case DType::kF64:
          std::memcpy(bytes.data() + j * 8, &v, 8);
          break;
      }
    }
    data.push_back(std::move(bytes));
  }
  return data;
}

double element(const std::vector<unsigned char>& bytes, DType dtype, size_t i) {
  switch (dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, bytes.data() + i * 4, 4);
      return f;
    }
    case DType::kBF16: {
      bf16_t h;
      std::memcpy(&h, bytes.data() + i * 2, 2);
      return bf16_to_f32(h);
    }
    case DType::kI32: {
      int32_t k;
      std::memcpy(&k, bytes.data() + i * 4, 4);
      return k;
    }
    case DType::kF64: {
      double d;
      std::memcpy(&d, bytes.data() + i * 8, 8);
      return d;
    }
  }
  return 0.0;
}

// Runs a case on a device and returns every argument's final bytes, or a failure message.
struct Run {
  std::vector<std::vector<unsigned char>> final;
  std::string failure;
};

Run run_case(Device& device, const Case& c, const std::vector<std::vector<unsigned char>>& inputs) {
  Run result;
  std::vector<Tensor> tensors;
  for (size_t i = 0; i < c.args.size(); ++i) {
    const ArgSpec& a = c.args[i];
    Tensor t = device.empty(a.dtype, a.shape);
    if (a.role == Role::kOut) {
      // Poison: all-ones bytes are a NaN in f32 and bf16, so an element the kernel forgets stays NaN.
      std::vector<unsigned char> poison(t.bytes(), 0xff);
      copy_from_host(t, poison.data());
    } else {
      copy_from_host(t, inputs[i].data());
    }
    tensors.push_back(t);
  }
  try {
    c.run(tensors);
    device.synchronize();
  } catch (const Error& e) {
    result.failure = cat("raised: ", e.what());
    return result;
  }
  for (size_t i = 0; i < c.args.size(); ++i) {
    std::vector<unsigned char> bytes(tensors[i].bytes());
    copy_to_host(bytes.data(), tensors[i]);
    const ArgSpec& a = c.args[i];
    if (a.role == Role::kIn && bytes != inputs[i] && result.failure.empty()) {
      result.failure = cat("modified its input '", a.name, "'");
    }
    if (a.role == Role::kOut && result.failure.empty()) {
      for (size_t j = 0; j < static_cast<size_t>(a.shape.numel()); ++j) {
        if (std::isnan(element(bytes, a.dtype, j))) {
          result.failure = cat("left element ", j, " of output '", a.name, "' unwritten (or NaN)");
          break;
        }
      }
    }
    result.final.push_back(std::move(bytes));
  }
  return result;
}

}  // namespace

double conformance_tolerance(Op op, DType dtype) {
  for (const ToleranceRow& row : kTolerances) {
    if (row.op == op) return dtype == DType::kBF16 ? row.bf16 : row.f32;
  }
  H2_CHECK(false) << "no tolerance row for " << op_name(op);
  return 0.0;
}

std::vector<CaseResult> run_conformance(Device& device, Device& reference, const ConformanceOptions& options) {
  if (&device.kernels() == &reference.kernels()) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("conformance: ", device.name(), " runs the reference's own kernels (", reference.kernels().name(),
                    "); comparing them with themselves proves nothing. The reference is checked against finite "
                    "differences and closed forms instead (tests/ops/gradcheck_test.cc)"));
  }
  std::vector<CaseResult> results;
  uint64_t case_seed = options.seed;
  for (const OpCases& entry : op_cases()) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      if (!reference.kernels().supports(entry.op, dtype)) continue;  // the op is not defined in this dtype
      for (const Case& c : entry.make(dtype)) {
        ++case_seed;
        CaseResult r{entry.op, dtype, c.shape, CaseStatus::kPass, 0.0, conformance_tolerance(entry.op, dtype), ""};
        if (!device.kernels().supports(entry.op, dtype)) {
          r.status = CaseStatus::kUnsupported;
          results.push_back(r);
          continue;
        }
        const auto inputs = make_inputs(c.args, case_seed);
        const Run expected = run_case(reference, c, inputs);
        H2_CHECK(expected.failure.empty())
            << "the ref backend failed " << op_name(entry.op) << " " << c.shape << ": " << expected.failure;
        const Run got = &device == &reference ? expected : run_case(device, c, inputs);
        if (!got.failure.empty()) {
          r.status = CaseStatus::kFail;
          r.detail = got.failure;
          results.push_back(r);
          continue;
        }
        for (size_t i = 0; i < c.args.size(); ++i) {
          const ArgSpec& a = c.args[i];
          if (a.role == Role::kIn) continue;
          double diff = 0.0, norm = 0.0;
          for (size_t j = 0; j < static_cast<size_t>(a.shape.numel()); ++j) {
            const double x = element(got.final[i], a.dtype, j), y = element(expected.final[i], a.dtype, j);
            diff += (x - y) * (x - y);
            norm += y * y;
          }
          const double err = std::isfinite(diff) ? std::sqrt(diff / std::max(norm, 1e-300)) : INFINITY;
          if (err > r.error || std::isnan(err)) r.error = err;
          if (!(err <= r.tolerance) && r.status == CaseStatus::kPass) {
            r.status = CaseStatus::kFail;
            r.detail = cat("output '", a.name, "' is off by ", err, " > tolerance ", r.tolerance);
          }
        }
        results.push_back(r);
      }
    }
  }
  return results;
}

bool all_passed(const std::vector<CaseResult>& results) {
  for (const CaseResult& r : results) {
    if (r.status == CaseStatus::kFail) return false;
  }
  return true;
}

std::string format_conformance_matrix(const std::vector<ConformanceColumn>& columns) {
  struct Cell {
    int cases = 0, failed = 0, unsupported = 0;
    double worst = 0.0;
    std::string detail;
  };
  // Rows in the op table's order; one cell per column.
  std::vector<std::pair<Op, DType>> rows;
  std::map<std::pair<int, int>, std::vector<Cell>> cells;
  for (size_t col = 0; col < columns.size(); ++col) {
    for (const CaseResult& r : columns[col].results) {
      const auto key = std::pair{static_cast<int>(r.op), static_cast<int>(r.dtype)};
      auto [it, inserted] = cells.try_emplace(key, std::vector<Cell>(columns.size()));
      if (inserted) rows.emplace_back(r.op, r.dtype);
      Cell& cell = it->second[col];
      ++cell.cases;
      if (r.status == CaseStatus::kUnsupported) ++cell.unsupported;
      if (r.status == CaseStatus::kFail) {
        if (cell.failed++ == 0) cell.detail = cat(r.shape, ": ", r.detail);
      }
      cell.worst = std::max(cell.worst, r.error);
    }
  }
  std::string out;
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%-30s %-5s", "op", "dtype");
  out += buf;
  for (const ConformanceColumn& c : columns) {
    std::snprintf(buf, sizeof(buf), " %-16s", c.backend.c_str());
    out += buf;
  }
  out += " tolerance\n";
  std::string failures;
  for (const auto& [op, dtype] : rows) {
    std::snprintf(buf, sizeof(buf), "%-30s %-5s", op_name(op), dtype_name(dtype));
    out += buf;
    const auto& row = cells[{static_cast<int>(op), static_cast<int>(dtype)}];
    for (size_t col = 0; col < columns.size(); ++col) {
      const Cell& cell = row[col];
      std::string text;
      if (cell.cases == 0 || cell.unsupported == cell.cases) {
        text = "n/a";
      } else if (cell.failed > 0) {
        std::snprintf(buf, sizeof(buf), "FAIL %.1e", cell.worst);
        text = buf;
        failures += cat("  ", columns[col].backend, " ", op_name(op), " ", dtype_name(dtype), " ", cell.detail, "\n");
      } else {
        std::snprintf(buf, sizeof(buf), "pass %.1e", cell.worst);
        text = buf;
      }
      std::snprintf(buf, sizeof(buf), " %-16s", text.c_str());
      out += buf;
    }
    std::snprintf(buf, sizeof(buf), " %.0e\n", conformance_tolerance(op, dtype));
    out += buf;
  }
  if (!failures.empty()) out += "failures:\n" + failures;
  return out;
}

std::vector<ConformanceColumn> check_backends(const std::vector<std::string>& backends,
                                              const std::optional<EmuProfile>& emu, const ConformanceOptions& options,
                                              const std::function<void(const std::string&)>& log) {
  if (backends.empty()) throw Error(ErrorCode::kInvalidArgument, "--backend lists no backend");
  auto reference = create_device(DeviceSpec{.backend = "ref"});
  std::vector<ConformanceColumn> columns;
  for (const std::string& name : backends) {
    if (name == "ref") {
      log("ref is the reference every backend is compared with; the test suite checks it against finite differences "
          "and closed forms (tests/ops/gradcheck_test.cc)");
      continue;
    }
    auto device = create_device(DeviceSpec{.backend = name, .emu = emu});
    log(cat("checking ", device->name(), " (", device->props().chip, ") ..."));
    columns.push_back({name, run_conformance(*device, *reference, options)});
  }
  return columns;
}

}  // namespace h2

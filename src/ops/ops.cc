// Argument checking and dispatch for every op (see ops.h).
#include "ops/ops.h"

#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "device/device.h"
#include "ops/cpu/kernels.h"

namespace h2::ops {
namespace {

// Collects an op's argument checks so every message starts with the op's name.
class Args {
 public:
  explicit Args(Op op) : op_(op) {}

  [[noreturn]] void fail(const std::string& message) const {
    throw Error(ErrorCode::kInvalidArgument, cat(op_name(op_), ": ", message));
  }
  void defined(const Tensor& t, const char* name) const {
    if (!t.defined()) fail(cat("argument '", name, "' is an undefined tensor"));
  }
  void dtype(const Tensor& t, const char* name, DType want) const {
    defined(t, name);
    if (t.dtype() != want) {
      fail(cat("argument '", name, "' is ", dtype_name(t.dtype()), " but must be ", dtype_name(want)));
    }
  }
  void numel(const Tensor& t, const char* name, int64_t want, const std::string& why) const {
    if (t.numel() != want) {
      fail(cat("argument '", name, "' has shape ", t.shape().str(), " (", t.numel(), " elements) but needs ", want,
               " elements (", why, ")"));
    }
  }
  void same_shape(const Tensor& t, const char* name, const Tensor& like, const char* like_name) const {
    defined(t, name);
    if (!(t.shape() == like.shape())) {
      fail(cat("argument '", name, "' has shape ", t.shape().str(), " but '", like_name, "' has shape ",
               like.shape().str(), "; they must match"));
    }
  }
  int64_t last_dim(const Tensor& t, const char* name) const {
    defined(t, name);
    if (t.shape().rank() < 1) fail(cat("argument '", name, "' must have at least one dimension"));
    return t.shape()[t.shape().rank() - 1];
  }
  int64_t dim(const Tensor& t, const char* name, int rank, int i) const {
    defined(t, name);
    if (t.shape().rank() != rank) {
      fail(cat("argument '", name, "' has shape ", t.shape().str(), " but must have ", rank, " dimensions"));
    }
    return t.shape()[i];
  }
  void positive(int64_t value, const char* what) const {
    if (value <= 0) fail(cat(what, " must be positive, got ", value));
  }
  // All tensors on one device; returns it.
  // The device of the arguments; their shapes and dtypes make the call's shape key (Device::launch).
  Device& device(std::initializer_list<const Tensor*> tensors) const {
    Device* dev = nullptr;
    shape_key_ = static_cast<uint64_t>(op_) + 1;
    const auto mix = [this](uint64_t v) { shape_key_ = (shape_key_ ^ v) * 0x100000001b3ULL; };  // FNV-1a's step
    for (const Tensor* t : tensors) {
      mix(t->defined() ? static_cast<uint64_t>(t->dtype()) + 1 : 0);
      if (!t->defined()) continue;
      for (int i = 0; i < t->shape().rank(); ++i) mix(static_cast<uint64_t>(t->shape()[i]));
      if (dev == nullptr) {
        dev = &t->device();
      } else if (dev != &t->device()) {
        fail(cat("arguments are on different devices (", dev->name(), " and ", t->device().name(),
                 "); copy them to one device first"));
      }
    }
    H2_CHECK(dev != nullptr);
    return *dev;
  }
  // Token ids must index a row of a (rows, ...) table; checked on host-addressable devices, where it is cheap.
  void token_range(const Tensor& tokens, const char* name, int64_t rows, bool allow_ignore) const {
    if (!tokens.device().props().host_addressable) return;
    const int32_t* ids = tokens.data_as<int32_t>();
    for (int64_t i = 0; i < tokens.numel(); ++i) {
      if ((ids[i] >= 0 && ids[i] < rows) || (allow_ignore && ids[i] == -1)) continue;
      fail(cat("argument '", name, "' element ", i, " is ", ids[i], ", outside [0, ", rows, ")",
               allow_ignore ? " and not -1 (ignore)" : ""));
    }
  }
  Op op() const { return op_; }
  uint64_t shape_key() const { return shape_key_; }

 private:
  Op op_;
  mutable uint64_t shape_key_ = 0;  // set by device()
};

int checked_int(const Args& a, int64_t value, const char* what) {
  if (value > INT32_MAX) a.fail(cat(what, " = ", value, " exceeds the kernels' 32-bit size limit"));
  return static_cast<int>(value);
}

void run(Device& dev, const Args& a, DType dtype, const std::function<void(const Kernels&)>& body) {
  const Kernels& kernels = select_kernels(dev, a.op(), dtype);
  dev.launch(op_name(a.op()), a.shape_key() ^ (static_cast<uint64_t>(dtype) << 56), [&] { body(kernels); });
}

}  // namespace

const Kernels& select_kernels(Device& device, Op op, DType dtype) {
  const Kernels& own = device.kernels();
  if (own.supports(op, dtype)) return own;
  const Kernels& cpu = cpu_kernels();
  if (!device.props().host_addressable || !cpu.supports(op, dtype)) {
    throw Error(ErrorCode::kUnsupported, cat(op_name(op), " in ", dtype_name(dtype), " is not supported on device ",
                                             device.name(), " (backend '", own.name(), "') nor by the cpu fallback"));
  }
  log_once(LogLevel::kInfo, cat("fallback:", device.name(), ":", op_name(op), ":", dtype_name(dtype)),
           cat("device ", device.name(), " (backend '", own.name(), "') has no ", op_name(op), " for ",
               dtype_name(dtype), "; running the cpu backend's kernel instead"));
  return cpu;
}

namespace {
// The embedding ops' shapes: tokens (B,T), table (Vr,C) holding rows [vocab_start, vocab_start + Vr) of a vocabulary
// of vocab_size (-1: the table is all of it), positions (maxT,C) or undefined.
struct EncoderDims {
  int64_t B, T, C, Vr, V;
};
EncoderDims encoder_dims(const Args& a, const Tensor& tokens, const Tensor& table, const char* table_name,
                         const Tensor& positions, const char* positions_name, int64_t vocab_start, int64_t vocab_size) {
  a.dtype(tokens, "tokens", DType::kI32);
  a.dtype(table, table_name, DType::kF32);
  const int64_t B = a.dim(tokens, "tokens", 2, 0), T = a.dim(tokens, "tokens", 2, 1);
  const int64_t Vr = a.dim(table, table_name, 2, 0), C = table.shape()[1];
  a.positive(C, cat("channels C (", table_name, "'s second dimension)").c_str());
  const int64_t V = vocab_size < 0 ? Vr : vocab_size;
  if (vocab_start < 0 || vocab_start + Vr > V) {
    a.fail(cat("'", table_name, "' holds rows [", vocab_start, ", ", vocab_start + Vr, ") of a vocabulary of ", V));
  }
  if (positions.defined()) {
    a.dtype(positions, positions_name, DType::kF32);
    if (a.dim(positions, positions_name, 2, 1) != C) {
      a.fail(cat("'", positions_name, "' has shape ", positions.shape().str(), " but '", table_name, "' has C = ", C));
    }
    if (positions.shape()[0] < T) {
      a.fail(cat("sequence length T = ", T, " exceeds the ", positions.shape()[0], " rows of '", positions_name, "'"));
    }
  }
  a.token_range(tokens, "tokens", V, false);
  return {B, T, C, Vr, V};
}
}  // namespace

void encoder_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int64_t vocab_start,
                     int64_t vocab_size) {
  Args a(Op::kEncoderForward);
  a.dtype(out, "out", DType::kF32);
  const auto [B, T, C, Vr, V] = encoder_dims(a, tokens, wte, "wte", wpe, "wpe", vocab_start, vocab_size);
  a.numel(out, "out", B * T * C, cat("B*T*C = ", B, "*", T, "*", C));
  Device& dev = a.device({&out, &tokens, &wte, &wpe});
  if (B * T == 0) return;
  run(dev, a, DType::kF32, [&](const Kernels& k) {
    k.encoder_forward(out.data_as<float>(), tokens.data_as<int32_t>(), wte.data_as<float>(),
                      wpe.defined() ? wpe.data_as<float>() : nullptr, checked_int(a, B, "B"), checked_int(a, T, "T"),
                      checked_int(a, C, "C"), checked_int(a, vocab_start, "vocab_start"), checked_int(a, Vr, "Vr"));
  });
}

void encoder_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens,
                      int64_t vocab_start, int64_t vocab_size) {
  Args a(Op::kEncoderBackward);
  a.dtype(dout, "dout", DType::kF32);
  const auto [B, T, C, Vr, V] = encoder_dims(a, tokens, dwte, "dwte", dwpe, "dwpe", vocab_start, vocab_size);
  a.numel(dout, "dout", B * T * C, cat("B*T*C = ", B, "*", T, "*", C));
  Device& dev = a.device({&dwte, &dwpe, &dout, &tokens});
  if (B * T == 0) return;
  run(dev, a, DType::kF32, [&](const Kernels& k) {
    k.encoder_backward(dwte.data_as<float>(), dwpe.defined() ? dwpe.data_as<float>() : nullptr, dout.data_as<float>(),
                       tokens.data_as<int32_t>(), checked_int(a, B, "B"), checked_int(a, T, "T"),
                       checked_int(a, C, "C"), checked_int(a, vocab_start, "vocab_start"), checked_int(a, Vr, "Vr"));
  });
}

void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias) {
  Args a(Op::kLayernormForward);
  for (auto [t, name] : {std::pair{&out, "out"},
                         {&mean, "mean"},
                         {&rstd, "rstd"},
                         {&inp, "inp"},
                         {&weight, "weight"},
                         {&bias, "bias"}}) {
    a.dtype(*t, name, DType::kF32);
  }
  const int64_t C = a.last_dim(inp, "inp");
  a.positive(C, "channels C (inp's last dimension)");
  const int64_t N = inp.numel() / C;
  a.same_shape(out, "out", inp, "inp");
  a.numel(mean, "mean", N, "one per row of inp");
  a.numel(rstd, "rstd", N, "one per row of inp");
  a.numel(weight, "weight", C, "one per channel");
  a.numel(bias, "bias", C, "one per channel");
  Device& dev = a.device({&out, &mean, &rstd, &inp, &weight, &bias});
  if (N == 0) return;
  run(dev, a, DType::kF32, [&](const Kernels& k) {
    k.layernorm_forward(out.data_as<float>(), mean.data_as<float>(), rstd.data_as<float>(), inp.data_as<float>(),
                        weight.data_as<float>(), bias.data_as<float>(), N, checked_int(a, C, "C"));
  });
}

void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  Args a(Op::kLayernormBackward);
  for (auto [t, name] : {std::pair{&dinp, "dinp"},
                         {&dweight, "dweight"},
                         {&dbias, "dbias"},
                         {&dout, "dout"},
                         {&inp, "inp"},
                         {&weight, "weight"},
                         {&mean, "mean"},
                         {&rstd, "rstd"}}) {
    a.dtype(*t, name, DType::kF32);
  }
  const int64_t C = a.last_dim(inp, "inp");
  a.positive(C, "channels C (inp's last dimension)");
  const int64_t N = inp.numel() / C;
  a.same_shape(dinp, "dinp", inp, "inp");
  a.same_shape(dout, "dout", inp, "inp");
  a.numel(mean, "mean", N, "one per row of inp");
  a.numel(rstd, "rstd", N, "one per row of inp");
  a.numel(weight, "weight", C, "one per channel");
  a.numel(dweight, "dweight", C, "one per channel");
  a.numel(dbias, "dbias", C, "one per channel");
  Device& dev = a.device({&dinp, &dweight, &dbias, &dout, &inp, &weight, &mean, &rstd});
  if (N == 0) return;
  run(dev, a, DType::kF32, [&](const Kernels& k) {
    k.layernorm_backward(dinp.data_as<float>(), dweight.data_as<float>(), dbias.data_as<float>(), dout.data_as<float>(),
                         inp.data_as<float>(), weight.data_as<float>(), mean.data_as<float>(), rstd.data_as<float>(), N,
                         checked_int(a, C, "C"));
  });
}

void matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  Args a(Op::kMatmulForward);
  a.dtype(out, "out", DType::kF32);
  a.defined(inp, "inp");
  const DType dtype = inp.dtype() == DType::kBF16 ? DType::kBF16 : DType::kF32;  // of inp and weight
  a.dtype(inp, "inp", dtype);
  a.dtype(weight, "weight", dtype);
  const int64_t C = a.last_dim(inp, "inp");
  const int64_t OC = a.dim(weight, "weight", 2, 0);
  a.positive(C, "input channels C (inp's last dimension)");
  a.positive(OC, "output channels OC (weight's first dimension)");
  if (weight.shape()[1] != C) {
    a.fail(cat("'weight' has shape ", weight.shape().str(), " but 'inp' has shape ", inp.shape().str(),
               "; weight must be (OC, ", C, ")"));
  }
  const int64_t N = inp.numel() / C;
  if (bias.defined()) {
    a.dtype(bias, "bias", DType::kF32);
    a.numel(bias, "bias", OC, "one per output channel");
  }
  a.numel(out, "out", N * OC, cat("N*OC = ", N, "*", OC));
  Device& dev = a.device({&out, &inp, &weight, &bias});
  if (N == 0) return;
  const float* b = bias.defined() ? bias.data_as<float>() : nullptr;
  const int c = checked_int(a, C, "C"), oc = checked_int(a, OC, "OC");
  run(dev, a, dtype, [&](const Kernels& k) {
    if (dtype == DType::kBF16) {
      k.matmul_forward_bf16(out.data_as<float>(), inp.data_as<bf16_t>(), weight.data_as<bf16_t>(), b, N, c, oc);
    } else {
      k.matmul_forward(out.data_as<float>(), inp.data_as<float>(), weight.data_as<float>(), b, N, c, oc);
    }
  });
}

void matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight) {
  Args a(Op::kMatmulBackward);
  if (!dinp.defined() && !dweight.defined()) a.fail("'dinp' and 'dweight' are both undefined; pass at least one");
  for (auto [t, name] : {std::pair{&dinp, "dinp"}, {&dweight, "dweight"}, {&dout, "dout"}}) {
    if (t->defined() || t == &dout) a.dtype(*t, name, DType::kF32);
  }
  a.defined(inp, "inp");
  const DType dtype = inp.dtype() == DType::kBF16 ? DType::kBF16 : DType::kF32;  // of inp and weight
  a.dtype(inp, "inp", dtype);
  a.dtype(weight, "weight", dtype);
  const int64_t C = a.last_dim(inp, "inp");
  const int64_t OC = a.dim(weight, "weight", 2, 0);
  a.positive(C, "input channels C (inp's last dimension)");
  a.positive(OC, "output channels OC (weight's first dimension)");
  if (weight.shape()[1] != C) {
    a.fail(cat("'weight' has shape ", weight.shape().str(), " but 'inp' has shape ", inp.shape().str(),
               "; weight must be (OC, ", C, ")"));
  }
  const int64_t N = inp.numel() / C;
  if (dinp.defined()) a.same_shape(dinp, "dinp", inp, "inp");
  if (dweight.defined()) a.same_shape(dweight, "dweight", weight, "weight");
  a.numel(dout, "dout", N * OC, cat("N*OC = ", N, "*", OC));
  if (dbias.defined()) {
    a.dtype(dbias, "dbias", DType::kF32);
    a.numel(dbias, "dbias", OC, "one per output channel");
  }
  Device& dev = a.device({&dinp, &dweight, &dbias, &dout, &inp, &weight});
  if (N == 0) return;
  const auto f32_or_null = [](const Tensor& t) { return t.defined() ? t.data_as<float>() : nullptr; };
  float *di = f32_or_null(dinp), *dw = f32_or_null(dweight), *db = f32_or_null(dbias);
  const int c = checked_int(a, C, "C"), oc = checked_int(a, OC, "OC");
  run(dev, a, dtype, [&](const Kernels& k) {
    if (dtype == DType::kBF16) {
      k.matmul_backward_bf16(di, dw, db, dout.data_as<float>(), inp.data_as<bf16_t>(), weight.data_as<bf16_t>(), N, c,
                             oc);
    } else {
      k.matmul_backward(di, dw, db, dout.data_as<float>(), inp.data_as<float>(), weight.data_as<float>(), N, c, oc);
    }
  });
}

namespace {
struct AttentionDims {
  int64_t B, T, C;
};
// qkv and att both f32, or both bf16.
AttentionDims attention_dims(const Args& a, const Tensor& qkv, const Tensor& att, int num_heads) {
  a.defined(qkv, "qkv");
  a.dtype(qkv, "qkv", qkv.dtype() == DType::kBF16 ? DType::kBF16 : DType::kF32);
  a.dtype(att, "att", qkv.dtype());
  const int64_t B = a.dim(qkv, "qkv", 3, 0), T = qkv.shape()[1], C3 = qkv.shape()[2];
  a.positive(num_heads, "num_heads");
  if (C3 <= 0 || C3 % 3 != 0) a.fail(cat("'qkv' has shape ", qkv.shape().str(), "; its last dimension must be 3*C"));
  const int64_t C = C3 / 3;
  if (C % num_heads != 0) a.fail(cat("C = ", C, " is not divisible by num_heads = ", num_heads));
  a.numel(att, "att", B * num_heads * T * T, cat("B*NH*T*T = ", B, "*", num_heads, "*", T, "*", T));
  return {B, T, C};
}
}  // namespace

void attention_forward(const Tensor& out, const Tensor& att, const Tensor& qkv, int num_heads) {
  Args a(Op::kAttentionForward);
  const auto [B, T, C] = attention_dims(a, qkv, att, num_heads);
  const DType dtype = qkv.dtype();
  a.dtype(out, "out", dtype);
  a.numel(out, "out", B * T * C, cat("B*T*C = ", B, "*", T, "*", C));
  Device& dev = a.device({&out, &att, &qkv});
  if (B * T == 0) return;
  const int b = checked_int(a, B, "B"), t = checked_int(a, T, "T"), c = checked_int(a, C, "C");
  run(dev, a, dtype, [&](const Kernels& k) {
    if (dtype == DType::kBF16) {
      k.attention_forward_bf16(out.data_as<bf16_t>(), att.data_as<bf16_t>(), qkv.data_as<bf16_t>(), b, t, c, num_heads);
    } else {
      k.attention_forward(out.data_as<float>(), att.data_as<float>(), qkv.data_as<float>(), b, t, c, num_heads);
    }
  });
}

void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& att, int num_heads) {
  Args a(Op::kAttentionBackward);
  const auto [B, T, C] = attention_dims(a, qkv, att, num_heads);
  a.dtype(dout, "dout", DType::kF32);
  a.numel(dout, "dout", B * T * C, cat("B*T*C = ", B, "*", T, "*", C));
  a.same_shape(dqkv, "dqkv", qkv, "qkv");
  a.dtype(dqkv, "dqkv", DType::kF32);
  Device& dev = a.device({&dqkv, &dout, &qkv, &att});
  if (B * T == 0) return;
  const int b = checked_int(a, B, "B"), t = checked_int(a, T, "T"), c = checked_int(a, C, "C");
  const DType dtype = qkv.dtype();
  run(dev, a, dtype, [&](const Kernels& k) {
    if (dtype == DType::kBF16) {
      k.attention_backward_bf16(dqkv.data_as<float>(), dout.data_as<float>(), qkv.data_as<bf16_t>(),
                                att.data_as<bf16_t>(), b, t, c, num_heads);
    } else {
      k.attention_backward(dqkv.data_as<float>(), dout.data_as<float>(), qkv.data_as<float>(), att.data_as<float>(), b,
                           t, c, num_heads);
    }
  });
}

namespace {
// Element-wise ops: every tensor has the shape and dtype of the first.
DType elementwise(const Args& a, std::initializer_list<std::pair<const Tensor*, const char*>> tensors) {
  const auto& [first, first_name] = *tensors.begin();
  a.defined(*first, first_name);
  for (const auto& [t, name] : tensors) {
    a.same_shape(*t, name, *first, first_name);
    if (t->dtype() != first->dtype()) {
      a.fail(cat("argument '", name, "' is ", dtype_name(t->dtype()), " but '", first_name, "' is ",
                 dtype_name(first->dtype()), "; they must match"));
    }
  }
  return first->dtype();
}
}  // namespace

void gelu_forward(const Tensor& out, const Tensor& inp) {
  Args a(Op::kGeluForward);
  const DType dtype = elementwise(a, {{&out, "out"}, {&inp, "inp"}});
  Device& dev = a.device({&out, &inp});
  if (out.numel() == 0) return;
  run(dev, a, dtype, [&](const Kernels& k) { k.gelu_forward(out.data(), inp.data(), dtype, out.numel()); });
}

void gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  Args a(Op::kGeluBackward);
  a.defined(inp, "inp");
  a.dtype(dinp, "dinp", DType::kF32);
  a.dtype(dout, "dout", DType::kF32);
  a.same_shape(dinp, "dinp", inp, "inp");
  a.same_shape(dout, "dout", inp, "inp");
  const DType dtype = inp.dtype();
  Device& dev = a.device({&dinp, &inp, &dout});
  if (dinp.numel() == 0) return;
  run(dev, a, dtype, [&](const Kernels& k) {
    k.gelu_backward(dinp.data_as<float>(), inp.data(), dout.data_as<float>(), dtype, dinp.numel());
  });
}

void residual_forward(const Tensor& out, const Tensor& inp1, const Tensor& inp2) {
  Args a(Op::kResidualForward);
  const DType dtype = elementwise(a, {{&out, "out"}, {&inp1, "inp1"}, {&inp2, "inp2"}});
  Device& dev = a.device({&out, &inp1, &inp2});
  if (out.numel() == 0) return;
  run(dev, a, dtype,
      [&](const Kernels& k) { k.residual_forward(out.data(), inp1.data(), inp2.data(), dtype, out.numel()); });
}

void crossentropy_forward_backward(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                   const Tensor& targets, float dloss) {
  Args a(Op::kCrossentropyForwardBackward);
  a.dtype(losses, "losses", DType::kF32);
  a.dtype(dlogits, "dlogits", DType::kF32);
  a.dtype(logits, "logits", DType::kF32);
  a.dtype(targets, "targets", DType::kI32);
  const int64_t V = a.last_dim(logits, "logits");
  a.positive(V, "vocabulary V (logits' last dimension)");
  const int64_t N = logits.numel() / V;
  a.same_shape(dlogits, "dlogits", logits, "logits");
  a.numel(targets, "targets", N, "one per row of logits");
  a.numel(losses, "losses", N, "one per row of logits");
  Device& dev = a.device({&losses, &dlogits, &logits, &targets});
  a.token_range(targets, "targets", V, true);
  if (N == 0) return;
  run(dev, a, DType::kF32, [&](const Kernels& k) {
    k.crossentropy_forward_backward(losses.data_as<float>(), dlogits.data_as<float>(), logits.data_as<float>(),
                                    targets.data_as<int32_t>(), dloss, N, checked_int(a, V, "V"));
  });
}

namespace {
// The vocabulary-parallel cross-entropy's shapes: logits (N,Vr) of rows [vocab_start, vocab_start + Vr) of a
// vocabulary of vocab_size; targets and the per-row statistics one element per row.
struct CrossentropyDims {
  int64_t N, Vr;
};
CrossentropyDims crossentropy_dims(const Args& a, const Tensor& logits, const Tensor& targets,
                                   std::initializer_list<std::pair<const Tensor*, const char*>> per_row,
                                   int64_t vocab_start, int64_t vocab_size) {
  a.dtype(logits, "logits", DType::kF32);
  a.dtype(targets, "targets", DType::kI32);
  const int64_t Vr = a.last_dim(logits, "logits");
  a.positive(Vr, "vocabulary shard Vr (logits' last dimension)");
  if (vocab_start < 0 || vocab_start + Vr > vocab_size) {
    a.fail(cat("'logits' hold rows [", vocab_start, ", ", vocab_start + Vr, ") of a vocabulary of ", vocab_size));
  }
  const int64_t N = logits.numel() / Vr;
  a.numel(targets, "targets", N, "one per row of logits");
  for (const auto& [t, name] : per_row) {
    a.dtype(*t, name, DType::kF32);
    a.numel(*t, name, N, "one per row of logits");
  }
  a.token_range(targets, "targets", vocab_size, true);
  return {N, Vr};
}
}  // namespace

void crossentropy_stats(const Tensor& maxes, const Tensor& sums, const Tensor& target_logits, const Tensor& logits,
                        const Tensor& targets, int64_t vocab_start, int64_t vocab_size) {
  Args a(Op::kCrossentropyStats);
  const auto [N, Vr] =
      crossentropy_dims(a, logits, targets, {{&maxes, "maxes"}, {&sums, "sums"}, {&target_logits, "target_logits"}},
                        vocab_start, vocab_size);
  Device& dev = a.device({&maxes, &sums, &target_logits, &logits, &targets});
  if (N == 0) return;
  run(dev, a, DType::kF32, [&](const Kernels& k) {
    k.crossentropy_stats(maxes.data_as<float>(), sums.data_as<float>(), target_logits.data_as<float>(),
                         logits.data_as<float>(), targets.data_as<int32_t>(), N, checked_int(a, Vr, "Vr"),
                         checked_int(a, vocab_start, "vocab_start"));
  });
}

void crossentropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& maxes, const Tensor& sums,
                           const Tensor& targets, int64_t vocab_start, int64_t vocab_size, float dloss) {
  Args a(Op::kCrossentropyBackward);
  const auto [N, Vr] =
      crossentropy_dims(a, logits, targets, {{&maxes, "maxes"}, {&sums, "sums"}}, vocab_start, vocab_size);
  a.dtype(dlogits, "dlogits", DType::kF32);
  a.same_shape(dlogits, "dlogits", logits, "logits");
  Device& dev = a.device({&dlogits, &logits, &maxes, &sums, &targets});
  if (N == 0) return;
  run(dev, a, DType::kF32, [&](const Kernels& k) {
    k.crossentropy_backward(dlogits.data_as<float>(), logits.data_as<float>(), maxes.data_as<float>(),
                            sums.data_as<float>(), targets.data_as<int32_t>(), dloss, N, checked_int(a, Vr, "Vr"),
                            checked_int(a, vocab_start, "vocab_start"));
  });
}

void adamw_update(const Tensor& params, const Tensor& m, const Tensor& v, const Tensor& grads, const AdamwParams& hp) {
  Args a(Op::kAdamwUpdate);
  const DType dtype = elementwise(a, {{&params, "params"}, {&m, "m"}, {&v, "v"}, {&grads, "grads"}});
  if (dtype != DType::kF32) a.fail(cat("parameters and optimizer state must be f32, got ", dtype_name(dtype)));
  if (hp.step < 1) a.fail(cat("step must be >= 1 (it is 1-based for the bias correction), got ", hp.step));
  if (!(hp.beta1 >= 0.0f && hp.beta1 < 1.0f && hp.beta2 >= 0.0f && hp.beta2 < 1.0f)) {
    a.fail(cat("beta1 and beta2 must be in [0, 1), got ", hp.beta1, " and ", hp.beta2));
  }
  Device& dev = a.device({&params, &m, &v, &grads});
  if (params.numel() == 0) return;
  run(dev, a, dtype, [&](const Kernels& k) {
    k.adamw_update(params.data_as<float>(), m.data_as<float>(), v.data_as<float>(), grads.data_as<float>(),
                   params.numel(), hp);
  });
}

void global_norm_squared(const Tensor& out, const Tensor& inp) {
  Args a(Op::kGlobalNormSquared);
  a.dtype(out, "out", DType::kF32);
  a.dtype(inp, "inp", DType::kF32);
  a.numel(out, "out", 1, "a single accumulator");
  Device& dev = a.device({&out, &inp});
  if (inp.numel() == 0) return;
  run(dev, a, DType::kF32,
      [&](const Kernels& k) { k.global_norm_squared(out.data_as<float>(), inp.data_as<float>(), inp.numel()); });
}

void scale(const Tensor& x, float s) {
  Args a(Op::kScale);
  a.dtype(x, "x", DType::kF32);
  Device& dev = a.device({&x});
  if (x.numel() == 0) return;
  run(dev, a, DType::kF32, [&](const Kernels& k) { k.scale(x.data_as<float>(), s, x.numel()); });
}

void convert(const Tensor& out, const Tensor& inp) {
  Args a(Op::kConvert);
  a.same_shape(out, "out", inp, "inp");
  for (auto [t, name] : {std::pair{&out, "out"}, {&inp, "inp"}}) {
    if (t->dtype() != DType::kF32 && t->dtype() != DType::kBF16) {
      a.fail(cat("argument '", name, "' is ", dtype_name(t->dtype()), "; convert handles f32 and bf16"));
    }
  }
  Device& dev = a.device({&out, &inp});
  if (out.numel() == 0) return;
  // A backend must support the conversion in both of its dtypes.
  const DType key = out.dtype() == DType::kBF16 || inp.dtype() == DType::kBF16 ? DType::kBF16 : DType::kF32;
  run(dev, a, key, [&](const Kernels& k) { k.convert(out.data(), out.dtype(), inp.data(), inp.dtype(), out.numel()); });
}

}  // namespace h2::ops

// DiComm's collective algorithms, built on the communicator's blocking point-to-point steps. Each step has a
// number so that a timeout says how far the collective got.
#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "comm/communicator.h"

namespace h2 {
namespace {

// Reductions work on f32: bf16 data is widened first and rounded once at the end (f32 accumulation).
void reduce_into(float* acc, const float* in, size_t n, ReduceOp op) {
  if (op == ReduceOp::kMax) {
    for (size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], in[i]);
  } else {
    for (size_t i = 0; i < n; ++i) acc[i] += in[i];
  }
}

void widen(float* out, const void* data, size_t count, DType dtype) {
  if (dtype == DType::kBF16) {
    const auto* h = static_cast<const bf16_t*>(data);
    for (size_t i = 0; i < count; ++i) out[i] = bf16_to_f32(h[i]);
  } else if (count > 0 && out != data) {
    std::memcpy(out, data, count * 4);
  }
}

void narrow(void* data, const float* values, size_t count, DType dtype) {
  if (dtype == DType::kBF16) {
    auto* h = static_cast<bf16_t*>(data);
    for (size_t i = 0; i < count; ++i) h[i] = f32_to_bf16(values[i]);
  } else if (count > 0 && data != values) {
    std::memcpy(data, values, count * 4);
  }
}

void check_dtype(DType dtype, const char* op) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    throw Error(ErrorCode::kInvalidArgument, cat(op, ": dtype ", dtype_name(dtype), " is not supported (f32, bf16)"));
  }
}

// Block i of n over `count` elements starts here; block n ends at count.
size_t block(size_t count, int n, int i) { return count * static_cast<size_t>(i) / static_cast<size_t>(n); }

// Blocks are exchanged in messages of this size, each reduced as soon as it arrives (still in cache).
constexpr size_t kChunkBytes = size_t{256} << 10;

// Ring reduce-scatter (Patarasuk & Yuan 2009): in n - 1 steps each rank passes a block to its right neighbour
// and adds the block arriving from its left. Afterwards rank r holds the whole sum of block (r + 1) mod n.
void ring_reduce_scatter(Communicator& c, float* v, size_t count, ReduceOp op, const char* name) {
  const int n = c.size(), r = c.rank();
  float* incoming = c.scratch(1, count / static_cast<size_t>(n) + 1);
  for (int s = 0; s < n - 1; ++s) {
    const int sb = (r - s + n) % n, rb = (r - s - 1 + n) % n;
    const size_t s0 = block(count, n, sb), s1 = block(count, n, sb + 1);
    const size_t r0 = block(count, n, rb), r1 = block(count, n, rb + 1);
    c.send_recv_chunked(
        v + s0, (s1 - s0) * 4, (r + 1) % n, incoming, (r1 - r0) * 4, (r - 1 + n) % n, kChunkBytes, name, s,
        [&](size_t at, size_t bytes) { reduce_into(v + r0 + at / 4, incoming + at / 4, bytes / 4, op); });
  }
}

// Ring all-gather of the blocks left by ring_reduce_scatter: rank r starts with block (r + 1) mod n.
void ring_all_gather(Communicator& c, float* v, size_t count, const char* name, int step0) {
  const int n = c.size(), r = c.rank();
  for (int s = 0; s < n - 1; ++s) {
    const int sb = (r + 1 - s + n) % n, rb = (r - s + n) % n;
    const size_t s0 = block(count, n, sb), s1 = block(count, n, sb + 1);
    const size_t r0 = block(count, n, rb), r1 = block(count, n, rb + 1);
    c.send_recv(v + s0, (s1 - s0) * 4, (r + 1) % n, v + r0, (r1 - r0) * 4, (r - 1 + n) % n, name, step0 + s);
  }
}

// Recursive halving then doubling (Rabenseifner; Thakur, Rabenseifner & Gropp 2005), for a power-of-two number
// of ranks: the ring's bytes in 2 log2(n) steps instead of 2 (n - 1). In step k of the halving, rank r swaps half
// of the blocks it still reduces with rank r ^ (n / 2^(k+1)) and keeps the half its bit selects, ending with the
// sum of block r; the doubling gathers the blocks back in the reverse order.
void halving_doubling_all_reduce(Communicator& c, float* v, size_t count, ReduceOp op) {
  const int n = c.size(), r = c.rank();
  float* incoming = c.scratch(1, count / 2 + 1);
  int b0 = 0, b1 = n, step = 0;
  for (int mask = n / 2; mask >= 1; mask /= 2, ++step) {
    const int mid = (b0 + b1) / 2, peer = r ^ mask;
    const bool low = (r & mask) == 0;
    const size_t keep0 = block(count, n, low ? b0 : mid), keep1 = block(count, n, low ? mid : b1);
    const size_t send0 = block(count, n, low ? mid : b0), send1 = block(count, n, low ? b1 : mid);
    c.send_recv_chunked(
        v + send0, (send1 - send0) * 4, peer, incoming, (keep1 - keep0) * 4, peer, kChunkBytes, "all_reduce", step,
        [&](size_t at, size_t bytes) { reduce_into(v + keep0 + at / 4, incoming + at / 4, bytes / 4, op); });
    (low ? b1 : b0) = mid;
  }
  for (int mask = 1; mask < n; mask *= 2, ++step) {
    const int peer = r ^ mask, width = b1 - b0;
    const bool low = (r & mask) == 0;
    const int p0 = low ? b1 : b0 - width, p1 = p0 + width;  // the partner's blocks, beside this rank's
    const size_t mine0 = block(count, n, b0), mine1 = block(count, n, b1);
    const size_t its0 = block(count, n, p0), its1 = block(count, n, p1);
    c.send_recv(v + mine0, (mine1 - mine0) * 4, peer, v + its0, (its1 - its0) * 4, peer, "all_reduce", step);
    b0 = std::min(b0, p0);
    b1 = std::max(b1, p1);
  }
}

// The shared windows of a group's ranks (one host), used in halves: each use writes one half of this rank's
// window and reads the halves its peers wrote. Halves alternate across calls and communicators; a rank writes a
// half again only after every peer that read it has said it is done (those signals have usually long arrived),
// so a use never waits for the peers still reading the one before. Signals are zero- or 4-byte messages of the
// collective's own steps, so a dead or missing peer is named like in any other step.
class WindowUse {
 public:
  WindowUse(Communicator& c, SharedWindow& w, const char* op)
      : c_(c), w_(w), op_(op), n_(c.size()), r_(c.rank()), half_bytes_(w.bytes() / 2 / 64 * 64) {
    for (int p = 0; p < n_; ++p) windows_.push_back(w.peer(c.job_rank(p)));
    halves_.resize(static_cast<size_t>(n_));
  }
  size_t half_bytes() const { return half_bytes_; }

  // Takes the next half of this rank's window once its readers are done with it; returns it.
  char* begin() {
    half_ = w_.next_half();
    for (auto& p : w_.pending(half_)) {
      try {
        p.request->wait(c_.options().timeout);
      } catch (const CommError& e) {
        throw CommError(cat(op_, " (rank ", r_, " of ", n_, ") waiting for job rank ", p.peer,
                            " to finish reading this rank's shared window: ", e.what()));
      }
    }
    w_.pending(half_).clear();
    return w_.local() + static_cast<size_t>(half_) * half_bytes_;
  }
  // Signals every peer that this rank's half is written and waits for theirs; afterwards peer(p) is readable.
  void written(int step) { signal(true, step); }
  // Signals every peer and waits for every peer, carrying nothing (the next phase may start).
  void barrier(int step) { signal(false, step); }
  const char* peer(int p) const {
    return windows_[static_cast<size_t>(p)] + static_cast<size_t>(halves_[static_cast<size_t>(p)]) * half_bytes_;
  }
  // This rank is done reading the peers' halves, and they will be with its own: each side learns it before it
  // next writes there.
  void done(int step) {
    for (int p = 0; p < n_; ++p) {
      if (p == r_) continue;
      w_.pending(half_).push_back({c_.isend_step(nullptr, 0, p, step), c_.job_rank(p)});
      w_.pending(half_).push_back({c_.irecv_step(nullptr, 0, p, step), c_.job_rank(p)});
    }
  }

 private:
  void signal(bool with_half, int step) {
    requests_.clear();
    for (int p = 0; p < n_; ++p) {
      if (p != r_)
        requests_.push_back(
            c_.irecv_step(with_half ? &halves_[static_cast<size_t>(p)] : nullptr, with_half ? 4 : 0, p, step));
    }
    for (int p = 0; p < n_; ++p) {
      if (p != r_) requests_.push_back(c_.isend_step(with_half ? &half_ : nullptr, with_half ? 4 : 0, p, step));
    }
    for (size_t i = 0; i < requests_.size(); ++i) {
      const int k = static_cast<int>(i % static_cast<size_t>(n_ - 1));
      c_.wait_request(*requests_[i], op_, k < r_ ? k : k + 1, step);
    }
  }

  Communicator& c_;
  SharedWindow& w_;
  const char* op_;
  int n_, r_;
  size_t half_bytes_;
  std::vector<const char*> windows_;
  std::vector<int32_t> halves_;
  int32_t half_ = 0;
  std::vector<std::unique_ptr<Request>> requests_;
};

constexpr size_t kTile = 8192;  // floats reduced per pass over the peers' windows (32 KiB: stays in cache)

// Adds block [b0, b1) of every peer's window half (floats at the same offsets) into acc, tile by tile, so each
// tile of acc stays in cache across the peers; `then(t, e)` runs on each finished tile.
template <typename Then>
void reduce_from_peers(const WindowUse& use, int n, int r, float* acc, size_t b0, size_t b1, size_t offset, ReduceOp op,
                       Then then) {
  for (size_t t = b0; t < b1; t += kTile) {
    const size_t e = std::min(b1, t + kTile);
    for (int p = 0; p < n; ++p) {
      if (p != r) reduce_into(acc + (t - b0), reinterpret_cast<const float*>(use.peer(p)) + offset + t, e - t, op);
    }
    then(t, e);
  }
}

// All-reduce through the shared windows, in pieces of half a window. Per piece, rank r copies every block but its
// own into its window; once all have (signal 1), it adds the peers' copies of block r to its own and puts the sum
// in its window too; once all have (signal 2), it copies each peer's summed block out of that peer's window. Every
// byte crosses between processes once, read in place (message transports copy it into and out of a queue), and a
// piece takes two signals whatever the number of ranks (a ring takes 2 (n - 1) steps).
//
// Hierarchical use: `across`, when given, all-reduces each rank's summed block with the ranks that hold the same
// block on the other hosts before the block is published, so the host's ranks copy out the job-wide sums.
void window_all_reduce(Communicator& c, SharedWindow& w, float* v, size_t count, ReduceOp op,
                       const std::function<void(float*, size_t)>& across = nullptr) {
  const int n = c.size(), r = c.rank();
  WindowUse use(c, w, "all_reduce (shared window)");
  const size_t half = use.half_bytes() / 4;
  int step = 0;
  for (size_t at = 0; at < count; at += half, step += 3) {
    const size_t m = std::min(half, count - at);
    float* x = v + at;
    auto* mine = reinterpret_cast<float*>(use.begin());
    for (int b = 0; b < n; ++b) {
      if (b != r) std::memcpy(mine + block(m, n, b), x + block(m, n, b), (block(m, n, b + 1) - block(m, n, b)) * 4);
    }
    use.written(step);
    const size_t b0 = block(m, n, r), b1 = block(m, n, r + 1);
    if (across) {
      reduce_from_peers(use, n, r, x + b0, b0, b1, 0, op, [](size_t, size_t) {});
      across(x + b0, b1 - b0);
      std::memcpy(mine + b0, x + b0, (b1 - b0) * 4);
    } else {
      reduce_from_peers(use, n, r, x + b0, b0, b1, 0, op,
                        [&](size_t t, size_t e) { std::memcpy(mine + t, x + t, (e - t) * 4); });
    }
    use.barrier(step + 1);
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      const size_t p0 = block(m, n, p), p1 = block(m, n, p + 1);
      std::memcpy(x + p0, reinterpret_cast<const float*>(use.peer(p)) + p0, (p1 - p0) * 4);
    }
    use.done(step + 2);
  }
}

// Reduce-scatter through the shared windows: per piece of every block, rank r widens the blocks of the others into
// its window (slot b for block b) and, once all have, adds slot r of every peer's window to its own block. One
// signal per piece. `in`: n blocks of `count` elements of `dtype`; out: this rank's block, summed, in f32.
void window_reduce_scatter(Communicator& c, SharedWindow& w, float* out, const void* in, size_t count, DType dtype,
                           ReduceOp op) {
  const int n = c.size(), r = c.rank();
  WindowUse use(c, w, "reduce_scatter (shared window)");
  const size_t slot = use.half_bytes() / 4 / static_cast<size_t>(n) / 16 * 16;  // floats per block per piece
  const size_t width = dtype_size(dtype);
  const auto* bytes = static_cast<const char*>(in);
  int step = 0;
  for (size_t at = 0; at < count; at += slot, step += 2) {
    const size_t m = std::min(slot, count - at);
    auto* mine = reinterpret_cast<float*>(use.begin());
    for (int b = 0; b < n; ++b) {
      const char* from = bytes + (static_cast<size_t>(b) * count + at) * width;
      widen(b == r ? out + at : mine + static_cast<size_t>(b) * slot, from, m, dtype);
    }
    use.written(step);
    reduce_from_peers(use, n, r, out + at, 0, m, static_cast<size_t>(r) * slot, op, [](size_t, size_t) {});
    use.done(step + 1);
  }
}

// All-gather through the shared windows: per piece, each rank copies its block into its window and, once all
// have, copies every peer's out of theirs. One signal per piece.
void window_all_gather(Communicator& c, SharedWindow& w, char* out, size_t bytes) {
  const int n = c.size(), r = c.rank();
  WindowUse use(c, w, "all_gather (shared window)");
  const size_t half = use.half_bytes();
  int step = 0;
  for (size_t at = 0; at < bytes; at += half, step += 2) {
    const size_t m = std::min(half, bytes - at);
    std::memcpy(use.begin(), out + static_cast<size_t>(r) * bytes + at, m);
    use.written(step);
    for (int p = 0; p < n; ++p) {
      if (p != r) std::memcpy(out + static_cast<size_t>(p) * bytes + at, use.peer(p), m);
    }
    use.done(step + 1);
  }
}

// Recursive doubling, for small all-reduces on a power of two of ranks: in step k, rank r swaps its whole vector
// with rank r ^ 2^k and adds, so log2(n) exchanges (the tree needs 2 log2 n messages one after the other). Every
// rank adds the same partial sums (a + b = b + a in IEEE arithmetic), so all end bitwise equal.
void recursive_doubling_all_reduce(Communicator& c, float* v, size_t count, ReduceOp op) {
  float* incoming = c.scratch(1, count);
  int step = 0;
  for (int mask = 1; mask < c.size(); mask <<= 1, ++step) {
    const int peer = c.rank() ^ mask;
    c.send_recv(v, count * 4, peer, incoming, count * 4, peer, "all_reduce", step);
    reduce_into(v, incoming, count, op);
  }
}

// Binomial tree: reduce to rank 0 in ceil(log2 n) rounds, then broadcast back the same way.
void tree_all_reduce(Communicator& c, float* v, size_t count, ReduceOp op) {
  const int n = c.size(), r = c.rank();
  float* incoming = c.scratch(1, count);
  int step = 0;
  for (int d = 1; d < n; d <<= 1, ++step) {
    if (r % (2 * d) == d) {
      c.send(v, count * 4, r - d, "all_reduce", step);
      break;
    }
    if (r % (2 * d) == 0 && r + d < n) {
      c.recv(incoming, count * 4, r + d, "all_reduce", step);
      reduce_into(v, incoming, count, op);
    }
  }
  int top = 1;
  while (top < n) top <<= 1;
  for (int d = top >> 1; d >= 1; d >>= 1) {
    if (r % (2 * d) == 0 && r + d < n) c.send(v, count * 4, r + d, "all_reduce", 100 + d);
    if (r % (2 * d) == d) c.recv(v, count * 4, r - d, "all_reduce", 100 + d);
  }
}

}  // namespace

void Communicator::all_reduce(void* data, size_t count, DType dtype, ReduceOp op) {
  check_dtype(dtype, "all_reduce");
  next_sequence();
  if (size() == 1 || count == 0) {
    last_algorithm_ = "none";
    if (op != ReduceOp::kAvg || count == 0) return;
  }
  // f32 is reduced in place; bf16 is widened into a persistent buffer and rounded once at the end.
  float* v = dtype == DType::kF32 ? static_cast<float*>(data) : scratch(0, count);
  widen(v, data, count, dtype);
  const ReduceOp sum_or_max = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  if (size() > 1) {
    const bool power_of_two = (size() & (size() - 1)) == 0;
    if (count * dtype_size(dtype) <= options_.small_message_bytes || count < static_cast<size_t>(size())) {
      last_algorithm_ = power_of_two ? "recursive-doubling" : "tree";
      (power_of_two ? recursive_doubling_all_reduce : tree_all_reduce)(*this, v, count, sum_or_max);
    } else if (hierarchical()) {
      // Within each host, then across hosts (one rank per host per block), then within the host again: the
      // slow inter-host links carry 2 (h-1)/h of the data once instead of every ring step crossing them. Within
      // a host through the shared windows where its ranks have them (the cross-host all-reduce of each piece's
      // block sits between the window's reduction and its copy-out), else by ring.
      last_algorithm_ = "hierarchical";
      const auto across = [&](float* x, size_t n) { cross_->all_reduce(x, n, DType::kF32, sum_or_max); };
      if (SharedWindow* w = local_->shared_window()) {
        local_->next_sequence();
        window_all_reduce(*local_, *w, v, count, sum_or_max, across);
      } else {
        const int l = local_->size(), mine = (local_->rank() + 1) % l;
        const size_t b0 = block(count, l, mine), b1 = block(count, l, mine + 1);
        local_->next_sequence();
        ring_reduce_scatter(*local_, v, count, sum_or_max, "all_reduce(local)");
        across(v + b0, b1 - b0);
        local_->next_sequence();
        ring_all_gather(*local_, v, count, "all_reduce(local)", l);
      }
    } else if (SharedWindow* w = shared_window()) {
      last_algorithm_ = "shared-window";
      window_all_reduce(*this, *w, v, count, sum_or_max);
    } else if (size() > 2 && power_of_two) {
      last_algorithm_ = "halving-doubling";
      halving_doubling_all_reduce(*this, v, count, sum_or_max);
    } else {
      last_algorithm_ = "ring";
      ring_reduce_scatter(*this, v, count, sum_or_max, "all_reduce");
      ring_all_gather(*this, v, count, "all_reduce", size());
    }
  }
  if (op == ReduceOp::kAvg) {
    const float inv = 1.0f / static_cast<float>(size());
    for (size_t i = 0; i < count; ++i) v[i] *= inv;
  }
  narrow(data, v, count, dtype);
}

void Communicator::reduce_scatter(void* out, const void* in, size_t count, DType dtype, ReduceOp op) {
  check_dtype(dtype, "reduce_scatter");
  next_sequence();
  const int n = size();
  const size_t width = dtype_size(dtype);
  const ReduceOp sum_or_max = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  float* result = nullptr;
  SharedWindow* w =
      n > 1 && count * width * static_cast<size_t>(n) > options_.small_message_bytes ? shared_window() : nullptr;
  if (w != nullptr) {
    result = scratch(0, count);
    window_reduce_scatter(*this, *w, result, in, count, dtype, sum_or_max);
  } else {
    // ring_reduce_scatter leaves rank r with block r + 1 complete, so shift the input by one block: block b of the
    // input goes to position b + 1, and rank r ends with the sum of input block r.
    float* v = scratch(0, count * static_cast<size_t>(n));
    for (int b = 0; b < n; ++b) {
      widen(v + count * static_cast<size_t>((b + 1) % n),
            static_cast<const char*>(in) + count * width * static_cast<size_t>(b), count, dtype);
    }
    if (n > 1) ring_reduce_scatter(*this, v, count * static_cast<size_t>(n), sum_or_max, "reduce_scatter");
    result = v + count * static_cast<size_t>(n > 1 ? (rank() + 1) % n : 0);  // the block this rank holds in full
  }
  if (op == ReduceOp::kAvg) {
    for (size_t i = 0; i < count; ++i) result[i] /= static_cast<float>(n);
  }
  narrow(out, result, count, dtype);
}

void Communicator::all_gather(void* out, const void* in, size_t count, DType dtype) {
  check_dtype(dtype, "all_gather");
  next_sequence();
  const int n = size(), r = rank();
  const size_t bytes = count * dtype_size(dtype);
  auto* o = static_cast<char*>(out);
  if (bytes > 0 && o + bytes * static_cast<size_t>(r) != in) std::memcpy(o + bytes * static_cast<size_t>(r), in, bytes);
  if (n > 1 && bytes * static_cast<size_t>(n) > options_.small_message_bytes) {
    if (SharedWindow* w = shared_window()) return window_all_gather(*this, *w, o, bytes);
  }
  // Ring: in step s, pass on the block that arrived in step s - 1.
  for (int s = 0; s < n - 1; ++s) {
    const int sb = (r - s + n) % n, rb = (r - s - 1 + n) % n;
    send_recv(o + bytes * static_cast<size_t>(sb), bytes, (r + 1) % n, o + bytes * static_cast<size_t>(rb), bytes,
              (r - 1 + n) % n, "all_gather", s);
  }
}

void Communicator::broadcast(void* data, size_t count, DType dtype, int root) {
  if (root < 0 || root >= size()) {
    throw Error(ErrorCode::kInvalidArgument, cat("broadcast: root ", root, " is not in the group of ", size()));
  }
  next_sequence();
  const int n = size();
  const int vr = (rank() - root + n) % n;  // ranks renumbered so the root is 0
  const size_t bytes = count * dtype_size(dtype);
  int top = 1;
  while (top < n) top <<= 1;
  for (int d = top >> 1; d >= 1; d >>= 1) {
    if (vr % (2 * d) == 0 && vr + d < n) send(data, bytes, (vr + d + root) % n, "broadcast", d);
    if (vr % (2 * d) == d) recv(data, bytes, (vr - d + root) % n, "broadcast", d);
  }
}

void Communicator::barrier() {
  float token = 0;
  all_reduce(&token, 1, DType::kF32, ReduceOp::kSum);
}

}  // namespace h2

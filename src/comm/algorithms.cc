// DiComm's collective algorithms, built on the communicator's blocking point-to-point steps. Each step has a
// number so that a timeout says how far the collective got.
#include <algorithm>
#include <cstring>
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

// Waits until every peer has finished reading half `h` of this rank's shared window (their "read" signals of
// earlier uses, which have usually long arrived).
void settle_window(Communicator& c, SharedWindow& w, int h) {
  auto& pending = w.pending(h);
  for (auto& p : pending) {
    try {
      p.request->wait(c.options().timeout);
    } catch (const CommError& e) {
      throw CommError(cat("all_reduce (shared window, rank ", c.rank(), " of ", c.size(), ") waiting for job rank ",
                          p.peer, " to finish reading this rank's window: ", e.what()));
    }
  }
  pending.clear();
}

// All-reduce through the shared windows of ranks on one host, in pieces of half a window. Per piece, rank r
// copies every block but its own into its window; once all have (signal 1), it adds the peers' copies of block r
// to its own, tile by tile while the tile is in cache, and puts the sum in its window too; once all have
// (signal 2), it copies each peer's summed block out of that peer's window. Every byte crosses between processes
// once, read in place (message transports copy it into and out of a queue), and a piece needs two signals
// whatever the number of ranks (a ring needs 2 (n - 1) steps). The signals carry the window half each rank
// wrote; halves alternate, and a rank writes a half again only after its readers said they are done with it.
void window_all_reduce(Communicator& c, SharedWindow& w, float* v, size_t count, ReduceOp op) {
  const int n = c.size(), r = c.rank();
  constexpr size_t kTile = 8192;                                // floats reduced per pass over the peers (32 KiB)
  const size_t half = w.bytes() / 2 / sizeof(float) / 16 * 16;  // floats per half, 64-byte aligned
  std::vector<const float*> windows(static_cast<size_t>(n));
  for (int p = 0; p < n; ++p) windows[static_cast<size_t>(p)] = reinterpret_cast<const float*>(w.peer(c.job_rank(p)));
  std::vector<int32_t> halves(static_cast<size_t>(n));
  std::vector<std::unique_ptr<Request>> requests;
  // One signal to and from every peer at step `step`; `data` (an int32 or nothing) goes to all of them, theirs
  // lands in halves[p].
  const auto signal = [&](const int32_t* data, int step) {
    requests.clear();
    for (int p = 0; p < n; ++p) {
      if (p != r)
        requests.push_back(c.irecv_step(data ? &halves[static_cast<size_t>(p)] : nullptr, data ? 4 : 0, p, step));
    }
    for (int p = 0; p < n; ++p) {
      if (p != r) requests.push_back(c.isend_step(data, data ? 4 : 0, p, step));
    }
    for (size_t i = 0; i < requests.size(); ++i) {
      const int k = static_cast<int>(i % static_cast<size_t>(n - 1));
      c.wait_request(*requests[i], "all_reduce (shared window)", k < r ? k : k + 1, step);
    }
  };
  int step = 0;
  for (size_t at = 0; at < count; at += half, step += 3) {
    const size_t m = std::min(half, count - at);
    float* x = v + at;
    const int32_t h = w.next_half();
    settle_window(c, w, h);
    float* mine = reinterpret_cast<float*>(w.local()) + static_cast<size_t>(h) * half;
    for (int b = 0; b < n; ++b) {
      if (b != r) std::memcpy(mine + block(m, n, b), x + block(m, n, b), (block(m, n, b + 1) - block(m, n, b)) * 4);
    }
    signal(&h, step);
    const auto peer_half = [&](int p) {
      return windows[static_cast<size_t>(p)] + static_cast<size_t>(halves[static_cast<size_t>(p)]) * half;
    };
    const size_t b0 = block(m, n, r), b1 = block(m, n, r + 1);
    for (size_t t = b0; t < b1; t += kTile) {
      const size_t e = std::min(b1, t + kTile);
      for (int p = 0; p < n; ++p) {
        if (p != r) reduce_into(x + t, peer_half(p) + t, e - t, op);
      }
      std::memcpy(mine + t, x + t, (e - t) * 4);
    }
    signal(nullptr, step + 1);
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      std::memcpy(x + block(m, n, p), peer_half(p) + block(m, n, p), (block(m, n, p + 1) - block(m, n, p)) * 4);
      // This rank is done with p's half; p learns it before it next writes there. Likewise p about this one's.
      w.pending(h).push_back({c.isend_step(nullptr, 0, p, step + 2), c.job_rank(p)});
      w.pending(h).push_back({c.irecv_step(nullptr, 0, p, step + 2), c.job_rank(p)});
    }
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
      // slow inter-host links carry 2 (h-1)/h of the data once instead of every ring step crossing them.
      last_algorithm_ = "hierarchical";
      const int l = local_->size(), mine = (local_->rank() + 1) % l;
      const size_t b0 = block(count, l, mine), b1 = block(count, l, mine + 1);
      local_->next_sequence();
      ring_reduce_scatter(*local_, v, count, sum_or_max, "all_reduce(local)");
      cross_->all_reduce(v + b0, b1 - b0, DType::kF32, sum_or_max);
      local_->next_sequence();
      ring_all_gather(*local_, v, count, "all_reduce(local)", l);
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
  // ring_reduce_scatter leaves rank r with block r + 1 complete, so shift the input by one block: block b of the
  // input goes to position b + 1, and rank r ends with the sum of input block r.
  float* v = scratch(0, count * static_cast<size_t>(n));
  const size_t width = dtype_size(dtype);
  for (int b = 0; b < n; ++b) {
    widen(v + count * static_cast<size_t>((b + 1) % n),
          static_cast<const char*>(in) + count * width * static_cast<size_t>(b), count, dtype);
  }
  if (n > 1) ring_reduce_scatter(*this, v, count * static_cast<size_t>(n), op, "reduce_scatter");
  const int mine = n > 1 ? (rank() + 1) % n : 0;  // the block this rank now holds in full
  float* result = v + count * static_cast<size_t>(mine);
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
  if (bytes > 0) std::memcpy(o + bytes * static_cast<size_t>(r), in, bytes);
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

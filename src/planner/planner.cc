// The two-stage search and the scoring of one layout (see planner.h).
#include "planner/planner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <span>
#include <thread>
#include <tuple>
#include <unordered_map>

#include "core/clock.h"
#include "core/error.h"
#include "core/format.h"

namespace h2 {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// "1 stage", "3 stages" (fit failures' messages).
std::string count_stages(size_t stages) { return cat(stages, stages == 1 ? " stage" : " stages"); }

// A stage's blocks by what it holds of them, from half-block `first` to `end` (a block is two half-blocks, its
// attention half first): whole blocks, a lone MLP half at its start, a lone attention half at its end.
BlockHalves pieces(int64_t first, int64_t end) {
  if (end <= first) return {};
  const int64_t mlp = first % 2, attention = end - first - mlp > 0 ? end % 2 : 0;
  return {(end - first - mlp - attention) / 2, attention, mlp};
}

// Per-stage quantities that do not depend on the number of layers. Memory is model/costs.h's stage_memory, which is
// affine in the number of layers n >= 1 (up to ZeRO-1's rounding of the optimizer shard, a few bytes):
// fixed[r] + n per_layer[r].
struct StageTerms {
  int chip, tp, dp, rows, in_flight;  // rows: a micro-batch's sequences on one replica
  std::vector<int> chunk_in_flight;   // interleaved: per chunk, its micro-batches in flight (empty: one chunk)
  bool embedding, head;
  double extra_fwd_s, extra_bwd_s;  // embedding / head work per micro-batch
  double usable_bytes;
  const CostModel::PieceTimes* times;  // the cost model's, for this chip type, TP and rows
  double fwd_layer_s;
  double bwd_layer_s[3];      // by Recompute
  double fixed_bytes[3];      // by Recompute
  double per_layer_bytes[3];  // by Recompute: a layer's state and its activations for every micro-batch in flight
  double state_layer_bytes;   // a layer's weights, gradients and optimizer state
  int64_t caps[3];            // by Recompute: the layers that fit (cap), from the two above
  // A lone half of a block (a stage boundary inside it), the same way; its bytes only with one chunk, once asked
  // (fill_half_memory).
  double fwd_attention_s, fwd_mlp_s, bwd_attention_s[3], bwd_mlp_s[3];
  double attention_bytes[3], mlp_bytes[3];
  // The stage with no layers (a vocabulary-only stage), exactly: fixed_bytes, extrapolated from one and two layers,
  // also holds the buffers a stage has once it has any block (gradient scratch, recomputation's), which would
  // refuse a head alone on a chip it fits.
  double empty_bytes;
  StageMemorySpec spec;  // the stage without its layer count and recomputation
  // A stage whose replicas mix chip types: each type's own terms (its rows); the stage's times are the slowest
  // share's and its layers those that fit on every share.
  std::vector<StageTerms> shares;
  int replicas = 0;  // of a share
  // Layers that fit with recomputation r (may be < 0: not even the fixed part fits).
  int64_t cap(Recompute r) const {
    if (!shares.empty()) {
      int64_t least = std::numeric_limits<int64_t>::max();
      for (const StageTerms& s : shares) least = std::min(least, s.cap(r));
      return least;
    }
    return caps[static_cast<int>(r)];
  }
  double layer_s(Recompute r) const {
    double slowest = fwd_layer_s + bwd_layer_s[static_cast<int>(r)];
    for (const StageTerms& s : shares) slowest = std::max(slowest, s.layer_s(r));
    return slowest;
  }
  // Forward and backward of the blocks in `q` on one replica of this chip type (not its shares); the first `redo` of
  // them (first_blocks(); -1: all) under r, the rest under none.
  double forward_s(const BlockHalves& q) const {
    return static_cast<double>(q.whole) * fwd_layer_s + static_cast<double>(q.attention) * fwd_attention_s +
           static_cast<double>(q.mlp) * fwd_mlp_s;
  }
  double backward_s(const BlockHalves& q, Recompute r, int64_t redo = -1) const {
    const auto sum = [&](const BlockHalves& part, int i) {
      return static_cast<double>(part.whole) * bwd_layer_s[i] +
             static_cast<double>(part.attention) * bwd_attention_s[i] + static_cast<double>(part.mlp) * bwd_mlp_s[i];
    };
    const BlockHalves redone = first_blocks(q, redo);
    return sum(redone, static_cast<int>(r)) + sum(q - redone, 0);
  }
  // Of backward_s(q, ...) + extra_bwd_s, the weight gradients' part (CostModel::layer_weight_s): no recomputation.
  double weight_s(const BlockHalves& q) const {
    return static_cast<double>(q.whole) * times->layer_weight_s +
           static_cast<double>(q.attention) * times->attention_weight_s +
           static_cast<double>(q.mlp) * times->mlp_weight_s + (embedding ? times->embedding_weight_s : 0) +
           (head ? times->head_weight_s : 0);
  }
  // Bytes per device of the blocks in `q` on this chip type, the first `redo` recomputing under r, the rest none.
  double bytes(const BlockHalves& q, Recompute r, int64_t redo = -1) const {
    const auto sum = [&](const BlockHalves& part, int i) {
      return static_cast<double>(part.whole) * per_layer_bytes[i] +
             static_cast<double>(part.attention) * attention_bytes[i] + static_cast<double>(part.mlp) * mlp_bytes[i];
    };
    const BlockHalves redone = first_blocks(q, redo);
    return fixed_bytes[redone.blocks() > 0 ? static_cast<int>(r) : 0] + sum(redone, static_cast<int>(r)) +
           sum(q - redone, 0) + kRoundingBytes;
  }
  bool fits(const BlockHalves& q, Recompute r, int64_t redo = -1) const { return bytes(q, r, redo) <= usable_bytes; }
  // The fewest of q's first blocks that must recompute under r for q to fit on this chip type; -1: not even all.
  int64_t least_redo(const BlockHalves& q, Recompute r) const {
    if (fits(q, Recompute::kNone)) return 0;
    if (!fits(q, r)) return -1;
    const int i = static_cast<int>(r);
    // Each recomputed block saves its activations; the shared buffer counts from the first. In order: the MLP half,
    // the whole blocks, the attention half.
    double over = bytes(q, r, 0) - fixed_bytes[0] + fixed_bytes[i] - usable_bytes;
    int64_t j = 0;
    if (q.mlp > 0) {
      over -= mlp_bytes[0] - mlp_bytes[i];
      j = 1;
    }
    const double save = per_layer_bytes[0] - per_layer_bytes[i];
    if (over > 0 && q.whole > 0 && save > 0) j += std::min(q.whole, static_cast<int64_t>(std::ceil(over / save)));
    while (!fits(q, r, j)) ++j;  // rounding: at most a block or two more, and all of them fit
    return j;
  }
  // The most whole blocks within `bound` seconds and memory, the first of them recomputing under r as few as fit, the
  // rest none. With j of n recomputed, memory is fixed[r] + j per_layer[r] + (n - j) per_layer[none], so the fewest
  // that fit are j(n) = ceil((fixed[r] + n per_layer[none] - room) / saved), and the time n (f + b[none]) + j(n)
  // (b[r] - b[none]) is affine in n but for the ceiling: solved for n, then stepped down to the exact fit.
  int64_t most_blocks_partial(Recompute r, double bound) const {
    const int i = static_cast<int>(r);
    const double room = usable_bytes - kRoundingBytes, saved = per_layer_bytes[0] - per_layer_bytes[i];
    const double time = bound - extra_fwd_s - extra_bwd_s + 1e-9 * (fwd_layer_s + bwd_layer_s[0]);
    const double extra = bwd_layer_s[i] - bwd_layer_s[0];  // a recomputed block's extra time
    if (saved <= 0 || time <= 0) return 0;
    const auto least = [&](int64_t n) {  // recomputed blocks of n for memory (may exceed n: not even all fit)
      return std::max<int64_t>(
          0, static_cast<int64_t>(
                 std::ceil((fixed_bytes[i] + static_cast<double>(n) * per_layer_bytes[0] - room) / saved - 1e-12)));
    };
    const auto within = [&](int64_t n) {
      const int64_t j = least(n);
      return j <= n && static_cast<double>(n) * (fwd_layer_s + bwd_layer_s[0]) + static_cast<double>(j) * extra <= time;
    };
    const double a = per_layer_bytes[0] / saved, b = (fixed_bytes[i] - room) / saved;
    int64_t n = std::min(
        cap(r), static_cast<int64_t>(std::floor((time - b * extra) / (fwd_layer_s + bwd_layer_s[0] + a * extra))) + 1);
    while (n > 0 && !within(n)) --n;
    return std::max<int64_t>(n, 0);
  }
  // The most half-blocks from `first` (at most `limit`) within `bound` seconds and memory, the first of them
  // recomputing under r as few as fit, the rest none; at least `least`, which recomputing all of them under r takes.
  int64_t most_halves_partial(Recompute r, double bound, int64_t first, int64_t limit, int64_t least) const {
    const double room = bound - extra_fwd_s - extra_bwd_s + 1e-9 * (fwd_layer_s + bwd_layer_s[0]);
    const auto within = [&](int64_t k) {
      const BlockHalves q = pieces(first, first + k);
      const int64_t j = least_redo(q, r);
      return j >= 0 && forward_s(q) + backward_s(q, r, j) <= room;
    };
    int64_t lo = least, hi = limit;  // within(lo), and nothing past hi
    if (room < 0 || lo >= hi || !within(lo + 1)) return lo;
    ++lo;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (within(mid)) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  }
  // The most half-blocks from half-block `first` (at most `limit`) within `bound` seconds and memory under r, on one
  // chip type: its MLP half if `first` is one, whole blocks, then an attention half; the blocks in order.
  int64_t most_halves(Recompute r, double bound, int64_t first, int64_t limit) const {
    const int i = static_cast<int>(r);
    const double layer = fwd_layer_s + bwd_layer_s[i], slack = 1e-9 * layer;
    double time = bound - extra_fwd_s - extra_bwd_s + slack, room = usable_bytes - fixed_bytes[i] - kRoundingBytes;
    int64_t k = 0;
    if (first % 2 == 1 && limit > 0) {
      const double mlp = fwd_mlp_s + bwd_mlp_s[i];
      if (mlp > time || mlp_bytes[i] > room) return 0;
      time -= mlp;
      room -= mlp_bytes[i];
      k = 1;
    }
    const int64_t n =
        std::max<int64_t>(0, std::min({static_cast<int64_t>(std::floor(time / layer)),
                                       static_cast<int64_t>(std::floor(room / per_layer_bytes[i])), (limit - k) / 2}));
    k += 2 * n;
    time -= static_cast<double>(n) * layer;
    room -= static_cast<double>(n) * per_layer_bytes[i];
    if (k < limit && fwd_attention_s + bwd_attention_s[i] <= time && attention_bytes[i] <= room) ++k;
    return k;
  }
  // Whether the stage fits with no layers, on every chip type of its replicas.
  bool fits_empty() const {
    for (const StageTerms& s : members()) {
      if (s.empty_bytes + kRoundingBytes > s.usable_bytes) return false;
    }
    return true;
  }
  // The stage's replicas by chip type: its shares, or itself.
  std::span<const StageTerms> members() const {
    return shares.empty() ? std::span<const StageTerms>(this, 1) : std::span<const StageTerms>(shares);
  }
  static constexpr double kRoundingBytes = 4096;  // ZeRO-1's rounded-up shards
};

// The memory terms of the stages a search has costed (fill_memory's, and fill_half_memory's once asked), by
// everything they depend on (the model and the setup are the search's): a search costs the same stages in layout
// after layout, and asking stage_memory for them each time was most of its time. One per search thread, not shared.
struct MemoryTerms {
  double per_layer_bytes[3], fixed_bytes[3], state_layer_bytes, empty_bytes;
  int64_t caps[3];
  bool halves = false;  // attention_bytes and mlp_bytes filled
  double attention_bytes[3], mlp_bytes[3];
};
struct MemoryKey {
  int chip, tp, rows, optimizer_shards, in_flight;
  bool embedding, head;
  std::vector<int> chunk_in_flight;
  bool operator==(const MemoryKey&) const = default;
};
struct MemoryKeyHash {
  size_t operator()(const MemoryKey& k) const {
    size_t h = 0;
    const auto mix = [&h](int64_t x) { h = (h ^ static_cast<size_t>(x)) * 1099511628211ull; };  // FNV-1a's prime
    for (int x : {k.chip, k.tp, k.rows, k.optimizer_shards, k.in_flight, 2 * int{k.embedding} + int{k.head}}) mix(x);
    for (int x : k.chunk_in_flight) mix(x);
    return h;
  }
};
using MemoryCache = std::unordered_map<MemoryKey, MemoryTerms, MemoryKeyHash>;

// Copies fill_memory's terms (whole: per layer, fixed, caps, state, empty) or fill_half_memory's (halves) between a
// stage and its cache entry, either way.
template <typename From, typename To>
void copy_memory_terms(const From& from, To& to, bool halves) {
  if (halves) {
    std::copy_n(from.attention_bytes, 3, to.attention_bytes);
    std::copy_n(from.mlp_bytes, 3, to.mlp_bytes);
    return;
  }
  std::copy_n(from.per_layer_bytes, 3, to.per_layer_bytes);
  std::copy_n(from.fixed_bytes, 3, to.fixed_bytes);
  std::copy_n(from.caps, 3, to.caps);
  to.state_layer_bytes = from.state_layer_bytes;
  to.empty_bytes = from.empty_bytes;
}

MemoryKey memory_key(const StageTerms& t) {  // t with its spec set
  return {t.chip, t.tp, t.rows, t.spec.optimizer_shards, t.in_flight, t.embedding, t.head, t.chunk_in_flight};
}

// A stage's embedding or head work and its memory terms, given its chip, TP, rows, replicas, place and chunks; the
// memory terms from `cache` when it has them.
void fill_memory(const CostModel& c, StageTerms& t, MemoryCache* cache = nullptr) {
  if (t.embedding) {
    t.extra_fwd_s += t.times->embedding_forward_s;
    t.extra_bwd_s += t.times->embedding_backward_s;
  }
  if (t.head) {
    t.extra_fwd_s += t.times->head_forward_s;
    t.extra_bwd_s += t.times->head_backward_s;
  }
  t.spec = StageMemorySpec{.shape = c.model(),
                           .embedding = t.embedding,
                           .head = t.head,
                           .rows = t.rows,
                           .tp = t.tp,
                           .optimizer_shards = c.train().zero1 ? t.dp : 1,
                           .in_flight = t.in_flight};
  if (cache != nullptr) {
    if (const auto it = cache->find(memory_key(t)); it != cache->end()) {
      copy_memory_terms(it->second, t, false);
      return;
    }
  }
  // Affine from one and two layers per chunk (exact when the chunks' layers are equal).
  const int v = std::max<int>(1, static_cast<int>(t.chunk_in_flight.size()));
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    StageMemorySpec spec = t.spec;
    spec.recompute = r;
    spec.layers = v;
    const StageMemory one = c.stage_memory(spec, t.chunk_in_flight);
    spec.layers = 2 * v;
    const StageMemory two = c.stage_memory(spec, t.chunk_in_flight);
    const int k = static_cast<int>(r);
    t.per_layer_bytes[k] = (two.total() - one.total()) / v;
    t.fixed_bytes[k] = one.total() - v * t.per_layer_bytes[k];
    t.state_layer_bytes = (two.state() - one.state()) / v;
    t.caps[k] = static_cast<int64_t>(
        std::floor((t.usable_bytes - t.fixed_bytes[k] - StageTerms::kRoundingBytes) / t.per_layer_bytes[k]));
  }
  StageMemorySpec empty = t.spec;
  empty.layers = 0;
  t.empty_bytes = c.stage_memory(empty, t.chunk_in_flight).total();
  if (cache != nullptr) copy_memory_terms(t, (*cache)[memory_key(t)], false);
}

// What a lone attention half and a lone MLP half add to a stage of one chunk, beside fill_memory's terms: asked only
// of the layouts whose split in half-blocks is tried (most are pruned before).
void fill_half_memory(const CostModel& c, StageTerms& t, MemoryCache* cache = nullptr) {
  for (StageTerms& share : t.shares) fill_half_memory(c, share, cache);
  // fill_memory, asked first with the same cache, made t's entry.
  MemoryTerms* terms = cache != nullptr ? &cache->at(memory_key(t)) : nullptr;
  if (terms != nullptr && terms->halves) {
    copy_memory_terms(*terms, t, true);
    return;
  }
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    StageMemorySpec spec = t.spec;
    spec.recompute = r;
    spec.layers = 1;
    const double one = c.stage_memory(spec).total();
    spec.layers = 2;
    spec.ends_at_attention = true;  // a block and an attention half
    t.attention_bytes[static_cast<int>(r)] = c.stage_memory(spec).total() - one;
    spec.ends_at_attention = false;
    spec.starts_at_mlp = true;  // an MLP half and a block
    t.mlp_bytes[static_cast<int>(r)] = c.stage_memory(spec).total() - one;
  }
  if (terms != nullptr) {
    copy_memory_terms(t, *terms, true);
    terms->halves = true;
  }
}

std::vector<StageTerms> stage_terms(const CostModel& c, const Layout& layout, MemoryCache* cache = nullptr) {
  const int p = static_cast<int>(layout.stages.size());
  const int m = static_cast<int>(c.train().global_batch / (layout.dp * layout.micro_batch));
  // 1F1B's micro-batches in flight have a closed form (max_in_flight's, tested equal); other schedules are generated.
  const bool one_f_one_b = layout.schedule == ScheduleKind::k1F1B;
  const Schedule schedule = one_f_one_b ? Schedule{} : make_schedule(layout.schedule, p, layout.chunks, m);
  // Stages of one chip type, TP degree and rows per replica share their time per layer: cost each once.
  std::vector<StageTerms> bases;
  auto base = [&](int chip, int tp, int b) -> const StageTerms& {
    for (const StageTerms& t : bases) {
      if (t.chip == chip && t.tp == tp && t.rows == b) return t;
    }
    StageTerms t{};
    t.chip = chip;
    t.tp = tp;
    t.rows = b;
    t.usable_bytes = c.usable_bytes(chip);
    t.times = &c.piece_times(chip, tp, b);
    t.fwd_layer_s = t.times->layer_forward_s;
    t.fwd_attention_s = t.times->attention_forward_s;
    t.fwd_mlp_s = t.times->mlp_forward_s;
    for (int r = 0; r < 3; ++r) {
      t.bwd_layer_s[r] = t.times->layer_backward_s[r];
      t.bwd_attention_s[r] = t.times->attention_backward_s[r];
      t.bwd_mlp_s[r] = t.times->mlp_backward_s[r];
    }
    bases.push_back(t);
    return bases.back();
  };
  std::vector<StageTerms> out;
  out.reserve(static_cast<size_t>(p));
  for (int i = 0; i < p; ++i) {
    const int dp = layout.stage_dp(static_cast<size_t>(i)), tp = layout.stages[static_cast<size_t>(i)].tp;
    std::vector<StageTerms> shares;
    shares.reserve(std::max<size_t>(1, layout.stages[static_cast<size_t>(i)].mix.size()));
    layout.for_each_share(static_cast<size_t>(i), [&](const Layout::Share& s) {
      shares.push_back(base(s.chip, tp, s.rows));
      shares.back().replicas = s.replicas;
    });
    for (StageTerms& t : shares) {
      t.dp = dp;
      // The micro-batches (a chunk's share each when interleaved) its schedule keeps in flight: 1F1B min(p - i, m).
      t.in_flight = one_f_one_b ? std::min(p - i, m) : max_in_flight(schedule, i);
      if (layout.chunks > 1) {
        for (int k = 0; k < layout.chunks; ++k) t.chunk_in_flight.push_back(max_in_flight(schedule, i, k * p + i));
      }
      t.embedding = i == 0;
      t.head = i == p - 1;
      fill_memory(c, t, cache);
    }
    if (shares.size() == 1) {
      out.push_back(std::move(shares.front()));
      continue;
    }
    // Mixed: the stage's extra work (embedding, head) is the slowest share's, its time per layer and its room for
    // layers the shares' (layer_s and cap ask each); the rest stays the first share's.
    StageTerms whole = shares.front();
    for (const StageTerms& s : shares) {
      whole.extra_fwd_s = std::max(whole.extra_fwd_s, s.extra_fwd_s);
      whole.extra_bwd_s = std::max(whole.extra_bwd_s, s.extra_bwd_s);
    }
    whole.shares = std::move(shares);
    out.push_back(std::move(whole));
  }
  return out;
}

// What any stage of one layer needs at the least (a middle stage, full recomputation, one micro-batch in flight):
// a TP degree below this cannot hold a layer at all.
double one_layer_bytes(const CostModel& c, int tp, int dp, int b) {
  return c
      .stage_memory({.layers = 1,
                     .rows = b,
                     .tp = tp,
                     .optimizer_shards = c.train().zero1 ? dp : 1,
                     .recompute = Recompute::kFull})
      .total();
}

// The weights, gradients and optimizer state of all the layers, which a pipeline's devices must hold together.
double layers_state_bytes(const CostModel& c, int dp) {
  return c.stage_memory({.layers = c.model().layers, .optimizer_shards = c.train().zero1 ? dp : 1}).state();
}

// The allowed recomputation choices, fastest first.
std::vector<Recompute> allowed(const CostModel& c) {
  std::vector<Recompute> r;
  for (Recompute x : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    if (std::find(c.train().allowed_recompute.begin(), c.train().allowed_recompute.end(), x) !=
        c.train().allowed_recompute.end()) {
      r.push_back(x);
    }
  }
  return r;
}

// The recomputations a stage may apply to only its first blocks (the rest none): the allowed ones but none, when none
// is allowed too and the setup does not forbid it. For stages of one chunk (partial_on).
std::vector<Recompute> partial(const CostModel& c) {
  std::vector<Recompute> r = allowed(c);
  if (!c.train().partial_recompute || r.front() != Recompute::kNone) return {};
  r.erase(r.begin());
  return r;
}
std::span<const Recompute> partial_on(const std::vector<Recompute>& partial, const StageTerms& t) {
  return t.chunk_in_flight.empty() ? std::span<const Recompute>(partial) : std::span<const Recompute>();
}

// A stage's recomputation on one chip type: r on its first `blocks` (-1: all of them).
struct RecomputeChoice {
  Recompute r = Recompute::kNone;
  int64_t blocks = -1;
};

// The fastest recomputation under which the blocks in q fit on chip type t: each allowed one on all of them, or on as
// few of the first as fit (partial); nullopt when none fits.
std::optional<RecomputeChoice> fastest_fit(const std::vector<Recompute>& choices,
                                           const std::vector<Recompute>& partials, const StageTerms& t,
                                           const BlockHalves& q) {
  std::optional<RecomputeChoice> best;
  double best_s = kInf;
  for (Recompute r : choices) {
    if (!t.fits(q, r) || t.backward_s(q, r) >= best_s) continue;
    if (r == Recompute::kNone) return RecomputeChoice{r, -1};  // the fastest of all
    best = RecomputeChoice{r, -1}, best_s = t.backward_s(q, r);
  }
  for (Recompute r : partial_on(partials, t)) {
    const int64_t j = t.least_redo(q, r);
    if (j > 0 && j < q.blocks() && t.backward_s(q, r, j) < best_s) {
      best = RecomputeChoice{r, j}, best_s = t.backward_s(q, r, j);
    }
  }
  return best;
}

// Whether f is the failure to report rather than `than`: the smaller shortfall, ties by text (the search's threads
// reach layouts in any order, the error does not depend on it).
bool closer(const FitFailure& f, const FitFailure& than) {
  if (than.what.empty()) return true;
  return std::tie(f.shortfall_bytes, f.what) < std::tie(than.shortfall_bytes, than.what);
}

std::string describe_stage(const CostModel& c, int i, const StageTerms& t) {
  return cat("stage ", i, " (", c.cluster().chips[static_cast<size_t>(t.chip)].name, ", TP ", t.tp, ")");
}

}  // namespace

std::vector<int> tp_options(const CostModel& c, int chip) {
  std::vector<int> out;
  const NodeGroup& g = c.cluster().group_of(chip);
  for (int t = 1; t <= g.chips_per_node; t *= 2) {
    if (c.train().max_tp > 0 && t > c.train().max_tp) break;
    if (c.model().heads % t == 0 && c.model().kv_heads % t == 0) out.push_back(t);
  }
  return out;
}

namespace {

// score_split with the layout's stage terms (the search computes them once for the split and the scoring).
std::optional<Plan> score_terms(const CostModel& c, const Layout& layout, const std::vector<StageTerms>& terms,
                                const std::vector<int>& layers, FitFailure* failure, const ScoreOptions& options) {
  const std::vector<Recompute> choices = allowed(c), partials = partial(c);
  const int p = static_cast<int>(terms.size());
  const int b = layout.micro_batch, v = layout.chunks;
  const int m = static_cast<int>(c.train().global_batch / (layout.dp * b));
  const TransformerShape& s = c.model();
  Plan plan;
  plan.cluster = c.cluster().name;
  plan.shape = s;
  plan.global_batch = c.train().global_batch;
  plan.precision = c.train().precision;
  plan.h2_runtime = c.train().h2_runtime;
  plan.zero1 = c.train().zero1;
  plan.micro_batch = b;
  plan.num_micro_batches = m;
  plan.dp = layout.dp;
  plan.schedule = layout.schedule;
  plan.chunks = v;
  int64_t first = 0;  // layers, or half-blocks with options.halves
  double sum_e = 0, max_e = 0, sum_c = 0, max_c = 0;
  for (int i = 0; i < p; ++i) {
    const StageTerms& t = terms[static_cast<size_t>(i)];
    const int n = layers[static_cast<size_t>(i)];
    const BlockHalves q = options.halves ? pieces(first, first + n) : BlockHalves{.whole = n};
    H2_CHECK(!options.halves || t.attention_bytes[0] > 0) << "half-blocks scored without fill_half_memory";
    // Per chip type of the stage (its k-th share): the given recomputation, else the fastest under which n layers fit
    // on it. As a plan holds it: recomputing 0 blocks is none, all of them (or more) -1.
    const auto normal = [&](Recompute r, int64_t blocks) {
      if (blocks == 0) r = Recompute::kNone;
      return RecomputeChoice{r, r == Recompute::kNone || blocks >= q.blocks() ? -1 : blocks};
    };
    const auto given = [&](size_t k) -> std::optional<RecomputeChoice> {
      if (options.recompute.empty()) return std::nullopt;
      const GivenRecompute& stage = options.recompute.at(static_cast<size_t>(i));
      if (!stage.shares.empty() && stage.shares.at(k).recompute) {
        return normal(*stage.shares[k].recompute, stage.shares[k].blocks);
      }
      if (!stage.recompute) return std::nullopt;
      return normal(*stage.recompute, stage.blocks);
    };
    bool found = true;  // a recomputation was given, or one fits on every chip type of the stage
    const auto recompute_of = [&](const StageTerms& share, size_t k) {
      if (const std::optional<RecomputeChoice> r = given(k)) return *r;
      if (const std::optional<RecomputeChoice> r = fastest_fit(choices, partials, share, q)) return *r;
      found = false;
      return RecomputeChoice{choices.back(), -1};
    };
    StagePlan st;
    st.tp = t.tp;
    st.dp = t.dp;
    st.first_layer = static_cast<int>(options.halves ? first / 2 : first);
    st.layers = static_cast<int>(q.blocks());
    st.starts_at_mlp = q.mlp > 0;
    st.ends_at_attention = q.attention > 0;
    st.embedding = t.embedding;
    st.head = t.head;
    st.in_flight = t.in_flight;
    // Each chip type of the stage (one, or the shares of a mixed stage): its time and memory. The stage's times
    // are the slowest share's, its memory the share with the least headroom, its chip the share that bounds time.
    const double params = static_cast<double>(stage_params({.shape = s,
                                                            .embedding = t.embedding,
                                                            .head = t.head,
                                                            .layers = q.blocks(),
                                                            .starts_at_mlp = st.starts_at_mlp,
                                                            .ends_at_attention = st.ends_at_attention,
                                                            .tp = t.tp}));  // per device: a TP rank's shard
    // The model's tensors on this stage (gpt.cc): 12 per block (6 a half), wte and wpe, ln_f's two and its own wte.
    const int tensors = static_cast<int>(12 * q.whole + 6 * (q.attention + q.mlp)) + (t.embedding ? 2 : 0) +
                        (t.head ? (t.embedding ? 2 : 3) : 0);
    double slowest = -1, headroom = kInf;
    for (size_t k = 0; k < t.members().size(); ++k) {
      const StageTerms& share = t.members()[k];
      const auto [recompute, redo] = recompute_of(share, k);
      StageMemorySpec spec = share.spec;
      spec.layers = q.blocks();
      spec.starts_at_mlp = st.starts_at_mlp;
      spec.ends_at_attention = st.ends_at_attention;
      spec.recompute = recompute;
      spec.recompute_blocks = redo;
      const StageMemory memory = c.stage_memory(spec, share.chunk_in_flight);
      const double total = memory.total();
      if (total > share.usable_bytes && failure != nullptr) {
        failure->shortfall_bytes = total - share.usable_bytes;
        failure->what =
            cat(describe_stage(c, i, share), " with ", format("%g", options.halves ? n / 2.0 : n), " layers needs ",
                format_bytes(total), " per device with ", recompute_label(recompute, static_cast<int>(redo)),
                " recomputation; it has ", format_bytes(share.usable_bytes), " usable (short by ",
                format_bytes(failure->shortfall_bytes), ")");
      }
      ReplicaGroup g{.chip = c.cluster().chips[static_cast<size_t>(share.chip)].name,
                     .chip_index = share.chip,
                     .replicas = share.replicas,
                     .rows = share.rows,
                     .recompute = recompute,
                     .recompute_blocks = static_cast<int>(redo),
                     .forward_s = share.forward_s(q) + share.extra_fwd_s,
                     .backward_s = share.backward_s(q, recompute, redo) + share.extra_bwd_s,
                     .weight_s = share.weight_s(q),
                     .memory_bytes = total,
                     .capacity_bytes = share.usable_bytes};
      st.forward_s = std::max(st.forward_s, g.forward_s);
      if (g.backward_s > st.backward_s) st.backward_s = g.backward_s, st.weight_s = g.weight_s;
      if (g.forward_s + g.backward_s > slowest) {
        slowest = g.forward_s + g.backward_s;
        st.chip = g.chip;
        st.chip_index = g.chip_index;
        st.recompute = recompute;
        st.recompute_blocks = g.recompute_blocks;
      }
      if (1.0 - total / share.usable_bytes < headroom) {
        headroom = 1.0 - total / share.usable_bytes;
        st.state_bytes = memory.state();
        // Per micro-batch in flight (interleaved: what the chunks hold, over the stage's most in flight at once).
        st.activation_bytes = memory.per_micro_batch() * memory.in_flight / share.in_flight;
        st.buffer_bytes = memory.buffers();
        st.weight_pending_bytes = c.weight_pending_bytes(spec);
        st.memory_bytes = total;
        st.capacity_bytes = share.usable_bytes;
      }
      plan.fits = plan.fits && total <= share.usable_bytes;
      st.optimizer_s = std::max(st.optimizer_s, c.optimizer_s(share.chip, t.dp, params, tensors));
      if (i + 1 < p) {
        for (const StageTerms& next : terms[static_cast<size_t>(i + 1)].members()) {
          st.send_s = std::max(st.send_s, c.transfer_s(share.chip, t.tp, next.chip, next.tp, next.rows));
        }
      }
      if (!t.shares.empty()) st.groups.push_back(g);
    }
    if (!found && options.require_fit) return std::nullopt;
    std::vector<int> types;
    for (const StageTerms& share : t.members()) types.push_back(share.chip);
    st.dp_allreduce_s = c.dp_allreduce_s(types, t.tp, t.dp, params);
    if (p > 1 && s.tied_embeddings && (t.embedding || t.head)) {
      // As the runtime sums them (pipeline/runtime.h, StageComms::tied): the ends' DP and TP alike, each rank with
      // its counterpart, its rows; the DP alike, a replica's ranks at both ends, the whole vocabulary's rows; else
      // each rank its rows with the other end's ranks that hold them.
      const StageTerms &a = terms.front(), &z = terms.back();
      const double rows = static_cast<double>(s.vocab * s.hidden);
      st.tied_allreduce_s = a.dp == z.dp && a.tp != z.tp ? c.tied_allreduce_s(a.chip, z.chip, rows, a.tp + z.tp)
                                                         : c.tied_allreduce_s(a.chip, z.chip, rows / t.tp);
    }
    const double e = st.forward_s + st.backward_s;
    sum_e += e;
    max_e = std::max(max_e, e);
    sum_c += st.send_s;
    max_c = std::max(max_c, st.send_s);
    plan.stages.push_back(st);
    first += n;
  }
  // 1F1B (Narayanan et al. 2021): fill and drain pass every stage once each way; in steady state the slowest
  // stage (or link) sets the pace for the remaining m - 1 micro-batches. Stage i finishes its last backward before
  // the drain reaches the stages in front of it; then its gradient all-reduce and optimizer step run. Other
  // schedules have no closed form here: the replay's times.
  std::vector<double> finish;
  double pipe = 0;
  if (layout.schedule == ScheduleKind::k1F1B) {
    // The steady state's period: the slowest stage or link, or a round trip — stage i keeps p - i micro-batches
    // in flight, each of which must go to the last stage and back (its compute and links) before the next
    // enters, so it starts one at most every round trip / (p - i).
    double period = std::max(max_e, max_c), round_trip = 0;
    for (int i = p - 1; i >= 0; --i) {
      const StagePlan& st = plan.stages[static_cast<size_t>(i)];
      round_trip += st.forward_s + st.backward_s + 2 * st.send_s;
      period = std::max(period, round_trip / std::min(p - i, m));
    }
    pipe = sum_e + 2 * sum_c + (m - 1) * period;
    double ahead = 0;
    for (int i = 0; i < p; ++i) {
      const StagePlan& st = plan.stages[static_cast<size_t>(i)];
      finish.push_back(pipe - ahead);
      ahead += st.backward_s + st.send_s;
    }
  } else {
    const ReplayResult r = replay_plan(plan);
    finish = r.finish;
    pipe = r.makespan;
  }
  plan.devices_used = 0;
  for (const StagePlan& st : plan.stages) plan.devices_used += st.devices();
  for (const NodeGroup& g : c.cluster().groups) plan.devices_total += g.devices();
  set_step(c, plan, finish, pipe, layout.schedule == ScheduleKind::k1F1B && max_c > max_e);
  return plan;
}

}  // namespace

std::optional<Plan> score_split(const CostModel& c, const Layout& layout, const std::vector<int>& layers,
                                FitFailure* failure, const ScoreOptions& options) {
  std::vector<StageTerms> terms = stage_terms(c, layout);
  if (options.halves) {
    for (StageTerms& t : terms) fill_half_memory(c, t);
  }
  return score_terms(c, layout, terms, layers, failure, options);
}

void set_step(const CostModel& c, Plan& plan, const std::vector<double>& finish, double pipe, bool link_bound) {
  const int p = static_cast<int>(plan.stages.size()), m = plan.num_micro_batches;
  const double step = end_of_step(plan, finish).step_s;
  plan.step_s = step;
  plan.tokens_per_s = static_cast<double>(plan.global_batch) * plan.shape.seq_len / step;
  double peak = 0, sum_e = 0;
  const bool bf16 = c.train().precision == Precision::kBf16;
  for (const StagePlan& st : plan.stages) {
    for (const ReplicaGroup& g : st.replica_groups()) {
      peak += st.tp * g.replicas * c.cluster().chips[static_cast<size_t>(g.chip_index)].peak_flops(bf16);
    }
    sum_e += st.forward_s + st.backward_s;
  }
  plan.mfu = c.step_model_flops() / (step * peak);
  // Idle share of the stages' time; a pipeline summed action by action may round below m x (f + b), not idle.
  plan.bubble_fraction = std::max(0.0, 1.0 - m * sum_e / p / pipe);
  // What bounds it.
  int slowest = 0, sender = 0;
  for (int i = 1; i < p; ++i) {
    const auto& a = plan.stages[static_cast<size_t>(i)];
    const auto& z = plan.stages[static_cast<size_t>(slowest)];
    if (a.forward_s + a.backward_s > z.forward_s + z.backward_s) slowest = i;
    if (a.send_s > plan.stages[static_cast<size_t>(sender)].send_s) sender = i;
  }
  const StagePlan& sl = plan.stages[static_cast<size_t>(slowest)];
  const std::string not_fit =
      plan.limited_by.starts_with("DOES NOT FIT") ? plan.limited_by.substr(0, plan.limited_by.find("; ")) + "; " : "";
  if (link_bound) {
    plan.limited_by =
        cat(not_fit, "the link after stage ", sender, ": ", plan.stages[static_cast<size_t>(sender)].send_s * 1e3,
            " ms per micro-batch exceeds every stage's compute");
  } else {
    plan.limited_by =
        cat(not_fit, "compute of stage ", slowest, " (", sl.chip, ", TP ", sl.tp, ", ", format("%g", sl.halves() / 2.0),
            " layers, ", recompute_label(sl.recompute, sl.recompute_blocks),
            " recomputation): ", (sl.forward_s + sl.backward_s) * 1e3, " ms per micro-batch");
  }
  double tightest = 1.0;
  int tight = 0;
  for (int i = 0; i < p; ++i) {
    const auto& st = plan.stages[static_cast<size_t>(i)];
    const double headroom = 1.0 - st.memory_bytes / st.capacity_bytes;
    if (headroom < tightest) tightest = headroom, tight = i;
  }
  plan.limited_by += cat("; least memory headroom: stage ", tight, " at ", std::lround(tightest * 100), "%");
  if (plan.bubble_fraction > 0.2)
    plan.limited_by += cat("; pipeline bubble ", std::lround(plan.bubble_fraction * 100), "%");
}

void score_by_replay(const CostModel& c, Plan& plan) {
  const ReplayResult r = replay_plan(plan);
  set_step(c, plan, r.finish, r.makespan, false);
}

void score_with_zero_bubble(const CostModel& c, Plan& plan) {
  score_by_replay(c, plan);
  if (!c.train().zero_bubble) return;
  std::optional<Plan> z = as_zero_bubble(plan);
  if (!z) return;
  score_by_replay(c, *z);
  if (z->step_s < plan.step_s) plan = std::move(*z);
}

namespace {

struct Split {
  std::vector<int> layers;  // per stage: layers, or half-blocks (balanced_half_split); empty: beyond the cutoff
  double bottleneck_s;      // the slowest stage's time per micro-batch; with no layers, what it exceeds
};

// Stage 2: the least bottleneck time B such that the stages can take all layers, each stage taking
// n_i(B) = max over recomputation r of min(cap_i(r), floor((B - extra_i) / layer_i(r))) layers. Where B exceeds
// `cutoff` (a layout the search would prune for it), the split says so after one try instead of searching for B.
std::optional<Split> balanced_split(const CostModel& c, const Layout& layout, const std::vector<StageTerms>& terms,
                                    FitFailure* failure, double cutoff = kInf) {
  const std::vector<Recompute> choices = allowed(c), partials = partial(c);
  const int64_t L = c.model().layers;
  const int p = static_cast<int>(terms.size());
  // Every stage must hold at least one layer (interleaved: one per chunk); a vocabulary-only stage none.
  std::vector<int> least(static_cast<size_t>(p), layout.chunks);
  int64_t needed = 0;
  for (int i = 0; i < p; ++i) {
    if (layout.stages[static_cast<size_t>(i)].vocabulary_only) least[static_cast<size_t>(i)] = 0;
    needed += least[static_cast<size_t>(i)];
  }
  if (needed > L) {
    if (failure) failure->what = cat(p, " stages of ", layout.chunks, " chunks for ", L, " layers");
    return std::nullopt;
  }
  // The layers stage i takes within `bound`: -1 when its own extra work (embedding, head) alone exceeds it.
  // On one chip type: the most layers within `bound` under its best recomputation.
  auto take_on = [&](const StageTerms& t, double bound) {
    int64_t best = 0, most = 0;  // most: within the bound without recomputation, memory aside
    for (Recompute r : choices) {
      const int64_t by_time =
          static_cast<int64_t>(std::floor((bound - t.extra_fwd_s - t.extra_bwd_s) / t.layer_s(r) + 1e-9));
      if (r == Recompute::kNone) most = by_time;
      best = std::max(best, std::min(t.cap(r), by_time));
    }
    // Recomputing only the first blocks: at most what none takes in time and r in memory, so worth asking only
    // when that is more than the best so far.
    for (Recompute r : partial_on(partials, t)) {
      if (std::min(t.cap(r), most) > best) best = std::max(best, t.most_blocks_partial(r, bound));
    }
    return best;
  };
  // A stage whose replicas mix chip types takes what every type can, each with its own recomputation.
  auto take = [&](int i, double bound) -> int64_t {
    const StageTerms& t = terms[static_cast<size_t>(i)];
    if (least[static_cast<size_t>(i)] == 0) return bound + 1e-12 >= t.extra_fwd_s + t.extra_bwd_s ? 0 : -1;
    int64_t n = std::numeric_limits<int64_t>::max();
    for (const StageTerms& share : t.members()) n = std::min(n, take_on(share, bound));
    return n;
  };
  for (int i = 0; i < p; ++i) {
    const StageTerms& t = terms[static_cast<size_t>(i)];
    const int64_t at_least = least[static_cast<size_t>(i)];
    if (at_least == 0 ? !t.fits_empty() : t.cap(choices.back()) < at_least) {
      FitFailure f;
      score_split(c, layout, least, &f);
      if (at_least > 0 && (t.embedding || t.head) && t.fits_empty()) f.vocabulary_alone = i;
      if (failure) *failure = f;
      return std::nullopt;
    }
  }
  int64_t capacity = 0;
  double hi = 0;
  for (int i = 0; i < p; ++i) {
    const StageTerms& t = terms[static_cast<size_t>(i)];
    if (least[static_cast<size_t>(i)] > 0) capacity += t.cap(choices.back());
    hi = std::max(
        hi, t.extra_fwd_s + t.extra_bwd_s + (least[static_cast<size_t>(i)] > 0 ? L : 0) * t.layer_s(choices.back()));
  }
  if (capacity < L) {
    if (failure) {
      failure->what =
          cat("the ", count_stages(static_cast<size_t>(p)), p == 1 ? " holds" : " hold", " at most ", capacity, " of ",
              L, " layers in memory even with ", recompute_name(choices.back()), " recomputation");
      failure->shortfall_bytes = (L - capacity) * (terms.front().state_layer_bytes);
    }
    return std::nullopt;
  }
  const auto feasible = [&](double bound) {
    int64_t total = 0;
    for (int i = 0; i < p; ++i) {
      const int64_t n = take(i, bound);
      if (n < least[static_cast<size_t>(i)]) return false;
      total += n;
    }
    return total >= L;
  };
  if (cutoff < hi) {
    if (!feasible(cutoff)) return Split{{}, cutoff};
    hi = cutoff;
  }
  double lo = 0;
  for (int iter = 0; iter < 60 && hi - lo > 1e-6 * hi; ++iter) {
    const double mid = 0.5 * (lo + hi);
    (feasible(mid) ? hi : lo) = mid;
  }
  Split split{std::vector<int>(static_cast<size_t>(p)), hi};
  std::vector<int>& layers = split.layers;
  int64_t total = 0;
  for (int i = 0; i < p; ++i) total += layers[static_cast<size_t>(i)] = static_cast<int>(take(i, hi));
  // Give back the surplus from the stages whose time is highest, which also shortens fill and drain.
  while (total > L) {
    int worst = -1;
    double worst_s = -1;
    for (int i = 0; i < p; ++i) {
      const StageTerms& t = terms[static_cast<size_t>(i)];
      const double s = layers[static_cast<size_t>(i)] * t.layer_s(choices.front()) + t.extra_fwd_s + t.extra_bwd_s;
      if (layers[static_cast<size_t>(i)] > least[static_cast<size_t>(i)] && s > worst_s) worst_s = s, worst = i;
    }
    --layers[static_cast<size_t>(worst)];
    --total;
  }
  return split;
}

// Stage 2 with stage boundaries inside blocks: the least bottleneck B at which the stages, in order, can take the
// model's 2L half-blocks. What a stage can take depends on where it starts (an MLP half first, or a block), so the
// half-blocks reachable after each stage form an interval (all starts of either kind ending within it); B is
// feasible when 2L is reachable after the last stage. Then, from the end, each stage takes the most it can from the
// earliest start the stages before it reach — the later stages the most, the earlier the rest. `whole` is the split
// in whole layers (its bottleneck bounds B from above); without a better one, nullopt.
std::optional<Split> balanced_half_split(const CostModel& c, const Layout& layout, const std::vector<StageTerms>& terms,
                                         const Split& whole) {
  const std::vector<Recompute> choices = allowed(c), partials = partial(c);
  const int64_t H = 2 * c.model().layers;
  const int p = static_cast<int>(terms.size());
  // The most half-blocks stage i takes from half-block `first` within `bound`, each chip type of its replicas under
  // its best recomputation; a vocabulary-only stage none (-1: its own work exceeds the bound).
  const auto take = [&](int i, double bound, int64_t first) -> int64_t {
    const StageTerms& t = terms[static_cast<size_t>(i)];
    if (layout.stages[static_cast<size_t>(i)].vocabulary_only) {
      return bound + 1e-12 >= t.extra_fwd_s + t.extra_bwd_s ? 0 : -1;
    }
    int64_t n = std::numeric_limits<int64_t>::max();
    for (const StageTerms& share : t.members()) {
      int64_t most = 0;
      for (Recompute r : choices) most = std::max(most, share.most_halves(r, bound, first, H - first));
      for (Recompute r : partial_on(partials, share)) {
        most = std::max(most, share.most_halves_partial(r, bound, first, H - first, most));
      }
      n = std::min(n, most);
    }
    return n;
  };
  const auto least = [&](int i) { return layout.stages[static_cast<size_t>(i)].vocabulary_only ? 0 : 1; };
  // The half-blocks reachable after each stage within `bound`, [lo, hi]; empty when 2L is not reached.
  const auto reach = [&](double bound) {
    std::vector<std::pair<int64_t, int64_t>> after;
    int64_t lo = 0, hi = 0;
    for (int i = 0; i < p; ++i) {
      int64_t next_lo = H + 1, next_hi = -1;
      for (int64_t first : {lo, lo + 1, hi - 1, hi}) {
        if (first < lo || first > hi) continue;
        const int64_t n = take(i, bound, first);
        if (n < least(i)) continue;
        next_lo = std::min(next_lo, first + least(i));
        next_hi = std::max(next_hi, first + n);
      }
      if (next_lo > next_hi) return std::vector<std::pair<int64_t, int64_t>>{};
      lo = next_lo;
      hi = next_hi;
      after.push_back({lo, hi});
    }
    if (lo > H || hi < H) return std::vector<std::pair<int64_t, int64_t>>{};
    return after;
  };
  double lo = 0, hi = whole.bottleneck_s;
  if (reach(hi).empty()) return std::nullopt;
  // To 0.01% (each try walks every stage): the split is the one at `hi`, which is feasible.
  for (int iter = 0; iter < 60 && hi - lo > 1e-4 * hi; ++iter) {
    const double mid = 0.5 * (lo + hi);
    (reach(mid).empty() ? lo : hi) = mid;
  }
  const std::vector<std::pair<int64_t, int64_t>> after = reach(hi);
  Split split{std::vector<int>(static_cast<size_t>(p)), hi};
  int64_t end = H;
  for (int i = p - 1; i >= 0; --i) {
    // The earliest start the stages before reach from which this stage takes everything up to `end`.
    const int64_t from = i > 0 ? after[static_cast<size_t>(i - 1)].first : 0;
    const int64_t to = i > 0 ? after[static_cast<size_t>(i - 1)].second : 0;
    int64_t first = -1;
    for (int64_t f = std::max(from, end - H); f <= std::min(to, end - least(i)); ++f) {
      if (end - f <= take(i, hi, f)) {
        first = f;
        break;
      }
    }
    if (first < 0) return std::nullopt;  // a gap in what the stages before reach (the intervals assume none)
    split.layers[static_cast<size_t>(i)] = static_cast<int>(end - first);
    end = first;
  }
  if (end != 0) return std::nullopt;
  return split;
}

}  // namespace

std::optional<Plan> plan_uniform(const CostModel& c, const Layout& layout, FitFailure* failure) {
  const int p = static_cast<int>(layout.stages.size());
  const int64_t L = c.model().layers;
  Layout even = layout;
  for (size_t i = 0; i < even.stages.size(); ++i) {
    even.stages[i].vocabulary_only = false;  // a homogeneous-style split gives every stage layers
    // Replicas of several chip types take equal shares, as if they were alike (when the shares are whole).
    const int rows = even.dp * even.micro_batch, replicas = even.stage_dp(i);
    if (!even.stages[i].mix.empty() && rows % replicas == 0) {
      for (Layout::Share& s : even.stages[i].mix) s.rows = rows / replicas;
    }
  }
  std::vector<int> layers(static_cast<size_t>(p));
  for (int i = 0; i < p; ++i) layers[static_cast<size_t>(i)] = static_cast<int>(L / p + (i < L % p ? 1 : 0));
  std::optional<Plan> plan = score_split(c, even, layers, failure);
  if (plan) score_with_zero_bubble(c, *plan);
  return plan;
}

Layout layout_of(const Plan& plan, const Cluster& cluster) {
  Layout l;
  l.dp = plan.dp;
  l.micro_batch = plan.micro_batch;
  // A layout is costed with 1F1B; ZB-H1 is what the replay may choose for a costed plan (score_with_zero_bubble).
  l.schedule = plan.schedule == ScheduleKind::kZeroBubbleH1 ? ScheduleKind::k1F1B : plan.schedule;
  l.chunks = plan.chunks;
  for (const StagePlan& s : plan.stages) {
    Layout::Slot slot{cluster.chip_index(s.chip), s.tp, s.dp};
    for (const ReplicaGroup& g : s.groups) slot.mix.push_back({cluster.chip_index(g.chip), g.replicas, g.rows});
    slot.vocabulary_only = s.layers == 0 && s.embedding != s.head;
    if (!slot.mix.empty()) slot.chip = slot.mix.front().chip;
    l.stages.push_back(slot);
  }
  return l;
}

std::vector<Layout::Share> Layout::shares(size_t i) const {
  std::vector<Share> out;
  for_each_share(i, [&](const Share& s) { out.push_back(s); });
  return out;
}

namespace {

struct TypeOption {
  int tp;
  int stages;
  int dp;  // each of its stages' replicas (a micro-batch's dp x micro_batch rows shared among them)
};

// What a chip type may contribute to a layout: (TP, number of stages, DP) triples, finer per tier.
//   exhaustive: every TP, every DP that divides a micro-batch's rows, and every stage count; coarse: the layout's
//   DP, the smallest and the largest TP at which a layer fits, and stage counts 1, 2 and a quarter, half, three
//   quarters and all of what the devices allow; greedy: the layout's DP, the largest TP, and half or all of the
//   devices. Every tier may also leave the type out. Below exhaustive, refine() changes the DP of the best plans'
//   types.
std::vector<TypeOption> type_options(const CostModel& c, int chip, int dp, int b, const std::string& tier) {
  std::vector<int> widths = {dp};
  if (tier == "exhaustive") {
    widths.clear();
    for (int d = 1; d <= dp * b && d <= c.cluster().devices_of(chip); ++d) {
      if ((dp * b) % d == 0) widths.push_back(d);
    }
  }
  std::vector<TypeOption> out = {{1, 0, dp}};
  for (int d : widths) {
    std::vector<int> fitting;
    for (int t : tp_options(c, chip)) {
      if (one_layer_bytes(c, t, d, dp * b / d) < c.usable_bytes(chip)) fitting.push_back(t);
    }
    // Below exhaustive, the extremes: the smallest TP that fits (the most stages, the least TP communication)
    // and the largest (the fewest stages, which keeps a type with many devices from deepening the pipeline).
    if (tier != "exhaustive" && fitting.size() > 2) fitting = {fitting.front(), fitting.back()};
    if (tier == "greedy" && fitting.size() > 1) fitting = {fitting.back()};
    for (int t : fitting) {
      const int max = static_cast<int>(std::min<int64_t>(c.cluster().devices_of(chip) / (d * t), c.model().layers));
      std::vector<int> counts;
      if (tier == "exhaustive") {
        for (int n = 1; n <= max; ++n) counts.push_back(n);
      } else if (tier == "coarse") {
        counts = {1, 2, max / 4, max / 2, 3 * max / 4, max};
      } else {
        counts = {max / 2, max};
      }
      std::sort(counts.begin(), counts.end());
      counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
      for (int n : counts) {
        if (n >= 1 && n <= max) out.push_back({t, n, d});
      }
    }
  }
  return out;
}

// Plans by their step, and plans of one step (one layout written two ways: dp pipelines of micro-batch b, or
// 1 pipeline of micro-batch dp x b whose stages each have dp replicas) by their layout, so that which of them the
// search keeps does not depend on which it met first.
bool earlier(const Plan& a, const Plan& b) {
  if (a.step_s != b.step_s) return a.step_s < b.step_s;
  const auto key = [](const Plan& p) {
    std::vector<int64_t> k{p.dp, p.micro_batch, static_cast<int>(p.schedule), p.chunks};
    for (const StagePlan& s : p.stages) {
      k.insert(k.end(), {s.chip_index, s.tp, s.dp, s.first_layer, s.layers, s.starts_at_mlp, s.ends_at_attention,
                         static_cast<int>(s.recompute), s.recompute_blocks});
      for (const ReplicaGroup& g : s.groups) {
        k.insert(k.end(), {g.chip_index, g.replicas, g.rows, static_cast<int>(g.recompute), g.recompute_blocks});
      }
    }
    return k;
  };
  return key(a) < key(b);
}

struct Search {
  const CostModel& c;
  const PlannerOptions& opt;
  std::string tier;
  std::vector<int> chips;  // chip types with devices
  double deadline;
  std::mutex mu;
  std::optional<Plan> best;
  static constexpr size_t kCandidates = 32;
  // The fastest plans by the closed form, fastest first, kCandidates of them; the replay chooses among them at the
  // end. Pruning by the slowest of them (not by the fastest, as before 2026-12-06) is what makes them the fastest
  // kCandidates of all, whatever order the threads reached the layouts in; pruned by the fastest, a layout the
  // replay would have preferred was costed or not as the threads went, and a plan could change from run to run.
  struct Pool {
    std::vector<Plan> plans;
    // The step a plan must beat to enter. It only falls as the search goes on, so a layout whose bound is under its
    // final value was never pruned.
    double bar() const { return plans.size() < kCandidates ? kInf : plans.back().step_s; }
    void add(const Plan& p) {
      if (plans.size() == kCandidates && !earlier(p, plans.back())) return;
      plans.insert(std::upper_bound(plans.begin(), plans.end(), p, earlier), p);
      if (plans.size() > kCandidates) plans.pop_back();
    }
  };
  Pool finalists;
  // The same among splits with a stage boundary inside a block, apart: their stages are better balanced, where the
  // closed form is the more optimistic, so they neither displace whole-block finalists nor lower the bar. Each with
  // its layout's bound (consider's, from its whole-block split): kept while that is under the bar, which every layout
  // under the bar's final value stays; settle() takes the kCandidates fastest of those.
  std::vector<std::pair<double, Plan>> half_finalists;
  // Layouts whose end stage held no layer beside the embedding or head but holds it alone: the vocabulary phase
  // tries the kCandidates of them with the lowest bound as vocabulary-only stages (all of them, thousands on the
  // 1,024-chip example, cost a third of the search's time and change none of its plans).
  std::vector<Layout> ends_alone;
  FitFailure closest;  // the failure with the smallest memory shortfall, for the error when nothing fits
  std::atomic<int64_t> layouts{0}, pruned_memory{0}, pruned_bound{0}, evaluated{0};
  std::atomic<bool> out_of_time{false};

  // The step a layout must beat to matter. Called with mu held.
  double bar() const { return finalists.bar(); }

  // The kCandidates fastest half-block splits of the layouts whose bound is under the bar's final value.
  void settle() {
    const double b = bar();
    std::erase_if(half_finalists, [&](const auto& h) { return h.first >= b; });
    std::sort(half_finalists.begin(), half_finalists.end(),
              [](const auto& x, const auto& y) { return earlier(x.second, y.second); });
    if (half_finalists.size() > kCandidates) half_finalists.resize(kCandidates);
  }

  // What a layout's stages bound its step by, whatever their order: each stage's FLOP rate (all its replicas at the
  // chip's full rate), and its time per block at its fastest (no recomputation; a mixed stage's fastest share) tau
  // with how far a stage boundary inside a block can take a stage below its share of blocks times tau: a stage of
  // a attention and m MLP halves (|a - m| <= 1) takes a t_a + m t_m >= (a + m) / 2 (t_a + t_m) - |t_m - t_a| / 2.
  struct Bounds {
    double rate_sum = 0, rate_most = 0;
    double inverse_sum = 0, slack_over_tau = 0, slack = 0, fastest = kInf;  // over the stages that take layers
    void add(double rate, double tau, double delta, int count, bool layers) {
      rate_sum += count * rate;
      rate_most = std::max(rate_most, rate);
      if (!layers) return;
      inverse_sum += count / tau;
      slack_over_tau += count * delta / tau;
      slack += count * delta;
      fastest = std::min(fastest, tau);
    }
  };
  // tau and delta (see Bounds) of a replica of `chip` at TP tp taking `rows` rows.
  std::pair<double, double> block_time(int chip, int tp, int rows) const {
    const CostModel::PieceTimes& t = c.piece_times(chip, tp, rows);
    const int none = static_cast<int>(Recompute::kNone);
    const double a = t.attention_forward_s + t.attention_backward_s[none];
    const double m = t.mlp_forward_s + t.mlp_backward_s[none];
    return {std::min(t.layer_forward_s + t.layer_backward_s[none], a + m), std::abs(m - a) / 2};
  }

  // No layout with these devices can be faster. A step's m micro-batches each carry the work w = W / m; stage i
  // takes T_i per micro-batch, at least its part w_i of w at its rate R_i, and at least h_i tau_i - delta_i for its
  // h_i of the L blocks. Then max T_i >= w / sum R, and >= T* where sum (T* + delta_i) / tau_i = L; sum T_i >= w /
  // max R, and >= L min tau - sum delta. 1F1B's step (the closed form: sum T_i + (m - 1) max T_i, plus sends and
  // what follows the pipeline) is at least each of those pairs; any schedule's at least m max T_i.
  double step_bound(const Bounds& b, double m, bool one_f_one_b) const {
    const double w = c.step_model_flops() / m, L = static_cast<double>(c.model().layers);
    const double bottleneck = std::max(w / b.rate_sum, (L - b.slack_over_tau) / b.inverse_sum);
    if (!one_f_one_b) return m * bottleneck;
    const double way = std::max({w / b.rate_most, L * b.fastest - b.slack, 0.0});
    return way + (m - 1) * bottleneck;
  }

  double micro_batches(const Layout& l) const {
    return static_cast<double>(c.train().global_batch / (int64_t{l.dp} * l.micro_batch));
  }

  double lower_bound(const Layout& l) const {
    Bounds b;
    for (size_t i = 0; i < l.stages.size(); ++i) {
      double rate = 0, tau = kInf, delta = 0;
      l.for_each_share(i, [&](const Layout::Share& s) {
        rate += l.stages[i].tp * s.replicas * c.flops_rate(s.chip);
        const auto [t, d] = block_time(s.chip, l.stages[i].tp, s.rows);
        if (t < tau) tau = t, delta = d;
      });
      b.add(rate, tau, delta, 1, !l.stages[i].vocabulary_only);
    }
    return step_bound(b, micro_batches(l), l.schedule == ScheduleKind::k1F1B);
  }

  // The lower bound depends only on which devices are used, not on their order: check it once per choice (of
  // 1F1B layouts of dp pipelines and micro-batch b).
  bool bound_prunes(const std::vector<std::vector<TypeOption>>& options, const std::vector<size_t>& pick, int dp,
                    int b) {
    Bounds bounds;
    for (size_t i = 0; i < options.size(); ++i) {
      const TypeOption& o = options[i][pick[i]];
      if (o.stages == 0) continue;
      const auto [tau, delta] = block_time(chips[i], o.tp, dp * b / o.dp);
      bounds.add(o.tp * o.dp * c.flops_rate(chips[i]), tau, delta, o.stages, true);
    }
    if (bounds.rate_sum <= 0) return false;
    const double m = static_cast<double>(c.train().global_batch / (int64_t{dp} * b));
    const double bound = step_bound(bounds, m, true);
    std::lock_guard<std::mutex> lock(mu);
    if (bound < bar()) return false;
    ++pruned_bound;
    return true;
  }

  // Whole-model state that must fit in the used devices' memory: each stage holds as many layers' weights,
  // gradients and optimizer state (sharded over its DP under ZeRO-1) as its replica's devices have room for.
  double layers_room(const Layout& l) const {
    double layers = 0, state = 0;
    int state_dp = -1;  // the DP `state` is for: most layouts have one for all their stages
    for (size_t i = 0; i < l.stages.size(); ++i) {
      double least = kInf;  // a mixed stage holds what its smallest chip type has room for
      l.for_each_share(i, [&](const Layout::Share& s) { least = std::min(least, c.usable_bytes(s.chip)); });
      if (l.stage_dp(i) != state_dp) state = layers_state_bytes(c, state_dp = l.stage_dp(i));
      layers += l.stages[i].tp * least / state;
    }
    return layers * static_cast<double>(c.model().layers);
  }

  // The passes after the tiers, which run on one thread, share this cache; each thread of a tier has its own.
  MemoryCache memory;
  void consider(const Layout& l) { consider(l, memory); }
  void consider(const Layout& l, MemoryCache& cache) {
    ++layouts;
    const double room = layers_room(l), L = static_cast<double>(c.model().layers);
    if (room < L) {
      ++pruned_memory;
      FitFailure f;
      const double need = layers_state_bytes(c, l.stage_dp(0));
      f.shortfall_bytes = need * (1 - room / L);
      f.what = cat("the layers' weights, gradients and optimizer state need ", format_bytes(need),
                   " per pipeline but a layout of ", count_stages(l.stages.size()), " holds ",
                   format_bytes(need * room / L), " (short by ", format_bytes(f.shortfall_bytes), ")");
      std::lock_guard<std::mutex> lock(mu);
      if (closer(f, closest)) closest = f;
      return;
    }
    const double least = lower_bound(l);
    {
      std::lock_guard<std::mutex> lock(mu);
      if (least >= bar()) {
        ++pruned_bound;
        return;
      }
    }
    ++evaluated;
    FitFailure f;
    MemoryCache* const cached = opt.memory_cache ? &cache : nullptr;
    std::vector<StageTerms> terms = stage_terms(c, l, cached);
    // The bottleneck past which m x it alone would prune the layout (the bar only falls: the one read now is safe).
    const double m = micro_batches(l);
    double cutoff = kInf;
    {
      std::lock_guard<std::mutex> lock(mu);
      cutoff = bar() / m;
    }
    const std::optional<Split> split = balanced_split(c, l, terms, &f, cutoff);
    if (!split) {
      // An end stage that cannot hold a layer beside the embedding or the head may still hold the vocabulary
      // alone (the vocabulary phase takes apart the ends of layouts that fit; these it tries as they are).
      std::lock_guard<std::mutex> lock(mu);
      if (f.vocabulary_alone >= 0 && l.stages.size() > 1 && l.schedule == ScheduleKind::k1F1B) {
        ends_alone.push_back(l);
        ends_alone.back().stages[static_cast<size_t>(f.vocabulary_alone)].vocabulary_only = true;
      }
      if (closest.what.empty() || (f.shortfall_bytes > 0 && closer(f, closest))) closest = f;
      return;
    }
    // Every micro-batch passes the slowest stage: m x bottleneck bounds the step from below; 1F1B's closed form is
    // also at least (m - 1) x bottleneck plus the first micro-batch's way through the stages, each with its layers
    // at its fastest (and that way is at least the slowest stage's time).
    double bound = std::max(least, m * split->bottleneck_s);
    if (!split->layers.empty() && l.schedule == ScheduleKind::k1F1B) {
      double way = 0;
      for (size_t i = 0; i < terms.size(); ++i) {
        way += terms[i].extra_fwd_s + terms[i].extra_bwd_s + split->layers[i] * terms[i].layer_s(Recompute::kNone);
      }
      bound = std::max(bound, (m - 1) * split->bottleneck_s + way);
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      if (split->layers.empty() || bound >= bar()) {
        ++pruned_bound;
        return;
      }
    }
    std::optional<Plan> p = score_terms(c, l, terms, split->layers, &f, {}), h;
    if (opt.split_blocks && l.chunks == 1) {  // the split in half-blocks too, where it balances the stages better
      for (StageTerms& t : terms) fill_half_memory(c, t, cached);
      const std::optional<Split> halves = balanced_half_split(c, l, terms, *split);
      if (halves && halves->bottleneck_s < split->bottleneck_s * (1 - 1e-9)) {
        h = score_terms(c, l, terms, halves->layers, &f, ScoreOptions{.halves = true});
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    if (h) {
      half_finalists.emplace_back(bound, std::move(*h));
      if (half_finalists.size() > 64 * kCandidates) {  // those that can no longer be kept
        std::erase_if(half_finalists, [&](const auto& x) { return x.first >= bar(); });
      }
    }
    if (p) {
      finalists.add(*p);
      if (!best || earlier(*p, *best)) best = std::move(p);
    }
  }

  // The finalists by the replay of their schedule: the plan returned is the fastest the simulator would say.
  void pick_by_replay() {
    if (finalists.plans.empty()) return;
    for (Plan& p : finalists.plans) score_with_zero_bubble(c, p);
    for (auto& h : half_finalists) score_with_zero_bubble(c, h.second);
    const auto faster = [](const Plan& a, const Plan& b) { return a.step_s < b.step_s; };
    best = *std::min_element(finalists.plans.begin(), finalists.plans.end(), faster);  // the first of equals
    for (const auto& h : half_finalists) {
      if (h.second.step_s < best->step_s) best = h.second;
    }
  }

  // Every choice of (tp, stages) per chip type, then the orders of the used types: all permutations in the
  // exhaustive tier, otherwise by memory, largest first (early 1F1B stages hold more micro-batches), and the
  // reverse; refine() later tries every order of the best layout's types.
  void enumerate(int dp, int b, MemoryCache& cache) {
    const size_t k = chips.size();
    std::vector<std::vector<TypeOption>> options(k);
    for (size_t i = 0; i < k; ++i) options[i] = type_options(c, chips[i], dp, b, tier);
    std::vector<size_t> pick(k, 0);
    while (true) {
      if (monotonic_seconds() > deadline) {
        out_of_time = true;
        return;
      }
      int total = 0;
      std::vector<int> used;
      for (size_t i = 0; i < k; ++i) {
        const int n = options[i][pick[i]].stages;
        total += n;
        if (n > 0) used.push_back(static_cast<int>(i));
      }
      if (total >= 1 && total <= c.model().layers && !bound_prunes(options, pick, dp, b)) {
        for (const std::vector<int>& order : orders(used)) {
          Layout l{dp, b, {}};
          for (int i : order) {
            const TypeOption& o = options[static_cast<size_t>(i)][pick[static_cast<size_t>(i)]];
            for (int j = 0; j < o.stages; ++j) {
              l.stages.push_back({chips[static_cast<size_t>(i)], o.tp, o.dp == dp ? 0 : o.dp});
            }
          }
          consider(l, cache);
        }
      }
      size_t i = 0;
      while (i < k && ++pick[i] == options[i].size()) pick[i++] = 0;
      if (i == k) return;
    }
  }

  std::vector<std::vector<int>> orders(std::vector<int> used) const {
    std::vector<std::vector<int>> out;
    if (tier == "exhaustive") {
      do out.push_back(used);
      while (std::next_permutation(used.begin(), used.end()));
      return out;
    }
    std::sort(used.begin(), used.end(), [&](int a, int z) {
      return c.cluster().chips[static_cast<size_t>(chips[static_cast<size_t>(a)])].memory_gib >
             c.cluster().chips[static_cast<size_t>(chips[static_cast<size_t>(z)])].memory_gib;
    });
    out.push_back(used);
    if (used.size() > 1) {
      std::reverse(used.begin(), used.end());
      out.push_back(used);
    }
    return out;
  }

  // Stages of different widths: from the best layout, with its micro-batch as it is, doubled or halved (each
  // stage keeping its replicas), give one chip type's stages another DP (the same, twice or half) and TP (the
  // same, twice or half), with about the same devices (the stage count scaled, or one more or fewer), while the
  // best plan improves. The exhaustive tier enumerates such layouts; the coarser tiers find them here.
  void reshape() {
    const std::vector<int>& sizes = c.train().micro_batches;
    for (int round = 0; round < 16 && best; ++round) {
      const double before = best->step_s;
      const Layout best_layout = layout_of(*best, c.cluster());
      if (std::any_of(best_layout.stages.begin(), best_layout.stages.end(),
                      [](const Layout::Slot& s) { return !s.mix.empty(); })) {
        return;  // mixed stages' shares are for their micro-batch; mixed() chose them
      }
      for (int b : {best_layout.micro_batch, 2 * best_layout.micro_batch, best_layout.micro_batch / 2}) {
        if (std::find(sizes.begin(), sizes.end(), b) == sizes.end() ||
            c.train().global_batch % (int64_t{best_layout.dp} * b) != 0) {
          continue;
        }
        Layout l = best_layout;
        l.micro_batch = b;
        const int rows = l.dp * b;
        bool whole = true;  // every stage's replicas still share a micro-batch's rows evenly
        for (size_t i = 0; i < l.stages.size(); ++i) {
          l.stages[i].dp = best_layout.stage_dp(i) == l.dp ? 0 : best_layout.stage_dp(i);
          whole = whole && rows % l.stage_dp(i) == 0;
        }
        if (!whole) continue;
        if (b != best_layout.micro_batch) consider(l);
        reshape_blocks(l);
      }
      if (!(best->step_s < before)) break;
    }
  }

  void reshape_blocks(const Layout& l) {
    const int rows = l.dp * l.micro_batch;
    for (size_t first = 0; first < l.stages.size();) {
      size_t end = first;
      while (end < l.stages.size() && l.stages[end].chip == l.stages[first].chip) ++end;
      const int chip = l.stages[first].chip, t = l.stages[first].tp, d = l.stage_dp(first);
      const int n = static_cast<int>(end - first);
      int others = 0;  // this type's devices in other blocks
      for (size_t i = 0; i < l.stages.size(); ++i) {
        if ((i < first || i >= end) && l.stages[i].chip == chip) others += l.stages[i].tp * l.stage_dp(i);
      }
      const std::vector<int> tps = tp_options(c, chip);
      for (int d2 : {d, 2 * d, d / 2}) {
        if (d2 < 1 || rows % d2 != 0) continue;
        for (int t2 : {t, 2 * t, t / 2}) {
          if (std::find(tps.begin(), tps.end(), t2) == tps.end() || (d2 == d && t2 == t)) continue;
          const int same = n * d * t / (d2 * t2);
          for (int n2 : {same, same + 1, same - 1}) {
            if (n2 < 1 || others + n2 * d2 * t2 > c.cluster().devices_of(chip) ||
                static_cast<int64_t>(l.stages.size()) - n + n2 > c.model().layers) {
              continue;
            }
            Layout r = l;
            r.stages.erase(r.stages.begin() + static_cast<std::ptrdiff_t>(first),
                           r.stages.begin() + static_cast<std::ptrdiff_t>(end));
            r.stages.insert(r.stages.begin() + static_cast<std::ptrdiff_t>(first), static_cast<size_t>(n2),
                            Layout::Slot{chip, t2, d2 == l.dp ? 0 : d2});
            consider(r);
          }
        }
      }
      first = end;
    }
  }

  // The vocabulary as its own part: a first stage holding only the embedding, or a last stage only the head and
  // loss, sharded over its TP ranks. Each of the best layouts (the finalists) of two or more stages with its first
  // or its last stage so, and the best layout with such a stage added on devices it leaves idle — any chip type
  // with idle devices, any of its TP degrees and replicas 1, 2, 4, ... that divide a micro-batch's rows. Where the
  // embedding or head bounds its stage's memory or time (a large vocabulary beside few layers), the stages of
  // layers take more layers or recompute less.
  void vocabulary() {
    // Those under the bar, which every thread order gives (see bar()), in the order of their bound, then of their
    // stages (layouts of the same devices have the same bound).
    std::vector<std::tuple<double, std::vector<int>, Layout>> alone;
    for (Layout& l : std::exchange(ends_alone, {})) {
      const double b = lower_bound(l);
      if (b >= bar()) continue;
      std::vector<int> stages{l.dp, l.micro_batch};
      for (const Layout::Slot& s : l.stages) stages.insert(stages.end(), {s.chip, s.tp, s.dp});
      alone.emplace_back(b, std::move(stages), std::move(l));
    }
    const size_t n = std::min(alone.size(), kCandidates);
    std::partial_sort(alone.begin(), alone.begin() + static_cast<std::ptrdiff_t>(n), alone.end(),
                      [](const auto& a, const auto& b) {
                        return std::tie(std::get<0>(a), std::get<1>(a)) < std::tie(std::get<0>(b), std::get<1>(b));
                      });
    for (size_t i = 0; i < n; ++i) consider(std::get<2>(alone[i]));
    std::vector<Layout> layouts;
    for (const Plan& p : finalists.plans) layouts.push_back(layout_of(p, c.cluster()));
    for (const Layout& l : layouts) {
      if (l.stages.size() < 2 || l.schedule != ScheduleKind::k1F1B ||
          std::any_of(l.stages.begin(), l.stages.end(), [](const Layout::Slot& s) { return s.vocabulary_only; })) {
        continue;
      }
      Layout head = l, embedding = l;
      head.stages.back().vocabulary_only = true;
      embedding.stages.front().vocabulary_only = true;
      consider(head);
      consider(embedding);
    }
    if (!best) return;
    const Layout base = layout_of(*best, c.cluster());
    if (base.schedule != ScheduleKind::k1F1B) return;
    std::vector<int> idle(c.cluster().chips.size());
    for (size_t k = 0; k < idle.size(); ++k) idle[k] = c.cluster().devices_of(static_cast<int>(k));
    for (size_t i = 0; i < base.stages.size(); ++i) {
      if (base.stages[i].vocabulary_only) return;  // already apart
      for (const Layout::Share& s : base.shares(i)) idle[static_cast<size_t>(s.chip)] -= base.stages[i].tp * s.replicas;
    }
    const int rows = base.dp * base.micro_batch;
    for (int chip : chips) {
      for (int tp : tp_options(c, chip)) {
        for (int d = 1; tp * d <= idle[static_cast<size_t>(chip)] && d <= rows; d *= 2) {
          if (rows % d != 0) continue;
          const Layout::Slot apart{chip, tp, d == base.dp ? 0 : d, {}, true};
          Layout head = base, embedding = base;
          head.stages.push_back(apart);
          embedding.stages.insert(embedding.stages.begin(), apart);
          consider(head);
          consider(embedding);
        }
      }
    }
  }

  // Interleaved 1F1B (Narayanan et al. 2021): each of the best layouts found so far (the finalists, 1F1B) with 2, 3
  // or 4 chunks per stage, where its micro-batches are a multiple of its stages; the layers are split again (each
  // stage then needs at least `chunks` of them) and the schedule's replay scores it — more micro-batches in flight
  // per stage for a bubble divided by the chunks.
  void interleave() {
    std::vector<Layout> layouts;
    for (const Plan& p : finalists.plans) layouts.push_back(layout_of(p, c.cluster()));
    for (const Layout& base : layouts) {
      const int64_t m = c.train().global_batch / (int64_t{base.dp} * base.micro_batch);
      const int p = static_cast<int>(base.stages.size());
      const bool apart =
          std::any_of(base.stages.begin(), base.stages.end(), [](const Layout::Slot& s) { return s.vocabulary_only; });
      if (p < 2 || apart || base.schedule != ScheduleKind::k1F1B || m % p != 0) continue;
      for (int v : {2, 3, 4}) {
        if (int64_t{p} * v > c.model().layers) break;
        Layout l = base;
        l.schedule = ScheduleKind::kInterleaved;
        l.chunks = v;
        consider(l);
      }
    }
  }

  // Stages whose replicas mix chip types, with uneven shares of a micro-batch (Metis, ATC'24; Zorse, Poplar): every
  // stage holds the same part of each chosen type's devices at one TP degree, and a micro-batch's rows are
  // apportioned over its replicas by their chip's speed (largest remainders, at least one row each; replicas of one
  // type may so differ by a row, and form two groups). For every set of at least two types (beyond 5 types: the
  // fastest 2, 3, ... of them), every TP they share, stage counts 1, 2, 4, ..., and micro-batches (dp of them,
  // micro_batch 1) among the global batch's divisors from one row per replica to 16, each at least 1.5x the last.
  void mixed() {
    if (chips.size() < 2) return;
    std::vector<int> by_speed = chips;  // fastest first
    std::sort(by_speed.begin(), by_speed.end(), [&](int a, int b) { return c.flops_rate(a) > c.flops_rate(b); });
    std::vector<std::vector<int>> sets;
    const size_t k = by_speed.size();
    if (k <= 5) {
      for (unsigned mask = 1; mask < (1u << k); ++mask) {
        std::vector<int> set;
        for (size_t i = 0; i < k; ++i) {
          if (mask & (1u << i)) set.push_back(by_speed[i]);
        }
        if (set.size() >= 2) sets.push_back(set);
      }
    } else {
      for (size_t n = 2; n <= k; ++n)
        sets.emplace_back(by_speed.begin(), by_speed.begin() + static_cast<std::ptrdiff_t>(n));
    }
    const int64_t G = c.train().global_batch;
    for (const std::vector<int>& set : sets) {
      for (int tp : tp_options(c, set.front())) {
        bool shared = true;
        int most_stages = static_cast<int>(c.model().layers);
        for (int chip : set) {
          const std::vector<int> t = tp_options(c, chip);
          shared = shared && std::find(t.begin(), t.end(), tp) != t.end();
          most_stages = std::min(most_stages, c.cluster().devices_of(chip) / tp);
        }
        if (!shared) continue;
        for (int stages = 1; stages <= most_stages; stages *= 2) {
          std::vector<int> replicas;  // per type of the set
          int64_t total = 0;
          for (int chip : set) total += replicas.emplace_back(c.cluster().devices_of(chip) / (stages * tp));
          double last = 0;
          for (int64_t rows = total; rows <= std::min(16 * total, G); ++rows) {
            if (G % rows != 0 || rows < 1.5 * last) continue;
            last = static_cast<double>(rows);
            if (monotonic_seconds() > deadline) {
              out_of_time = true;
              return;
            }
            const std::vector<Layout::Share> mix = apportion(set, replicas, rows);
            if (mix.empty()) continue;
            Layout l{static_cast<int>(rows), 1, {}};
            l.stages.assign(static_cast<size_t>(stages),
                            Layout::Slot{mix.front().chip, tp, static_cast<int>(total), mix});
            consider(l);
          }
        }
      }
    }
  }

  // `rows` over the replicas of `set` (replicas[i] of type set[i]) in proportion to their chip's speed: each its
  // quota's whole rows (at least one), the rest one each to the replicas of the largest remainders; as groups of
  // one type and one share.
  std::vector<Layout::Share> apportion(const std::vector<int>& set, const std::vector<int>& replicas,
                                       int64_t rows) const {
    double speed = 0;
    for (size_t i = 0; i < set.size(); ++i) speed += replicas[i] * c.flops_rate(set[i]);
    std::vector<int> base(set.size());
    std::vector<std::pair<double, size_t>> remainders;  // per type, the fractional part of its quota
    int64_t left = rows;
    for (size_t i = 0; i < set.size(); ++i) {
      const double quota = static_cast<double>(rows) * c.flops_rate(set[i]) / speed;
      base[i] = std::max(1, static_cast<int>(std::floor(quota)));
      left -= int64_t{base[i]} * replicas[i];
      remainders.push_back({quota - std::floor(quota), i});
    }
    if (left < 0) return {};  // the one row each is more than the quotas leave
    std::sort(remainders.begin(), remainders.end(), std::greater<>());
    std::vector<Layout::Share> out;
    std::vector<int> extra(set.size(), 0);  // replicas of each type that take one row more
    for (const auto& [fraction, i] : remainders) {
      extra[i] = static_cast<int>(std::min<int64_t>(left, replicas[i]));
      left -= extra[i];
    }
    if (left > 0) return {};
    for (size_t i = 0; i < set.size(); ++i) {
      if (extra[i] > 0) out.push_back({set[i], extra[i], base[i] + 1});
      if (replicas[i] > extra[i]) out.push_back({set[i], replicas[i] - extra[i], base[i]});
    }
    return out;
  }

  // Every order of the best layout's chip-type blocks (up to 6 types; beyond, neighbouring swaps).
  void refine() {
    if (!best) return;
    const Layout l = layout_of(*best, c.cluster());
    std::vector<std::pair<int, std::vector<Layout::Slot>>> blocks;
    for (const Layout::Slot& s : l.stages) {
      if (blocks.empty() || blocks.back().first != s.chip) blocks.push_back({s.chip, {}});
      blocks.back().second.push_back(s);
    }
    std::vector<size_t> idx(blocks.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    auto try_order = [&](const std::vector<size_t>& order) {
      Layout n{l.dp, l.micro_batch, {}};
      for (size_t i : order) n.stages.insert(n.stages.end(), blocks[i].second.begin(), blocks[i].second.end());
      consider(n);
    };
    if (blocks.size() <= 6) {
      while (std::next_permutation(idx.begin(), idx.end())) try_order(idx);
    } else {
      for (size_t i = 0; i + 1 < idx.size(); ++i) {
        std::vector<size_t> o = idx;
        std::swap(o[i], o[i + 1]);
        try_order(o);
      }
    }
  }
};

Plan search_plan(const CostModel& c, const PlannerOptions& options, SearchStats* stats, bool hint);

// What the error when nothing fits suggests: of what the training setup does not already do (full recomputation,
// ZeRO-1, a micro-batch of 1, any TP), each by its field in the train file, those under which the search then finds
// a plan (each alone, then all together; at most a second's search each); else more devices.
std::string fit_hint(const CostModel& c, const PlannerOptions& options) {
  struct Remedy {
    const char* field;
    std::function<void(TrainSetup&)> apply;
  };
  const TrainSetup& t = c.train();
  std::vector<Remedy> lacking;
  if (std::ranges::find(t.allowed_recompute, Recompute::kFull) == t.allowed_recompute.end()) {
    lacking.push_back({"recompute: [none, selective, full]", [](TrainSetup& s) {
                         s.allowed_recompute = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
                       }});
  }
  if (!t.zero1) lacking.push_back({"zero1: true", [](TrainSetup& s) { s.zero1 = true; }});
  if (std::ranges::min(t.micro_batches) > 1) {
    lacking.push_back(
        {"micro_batches: [1, ...]", [](TrainSetup& s) { s.micro_batches.insert(s.micro_batches.begin(), 1); }});
  }
  if (t.max_tp > 0 &&
      std::ranges::any_of(c.cluster().groups, [&](const NodeGroup& g) { return g.chips_per_node > t.max_tp; })) {
    lacking.push_back({"max_tp: 0", [](TrainSetup& s) { s.max_tp = 0; }});
  }
  const auto fits_with = [&](std::span<const Remedy> remedies) {
    TrainSetup setup = t;
    for (const Remedy& r : remedies) r.apply(setup);
    PlannerOptions quick = options;
    quick.time_budget_s = std::min(options.time_budget_s, 1.0);
    try {
      search_plan(CostModel(c.cluster(), c.model(), setup), quick, nullptr, false);
      return true;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kInvalidArgument) throw;
      return false;
    }
  };
  // "a", "a<last>b", "a, b<last>c".
  const auto list = [](const std::vector<std::string>& items, const char* last) {
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) out += (i == 0 ? "" : i + 1 == items.size() ? last : ", ") + items[i];
    return out;
  };
  const auto fields = [](std::span<const Remedy> remedies) {
    std::vector<std::string> out;
    for (const Remedy& r : remedies) out.push_back(r.field);
    return out;
  };
  const std::vector<std::string> tried = fields(lacking);
  std::vector<std::string> fitting;
  for (const Remedy& r : lacking) {
    if (fits_with(std::span(&r, 1))) fitting.push_back(r.field);
  }
  if (!fitting.empty()) return cat("Hint: it fits with ", list(fitting, " or with "), " in the train file");
  if (lacking.size() > 1 && fits_with(lacking)) {
    // All of them are enough: leave out each that the others do without.
    for (size_t i = 0; i < lacking.size();) {
      std::vector<Remedy> others = lacking;
      others.erase(others.begin() + static_cast<std::ptrdiff_t>(i));
      if (fits_with(others)) {
        lacking = std::move(others);
      } else {
        ++i;
      }
    }
    return cat("Hint: it fits with ", list(fields(lacking), " and "), " in the train file");
  }
  return cat(
      "Hint: add devices, or devices with more memory",
      tried.empty() ? "" : cat(" (with ", list(tried, " or "), " in the train file the search found no plan either)"));
}

Plan search_plan(const CostModel& c, const PlannerOptions& options, SearchStats* stats, bool hint) {
  const double t0 = monotonic_seconds();
  Search search{c, options, "", {}, t0 + options.time_budget_s};
  int devices = 0;
  for (size_t i = 0; i < c.cluster().chips.size(); ++i) {
    const int n = c.cluster().devices_of(static_cast<int>(i));
    if (n > 0) search.chips.push_back(static_cast<int>(i));
    devices += n;
  }
  if (devices == 0) throw Error(ErrorCode::kInvalidArgument, cat("cluster ", c.cluster().name, " has no devices"));
  // (dp, micro-batch) pairs: dp divides the global batch and leaves whole micro-batches.
  std::vector<std::pair<int, int>> pairs;
  const int64_t G = c.train().global_batch;
  for (int64_t dp = 1; dp <= std::min<int64_t>(G, devices); ++dp) {
    if (G % dp != 0) continue;
    for (int b : c.train().micro_batches) {
      if ((G / dp) % b == 0) pairs.push_back({static_cast<int>(dp), b});
    }
  }
  if (pairs.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("no micro-batch size in train.micro_batches divides the global batch ", G, "; add 1 to the list"));
  }
  // Anytime search: the greedy tier first (fast, and its best plan prunes the finer tiers by the lower
  // bound), then the coarse tier, which stops at the time budget if it must; the exhaustive tier only when
  // its space is small enough to finish (up to kExhaustiveLayouts layouts).
  // A tier is tried only when it can finish: up to kCoarseLayouts layouts (the coarse tier of the 1,024-chip
  // example has 5e5) or kExhaustiveLayouts (each costs more: every order of the types).
  constexpr double kCoarseLayouts = 2e7, kExhaustiveLayouts = 2e6;
  std::string too_large;  // the first tier left out for its size, said in the plan's why
  const unsigned threads =
      options.threads > 0 ? static_cast<unsigned>(options.threads) : std::max(1u, std::thread::hardware_concurrency());
  for (const char* tier : {"greedy", "coarse", "exhaustive"}) {
    if (std::string(tier) == "coarse" && options.finest_tier == "greedy") break;
    if (std::string(tier) == "exhaustive" && options.finest_tier != "exhaustive") break;
    if (std::string(tier) != "greedy") {
      // The tier's layouts: every choice per type, in every order (exhaustive) or two (coarse).
      double count = 0;
      for (const auto& [dp, b] : pairs) {
        double combos = 1;
        for (int chip : search.chips) combos *= static_cast<double>(type_options(c, chip, dp, b, tier).size());
        count += combos * (std::string(tier) == "exhaustive" ? std::tgamma(search.chips.size() + 1.0) : 2.0);
      }
      const bool coarse = std::string(tier) == "coarse";
      if (count > (coarse ? kCoarseLayouts : kExhaustiveLayouts)) {
        // Too large to finish: the previous tier's plan stands. Said for the coarse tier; that the exhaustive
        // tier is out of reach on all but small clusters is the rule, not news.
        if (coarse)
          too_large = format("the coarse tier's %.2g layouts were not enumerated (too many to finish)", count);
        break;
      }
    }
    search.tier = tier;
    std::atomic<size_t> next{0};
    std::vector<std::thread> pool;
    std::exception_ptr failed;  // the first worker's exception, rethrown here (a thread must not let one escape)
    for (unsigned t = 0; t < threads; ++t) {
      pool.emplace_back([&] {
        try {
          MemoryCache cache;
          for (size_t i; (i = next++) < pairs.size() && !search.out_of_time;)
            search.enumerate(pairs[i].first, pairs[i].second, cache);
        } catch (...) {
          std::lock_guard<std::mutex> lock(search.mu);
          if (!failed) failed = std::current_exception();
          search.out_of_time = true;  // stops the other workers
        }
      });
    }
    for (std::thread& t : pool) t.join();
    if (failed) std::rethrow_exception(failed);
    if (search.out_of_time) break;
  }
  search.settle();
  if (options.mixed_stages) search.mixed();
  search.refine();
  search.reshape();
  search.refine();
  search.vocabulary();
  if (options.interleave) search.interleave();
  if (stats != nullptr) {
    stats->layouts = search.layouts;
    stats->pruned_memory = search.pruned_memory;
    stats->pruned_bound = search.pruned_bound;
    stats->evaluated = search.evaluated;
    stats->seconds = monotonic_seconds() - t0;
    stats->budget_exhausted = search.out_of_time;
    stats->tier = search.tier;
  }
  if (!search.best && search.closest.what.empty()) {
    // No layout was even generated: no chip type can hold one layer at any TP degree.
    double least = kInf;
    for (int chip : search.chips) {
      const int t = tp_options(c, chip).back();
      const double need = one_layer_bytes(c, t, 1, 1);
      if (need - c.usable_bytes(chip) < least) {
        least = need - c.usable_bytes(chip);
        search.closest.what = cat("one layer needs ", format_bytes(need), " per device on chip type ",
                                  c.cluster().chips[static_cast<size_t>(chip)].name, " at TP ", t,
                                  " with full recomputation; it has ", format_bytes(c.usable_bytes(chip)),
                                  " usable (short by ", format_bytes(need - c.usable_bytes(chip)), ")");
      }
    }
  }
  if (!search.best) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("the model fits nowhere on cluster ", c.cluster().name, ": ",
                    search.closest.what.empty() ? "no layout was found" : search.closest.what,
                    hint ? cat(". ", fit_hint(c, options)) : ""));
  }
  search.settle();
  search.pick_by_replay();
  Plan plan = *search.best;
  plan.why = cat("fastest by its schedule's replay of the ", search.finalists.plans.size(), " best of ",
                 search.evaluated.load(), " costed layouts",
                 search.half_finalists.empty()
                     ? std::string()
                     : cat(" and the ", search.half_finalists.size(), " best of their splits inside blocks"),
                 " (", search.layouts.load(), " generated, ", search.pruned_memory.load(), " pruned for memory, ",
                 search.pruned_bound.load(), " pruned by the lower bound; ", search.tier, " enumeration)");
  if (plan.schedule == ScheduleKind::kZeroBubbleH1) {
    Plan one = plan;  // the same layout in 1F1B, for the gain
    one.schedule = ScheduleKind::k1F1B;
    score_by_replay(c, one);
    std::string deferred;
    for (int d : zb_deferrals(plan)) deferred += cat(" ", d);
    plan.why += cat("; ZB-H1 (backwards split into B and W; W's deferred per stage:", deferred, ", -1 not split) ",
                    format("%.1f%%", 100 * (1 - plan.step_s / one.step_s)), " faster than 1F1B by the replay");
  }
  if (!too_large.empty()) plan.why += "; " + too_large;
  if (plan.devices_used < plan.devices_total) {
    plan.why += cat("; ", plan.devices_total - plan.devices_used, " of ", plan.devices_total,
                    " devices are left idle because no plan using them was faster");
  }
  return plan;
}

}  // namespace

Plan plan_training(const CostModel& c, const PlannerOptions& options, SearchStats* stats) {
  return search_plan(c, options, stats, true);
}

}  // namespace h2

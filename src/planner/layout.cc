// What-if layouts (see layout.h).
#include "planner/layout.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace h2 {
namespace {

// The checks a layout must pass against the cluster, model and setup, each naming its field through `fail`.
void check_layout(const CostModel& c, const LayoutSpec& s,
                  const std::function<void(size_t, const char*, const std::string&)>& fail) {
  const TransformerShape& m = c.model();
  const Layout& l = s.layout;
  constexpr size_t kTop = static_cast<size_t>(-1);
  if (l.dp < 1) fail(kTop, "dp", cat("must be >= 1, got ", l.dp));
  if (l.micro_batch < 1) fail(kTop, "micro_batch", cat("must be >= 1, got ", l.micro_batch));
  const int64_t rows = int64_t{l.dp} * l.micro_batch;
  if (c.train().global_batch % rows != 0) {
    fail(kTop, "micro_batch",
         cat(l.dp, " pipelines x ", l.micro_batch, " sequences do not divide the global batch of ",
             c.train().global_batch));
  }
  if (l.stages.empty()) fail(kTop, "stages", "lists no stage");
  std::vector<int> used(c.cluster().chips.size(), 0);
  int total = 0, fewest = static_cast<int>(m.layers);
  for (size_t i = 0; i < l.stages.size(); ++i) {
    const Layout::Slot& st = l.stages[i];
    const NodeGroup& g = c.cluster().group_of(st.chip);
    if (st.tp < 1 || m.heads % st.tp != 0 || m.kv_heads % st.tp != 0) {
      fail(i, "tp", cat("TP ", st.tp, " does not divide the model's ", m.heads, " heads"));
    }
    if (st.tp > g.chips_per_node) {
      fail(i, "tp",
           cat("TP ", st.tp, " exceeds the ", g.chips_per_node, " chips of a node of ",
               c.cluster().chips[static_cast<size_t>(st.chip)].name, " (tensor parallelism stays in a node)"));
    }
    const int dp = l.stage_dp(i);
    if (st.mix.empty() && (dp < 1 || rows % dp != 0))
      fail(i, "dp", cat(dp, " replicas do not divide a micro-batch of ", rows, " sequences"));
    if (!st.mix.empty()) {
      int64_t replicas = 0, shared = 0;
      for (const Layout::Share& share : st.mix) {
        if (st.tp > c.cluster().group_of(share.chip).chips_per_node) {
          fail(i, "mix",
               cat("TP ", st.tp, " exceeds the chips of a node of ",
                   c.cluster().chips[static_cast<size_t>(share.chip)].name));
        }
        replicas += share.replicas;
        shared += int64_t{share.replicas} * share.rows;
        used[static_cast<size_t>(share.chip)] += st.tp * share.replicas;
      }
      if (replicas != dp || shared != rows) {
        fail(i, "mix", cat("its ", replicas, " replicas take ", shared, " sequences; a micro-batch is ", rows));
      }
    }
    if (s.layers[i] < 0) fail(i, "layers", cat("must be >= 0, got ", s.layers[i]));
    if (s.layers[i] == 0 && i > 0 && i + 1 < l.stages.size()) {
      fail(i, "layers", "a stage between the first and the last needs at least one layer");
    }
    total += s.layers[i];
    fewest = std::min(fewest, s.layers[i]);
    if (st.mix.empty()) used[static_cast<size_t>(st.chip)] += st.tp * dp;
  }
  const int64_t units = s.halves ? 2 * m.layers : m.layers;
  if (total != units) {
    fail(kTop, "stages", cat("the stages hold ", s.halves ? total / 2.0 : total, " layers; the model has ", m.layers));
  }
  if (s.halves && l.schedule == ScheduleKind::kInterleaved) {
    fail(kTop, "schedule", "interleaved stages hold whole blocks; a stage boundary inside a block needs 1f1b");
  }
  for (size_t k = 0; k < used.size(); ++k) {
    if (used[k] > c.cluster().devices_of(static_cast<int>(k))) {
      fail(kTop, "stages",
           cat("the stages use ", used[k], " devices of ", c.cluster().chips[k].name, "; the cluster has ",
               c.cluster().devices_of(static_cast<int>(k))));
    }
  }
  if (l.chunks < 1) fail(kTop, "chunks", cat("must be >= 1, got ", l.chunks));
  if (l.schedule == ScheduleKind::kInterleaved) {
    if (l.chunks > fewest) fail(kTop, "chunks", cat(l.chunks, " chunks, but a stage has ", fewest, " layers"));
    const int64_t micro_batches = c.train().global_batch / rows;
    if (micro_batches % static_cast<int64_t>(l.stages.size()) != 0) {
      fail(kTop, "schedule",
           cat("interleaved 1F1B needs the ", micro_batches, " micro-batches to be a multiple of the ", l.stages.size(),
               " stages"));
    }
  } else if (l.chunks != 1) {
    fail(kTop, "chunks", cat("chunks need schedule: interleaved, not ", schedule_name(l.schedule)));
  }
}

}  // namespace

LayoutSpec load_layout(const ConfigNode& root, const CostModel& c) {
  root.allow_only({"dp", "micro_batch", "schedule", "chunks", "stages"});
  LayoutSpec s;
  const auto int_field = [](const ConfigNode& n, const char* key, int64_t fallback) {
    const int64_t v = n.get<int64_t>(key, fallback);
    if (v < 1 || v > (int64_t{1} << 30)) n.at(key).fail(cat("must be a positive integer, got ", v));
    return static_cast<int>(v);
  };
  s.layout.dp = int_field(root, "dp", 1);
  s.layout.micro_batch = int_field(root, "micro_batch", 1);
  if (root.has("schedule")) {
    try {
      s.layout.schedule = parse_schedule_kind(root.get<std::string>("schedule"));
    } catch (const Error& e) {
      root.at("schedule").fail(e.what());
    }
    s.zero_bubble = s.layout.schedule == ScheduleKind::kZeroBubbleH1;
    if (s.zero_bubble) s.layout.schedule = ScheduleKind::k1F1B;  // costed so, then split
  }
  s.layout.chunks = int_field(root, "chunks", 1);
  // A stage's (or a share's) recomputation, absent: the fastest that fits; on its first recompute_blocks blocks.
  const auto recompute_of = [&](const ConfigNode& n) {
    std::optional<Recompute> r;
    if (n.has("recompute")) {
      r = parse_recompute(n.get<std::string>("recompute"));
      if (!r) n.at("recompute").fail("must be none, selective or full");
    }
    int64_t blocks = -1;
    if (n.has("recompute_blocks")) {
      if (!r || *r == Recompute::kNone) n.at("recompute_blocks").fail("needs recompute: selective or full");
      if (s.layout.chunks > 1) n.at("recompute_blocks").fail("is for stages of one chunk, not interleaved");
      blocks = int_field(n, "recompute_blocks", 1);
    }
    return GivenRecompute{r, blocks};
  };
  const std::vector<ConfigNode> stages = root.at("stages").items();
  for (const ConfigNode& n : stages) {
    n.allow_only({"chip", "tp", "dp", "mix", "layers", "recompute", "recompute_blocks"});
    const auto chip_of = [&](const ConfigNode& node) {
      const std::string chip = node.get<std::string>("chip");
      const int index = c.cluster().chip_index(chip);
      if (index < 0) node.at("chip").fail(cat("unknown chip type '", chip, "' in cluster ", c.cluster().name));
      return index;
    };
    // In half-blocks: 2.5 is two blocks and one more's attention half, or (after a stage that ended on one) its
    // MLP half and two blocks (ScoreOptions::halves).
    const double layers = n.get<double>("layers");
    if (!(layers >= 0 && layers <= static_cast<double>(c.model().layers)) || layers * 2 != std::floor(layers * 2)) {
      n.at("layers").fail(cat("must be a whole or half number of layers in [0, ", c.model().layers, "], got ", layers));
    }
    Layout::Slot slot{0, int_field(n, "tp", 1), n.has("dp") ? int_field(n, "dp", 1) : 0};
    std::vector<GivenRecompute> shares;  // a mixed stage's, each its own
    if (n.has("mix")) {
      // Replicas of several chip types with their shares of a micro-batch: [{chip: A100, replicas: 2, rows: 3}, ..].
      if (n.has("chip") || n.has("dp")) n.at("mix").fail("a stage gives either chip (and dp) or mix, not both");
      slot.dp = 0;
      for (const ConfigNode& m : n.at("mix").items()) {
        m.allow_only({"chip", "replicas", "rows", "recompute", "recompute_blocks"});
        slot.mix.push_back({chip_of(m), int_field(m, "replicas", 1), int_field(m, "rows", 1)});
        slot.dp += slot.mix.back().replicas;
        shares.push_back(recompute_of(m));
      }
      if (slot.mix.empty()) n.at("mix").fail("lists no replicas");
      slot.chip = slot.mix.front().chip;
    } else {
      slot.chip = chip_of(n);
    }
    s.layout.stages.push_back(slot);
    s.layers.push_back(static_cast<int>(2 * layers));
    s.halves = s.halves || layers != std::floor(layers);
    s.recompute.push_back(recompute_of(n));
    s.recompute.back().shares = std::move(shares);
  }
  if (!s.halves) {
    for (int& layers : s.layers) layers /= 2;
  }
  check_layout(c, s, [&](size_t stage, const char* field, const std::string& what) {
    const ConfigNode& where = stage == static_cast<size_t>(-1) ? root : stages[stage];
    if (where.has(field)) where.at(field).fail(what);
    where.fail(cat(field, ": ", what));
  });
  return s;
}

void check_plan_on_cluster(const Plan& plan, const Cluster& cluster, const std::string& source) {
  std::vector<int64_t> used(cluster.chips.size(), 0);
  for (size_t i = 0; i < plan.stages.size(); ++i) {
    const StagePlan& s = plan.stages[i];
    for (const ReplicaGroup& g : s.replica_groups()) {
      const int k = cluster.chip_index(g.chip);
      if (k < 0) {
        throw Error(ErrorCode::kConfig, cat(source, ": stage ", i, " runs on chip type '", g.chip, "', which cluster ",
                                            cluster.name, " does not have; plan for this cluster (h2 plan --cluster)"));
      }
      used[static_cast<size_t>(k)] += int64_t{s.tp} * g.replicas;
    }
  }
  for (size_t k = 0; k < used.size(); ++k) {
    const int have = cluster.devices_of(static_cast<int>(k));
    if (used[k] > have) {
      throw Error(ErrorCode::kConfig,
                  cat(source, ": the plan runs ", used[k], " ranks on ", cluster.chips[k].name, " devices; cluster ",
                      cluster.name, " has ", have, ". Plan for this cluster (h2 plan --cluster)"));
    }
  }
}

TrainSetup setup_of(const Plan& plan) {
  TrainSetup t;
  t.global_batch = plan.global_batch;
  t.precision = plan.precision;
  t.h2_runtime = plan.h2_runtime;
  t.zero1 = plan.zero1;
  t.micro_batches = {plan.micro_batch};
  return t;
}

LayoutSpec layout_spec_of(const Plan& plan, const CostModel& c) {
  check_plan_model(plan, c.model(), "the model file");
  if (plan.global_batch != c.train().global_batch) {
    throw Error(ErrorCode::kConfig,
                cat("the plan's global batch is ", plan.global_batch, ", the setup's ", c.train().global_batch));
  }
  LayoutSpec s;
  s.layout = layout_of(plan, c.cluster());
  s.zero_bubble = plan.schedule == ScheduleKind::kZeroBubbleH1;
  for (size_t i = 0; i < plan.stages.size(); ++i) {
    const Layout::Slot& slot = s.layout.stages[i];
    if (slot.chip < 0 ||
        std::any_of(slot.mix.begin(), slot.mix.end(), [](const Layout::Share& x) { return x.chip < 0; })) {
      throw Error(ErrorCode::kConfig, cat("stages[", i, "].chip: a chip type of stage ", i, " (", plan.stages[i].chip,
                                          ") is not in cluster ", c.cluster().name));
    }
    s.layers.push_back(plan.stages[i].halves());
    s.halves = s.halves || plan.stages[i].starts_at_mlp || plan.stages[i].ends_at_attention;
    s.recompute.push_back({plan.stages[i].recompute, plan.stages[i].recompute_blocks});
    for (const ReplicaGroup& g : plan.stages[i].groups)
      s.recompute.back().shares.push_back({g.recompute, g.recompute_blocks});
  }
  if (!s.halves) {
    for (size_t i = 0; i < plan.stages.size(); ++i) s.layers[i] = plan.stages[i].layers;
  }
  check_layout(c, s, [&](size_t stage, const char* field, const std::string& what) {
    throw Error(ErrorCode::kConfig,
                cat(stage == static_cast<size_t>(-1) ? std::string() : cat("stages[", stage, "]."), field, ": ", what));
  });
  return s;
}

Plan cost_layout(const CostModel& c, const LayoutSpec& s) {
  FitFailure failure;
  std::optional<Plan> plan =
      score_split(c, s.layout, s.layers, &failure,
                  ScoreOptions{.recompute = s.recompute, .require_fit = false, .halves = s.halves});
  H2_CHECK(plan.has_value()) << "a plan is scored whether or not it fits";
  score_by_replay(c, *plan);
  plan->why = "costed as given (--layout)";
  if (s.zero_bubble) {
    if (std::optional<Plan> z = as_zero_bubble(*plan)) {
      score_by_replay(c, *z);
      plan = std::move(z);
    } else {
      plan->why += "; zb-h1 asked for, but no stage splits its backward (each recomputes or has no room): 1F1B";
    }
  }
  if (!plan->fits) plan->limited_by = cat("DOES NOT FIT: ", failure.what, "; ", plan->limited_by);
  return *plan;
}

}  // namespace h2

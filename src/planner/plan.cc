// plan.json: writing and reading, with a version and checked fields.
#include "planner/plan.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <type_traits>

#include "core/error.h"
#include "core/file.h"

namespace h2 {

namespace {

// plan.json's fields, described once: each visitor sees a field's JSON name and a reference to its value, so
// writing and reading cannot disagree. `S` is the struct or its const version.
template <typename S, typename F>
void visit_model(S& p, F&& f) {
  f("name", p.model);
  f("layers", p.shape.layers);
  f("hidden", p.shape.hidden);
  f("heads", p.shape.heads);
  f("kv_heads", p.shape.kv_heads);
  f("ffn", p.shape.ffn);
  f("vocab", p.shape.vocab);
  f("seq_len", p.shape.seq_len);
  f("tied_embeddings", p.shape.tied_embeddings);
}

template <typename S, typename F>
void visit_layout(S& p, F&& f) {
  f("global_batch", p.global_batch);
  f("micro_batch", p.micro_batch);
  f("num_micro_batches", p.num_micro_batches);
  f("dp", p.dp);
  f("schedule", p.schedule);
  f("chunks", p.chunks);
  f("precision", p.precision);
  f("zero1", p.zero1);
}

template <typename S, typename F>
void visit_stage(S& s, F&& f) {
  f("chip", s.chip);
  f("tp", s.tp);
  f("dp", s.dp);
  f("first_layer", s.first_layer);
  f("layers", s.layers);
  f("embedding", s.embedding);
  f("head", s.head);
  f("recompute", s.recompute);
  f("in_flight", s.in_flight);
  f("forward_s", s.forward_s);
  f("backward_s", s.backward_s);
  f("send_s", s.send_s);
  f("dp_allreduce_s", s.dp_allreduce_s);
  f("tied_allreduce_s", s.tied_allreduce_s);
  f("optimizer_s", s.optimizer_s);
  f("state_bytes", s.state_bytes);
  f("activation_bytes", s.activation_bytes);
  f("buffer_bytes", s.buffer_bytes);
  f("memory_bytes", s.memory_bytes);
  f("capacity_bytes", s.capacity_bytes);
}

template <typename S, typename F>
void visit_group(S& g, F&& f) {
  f("chip", g.chip);
  f("replicas", g.replicas);
  f("rows", g.rows);
  f("recompute", g.recompute);
  f("forward_s", g.forward_s);
  f("backward_s", g.backward_s);
  f("memory_bytes", g.memory_bytes);
  f("capacity_bytes", g.capacity_bytes);
}

template <typename S, typename F>
void visit_prediction(S& p, F&& f) {
  f("step_s", p.step_s);
  f("tokens_per_s", p.tokens_per_s);
  f("mfu", p.mfu);
  f("bubble_fraction", p.bubble_fraction);
  f("devices_used", p.devices_used);
  f("devices_total", p.devices_total);
  f("fits", p.fits);
  f("limited_by", p.limited_by);
  f("why", p.why);
}

// Writes every visited field into `j`.
struct Writer {
  nlohmann::ordered_json& j;
  void operator()(const char* name, Recompute r) const { j[name] = recompute_name(r); }
  void operator()(const char* name, ScheduleKind k) const { j[name] = schedule_name(k); }
  void operator()(const char* name, Precision p) const { j[name] = precision_name(p); }
  template <typename T>
  void operator()(const char* name, const T& value) const {
    j[name] = value;
  }
};

// Reads every visited field from `j`; an error names the field by its path (`where`) and says what it expected.
struct Reader {
  const nlohmann::json& j;
  const std::string& source;
  std::string where;
  [[noreturn]] void fail(const char* name, const std::string& what) const {
    throw Error(ErrorCode::kConfig, cat(source, ": field '", where, name, "': ", what));
  }
  const nlohmann::json& at(const char* name) const {
    if (!j.contains(name)) fail(name, "missing");
    return j.at(name);
  }
  void operator()(const char* name, Recompute& r) const {
    const nlohmann::json& v = at(name);
    const std::optional<Recompute> parsed = v.is_string() ? parse_recompute(v.get<std::string>()) : std::nullopt;
    if (!parsed) fail(name, cat(v.dump(), " is not a recomputation; use \"none\", \"selective\" or \"full\""));
    r = *parsed;
  }
  void operator()(const char* name, Precision& p) const {
    const nlohmann::json& v = at(name);
    const std::optional<Precision> parsed = v.is_string() ? parse_precision(v.get<std::string>()) : std::nullopt;
    if (!parsed) fail(name, cat(v.dump(), " is not a precision; use \"bf16\" or \"f32\""));
    p = *parsed;
  }
  void operator()(const char* name, ScheduleKind& k) const {
    const nlohmann::json& v = at(name);
    if (!v.is_string())
      fail(name, cat(v.dump(), " is not a schedule; use \"gpipe\", \"1f1b\", \"interleaved\" or \"zb-h1\""));
    try {
      k = parse_schedule_kind(v.get<std::string>());
    } catch (const Error& e) {
      fail(name, e.what());
    }
  }
  template <typename T>
  void operator()(const char* name, T& value) const {
    const nlohmann::json& v = at(name);
    try {
      value = v.get<T>();
    } catch (const nlohmann::json::exception&) {
      fail(name, cat("expected ", expected<T>(), ", got ", v.dump()));
    }
    if constexpr (std::is_floating_point_v<T>) {
      if (!std::isfinite(value)) fail(name, cat("must be a finite number, got ", v.dump()));
    }
  }
  template <typename T>
  static const char* expected() {
    if constexpr (std::is_same_v<T, bool>) return "true or false";
    if constexpr (std::is_same_v<T, std::string>) return "a string";
    if constexpr (std::is_integral_v<T>) return "an integer";
    return "a number";
  }
};

}  // namespace

std::string Plan::to_json() const {
  nlohmann::ordered_json j;
  j["format"] = "h2-plan";
  j["version"] = version;
  j["cluster"] = cluster;
  visit_model(*this, Writer{j["model"]});
  visit_layout(*this, Writer{j});
  j["h2_runtime"] = h2_runtime;
  nlohmann::ordered_json stages_json = nlohmann::ordered_json::array();
  for (const StagePlan& s : stages) {
    nlohmann::ordered_json st;
    visit_stage(s, Writer{st});
    st["weight_s"] = s.weight_s;
    st["weight_pending_bytes"] = s.weight_pending_bytes;
    if (s.starts_at_mlp) st["starts_at_mlp"] = true;
    if (s.ends_at_attention) st["ends_at_attention"] = true;
    if (s.recompute_blocks >= 0) st["recompute_blocks"] = s.recompute_blocks;
    st["memory_headroom"] = s.capacity_bytes > 0 ? 1.0 - s.memory_bytes / s.capacity_bytes : 0.0;  // derived
    for (const ReplicaGroup& g : s.groups) {
      nlohmann::ordered_json gj;
      visit_group(g, Writer{gj});
      gj["weight_s"] = g.weight_s;
      if (g.recompute_blocks >= 0) gj["recompute_blocks"] = g.recompute_blocks;
      st["groups"].push_back(gj);
    }
    stages_json.push_back(st);
  }
  j["stages"] = stages_json;
  visit_prediction(*this, Writer{j["prediction"]});
  return j.dump(2) + "\n";
}

Plan Plan::from_json(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kConfig, cat(source, ": not valid JSON: ", e.what()));
  }
  if (!j.is_object()) throw Error(ErrorCode::kConfig, cat(source, ": not an H2 plan (not a JSON object)"));
  Plan p;
  const Reader top{j, source, ""};
  std::string format;
  top("format", format);
  if (format != "h2-plan") throw Error(ErrorCode::kConfig, cat(source, ": not an H2 plan (format is not h2-plan)"));
  top("version", p.version);
  if (p.version > kPlanVersion || p.version < 3) {
    throw Error(ErrorCode::kConfig,
                cat(source, ": plan version ", p.version, "; this build reads version ", kPlanVersion));
  }
  top("cluster", p.cluster);
  const auto object = [&](const nlohmann::json& parent, const char* name, const std::string& where) {
    const nlohmann::json& v = Reader{parent, source, where}.at(name);
    if (!v.is_object()) Reader{parent, source, where}.fail(name, "expected an object");
    return Reader{v, source, cat(where, name, ".")};
  };
  visit_model(p, object(j, "model", ""));
  visit_layout(p, top);
  if (j.contains("h2_runtime")) top("h2_runtime", p.h2_runtime);  // absent in plans written before it: false
  const nlohmann::json& stages = top.at("stages");
  if (!stages.is_array()) top.fail("stages", "expected a list");
  for (size_t i = 0; i < stages.size(); ++i) {
    const std::string where = cat("stages[", i, "].");
    if (!stages[i].is_object()) top.fail(cat("stages[", i, "]").c_str(), "expected an object");
    StagePlan st;
    const Reader stage{stages[i], source, where};
    visit_stage(st, stage);
    // Written only when set (a plan of whole blocks reads the same as before version 5).
    if (stages[i].contains("starts_at_mlp")) stage("starts_at_mlp", st.starts_at_mlp);
    if (stages[i].contains("ends_at_attention")) stage("ends_at_attention", st.ends_at_attention);
    if (stages[i].contains("recompute_blocks")) stage("recompute_blocks", st.recompute_blocks);  // version 6
    if (stages[i].contains("weight_s")) stage("weight_s", st.weight_s);                          // version 7
    if (stages[i].contains("weight_pending_bytes")) stage("weight_pending_bytes", st.weight_pending_bytes);
    if (stages[i].contains("groups")) {
      const nlohmann::json& groups = stages[i].at("groups");
      if (!groups.is_array()) Reader{stages[i], source, where}.fail("groups", "expected a list");
      for (size_t k = 0; k < groups.size(); ++k) {
        if (!groups[k].is_object())
          Reader{stages[i], source, where}.fail(cat("groups[", k, "]").c_str(), "expected an object");
        ReplicaGroup g;
        visit_group(g, Reader{groups[k], source, cat(where, "groups[", k, "].")});
        const Reader group{groups[k], source, cat(where, "groups[", k, "].")};
        if (groups[k].contains("recompute_blocks")) group("recompute_blocks", g.recompute_blocks);
        if (groups[k].contains("weight_s")) group("weight_s", g.weight_s);
        st.groups.push_back(g);
      }
    }
    p.stages.push_back(st);
  }
  visit_prediction(p, object(j, "prediction", ""));
  check_plan(p, source);
  return p;
}

std::string recompute_label(Recompute r, int blocks) {
  return blocks < 0 ? recompute_name(r) : cat(recompute_name(r), ":", blocks);
}

std::vector<ReplicaGroup> StagePlan::replica_groups() const {
  if (!groups.empty()) return groups;
  return {ReplicaGroup{.chip = chip,
                       .chip_index = chip_index,
                       .replicas = dp,
                       .rows = 0,
                       .recompute = recompute,
                       .recompute_blocks = recompute_blocks,
                       .forward_s = forward_s,
                       .backward_s = backward_s,
                       .weight_s = weight_s,
                       .memory_bytes = memory_bytes,
                       .capacity_bytes = capacity_bytes}};
}

ReplicaGroup StagePlan::group_of(int replica) const {
  const std::vector<ReplicaGroup> all = replica_groups();
  for (const ReplicaGroup& g : all) {
    if (replica < g.replicas) return g;
    replica -= g.replicas;
  }
  H2_CHECK(false) << "replica " << replica << " past the stage's " << dp;
  return all.back();
}

std::vector<int> StagePlan::replica_rows() const {
  std::vector<int> rows;
  for (const ReplicaGroup& g : groups) rows.insert(rows.end(), static_cast<size_t>(g.replicas), g.rows);
  return rows;
}

void save_plan(const Plan& plan, const std::string& path) { write_file_atomic(path, plan.to_json()); }

Plan load_plan(const std::string& path) { return Plan::from_json(read_file(path), path); }

StepEnd end_of_step(const Plan& plan, const std::vector<double>& finish) {
  const size_t p = plan.stages.size();
  StepEnd e;
  e.reduce_start = finish;
  std::vector<double> ready(p);
  for (size_t i = 0; i < p; ++i) ready[i] = finish[i] + plan.stages[i].dp_allreduce_s;
  e.tied_start.assign(p, -1.0);
  if (p > 1 && (plan.stages.front().tied_allreduce_s > 0 || plan.stages.back().tied_allreduce_s > 0)) {
    const double start = std::max(ready.front(), ready.back());
    e.tied_start.front() = e.tied_start.back() = start;
    ready.front() = start + plan.stages.front().tied_allreduce_s;
    ready.back() = start + plan.stages.back().tied_allreduce_s;
  }
  const double norm = *std::max_element(ready.begin(), ready.end());  // every rank agrees on the gradient norm
  e.optim_start.assign(p, norm);
  e.step_s = 0;
  for (size_t i = 0; i < p; ++i) e.step_s = std::max(e.step_s, norm + plan.stages[i].optimizer_s);
  return e;
}

namespace {

// A stage's (or group's) recomputation of its first blocks: -1 (all), or 1 to fewer than its blocks, with a
// recomputation to apply.
template <typename Fail>
void check_recompute_blocks(Recompute r, int blocks, int layers, const std::string& where, const Fail& fail) {
  if (blocks == -1) return;
  if (r == Recompute::kNone) fail(where + "recompute_blocks", cat(blocks, " blocks recompute, but recompute is none"));
  if (blocks < 1 || blocks >= layers) {
    fail(where + "recompute_blocks",
         cat("must be -1 (all) or 1..", layers - 1, " of the stage's ", layers, " blocks, got ", blocks));
  }
}

}  // namespace

void check_plan(const Plan& p, const std::string& source) {
  const auto fail = [&](const std::string& field, const std::string& what) {
    throw Error(ErrorCode::kConfig, cat(source, ": field '", field, "': ", what));
  };
  if (p.micro_batch < 1) fail("micro_batch", cat("must be >= 1, got ", p.micro_batch));
  if (p.num_micro_batches < 1) fail("num_micro_batches", cat("must be >= 1, got ", p.num_micro_batches));
  if (p.dp < 1) fail("dp", cat("must be >= 1, got ", p.dp));
  if (p.global_batch != int64_t{p.dp} * p.micro_batch * p.num_micro_batches) {
    fail("num_micro_batches", cat(p.num_micro_batches, " micro-batches of ", p.micro_batch, " sequences on ", p.dp,
                                  " pipelines make ", int64_t{p.dp} * p.micro_batch * p.num_micro_batches,
                                  " sequences, not the global batch of ", p.global_batch));
  }
  if (p.stages.empty()) fail("stages", "there are none");
  const int64_t rows = int64_t{p.dp} * p.micro_batch;  // a micro-batch's sequences over a stage's replicas
  // Bounded before any arithmetic on them (a fuzzed plan had -2^63 layers).
  if (p.shape.layers < 1 || p.shape.layers > 1'000'000) {
    fail("model.layers", cat("must be in 1..1000000, got ", p.shape.layers));
  }
  int64_t next_half = 0, fewest_layers = p.shape.layers;
  bool any_half = false;
  for (size_t i = 0; i < p.stages.size(); ++i) {
    const StagePlan& s = p.stages[i];
    const std::string where = cat("stages[", i, "].");
    if (s.tp < 1 || s.tp > 1024) fail(where + "tp", cat("must be in 1..1024, got ", s.tp));
    if (s.groups.empty() && (s.dp < 1 || rows % s.dp != 0)) {
      fail(where + "dp", cat(s.dp, " replicas do not divide a micro-batch's ", rows, " sequences"));
    }
    int64_t replicas = 0, shared = 0;
    for (size_t k = 0; k < s.groups.size(); ++k) {
      const ReplicaGroup& g = s.groups[k];
      const std::string at = cat(where, "groups[", k, "].");
      if (g.replicas < 1 || g.replicas > 1 << 20) fail(at + "replicas", cat("must be in 1..2^20, got ", g.replicas));
      if (g.rows < 1 || g.rows > rows) fail(at + "rows", cat("must be in 1..", rows, ", got ", g.rows));
      for (auto [v, name] : {std::pair{g.forward_s, "forward_s"}, {g.backward_s, "backward_s"}}) {
        if (!(v >= 0 && v <= 1e6)) fail(at + name, cat("must be in [0, 1e6], got ", v));
      }
      if (!(g.weight_s >= 0 && g.weight_s <= g.backward_s)) {
        fail(at + "weight_s", cat("must be in [0, backward_s = ", g.backward_s, "], got ", g.weight_s));
      }
      check_recompute_blocks(g.recompute, g.recompute_blocks, s.layers, at, fail);
      replicas += g.replicas;
      shared += int64_t{g.replicas} * g.rows;
    }
    if (!s.groups.empty() && (replicas != s.dp || shared != rows)) {
      fail(where + "groups", cat("their ", replicas, " replicas take ", shared, " sequences; the stage has dp ", s.dp,
                                 " and a micro-batch ", rows));
    }
    if (s.layers < 0 || s.layers > p.shape.layers || s.first_layer < 0 || s.first_layer > p.shape.layers ||
        s.start_half() != next_half) {
      fail(where + "first_layer",
           cat("layers ", s.first_layer, "..", int64_t{s.first_layer} + s.layers - 1,
               s.starts_at_mlp ? " from the MLP half" : "", ": the stages must cover the layers in order from 0",
               next_half % 2 == 1 ? ", this one from the MLP half of the block the stage before ends in" : ""));
    }
    if ((s.starts_at_mlp || s.ends_at_attention) && s.halves() < 1) {
      fail(where + "layers", cat(s.layers, " layers from an MLP half to an attention half hold no half-block"));
    }
    check_recompute_blocks(s.recompute, s.recompute_blocks, s.layers, where, fail);
    if (s.recompute_blocks >= 0 && p.chunks > 1) {
      fail(where + "recompute_blocks", "recomputing only some blocks is for stages of one chunk, not interleaved");
    }
    if (s.starts_at_mlp && s.embedding) fail(where + "starts_at_mlp", "the embedding's stage starts at a whole block");
    if (s.ends_at_attention && s.head) fail(where + "ends_at_attention", "the head's stage ends with a whole block");
    any_half = any_half || s.starts_at_mlp || s.ends_at_attention;
    for (auto [v, name] : {std::pair{s.forward_s, "forward_s"},
                           {s.backward_s, "backward_s"},
                           {s.send_s, "send_s"},
                           {s.dp_allreduce_s, "dp_allreduce_s"},
                           {s.tied_allreduce_s, "tied_allreduce_s"},
                           {s.optimizer_s, "optimizer_s"},
                           {s.state_bytes, "state_bytes"},
                           {s.activation_bytes, "activation_bytes"},
                           {s.buffer_bytes, "buffer_bytes"},
                           {s.weight_pending_bytes, "weight_pending_bytes"}}) {
      // Finite and within what one step of any real job could take or hold (a second of a day, a petabyte).
      const double most = std::string_view(name).ends_with("_s") ? 1e6 : 1e15;
      if (!(v >= 0 && v <= most)) fail(where + name, cat("must be in [0, ", most, "], got ", v));
    }
    if (!(s.weight_s >= 0 && s.weight_s <= s.backward_s)) {
      fail(where + "weight_s", cat("must be in [0, backward_s = ", s.backward_s, "], got ", s.weight_s));
    }
    if (p.schedule == ScheduleKind::kZeroBubbleH1 && s.weight_s <= 0) {
      fail(where + "weight_s", cat("zb-h1 splits each backward at its weight gradients, and this plan (version ",
                                   p.version, ") does not say how long they take; plan or cost it again"));
    }
    next_half += s.halves();
    fewest_layers = std::min<int64_t>(fewest_layers, s.layers);
  }
  if (next_half != 2 * p.shape.layers) {
    fail("stages", cat("the stages hold ", next_half / 2.0, " of the model's ", p.shape.layers, " layers"));
  }
  if (p.chunks < 1) fail("chunks", cat("must be >= 1, got ", p.chunks));
  // The schedule lists every stage's forward and backward of every micro-batch and chunk: bound it before building.
  const double actions = 2.0 * static_cast<double>(p.stages.size()) * p.chunks * p.num_micro_batches;
  if (actions > 5e7) {
    fail("num_micro_batches", cat(p.stages.size(), " stages x ", p.chunks, " chunks x ", p.num_micro_batches,
                                  " micro-batches make a schedule of ", actions, " actions; at most 5e7"));
  }
  if (p.schedule == ScheduleKind::kInterleaved) {
    if (any_half) fail("schedule", "interleaved stages hold whole blocks; a stage boundary inside a block needs 1f1b");
    if (p.chunks > fewest_layers) {
      fail("chunks", cat(p.chunks, " chunks per stage, but a stage has only ", fewest_layers,
                         " layers; each chunk needs at least one"));
    }
    if (p.num_micro_batches % static_cast<int>(p.stages.size()) != 0) {
      fail("num_micro_batches",
           cat("interleaved 1F1B needs a multiple of the ", p.stages.size(), " stages, got ", p.num_micro_batches));
    }
  } else if (p.chunks != 1) {
    fail("chunks", cat(p.chunks, " chunks need the interleaved schedule, not ", schedule_name(p.schedule)));
  }
}

void check_plan_model(const Plan& plan, const TransformerShape& model, const std::string& whose) {
  const TransformerShape& s = plan.shape;
  if (s.layers == model.layers && s.hidden == model.hidden && s.heads == model.heads && s.ffn == model.ffn &&
      s.vocab == model.vocab && s.seq_len == model.seq_len) {
    return;
  }
  const auto shape = [](const TransformerShape& m) {  // the MLP's width only where it is not GPT's 4 x hidden
    return cat(m.layers, " blocks x ", m.hidden, " (", m.heads, " heads, vocabulary ", m.vocab, ", ", m.seq_len,
               " tokens)", m.ffn != 4 * m.hidden ? cat(", MLP ", m.ffn) : "");
  };
  throw Error(ErrorCode::kConfig, cat("plan: made for a model of ", shape(s), "; ", whose, " has ", shape(model),
                                      ": plan again with ", whose));
}

std::vector<ChunkLayers> virtual_stages(const Plan& plan) {
  const int p = static_cast<int>(plan.stages.size()), v = plan.chunks;
  std::vector<ChunkLayers> out(static_cast<size_t>(p * v));
  int first = 0;
  for (int k = 0; k < p * v; ++k) {
    ChunkLayers& c = out[static_cast<size_t>(k)];
    c.first_layer = first;
    c.layers = chunk_layers(plan.stages[static_cast<size_t>(k % p)].layers, v, k / p);
    c.embedding = k == 0 && plan.stages.front().embedding;
    c.head = k == p * v - 1 && plan.stages.back().head;
    if (v == 1) {
      c.first_layer = plan.stages[static_cast<size_t>(k)].first_layer;
      c.starts_at_mlp = plan.stages[static_cast<size_t>(k)].starts_at_mlp;
      c.ends_at_attention = plan.stages[static_cast<size_t>(k)].ends_at_attention;
    }
    first += c.layers;
  }
  return out;
}

std::vector<int> zb_deferrals(const Plan& plan) {
  std::vector<int> out;
  for (size_t i = 0; i < plan.stages.size(); ++i) {
    const StagePlan& s = plan.stages[i];
    // Nor where its replicas are of several chip types: their memory differs, and the stage's figures are one's.
    bool recomputes = s.groups.size() > 1;
    for (const ReplicaGroup& g : s.replica_groups()) recomputes = recomputes || g.recompute != Recompute::kNone;
    // Beside its footprint under 1F1B (whatever the plan's schedule): min(p - i, m) micro-batches in flight.
    const int in_flight = std::min(static_cast<int>(plan.stages.size() - i), plan.num_micro_batches);
    const double room = s.capacity_bytes - (s.state_bytes + s.buffer_bytes + in_flight * s.activation_bytes);
    int d = recomputes ? -1 : static_cast<int>(i);
    while (d >= 0 && d * s.activation_bytes + (d + 1) * s.weight_pending_bytes > room) --d;
    out.push_back(d);
  }
  return out;
}

std::optional<Plan> as_zero_bubble(const Plan& plan) {
  if (plan.schedule != ScheduleKind::k1F1B || plan.chunks != 1) return std::nullopt;
  Plan z = plan;
  z.schedule = ScheduleKind::kZeroBubbleH1;
  const std::vector<int> deferred = zb_deferrals(z);
  if (std::none_of(deferred.begin(), deferred.end(), [](int d) { return d >= 0; })) return std::nullopt;
  const Schedule schedule = schedule_of(z);
  for (size_t i = 0; i < z.stages.size(); ++i) {
    if (deferred[i] < 0) continue;  // in 1F1B's order, holding what it held
    StagePlan& st = z.stages[i];
    const int rank = static_cast<int>(i), in_flight = max_in_flight(schedule, rank);
    st.memory_bytes += (in_flight - st.in_flight) * st.activation_bytes +
                       max_pending_weights(schedule, rank) * st.weight_pending_bytes;
    st.in_flight = in_flight;
    for (ReplicaGroup& g : st.groups) g.memory_bytes = st.memory_bytes;  // one group: zb_deferrals splits no other
    z.fits = z.fits && st.memory_bytes <= st.capacity_bytes;
  }
  return z;
}

Schedule schedule_of(const Plan& plan) {
  const int p = static_cast<int>(plan.stages.size());
  if (plan.schedule == ScheduleKind::kZeroBubbleH1)
    return schedule_zb_h1(p, plan.num_micro_batches, zb_deferrals(plan));
  return make_schedule(plan.schedule, p, plan.chunks, plan.num_micro_batches);
}

ReplayResult replay_plan(const Plan& plan) {
  const int p = static_cast<int>(plan.stages.size()), v = plan.chunks;
  double slowest_link = 0;
  for (const StagePlan& s : plan.stages) slowest_link = std::max(slowest_link, s.send_s);
  return replay(
      schedule_of(plan),
      [&](int vs, Work work) {
        const StagePlan& s = plan.stages[static_cast<size_t>(vs % p)];
        switch (work) {
          case Work::kForward:
            return s.forward_s / v;
          case Work::kBackward:
            return s.backward_s / v;
          case Work::kInputGradient:
            return (s.backward_s - s.weight_s) / v;
          case Work::kWeightGradient:
            return s.weight_s / v;
        }
        return 0.0;
      },
      [&](int vs) { return vs % p == p - 1 ? slowest_link : plan.stages[static_cast<size_t>(vs % p)].send_s; });
}

}  // namespace h2

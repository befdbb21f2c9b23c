// plan.json: writing and reading, with a version and checked fields.
#include "planner/plan.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file.h"
#include "planner/spec.h"

namespace h2 {

std::string Plan::to_json() const {
  nlohmann::ordered_json j;
  j["format"] = "h2-plan";
  j["version"] = version;
  j["cluster"] = cluster;
  j["model"] = {{"name", model},        {"layers", shape.layers},     {"hidden", shape.hidden},
                {"heads", shape.heads}, {"kv_heads", shape.kv_heads}, {"ffn", shape.ffn},
                {"vocab", shape.vocab}, {"seq_len", shape.seq_len},   {"tied_embeddings", shape.tied_embeddings}};
  j["global_batch"] = global_batch;
  j["micro_batch"] = micro_batch;
  j["num_micro_batches"] = num_micro_batches;
  j["dp"] = dp;
  j["schedule"] = "1f1b";
  nlohmann::ordered_json stages_json = nlohmann::ordered_json::array();
  for (const StagePlan& s : stages) {
    stages_json.push_back({{"chip", s.chip},
                           {"tp", s.tp},
                           {"dp", s.dp},
                           {"first_layer", s.first_layer},
                           {"layers", s.layers},
                           {"embedding", s.embedding},
                           {"head", s.head},
                           {"recompute", recompute_name(s.recompute)},
                           {"in_flight", s.in_flight},
                           {"forward_s", s.forward_s},
                           {"backward_s", s.backward_s},
                           {"send_s", s.send_s},
                           {"dp_allreduce_s", s.dp_allreduce_s},
                           {"tied_allreduce_s", s.tied_allreduce_s},
                           {"optimizer_s", s.optimizer_s},
                           {"state_bytes", s.state_bytes},
                           {"activation_bytes", s.activation_bytes},
                           {"memory_bytes", s.memory_bytes},
                           {"capacity_bytes", s.capacity_bytes},
                           {"memory_headroom", s.capacity_bytes > 0 ? 1.0 - s.memory_bytes / s.capacity_bytes : 0.0}});
  }
  j["stages"] = stages_json;
  j["prediction"] = {{"step_s", step_s},
                     {"tokens_per_s", tokens_per_s},
                     {"mfu", mfu},
                     {"bubble_fraction", bubble_fraction},
                     {"devices_used", devices_used},
                     {"devices_total", devices_total},
                     {"fits", fits},
                     {"limited_by", limited_by},
                     {"why", why}};
  return j.dump(2) + "\n";
}

Plan Plan::from_json(const std::string& text, const std::string& source) {
  Plan p;
  std::string field;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    field = "format";
    if (j.at("format") != "h2-plan")
      throw Error(ErrorCode::kConfig, cat(source, ": not an H2 plan (format is not h2-plan)"));
    field = "version";
    p.version = j.at("version").get<int>();
    if (p.version != kPlanVersion) {
      throw Error(ErrorCode::kConfig,
                  cat(source, ": plan version ", p.version, "; this build reads version ", kPlanVersion));
    }
    field = "cluster";
    p.cluster = j.at("cluster").get<std::string>();
    const auto& m = j.at("model");
    field = "model";
    p.model = m.at("name").get<std::string>();
    p.shape = TransformerShape{m.at("layers").get<int64_t>(),  m.at("hidden").get<int64_t>(),
                               m.at("heads").get<int64_t>(),   m.at("kv_heads").get<int64_t>(),
                               m.at("ffn").get<int64_t>(),     m.at("vocab").get<int64_t>(),
                               m.at("seq_len").get<int64_t>(), m.at("tied_embeddings").get<bool>()};
    field = "global_batch";
    p.global_batch = j.at("global_batch").get<int64_t>();
    field = "micro_batch";
    p.micro_batch = j.at("micro_batch").get<int>();
    field = "num_micro_batches";
    p.num_micro_batches = j.at("num_micro_batches").get<int>();
    field = "dp";
    p.dp = j.at("dp").get<int>();
    int next_layer = 0;
    for (size_t i = 0; i < j.at("stages").size(); ++i) {
      field = cat("stages[", i, "]");
      const auto& s = j.at("stages")[i];
      StagePlan st;
      st.chip = s.at("chip").get<std::string>();
      st.tp = s.at("tp").get<int>();
      st.dp = s.at("dp").get<int>();
      st.first_layer = s.at("first_layer").get<int>();
      st.layers = s.at("layers").get<int>();
      st.embedding = s.at("embedding").get<bool>();
      st.head = s.at("head").get<bool>();
      const std::string r = s.at("recompute").get<std::string>();
      st.recompute = r == "full" ? Recompute::kFull : r == "selective" ? Recompute::kSelective : Recompute::kNone;
      st.in_flight = s.at("in_flight").get<int>();
      st.forward_s = s.at("forward_s").get<double>();
      st.backward_s = s.at("backward_s").get<double>();
      st.send_s = s.at("send_s").get<double>();
      st.dp_allreduce_s = s.at("dp_allreduce_s").get<double>();
      st.tied_allreduce_s = s.value("tied_allreduce_s", 0.0);  // absent from plans written before it was modelled
      st.optimizer_s = s.at("optimizer_s").get<double>();
      st.state_bytes = s.at("state_bytes").get<double>();
      st.activation_bytes = s.at("activation_bytes").get<double>();
      st.memory_bytes = s.at("memory_bytes").get<double>();
      st.capacity_bytes = s.at("capacity_bytes").get<double>();
      if (st.tp < 1 || st.dp < 1 || st.layers < 0 || st.first_layer != next_layer || st.forward_s < 0 ||
          st.backward_s < 0 || st.tied_allreduce_s < 0) {
        throw Error(ErrorCode::kConfig, cat(source, ": ", field,
                                            ": inconsistent stage (tp, dp >= 1; layers contiguous "
                                            "from 0; times >= 0)"));
      }
      next_layer += st.layers;
      p.stages.push_back(st);
    }
    field = "stages";
    if (p.stages.empty() || next_layer != p.shape.layers) {
      throw Error(ErrorCode::kConfig,
                  cat(source, ": stages cover ", next_layer, " of the model's ", p.shape.layers, " layers"));
    }
    const auto& pr = j.at("prediction");
    field = "prediction";
    p.step_s = pr.at("step_s").get<double>();
    p.tokens_per_s = pr.at("tokens_per_s").get<double>();
    p.mfu = pr.at("mfu").get<double>();
    p.bubble_fraction = pr.at("bubble_fraction").get<double>();
    p.devices_used = pr.at("devices_used").get<int>();
    p.devices_total = pr.at("devices_total").get<int>();
    p.fits = pr.at("fits").get<bool>();
    p.limited_by = pr.at("limited_by").get<std::string>();
    p.why = pr.at("why").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kConfig, cat(source, ": field '", field, "': ", e.what()));
  }
  if (p.micro_batch < 1 || p.num_micro_batches < 1 || p.dp < 1) {
    throw Error(ErrorCode::kConfig, cat(source, ": micro_batch, num_micro_batches and dp must be >= 1"));
  }
  return p;
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

}  // namespace h2

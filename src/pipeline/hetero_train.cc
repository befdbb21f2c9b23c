// One rank of `h2 train --cluster`, and the driver's merge of what the ranks wrote.
#include "pipeline/hetero_train.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/clock.h"
#include "core/file.h"
#include "device/registry.h"
#include "model/dataset.h"
#include "pipeline/runtime.h"
#include "sim/simulator.h"

namespace h2 {
namespace {

namespace fs = std::filesystem;

fs::path trace_part(const HeteroRun& run, int rank) {
  return fs::path(run.config.out_dir) / "trace_parts" / cat("rank_", rank, ".json");
}

}  // namespace

StageLayout stage_layout_of(const Plan& plan) {
  StageLayout layout;
  for (const StagePlan& s : plan.stages) layout.stages.push_back(StageShape{s.dp, s.tp});
  return layout;
}

void check_plan_runs(const Plan& plan, const GptConfig& model) {
  const auto fail = [](const std::string& what) { throw Error(ErrorCode::kConfig, cat("plan: ", what)); };
  if (plan.stages.empty()) fail("has no stages");
  if (plan.num_micro_batches < 1 || plan.global_batch % plan.num_micro_batches != 0) {
    fail(cat("global_batch ", plan.global_batch, " is not a whole number of num_micro_batches (",
             plan.num_micro_batches, ")"));
  }
  const int64_t rows = plan.global_batch / plan.num_micro_batches;
  int next_layer = 0;
  for (size_t i = 0; i < plan.stages.size(); ++i) {
    const StagePlan& s = plan.stages[i];
    const std::string where = cat("stage ", i, " (", s.chip, "): ");
    if (s.first_layer != next_layer || s.layers < 0) {
      fail(cat(where, "first_layer ", s.first_layer, " with ", s.layers, " layers; the stages must cover blocks 0..",
               model.n_layer - 1, " in order"));
    }
    next_layer += s.layers;
    if (s.embedding != (i == 0) || s.head != (i + 1 == plan.stages.size())) {
      fail(cat(where, "only the first stage may hold the embedding and only the last the head"));
    }
    if (s.tp < 1 || model.n_head % s.tp != 0) {
      fail(cat(where, "tp ", s.tp, " does not divide the model's ", model.n_head, " heads"));
    }
    if (s.dp < 1 || rows % s.dp != 0) {
      fail(cat(where, "dp ", s.dp, " does not divide a micro-batch of ", rows, " sequences (global_batch / ",
               "num_micro_batches)"));
    }
  }
  if (next_layer != model.n_layer) fail(cat("the stages hold ", next_layer, " blocks; the model has ", model.n_layer));
}

GptConfig gpt_config_of(const TransformerShape& shape) {
  GptConfig c{.n_layer = static_cast<int>(shape.layers),
              .n_head = static_cast<int>(shape.heads),
              .n_embd = static_cast<int>(shape.hidden),
              .vocab_size = static_cast<int>(shape.vocab),
              .seq_len = static_cast<int>(shape.seq_len)};
  c.validate();
  return c;
}

EmuProfile emu_profile_of(const Cluster& cluster, const std::string& chip, int host_cores) {
  const int index = cluster.chip_index(chip);
  if (index < 0)
    throw Error(ErrorCode::kNotFound, cat("the plan's chip type '", chip, "' is not in cluster ", cluster.name));
  double fastest = 0;
  for (const ChipType& c : cluster.chips) fastest = std::max(fastest, c.flops_per_second());
  double busy_cores = 0;  // every device busy at its relative speed
  for (const NodeGroup& g : cluster.groups) {
    busy_cores += g.devices() * cluster.chips[static_cast<size_t>(g.chip)].flops_per_second() / fastest;
  }
  if (host_cores <= 0) host_cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const double scale = busy_cores > 0 ? std::min(1.0, 0.9 * host_cores / busy_cores) : 1.0;
  const ChipType& c = cluster.chips[static_cast<size_t>(index)];
  return EmuProfile{.chip = c.name,
                    .speed = scale * c.flops_per_second() / fastest,
                    .mem_capacity_bytes = static_cast<size_t>(c.memory_bytes()),
                    .mem_bandwidth_gbps = 0};
}

RankOutcome run_rank(const HeteroRun& run, Job& job, bool quiet, const std::atomic<bool>* stop_requested) {
  const TrainConfig& c = run.config;
  const Plan& plan = run.plan;
  Communicator& world = *job.world;
  check_plan_runs(plan, c.model);
  const StageLayout layout = stage_layout_of(plan);
  const int rank = world.rank();
  const StageLayout::Place place = layout.place(rank);
  StageComms comms = StageComms::split(world, layout);
  const StagePlan& sp = plan.stages[static_cast<size_t>(place.stage)];
  auto device = create_device(DeviceSpec{.backend = "emu", .index = rank, .emu = emu_profile_of(run.cluster, sp.chip)});
  const GptRange range{sp.embedding, sp.first_layer, sp.first_layer + sp.layers, sp.head};
  const int T = c.model.seq_len, M = plan.num_micro_batches;
  const int rows = static_cast<int>(plan.global_batch / M);  // a micro-batch, over all of a stage's replicas
  StageRunner runner(c.model, *device, range, layout, comms, rows, T,
                     OptimOptions{.grad_clip = c.grad_clip, .zero1 = run.zero1});
  runner.model().init(c.seed);
  // The plan's recomputation: a stage planned without it keeps the activations of the micro-batches 1F1B has in
  // flight there; with selective or full recomputation it keeps one and recomputes the others (the runtime
  // cannot drop only the attention scores, so selective is run as full).
  if (sp.recompute == Recompute::kNone) runner.keep_activations(std::max(1, sp.in_flight));
  // The first and last stages read each step's whole batch and take their micro-batch's and replica's rows, so
  // the data a step trains on does not depend on the plan (a run may resume under another one).
  std::unique_ptr<TokenLoader> loader;
  if (range.embedding || range.head) {
    loader =
        std::make_unique<TokenLoader>(expand_glob(c.train_data), static_cast<int>(plan.global_batch), T, c.seed, true);
  }
  std::vector<int32_t> tokens, targets;
  // Held-out data, read in order from the start at each evaluation (every rank knows how many batches there are).
  std::unique_ptr<TokenLoader> val_loader;
  if (!c.val_data.empty()) {
    val_loader =
        std::make_unique<TokenLoader>(expand_glob(c.val_data), static_cast<int>(plan.global_batch), T, c.seed, false);
  }
  const std::string checkpoint_dir = (fs::path(c.out_dir) / "checkpoints").string();
  int64_t first_step = 0;
  if (run.resume) {
    const std::string latest = latest_checkpoint(checkpoint_dir);
    const CheckpointState state = read_checkpoint_state(latest);
    check_checkpoint_model(state, c.model, latest);
    std::vector<float> mom, vel;
    load_checkpoint_by_name(latest, runner.model(), &mom, &vel);
    runner.set_optimizer_state(mom, vel);
    first_step = state.step;
    if (loader) loader->seek(state.data);
    if (rank == 0 && !quiet) std::printf("resumed from %s at step %lld\n", latest.c_str(), (long long)first_step);
  }
  const auto save = [&](int64_t done) {
    if (rank == 0) begin_checkpoint(checkpoint_dir, done);
    world.barrier();
    std::vector<float> mom, vel;
    runner.optimizer_state(mom, vel);
    if (place.replica == 0) {
      // The last stage's copy of the tied embedding is the first stage's: written once. TP ranks put their
      // shards together; the first of them writes.
      const std::vector<SavedParam> params = saved_params(
          runner.model(), mom.data(), vel.data(),
          [&](const Gpt::Param& p) { return !(place.stage > 0 && p.name == "wte.weight"); },
          [&](std::vector<float>& x) { comms.tp.all_reduce(x.data(), x.size(), DType::kF32, ReduceOp::kSum); });
      if (place.t == 0) {
        write_model_files((fs::path(checkpoint_dir) / (checkpoint_name(done) + ".tmp")).string(),
                          cat(".stage", place.stage), params);
      }
    }
    world.barrier();
    if (rank == 0) {
      write_checkpoint_state(
          (fs::path(checkpoint_dir) / (checkpoint_name(done) + ".tmp")).string(),
          CheckpointState{.step = done, .model = c.model, .data = loader->position(), .data_seed = c.seed});
      commit_checkpoint(checkpoint_dir, done, c.keep_checkpoints);
    }
    world.barrier();
  };
  int64_t kill_step = -1;
  if (const char* f = std::getenv("H2_FAULT_KILL")) {
    int fault_rank = -1;
    long long fault_step = -1;
    if (std::sscanf(f, "%d:%lld", &fault_rank, &fault_step) != 2) {
      throw Error(ErrorCode::kConfig, cat("H2_FAULT_KILL='", f, "' is not RANK:STEP"));
    }
    if (fault_rank == rank) kill_step = fault_step;
  }
  const Schedule schedule = add_gradient_reduction(lower_communication(schedule_1f1b(layout.num_stages(), M)));
  nlohmann::json trace = nlohmann::json::array();
  int64_t step = 0;
  runner.on_action = [&](const Action& a, double t0, double t1) {
    if (step + 1 == kill_step) std::raise(SIGKILL);
    trace.push_back(
        {{"name", a.str()}, {"ph", "X"}, {"pid", rank}, {"tid", 0}, {"ts", t0 * 1e6}, {"dur", (t1 - t0) * 1e6}});
  };
  std::ofstream metrics;
  if (rank == 0) {
    fs::create_directories(c.out_dir);
    metrics = open_metrics((fs::path(c.out_dir) / "metrics.jsonl").string(), first_step);
  }
  const StageRunner::Batch batch = [&](int m, int first_row, int n, std::vector<int32_t>& tok,
                                       std::vector<int32_t>& tgt) {
    const int64_t first = (int64_t{m} * rows + first_row) * T;
    tok.assign(tokens.begin() + first, tokens.begin() + first + int64_t{n} * T);
    tgt.assign(targets.begin() + first, targets.begin() + first + int64_t{n} * T);
  };
  RankOutcome out;
  const auto evaluate = [&] {
    val_loader->seek({0, 0});
    const int batches =
        static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(c.eval_batches), val_loader->batches_per_epoch()));
    double sum = 0;
    for (int i = 0; i < batches; ++i) {
      val_loader->next(tokens, targets);  // the training batch is loaded again at the next step
      sum += runner.evaluate(M, batch);
    }
    return static_cast<float>(sum / batches);
  };
  const double tokens_per_step = static_cast<double>(plan.global_batch) * T;
  // Step time: the mean after two warm-up steps (when the run has more than two), else over every step.
  double measured = 0, all = 0;
  int64_t measured_steps = 0;
  for (step = first_step; step < c.steps; ++step) {
    // Every rank stops at the same step: rank 0's wish (or anyone's) is agreed on first.
    float stop = stop_requested != nullptr && stop_requested->load() ? 1.0f : 0.0f;
    world.all_reduce(&stop, 1, DType::kF32, ReduceOp::kMax);
    if (stop > 0) {
      out.interrupted = true;
      if (step > first_step) save(step);  // what was trained is kept
      break;
    }
    const double t0 = monotonic_seconds();
    if (loader) loader->next(tokens, targets);
    const double lr = learning_rate(c, step);
    const float loss = runner.step(schedule, batch, adamw_params(c, step));
    const double dt = monotonic_seconds() - t0;
    all += dt;
    if (step >= first_step + 2) {
      measured += dt;
      ++measured_steps;
    }
    out.steps_done = step + 1;
    out.last_loss = loss;
    if (rank == 0) {
      metrics << nlohmann::json{{"step", step + 1}, {"loss", loss}, {"grad_norm", runner.last_grad_norm()},
                                {"lr", lr},         {"step_s", dt}, {"tokens_per_s", tokens_per_step / dt}}
                     .dump()
              << "\n";
      metrics.flush();
      if (!quiet && ((step + 1) % std::max<int64_t>(1, c.log_every) == 0 || step + 1 == c.steps)) {
        std::printf("step %5lld/%lld | loss %.4f | lr %.2e | norm %6.3f | %7.0f tok/s | step %.3f s (plan %.3f s)\n",
                    static_cast<long long>(step + 1), static_cast<long long>(c.steps), loss, lr,
                    runner.last_grad_norm(), tokens_per_step / dt, dt, plan.step_s);
        std::fflush(stdout);
      }
    }
    if (val_loader && (step + 1 == c.steps || (c.eval_every > 0 && (step + 1) % c.eval_every == 0))) {
      out.val_loss = evaluate();
      if (rank == 0) {
        metrics << nlohmann::json{{"step", step + 1}, {"val_loss", out.val_loss}}.dump() << "\n";
        metrics.flush();
        if (!quiet) std::printf("step %5lld | val loss %.4f\n", static_cast<long long>(step + 1), out.val_loss);
      }
    }
    if (step + 1 == c.steps || (c.checkpoint_every > 0 && (step + 1) % c.checkpoint_every == 0)) save(step + 1);
  }
  const int64_t ran = out.steps_done - first_step;
  out.step_seconds = measured_steps > 0 ? measured / static_cast<double>(measured_steps)
                     : ran > 0          ? all / static_cast<double>(ran)
                                        : 0;
  fs::create_directories(trace_part(run, rank).parent_path());
  write_file_atomic(trace_part(run, rank).string(), trace.dump());
  if (rank == 0) {
    write_file_atomic((fs::path(c.out_dir) / "measured.json").string(),
                      nlohmann::json{{"steps", out.steps_done},
                                     {"last_loss", out.last_loss},
                                     {"val_loss", out.val_loss},
                                     {"step_s", out.step_seconds},
                                     {"tokens_per_s", out.step_seconds > 0 ? tokens_per_step / out.step_seconds : 0}}
                          .dump(2));
  }
  world.barrier();  // nobody tears the job down while a peer still needs it
  return out;
}

double finish_run(const HeteroRun& run, int ranks) {
  const fs::path dir(run.config.out_dir);
  nlohmann::json events = nlohmann::json::array();
  for (int r = 0; r < ranks; ++r) {
    const fs::path part = trace_part(run, r);
    if (!fs::exists(part)) continue;
    for (auto& e : nlohmann::json::parse(read_file(part.string()))) events.push_back(e);
    fs::remove(part);
  }
  fs::remove(dir / "trace_parts");
  write_file_atomic((dir / "trace_measured.json").string(), nlohmann::json{{"traceEvents", events}}.dump());
  const SimResult sim = simulate(run.plan, SimOptions{});
  write_file_atomic((dir / "trace_predicted.json").string(), sim.trace_json);
  const nlohmann::json measured = nlohmann::json::parse(read_file((dir / "measured.json").string()));
  const double step_s = measured.at("step_s").get<double>();
  const double ratio = sim.step_s > 0 ? step_s / sim.step_s : 0;
  write_file_atomic((dir / "summary.json").string(),
                    nlohmann::json{{"measured_step_s", step_s},
                                   {"simulated_step_s", sim.step_s},
                                   {"planned_step_s", run.plan.step_s},
                                   {"measured_over_simulated", ratio},
                                   {"measured_tokens_per_s", measured.at("tokens_per_s")},
                                   {"planned_tokens_per_s", run.plan.tokens_per_s}}
                        .dump(2));
  return ratio;
}

}  // namespace h2

// One rank of `h2 train --cluster`, and the driver's merge of what the ranks wrote.
#include "pipeline/hetero_train.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "core/clock.h"
#include "core/file.h"
#include "core/format.h"
#include "core/hash.h"
#include "device/emu/device.h"
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

// The parameters a TP-`tp` shard of stage `s` holds (model/costs.h's stage_params).
double params_of(const TransformerShape& shape, const StagePlan& s, int tp) {
  return static_cast<double>(stage_params({.shape = shape,
                                           .embedding = s.embedding,
                                           .head = s.head,
                                           .layers = s.layers,
                                           .starts_at_mlp = s.starts_at_mlp,
                                           .ends_at_attention = s.ends_at_attention,
                                           .tp = tp}));
}

}  // namespace

StageLayout stage_layout_of(const Plan& plan) {
  StageLayout layout;
  for (const StagePlan& s : plan.stages) layout.stages.push_back(StageShape{s.dp, s.tp, s.replica_rows()});
  layout.chunks = plan.chunks;
  return layout;
}

void check_plan_runs(const Plan& plan, const GptConfig& model) {
  const auto fail = [](const std::string& what) { throw Error(ErrorCode::kConfig, cat("plan: ", what)); };
  if (plan.schedule == ScheduleKind::kGPipe) {
    fail(cat("schedule ", schedule_name(plan.schedule),
             ": h2 train runs 1F1B, interleaved 1F1B and ZB-H1; plan again, or set \"schedule\": \"1f1b\""));
  }
  check_plan(plan, "plan");  // the stages cover the blocks in order, replicas divide a micro-batch, chunks fit
  check_plan_model(plan, model.shape(), "the run's model");
  if (plan.chunks > 1 && plan.stages.size() < 2) {
    fail(cat("chunks ", plan.chunks, ": interleaving needs at least two stages; set \"chunks\": 1"));
  }
  for (size_t i = 0; i < plan.stages.size(); ++i) {
    const StagePlan& st = plan.stages[i];
    const std::string where = cat("stage ", i, " (", st.chip, "): ");
    if (st.embedding != (i == 0) || st.head != (i + 1 == plan.stages.size())) {
      fail(cat(where, "only the first stage may hold the embedding and only the last the head"));
    }
    if (model.n_head % st.tp != 0) {
      fail(cat(where, "tp ", st.tp, " does not divide the model's ", model.n_head, " heads"));
    }
  }
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
  for (const ChipType& c : cluster.chips) fastest = std::max(fastest, c.emulation_flops());
  double busy_cores = 0;  // every device busy at its relative speed
  for (const NodeGroup& g : cluster.groups) {
    busy_cores += g.devices() * cluster.chips[static_cast<size_t>(g.chip)].emulation_flops() / fastest;
  }
  if (host_cores <= 0) host_cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // The share of the cores the devices may keep busy: a rank that waits longer than its pace allows for a core, or
  // whose kernels the others slow beyond 1 / speed, cannot make the time up (device/emu/device.h). Measured on
  // 8 emulated chips on 2 cores (bench/run_emulated.sh's 8-device cluster, profiled, alternating): 0.9 ran
  // 1.06-1.20 of the simulated step, 0.6 ran 1.01-1.05. The built-in example (4 chips; bench/run_hetero.sh's runs,
  // 3 rounds alternating on 2026-12-05): 0.6 ran 1.02-1.12 of the simulated step, 0.4 ran 0.98-1.03.
  constexpr double kBusyShare = 0.4;
  const double scale = busy_cores > 0 ? std::min(1.0, kBusyShare * host_cores / busy_cores) : 1.0;
  const ChipType& c = cluster.chips[static_cast<size_t>(index)];
  return EmuProfile{
      .chip = c.name,
      .speed = scale * c.emulation_flops() / fastest,
      .mem_capacity_bytes = static_cast<size_t>(c.memory_bytes()),
      .mem_bandwidth_gbps = 0,
      .reference_work = c.kernel_work.empty() ? nullptr : std::make_shared<const KernelWork>(c.kernel_work)};
}

DeviceSpec device_spec_of(const Cluster& cluster, const std::string& chip, int index) {
  const EmuProfile emu = emu_profile_of(cluster, chip);  // checks the chip type exists
  const ChipType& c = cluster.chips[static_cast<size_t>(cluster.chip_index(chip))];
  if (c.backend == "emu") return DeviceSpec{.backend = "emu", .index = index, .emu = emu};
  return DeviceSpec{.backend = c.backend, .index = index, .mem_capacity_bytes = static_cast<size_t>(c.memory_bytes())};
}

std::vector<int> gpu_ordinals(const std::vector<uint64_t>& hosts, const std::vector<bool>& gpu) {
  std::vector<int> out(hosts.size(), -1);
  std::map<uint64_t, int> taken;  // per host, its GPUs given so far
  for (size_t r = 0; r < hosts.size(); ++r) {
    if (gpu[r]) out[r] = taken[hosts[r]]++;
  }
  return out;
}

namespace {

// Byte counts from every rank, exactly: each as two f32 that hold their parts exactly, whole MiB and the bytes
// below a MiB (to 16 TiB).
std::vector<std::vector<double>> gather_bytes(Communicator& world, const std::vector<double>& mine) {
  std::vector<float> parts;
  for (double b : mine) {
    const auto bytes = static_cast<uint64_t>(b);
    parts.push_back(static_cast<float>(bytes >> 20));
    parts.push_back(static_cast<float>(bytes & ((uint64_t{1} << 20) - 1)));
  }
  std::vector<float> all(parts.size() * static_cast<size_t>(world.size()));
  world.all_gather(all.data(), parts.data(), parts.size(), DType::kF32);
  std::vector<std::vector<double>> out(static_cast<size_t>(world.size()));
  for (size_t r = 0; r < out.size(); ++r) {
    for (size_t i = 0; i < mine.size(); ++i) {
      const float* p = &all[r * parts.size() + 2 * i];
      out[r].push_back(double{p[0]} * 1048576.0 + double{p[1]});
    }
  }
  return out;
}

// Rank 0 gets every rank's text, in rank order (its own first); the others an empty list. Point to point on the
// job's world, after an all-gather of the lengths: only the ranks with something to say send.
std::vector<std::string> gather_text(Communicator& world, const std::string& text) {
  constexpr uint32_t kTextTag = 1;  // the only point-to-point messages on the job's world
  const std::vector<std::vector<double>> lengths = gather_bytes(world, {static_cast<double>(text.size())});
  if (world.rank() != 0) {
    if (!text.empty()) {
      std::unique_ptr<Request> sent = world.isend(text.data(), text.size(), 0, kTextTag);
      world.wait_request(*sent, "sending rank 0 a report", 0);
    }
    return {};
  }
  std::vector<std::string> all{text};
  for (int r = 1; r < world.size(); ++r) {
    std::string got(static_cast<size_t>(lengths[static_cast<size_t>(r)][0]), '\0');
    if (!got.empty()) {
      std::unique_ptr<Request> received = world.irecv(got.data(), got.size(), r, kTextTag);
      world.wait_request(*received, "receiving a rank's report", r);
    }
    all.push_back(std::move(got));
  }
  return all;
}

// Rank 0 gets every rank's part of a checkpoint's manifest (its writers' sizes and checksums, as they wrote the
// files; a rank that wrote none has an empty part) and returns them together; the others get an empty one.
Manifest gather_manifest(Communicator& world, const Manifest& mine) {
  const std::vector<std::string> parts = gather_text(world, mine.empty() ? std::string() : manifest_json(mine));
  Manifest all;
  for (size_t r = 0; r < parts.size(); ++r) {
    if (parts[r].empty()) continue;
    for (auto& [name, file] : parse_manifest(parts[r], cat("rank ", r, "'s checkpoint files"))) {
      if (!all.emplace(name, std::move(file)).second) {
        throw Error(ErrorCode::kInternal,
                    cat("rank ", r, " wrote checkpoint file ", name, ", which another rank wrote"));
      }
    }
  }
  return all;
}

// One rank's training, in the phases run_rank calls in order: join (the stage's communicators), build the stage
// (its device and its range of the model), load the data, restore a checkpoint, the training loop, and finish
// (the trace part and the measured summary).
class RankTraining {
 public:
  RankTraining(const HeteroRun& run, Job& job, bool quiet)
      : run_(run),
        c_(run.config),
        plan_(run.plan),
        world_(*job.world),
        host_(job.host),
        quiet_(quiet),
        layout_(stage_layout_of(plan_)),
        rank_(world_.rank()),
        place_(layout_.place(rank_)),
        comms_(StageComms::split(world_, layout_)),
        stage_(plan_.stages[static_cast<size_t>(place_.stage)]),
        T_(c_.model.seq_len),
        M_(plan_.num_micro_batches),
        rows_(static_cast<int>(plan_.global_batch / M_)),
        schedule_(add_gradient_reduction(lower_communication(schedule_of(plan_)))),
        virtual_stages_(virtual_stages(plan_)),
        checkpoint_dir_((fs::path(c_.out_dir) / "checkpoints").string()) {
    build_stage();
  }

  void load_data();
  void restore();
  RankOutcome train(const std::atomic<bool>* stop_requested);
  void finish(const RankOutcome& out);

 private:
  void build_stage();
  // This rank's device of chip type `chip`: on a cuda type its host's GPU by gpu_ordinals, else numbered by the rank
  // (a collective when any rank's type is cuda).
  std::unique_ptr<Device> make_device(const std::string& chip);
  void save(int64_t done);
  float evaluate();
  void record_step(int64_t step, float loss, double lr, double dt);
  StageMemory predicted_memory(int rank) const;  // model/costs.h's formula for a rank: its chunks' sum
  // Every rank's device peak, backend, emulation drift and process peak, into peaks_, backends_, drifts_,
  // host_peaks_ (a collective).
  void gather_memory();
  nlohmann::json memory_report() const;  // per rank: its place, chip, planned and measured bytes, emulation drift
  void print_memory() const;
  // Rows [first_row, first_row + n) of micro-batch m of the step's batch.
  void take_rows(int m, int first_row, int n, std::vector<int32_t>& tok, std::vector<int32_t>& tgt) const {
    const int64_t first = (int64_t{m} * rows_ + first_row) * T_;
    tok.assign(tokens_.begin() + first, tokens_.begin() + first + int64_t{n} * T_);
    tgt.assign(targets_.begin() + first, targets_.begin() + first + int64_t{n} * T_);
  }

  const HeteroRun& run_;
  const TrainConfig& c_;
  const Plan& plan_;
  Communicator& world_;
  std::string host_;
  const bool quiet_;
  const StageLayout layout_;
  const int rank_;
  const StageLayout::Place place_;
  StageComms comms_;
  const StagePlan& stage_;
  const int T_, M_, rows_;                         // rows: a micro-batch's sequences over all of a stage's replicas
  const Schedule schedule_;                        // the plan's, lowered
  const std::vector<ChunkLayers> virtual_stages_;  // what each virtual stage holds (the stages without interleaving)
  const std::string checkpoint_dir_;
  std::string resumed_from_;  // the checkpoint this run resumed from, which retention keeps
  std::unique_ptr<Device> device_;
  std::vector<std::unique_ptr<StageRunner>> runners_;  // per chunk
  std::vector<StageRunner*> chunks_;
  std::unique_ptr<TokenLoader> loader_, val_loader_;
  std::vector<int32_t> tokens_, targets_;  // the step's whole batch (first and last stage)
  int64_t first_step_ = 0;
  std::vector<double> peaks_;                   // per rank: its device's measured peak, bytes
  std::vector<std::string> backends_;           // per rank: its device's backend
  std::vector<double> drifts_;                  // per rank: its device's emu_drift (1 for a chip not emulated)
  std::vector<double> host_peaks_;              // per rank: its process's peak resident memory, bytes
  std::vector<std::vector<double>> allocated_;  // per rank: what its stage allocated, stage_memory's terms
  nlohmann::json trace_ = nlohmann::json::array();
  std::ofstream metrics_;
};

std::unique_ptr<Device> RankTraining::make_device(const std::string& chip) {
  std::vector<bool> gpu;
  for (int r = 0; r < world_.size(); ++r) {
    const StageLayout::Place p = layout_.place(r);
    const std::string chip = plan_.stages[static_cast<size_t>(p.stage)].group_of(p.replica).chip;
    const int type = run_.cluster.chip_index(chip);
    gpu.push_back(type >= 0 && run_.cluster.chips[static_cast<size_t>(type)].backend == "cuda");
  }
  if (std::find(gpu.begin(), gpu.end(), true) == gpu.end())
    return create_device(device_spec_of(run_.cluster, chip, rank_));
  // Every rank's host, as 40 bits of a hash of its id (exact in gather_bytes).
  std::vector<uint64_t> hosts;
  for (const auto& h : gather_bytes(world_, {static_cast<double>(fnv1a(host_) & ((uint64_t{1} << 40) - 1))})) {
    hosts.push_back(static_cast<uint64_t>(h[0]));
  }
  if (!gpu[static_cast<size_t>(rank_)]) return create_device(device_spec_of(run_.cluster, chip, rank_));
  const int mine = gpu_ordinals(hosts, gpu)[static_cast<size_t>(rank_)];
  try {
    return create_device(device_spec_of(run_.cluster, chip, mine));
  } catch (const Error& e) {
    int on_host = 0;
    for (size_t r = 0; r < hosts.size(); ++r) on_host += hosts[r] == hosts[static_cast<size_t>(rank_)] && gpu[r];
    throw Error(e.code(),
                cat("rank ", rank_, " is GPU rank ", mine, " of the ", on_host, " the plan puts on host '", host_,
                    "' (one GPU each; launch fewer ranks of a cuda chip type per host if it has "
                    "fewer GPUs): ",
                    e.what()));
  }
}

void RankTraining::build_stage() {
  // A stage whose replicas mix chip types: this replica's type.
  const ReplicaGroup group = stage_.group_of(place_.replica);
  device_ = make_device(group.chip);
  // Sends move on while the chip computes (an emulated chip's pacing sleeps; Device::set_while_busy), as the
  // simulator has them: each activation leaves when its forward ends, not when this rank next waits on a message.
  device_->set_while_busy([this] { world_.progress(); });
  for (int c = 0; c < plan_.chunks; ++c) {
    const int vs = c * layout_.num_stages() + place_.stage;
    const ChunkLayers& v = virtual_stages_[static_cast<size_t>(vs)];
    const GptRange range{v.embedding, v.first_layer,   v.first_layer + v.layers,
                         v.head,      v.starts_at_mlp, v.ends_at_attention};
    // The plan's recomputation (on the first recompute_blocks blocks: a plan of one chunk, check_plan), and
    // activations for as many micro-batches as the schedule keeps in flight here.
    runners_.push_back(std::make_unique<StageRunner>(
        c_.model, *device_, range, layout_, comms_, rows_, T_,
        RunnerOptions{.grad_clip = c_.grad_clip, .zero1 = run_.zero1},
        ActivationPolicy{group.recompute, max_in_flight(schedule_, place_.stage, vs), c_.precision,
                         group.recompute_blocks, max_pending_weights(schedule_, place_.stage, vs)},
        c));
    runners_.back()->model().init(c_.seed);
    chunks_.push_back(runners_.back().get());
  }
}

void RankTraining::load_data() {
  // The first and last stages read each step's whole batch and take their micro-batch's and replica's rows, so
  // the data a step trains on does not depend on the plan (a run may resume under another one).
  if (stage_.embedding || stage_.head) {
    loader_ = std::make_unique<TokenLoader>(expand_glob(c_.train_data), static_cast<int>(plan_.global_batch), T_,
                                            c_.seed, true);
  }
  // Held-out data, read in order from the start at each evaluation (every rank knows how many batches there are).
  if (!c_.val_data.empty()) {
    val_loader_ = std::make_unique<TokenLoader>(expand_glob(c_.val_data), static_cast<int>(plan_.global_batch), T_,
                                                c_.seed, false);
  }
}

void RankTraining::restore() {
  if (!run_.resume) return;
  // Every rank verifies its share of each candidate's tensors (verify_checkpoint's part), newest first, and rank 0
  // hears what each found and tells them all whether the candidate is intact: ranks reading only their own stage's
  // tensors could disagree on which checkpoint is intact, and rank 0 reading it whole reads a 100B model's 1.2 TB
  // alone.
  const WaitLonger wait(world_, checkpoint_timeout(plan_, world_.options().timeout));
  std::vector<std::string> reasons;
  const std::vector<std::string> candidates = resume_candidates(checkpoint_dir_, &reasons);
  double count = static_cast<double>(candidates.size());
  world_.broadcast(&count, 1, DType::kF64, 0);
  if (count != static_cast<double>(candidates.size())) {
    throw Error(ErrorCode::kIo, cat(checkpoint_dir_, ": rank ", rank_, " sees ", candidates.size(),
                                    " checkpoint(s), rank 0 ", count, ": do the ranks share this folder?"));
  }
  std::string latest;
  for (const std::string& c : candidates) {
    std::string found;
    try {
      verify_checkpoint(c, rank_, world_.size());
    } catch (const Error& e) {
      found = e.what();
    }
    const std::vector<std::string> all = gather_text(world_, found);
    const auto reported = [](const std::string& r) { return !r.empty(); };
    const auto first = std::find_if(all.begin(), all.end(), reported);
    double intact = first == all.end() ? 1 : 0;
    if (first != all.end()) {
      const auto others = std::count_if(first + 1, all.end(), reported);
      reasons.push_back(cat(c, ": ", *first, " (rank ", first - all.begin(), "'s share",
                            others > 0 ? cat("; ", others, " other rank(s) found damage in theirs") : "", ")"));
      std::printf("warning: not resuming from %s\n", reasons.back().c_str());
    }
    world_.broadcast(&intact, 1, DType::kF64, 0);
    if (intact == 1) {
      latest = c;
      break;
    }
  }
  if (latest.empty()) {
    if (rank_ != 0) {
      throw Error(ErrorCode::kNotFound,
                  cat(checkpoint_dir_, ": rank 0 found no checkpoint to resume from (its error says why)"));
    }
    std::string all;
    for (const std::string& r : reasons) all += "\n  " + r;
    throw Error(ErrorCode::kNotFound, cat(checkpoint_dir_, ": no checkpoint to resume from verifies:", all));
  }
  resumed_from_ = latest;
  const CheckpointState state = read_checkpoint_state(latest);
  check_checkpoint_model(state, c_.model, latest);
  for (StageRunner* chunk : chunks_) {
    std::vector<float> mom, vel;
    load_checkpoint_by_name(latest, chunk->model(), &mom, &vel);
    chunk->set_optimizer_state(mom, vel);
  }
  first_step_ = state.step;
  if (loader_) loader_->seek(state.data);
  world_.barrier();  // every rank loaded, within the checkpoint's wait
  if (rank_ == 0 && !quiet_) std::printf("resumed from %s at step %lld\n", latest.c_str(), (long long)first_step_);
}

void RankTraining::save(int64_t done) {
  const std::chrono::milliseconds timeout = checkpoint_timeout(plan_, world_.options().timeout);
  const WaitLonger world_wait(world_, timeout), tp_wait(comms_.tp, timeout);
  if (rank_ == 0) begin_checkpoint(checkpoint_dir_, done);
  world_.barrier();
  const std::string folder = (fs::path(checkpoint_dir_) / (checkpoint_name(done) + ".tmp")).string();
  // The TP group's shards reach its writer point to point, the k-th message between two ranks under tag k.
  std::vector<uint32_t> sent_to(static_cast<size_t>(comms_.tp.size()));  // messages to each rank so far
  const auto tag = [](uint32_t& count) { return 1 + count++ % (Communicator::kMaxUserTag - 1); };
  const ShardGather gather{.send =
                               [&](const float* shard, size_t count) {
                                 std::unique_ptr<Request> r =
                                     comms_.tp.isend(shard, count * sizeof(float), 0, tag(sent_to[0]));
                                 comms_.tp.wait_request(*r, "checkpoint shard to the stage's writer", 0);
                               },
                           .receive =
                               [&](int from, float* shard, size_t count) {
                                 std::unique_ptr<Request> r = comms_.tp.irecv(shard, count * sizeof(float), from,
                                                                              tag(sent_to[static_cast<size_t>(from)]));
                                 comms_.tp.wait_request(*r, "checkpoint shard from a TP rank", from);
                               }};
  Manifest written;
  for (StageRunner* chunk : chunks_) {
    std::vector<float> mom, vel;
    chunk->optimizer_state(mom, vel);
    if (place_.replica != 0) continue;
    // The last stage's copy of the tied embedding is the first stage's: written once. The first TP rank puts the
    // shards together and writes, a file per virtual stage.
    const int vs = chunk->virtual_stage();
    written.merge(write_model_files(
        folder, cat(".stage", vs), chunk->model(), mom.data(), vel.data(),
        [&](const Gpt::Param& p) { return !(vs > 0 && p.name == "wte.weight"); }, gather));
  }
  const Manifest manifest = gather_manifest(world_, written);
  if (rank_ == 0) {
    write_checkpoint_state(folder, CheckpointState{.step = done,
                                                   .model = c_.model,
                                                   .data = loader_->position(),
                                                   .data_seed = c_.seed,
                                                   .precision = c_.precision,
                                                   .files = manifest});
    commit_checkpoint(checkpoint_dir_, done, c_.keep_checkpoints, resumed_from_);
  }
  world_.barrier();
}

float RankTraining::evaluate() {
  val_loader_->seek({0, 0});
  const int batches =
      static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(c_.eval_batches), val_loader_->batches_per_epoch()));
  double sum = 0;
  for (int i = 0; i < batches; ++i) {
    val_loader_->next(tokens_, targets_);  // the training batch is loaded again at the next step
    sum += StageRunner::evaluate(chunks_, M_, [this](auto&&... a) { take_rows(a...); });
  }
  return static_cast<float>(sum / batches);
}

// gather_bytes carries whole numbers: a drift goes as millionths.
constexpr double kDriftScale = 1e6;

void RankTraining::gather_memory() {
  peaks_.clear();
  backends_.clear();
  drifts_.clear();
  host_peaks_.clear();
  // The backend as its position in the registry, a number gather_bytes can carry.
  const std::vector<BackendInfo>& known = backends();
  size_t backend = 0;
  while (backend < known.size() && known[backend].name != device_->props().backend) ++backend;
  for (const auto& r : gather_bytes(
           world_, {static_cast<double>(device_->mem_peak_bytes()), static_cast<double>(backend),
                    std::round(emu_drift(*device_) * kDriftScale), static_cast<double>(peak_resident_bytes())})) {
    peaks_.push_back(r[0]);
    const size_t b = static_cast<size_t>(r[1]);
    backends_.push_back(b < known.size() ? known[b].name : "?");
    drifts_.push_back(r[2] / kDriftScale);
    host_peaks_.push_back(r[3]);
  }
}

nlohmann::json RankTraining::memory_report() const {
  nlohmann::json out = nlohmann::json::array();
  for (int r = 0; r < static_cast<int>(peaks_.size()); ++r) {
    const StageLayout::Place p = layout_.place(r);
    const StagePlan& s = plan_.stages[static_cast<size_t>(p.stage)];
    const ReplicaGroup group = s.group_of(p.replica);
    nlohmann::json entry = {
        {"rank", r},
        {"stage", p.stage},
        {"replica", p.replica},
        {"tp_rank", p.t},
        {"chip", group.chip},
        {"backend", backends_[static_cast<size_t>(r)]},
        {"planned_bytes", group.memory_bytes},
        {"peak_bytes", peaks_[static_cast<size_t>(r)]},
        {"host_peak_bytes", host_peaks_[static_cast<size_t>(r)]},
        {"host_counted_bytes", rank_host_bytes(backends_[static_cast<size_t>(r)], group.memory_bytes,
                                               checkpoint_host_bytes(plan_, p.stage, p.replica, p.t, run_.zero1))
                                   .total()}};
    if (backends_[static_cast<size_t>(r)] == "emu") entry["emulation_drift"] = drifts_[static_cast<size_t>(r)];
    if (static_cast<size_t>(r) < allocated_.size()) {
      // Term by term: model/costs.h's formula for this rank (its vocabulary shard) beside what it allocated.
      const std::vector<double> want = stage_memory_terms(predicted_memory(r));
      for (size_t i = 0; i < want.size(); ++i) {
        entry["terms"][kStageMemoryTerms[i]] = {{"predicted", want[i]},
                                                {"measured", allocated_[static_cast<size_t>(r)][i]}};
      }
    }
    out.push_back(entry);
  }
  return out;
}

StageMemory RankTraining::predicted_memory(int rank) const {
  const StageLayout::Place p = layout_.place(rank);
  const StagePlan& s = plan_.stages[static_cast<size_t>(p.stage)];
  std::vector<int> chunk_in_flight;
  for (int c = 0; c < plan_.chunks; ++c) {
    chunk_in_flight.push_back(max_in_flight(schedule_, p.stage, c * layout_.num_stages() + p.stage));
  }
  // combine_chunks: the per-micro-batch terms times the micro-batches in flight, as the rank holds them.
  return combine_chunks(
      {chunked_stage_memory({.shape = plan_.shape,
                             .embedding = s.embedding,
                             .head = s.head,
                             .layers = s.layers,
                             .starts_at_mlp = s.starts_at_mlp,
                             .ends_at_attention = s.ends_at_attention,
                             .rows = layout_.stages[static_cast<size_t>(p.stage)].rows_of(p.replica, rows_),
                             .seq = T_,
                             .tp = s.tp,
                             .tp_rank = p.t,
                             .optimizer_shards = run_.zero1 ? s.dp : 1,
                             .recompute = s.group_of(p.replica).recompute,
                             .recompute_blocks = s.group_of(p.replica).recompute_blocks,
                             .in_flight = chunk_in_flight.front(),
                             .pending_weights = max_pending_weights(schedule_, p.stage),  // zb-h1: one chunk
                             .bytes = ElementBytes::of(c_.precision)},
                            chunk_in_flight)});
}

void RankTraining::print_memory() const {
  std::printf("memory per device, measured peak beside the plan's prediction:\n");
  for (const auto& m : memory_report()) {
    const double planned = m["planned_bytes"].get<double>(), peak = m["peak_bytes"].get<double>();
    std::printf(
        "  rank %2d (stage %d, %s on %s): peak %s, planned %s (%.3f)%s\n", m["rank"].get<int>(), m["stage"].get<int>(),
        m["chip"].get<std::string>().c_str(), m["backend"].get<std::string>().c_str(), format_bytes(peak).c_str(),
        format_bytes(planned).c_str(), peak / planned,
        m.contains("emulation_drift") ? format("; host drift %.3f", m["emulation_drift"].get<double>()).c_str() : "");
  }
  std::fflush(stdout);
}

void RankTraining::record_step(int64_t step, float loss, double lr, double dt) {
  gather_memory();
  if (rank_ != 0) return;
  const double tokens_per_step = static_cast<double>(plan_.global_batch) * T_;
  metrics_ << nlohmann::json{{"step", step + 1},
                             {"loss", loss},
                             {"grad_norm", chunks_.front()->last_grad_norm()},
                             {"lr", lr},
                             {"step_s", dt},
                             {"tokens_per_s", tokens_per_step / dt},
                             {"mem_peak_bytes", peaks_}}
                  .dump()
           << "\n";
  if (!quiet_ && step == first_step_) print_memory();
  metrics_.flush();
  if (!quiet_ && ((step + 1) % std::max<int64_t>(1, c_.log_every) == 0 || step + 1 == c_.steps)) {
    std::printf("step %5lld/%lld | loss %.4f | lr %.2e | norm %6.3f | %7.0f tok/s | step %.3f s (plan %.3f s)\n",
                static_cast<long long>(step + 1), static_cast<long long>(c_.steps), loss, lr,
                chunks_.front()->last_grad_norm(), tokens_per_step / dt, dt, plan_.step_s);
    std::fflush(stdout);
  }
}

RankOutcome RankTraining::train(const std::atomic<bool>* stop_requested) {
  int64_t kill_step = -1;
  if (const char* f = std::getenv("H2_FAULT_KILL")) {
    int fault_rank = -1;
    long long fault_step = -1;
    if (std::sscanf(f, "%d:%lld", &fault_rank, &fault_step) != 2) {
      throw Error(ErrorCode::kConfig, cat("H2_FAULT_KILL='", f, "' is not RANK:STEP"));
    }
    if (fault_rank == rank_) kill_step = fault_step;
  }
  int64_t step = 0;
  for (StageRunner* chunk : chunks_) {
    chunk->on_action = [&](const Action& a, double t0, double t1) {
      if (step + 1 == kill_step) std::raise(SIGKILL);
      trace_.push_back(
          {{"name", a.str()}, {"ph", "X"}, {"pid", rank_}, {"tid", 0}, {"ts", t0 * 1e6}, {"dur", (t1 - t0) * 1e6}});
    };
  }
  if (rank_ == 0) {
    make_directory(c_.out_dir, "train.out_dir");
    metrics_ = open_metrics((fs::path(c_.out_dir) / "metrics.jsonl").string(), first_step_);
  }
  RankOutcome out;
  // Step time: the mean after two warm-up steps (when the run has more than two), else over every step.
  double measured = 0, all = 0;
  int64_t measured_steps = 0;
  int64_t truncate_step = -1;  // H2_FAULT_TRUNCATE=STEP: rank 0 truncates the training shards before that step
  if (const char* f = std::getenv("H2_FAULT_TRUNCATE")) truncate_step = std::strtoll(f, nullptr, 10);
  for (step = first_step_; step < c_.steps; ++step) {
    // The step's batch is read first, so that a rank whose data fails (a shard changed under the run) stops every
    // rank at the same step, after a checkpoint of the steps done.
    if (rank_ == 0 && step + 1 == truncate_step) {
      for (const std::string& shard : expand_glob(c_.train_data)) fs::resize_file(shard, kShardHeaderInts * 4);
    }
    const LoaderPosition before = loader_ ? loader_->position() : LoaderPosition{};
    const double load_t0 = monotonic_seconds();
    std::optional<Error> data_error;
    if (loader_) {
      try {
        loader_->next(tokens_, targets_);
      } catch (const Error& e) {
        data_error = e;
      }
    }
    const double load_s = monotonic_seconds() - load_t0;
    // Every rank stops at the same step: rank 0's wish (or anyone's) is agreed on first; 2: a rank's data failed.
    float stop = data_error ? 2.0f : stop_requested != nullptr && stop_requested->load() ? 1.0f : 0.0f;
    world_.all_reduce(&stop, 1, DType::kF32, ReduceOp::kMax);
    if (stop > 0) {
      if (loader_) loader_->seek(before);  // the step's batch is not trained: a resume starts there
      if (step > first_step_) save(step);  // what was trained is kept
      if (stop >= 2) {
        if (data_error) throw *data_error;
        throw Error(ErrorCode::kIo, cat("rank ", rank_, ": stopped before step ", step + 1,
                                        " (checkpoint written): another rank could not read its training data"));
      }
      out.interrupted = true;
      break;
    }
    const double t0 = monotonic_seconds() - load_s;
    const double lr = learning_rate(c_, step);
    const float loss = StageRunner::step(
        chunks_, schedule_, [this](auto&&... a) { take_rows(a...); }, adamw_params(c_, step));
    const double dt = monotonic_seconds() - t0;
    all += dt;
    if (step >= first_step_ + 2) {
      measured += dt;
      ++measured_steps;
    }
    out.steps_done = step + 1;
    out.last_loss = loss;
    record_step(step, loss, lr, dt);
    if (val_loader_ && (step + 1 == c_.steps || (c_.eval_every > 0 && (step + 1) % c_.eval_every == 0))) {
      out.val_loss = evaluate();
      if (rank_ == 0) {
        metrics_ << nlohmann::json{{"step", step + 1}, {"val_loss", out.val_loss}}.dump() << "\n";
        metrics_.flush();
        if (!quiet_) std::printf("step %5lld | val loss %.4f\n", static_cast<long long>(step + 1), out.val_loss);
      }
    }
    if (step + 1 == c_.steps || (c_.checkpoint_every > 0 && (step + 1) % c_.checkpoint_every == 0)) save(step + 1);
  }
  const int64_t ran = out.steps_done - first_step_;
  out.step_seconds = measured_steps > 0 ? measured / static_cast<double>(measured_steps)
                     : ran > 0          ? all / static_cast<double>(ran)
                                        : 0;
  return out;
}

void RankTraining::finish(const RankOutcome& out) {
  fs::create_directories(trace_part(run_, rank_).parent_path());
  write_file_atomic(trace_part(run_, rank_).string(), trace_.dump());
  gather_memory();
  std::vector<StageMemory> allocated;
  for (StageRunner* chunk : chunks_) allocated.push_back(chunk->allocated());
  allocated_ = gather_bytes(world_, stage_memory_terms(combine_chunks(allocated)));
  if (rank_ == 0) {
    const double tokens_per_step = static_cast<double>(plan_.global_batch) * T_;
    write_file_atomic((fs::path(c_.out_dir) / "measured.json").string(),
                      nlohmann::json{{"steps", out.steps_done},
                                     {"last_loss", out.last_loss},
                                     {"val_loss", out.val_loss},
                                     {"step_s", out.step_seconds},
                                     {"tokens_per_s", out.step_seconds > 0 ? tokens_per_step / out.step_seconds : 0},
                                     {"memory", memory_report()}}
                          .dump(2));
  }
  world_.barrier();  // nobody tears the job down while a peer still needs it
}

}  // namespace

RankOutcome run_rank(const HeteroRun& run, Job& job, bool quiet, const std::atomic<bool>* stop_requested) {
  check_plan_runs(run.plan, run.config.model);
  RankTraining rank(run, job, quiet);  // join, build the stage
  rank.load_data();
  rank.restore();
  const RankOutcome out = rank.train(stop_requested);
  rank.finish(out);
  return out;
}

HostBytes& HostBytes::operator+=(const HostBytes& o) {
  ranks += o.ranks;
  processes += o.processes;
  devices += o.devices;
  checkpoints += o.checkpoints;
  return *this;
}

HostBytes rank_host_bytes(const std::string& backend, double device_bytes, double checkpoint_bytes) {
  return {.ranks = 1,
          .processes = kRankProcessBytes,
          .devices = backend == "cuda" ? 0.0 : device_bytes,
          .checkpoints = checkpoint_bytes};
}

double checkpoint_host_bytes(const Plan& plan, int stage, int replica, int t, bool zero1) {
  const StagePlan& s = plan.stages[static_cast<size_t>(stage)];
  const TransformerShape& shape = plan.shape;
  constexpr double kF32 = 4;
  const double shard = params_of(shape, s, s.tp);
  double bytes = 2 * kF32 * (shard + (zero1 ? std::ceil(shard / s.dp) : 0.0));
  if (replica != 0) return bytes;
  // The tensor being written. Every TP rank copies its shard out; the writer (TP rank 0) also holds the value and
  // moments whole, a block's matrices' value transposed besides, and another rank's shard as it arrives.
  const auto writing = [&](double elements, bool transposed) {
    const double own = std::ceil(elements / s.tp);
    if (t != 0) return kF32 * own;
    return kF32 * ((transposed ? 4 : 3) * elements + own + (s.tp > 1 ? own : 0.0));
  };
  const double C = static_cast<double>(shape.hidden), table = static_cast<double>(shape.vocab) * C;
  double largest = 0;
  if (s.embedding || (s.head && !shape.tied_embeddings)) largest = writing(table, false);
  if (s.layers > 0) {
    const double qkv = C + 2.0 * static_cast<double>(shape.kv_dim());
    largest = std::max(largest, writing(C * std::max(qkv, static_cast<double>(shape.ffn)), true));
  }
  return bytes + largest;
}

std::chrono::milliseconds checkpoint_timeout(const Plan& plan, std::chrono::milliseconds base) {
  double params = 0;
  for (const StagePlan& s : plan.stages) params += params_of(plan.shape, s, 1);
  const double seconds = 3 * 4 * params / kCheckpointFloorBytesPerSecond;
  return base + std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000)));
}

std::string host_memory_line(const std::vector<RankHostMemory>& ranks, bool resumed) {
  if (ranks.empty()) return "";
  double peak = 0, counted = 0;
  size_t nearest = 0;  // the rank with the highest peak / count
  for (size_t r = 0; r < ranks.size(); ++r) {
    peak += ranks[r].peak;
    counted += ranks[r].counted;
    if (ranks[r].peak * ranks[nearest].counted > ranks[nearest].peak * ranks[r].counted) nearest = r;
  }
  const RankHostMemory& n = ranks[nearest];
  std::string line = format(
      "host memory, each rank's measured peak resident beside h2's count for it: %zu rank(s) together %s of %s "
      "(%.2f); highest against its count: rank %zu, %s of %s (%.2f)\n",
      ranks.size(), format_bytes(peak).c_str(), format_bytes(counted).c_str(), peak / counted, nearest,
      format_bytes(n.peak).c_str(), format_bytes(n.counted).c_str(), n.peak / n.counted);
  if (n.peak > n.counted) {
    line += format(
        "warning: rank %zu took %s more of this host's memory than h2 counted for it (%s for a rank's process "
        "beside its device and its checkpoints' buffers): its check before a launch may let a plan through that this "
        "host cannot hold%s\n",
        nearest, format_bytes(n.peak - n.counted).c_str(), format_bytes(kRankProcessBytes).c_str(),
        resumed ? " — or, as this run resumed, what it read of the checkpoint's files through a mapping (rank 0 "
                  "verifies all of them) counts toward its peak: page cache, which the kernel takes back when it "
                  "needs the memory"
                : "");
  }
  return line;
}

FinishedRun finish_run(const HeteroRun& run, int ranks) {
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
                                   {"planned_tokens_per_s", run.plan.tokens_per_s},
                                   {"memory", measured.at("memory")}}
                        .dump(2));
  std::vector<RankHostMemory> host;
  for (const auto& m : measured.at("memory")) {
    host.push_back({m.at("host_peak_bytes").get<double>(), m.at("host_counted_bytes").get<double>()});
  }
  return {ratio, host_memory_line(host, run.resume)};
}

}  // namespace h2

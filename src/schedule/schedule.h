// Pipeline schedules as data (docs/architecture.md, "pipeline"; the IR of PyTorch's pipelining schedules): per rank, an
// ordered list of actions. An action prints and parses as text — "2F0" is stage 2's forward of micro-batch 0,
// "2B0" its backward, "2SEND_F0"/"2RECV_F0" move micro-batch 0's activation, "2SEND_B0"/"2RECV_B0" its
// gradient, "2REDUCE_GRAD" reduces stage 2's gradients over its data-parallel group, "2OPTIM" steps its
// optimizer. A schedule may split a stage's backward in two (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR
// 2024): then "2B0" computes only the input gradient (what stage 1 waits for) and "2W0" the weight gradients,
// any time after it on the same rank; a stage with W actions has one for each of its backwards. Stages are virtual:
// with interleaving, rank r runs stages r, r + ranks, r + 2 ranks, ... Generators and lowering passes are pure
// functions; dry_run() checks a schedule for deadlock without devices.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace h2 {

enum class ActionType { kForward, kBackward, kWeight, kSendF, kRecvF, kSendB, kRecvB, kReduceGrad, kOptim };

struct Action {
  ActionType type;
  int stage = 0;
  int micro_batch = -1;  // -1 for REDUCE_GRAD and OPTIM

  std::string str() const;
  // Throws Error(kInvalidArgument) naming the text when it is not an action.
  static Action parse(std::string_view text);
  bool operator==(const Action&) const = default;
};

struct Schedule {
  int ranks = 0;
  int stages = 0;  // virtual stages: ranks x chunks
  int micro_batches = 0;
  std::vector<std::vector<Action>> actions;  // per rank, in order

  int rank_of(int stage) const { return stage % ranks; }
  // One line per rank: "rank,action,action,..."; parse_csv reads it back (hand-written schedules too).
  std::string to_csv() const;
  static Schedule parse_csv(std::string_view text, int ranks, int stages, int micro_batches);
};

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved, kZeroBubbleH1 };
const char* schedule_name(ScheduleKind kind);               // "gpipe", "1f1b", "interleaved", "zb-h1"
ScheduleKind parse_schedule_kind(const std::string& name);  // the same names; Error(kInvalidArgument) for others
// The generator of `kind` (chunks: virtual stages per rank, interleaved only).
Schedule make_schedule(ScheduleKind kind, int ranks, int chunks, int micro_batches);

// GPipe (Huang et al. 2019): all forwards, then all backwards.
Schedule schedule_gpipe(int ranks, int micro_batches);
// 1F1B (Narayanan et al. 2019, PipeDream-Flush): warm-up forwards, alternate one forward and one backward,
// drain backwards; stage r keeps at most ranks - r micro-batches in flight.
Schedule schedule_1f1b(int ranks, int micro_batches);
// Interleaved 1F1B (Narayanan et al. 2021): each rank runs `chunks` virtual stages; micro_batches must be a
// multiple of ranks.
Schedule schedule_interleaved(int ranks, int chunks, int micro_batches);
// ZB-H1 (Qi et al. 2024, section 2.1): 1F1B's order with each backward split into B and W, rank r deferring its
// first r W's so that its B's, which the ranks before it wait for, start as early as they can; the deferred W's fill
// the drain. Each rank then holds a micro-batch from its F to its W, min(ranks, m) at most, where 1F1B's rank r
// holds ranks - r. With F, B and W of one duration its idle time is (ranks - 1)(F + B - W), against 1F1B's
// (ranks - 1)(F + B + W). `deferred` (one per rank, each -1..r) defers fewer where memory is short: with 0 a rank
// runs each W right after its B and holds what 1F1B holds; with -1 it does not split its backward (1F1B's order).
Schedule schedule_zb_h1(int ranks, int micro_batches, const std::vector<int>& deferred = {});

// Lowering pass: around each compute action, the communication it needs — RECV_F before a forward and SEND_F
// after it (except at the first and last stage), RECV_B before a backward and SEND_B after it (except at the
// last and first stage). Neighbouring stages on the same rank (never, unless ranks = 1) exchange nothing.
Schedule lower_communication(const Schedule& schedule);
// Lowering pass: REDUCE_GRAD for each stage right after its gradients are complete on the rank (its last backward,
// or its last W where the backward is split), then OPTIM for each of the rank's stages at the end.
Schedule add_gradient_reduction(const Schedule& schedule);

// The most micro-batches rank `rank` holds at once under `schedule` (forwards run whose backward — or, split, whose
// W — has not): the activation memory a stage needs. 1F1B: min(ranks - rank, micro-batches); GPipe: all of them. With
// `stage` (interleaved: one of the rank's virtual stages), that stage's alone; -1: all of the rank's.
int max_in_flight(const Schedule& schedule, int rank, int stage = -1);
// The most micro-batches rank `rank` holds between their B and their W at once (a split backward keeps what each W
// reads: model/costs.h's weight_pending_bytes); 0 where its stages' backwards are whole. `stage` as above.
int max_pending_weights(const Schedule& schedule, int rank, int stage = -1);

// Runs the compute actions in dependency order (F of stage s needs F of s - 1; B of s needs F of s and B of
// s + 1; W of s needs B of s) with unit time, ignoring SEND/RECV. Returns "" when the schedule completes, else a
// description of the deadlock with the step x rank grid, the stuck cell of each rank marked with '*', or of a
// stage whose backward is split for some micro-batches and not others (a B without its W, or a W twice).
std::string dry_run(const Schedule& schedule);

}  // namespace h2

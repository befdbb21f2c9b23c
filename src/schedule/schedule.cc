// Schedule IR: printing, parsing, generators and the dry run.
#include "schedule/schedule.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"

namespace h2 {
namespace {

struct Name {
  ActionType type;
  const char* text;
  bool has_micro_batch;
};
// Longest names first so that parsing "SEND_F" is not mistaken for "F".
constexpr Name kNames[] = {
    {ActionType::kReduceGrad, "REDUCE_GRAD", false},
    {ActionType::kSendF, "SEND_F", true},
    {ActionType::kRecvF, "RECV_F", true},
    {ActionType::kSendB, "SEND_B", true},
    {ActionType::kRecvB, "RECV_B", true},
    {ActionType::kOptim, "OPTIM", false},
    {ActionType::kForward, "F", true},
    {ActionType::kBackward, "B", true},
    {ActionType::kWeight, "W", true},
};

// The stages of a rank's list whose backward is split (that have W actions).
std::set<int> split_stages(const std::vector<Action>& list) {
  std::set<int> out;
  for (const Action& a : list) {
    if (a.type == ActionType::kWeight) out.insert(a.stage);
  }
  return out;
}

}  // namespace

std::string Action::str() const {
  for (const Name& n : kNames) {
    if (n.type == type) return n.has_micro_batch ? cat(stage, n.text, micro_batch) : cat(stage, n.text);
  }
  return "?";
}

Action Action::parse(std::string_view text) {
  auto bad = [&] {
    return Error(
        ErrorCode::kInvalidArgument,
        cat("'", text,
            "' is not a schedule action (expected e.g. 2F0, 2B0, 2W0, 2SEND_F0, 2RECV_B3, 2REDUCE_GRAD, 2OPTIM)"));
  };
  size_t i = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
  if (i == 0 || i > 6) throw bad();
  Action a{ActionType::kForward, std::stoi(std::string(text.substr(0, i))), -1};
  const std::string_view rest = text.substr(i);
  for (const Name& n : kNames) {
    if (!rest.starts_with(n.text)) continue;
    const std::string_view num = rest.substr(std::string_view(n.text).size());
    if (n.has_micro_batch) {
      if (num.empty() || num.size() > 6 ||
          !std::all_of(num.begin(), num.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        throw bad();
      }
      a.micro_batch = std::stoi(std::string(num));
    } else if (!num.empty()) {
      throw bad();
    }
    a.type = n.type;
    return a;
  }
  throw bad();
}

std::string Schedule::to_csv() const {
  std::string out;
  for (int r = 0; r < ranks; ++r) {
    out += std::to_string(r);
    for (const Action& a : actions[static_cast<size_t>(r)]) {
      out += ',';  // appended separately: GCC 12 warns falsely on "," + std::string (-Wrestrict)
      out += a.str();
    }
    out += "\n";
  }
  return out;
}

Schedule Schedule::parse_csv(std::string_view text, int ranks, int stages, int micro_batches) {
  Schedule s{ranks, stages, micro_batches, std::vector<std::vector<Action>>(static_cast<size_t>(ranks))};
  std::istringstream in{std::string(text)};
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream cells(line);
    std::string cell;
    std::getline(cells, cell, ',');
    int rank = -1;
    try {
      rank = std::stoi(cell);
    } catch (const std::exception&) {
    }
    if (rank < 0 || rank >= ranks) {
      throw Error(ErrorCode::kInvalidArgument,
                  cat("schedule line ", line_no, ": '", cell, "' is not a rank in [0, ", ranks, ")"));
    }
    while (std::getline(cells, cell, ',')) {
      if (cell.empty()) continue;
      Action a = Action::parse(cell);
      if (a.stage >= stages || (a.micro_batch >= micro_batches) || s.rank_of(a.stage) != rank) {
        throw Error(ErrorCode::kInvalidArgument,
                    cat("schedule line ", line_no, ": ", cell, " does not belong on rank ", rank, " (", stages,
                        " stages, ", micro_batches, " micro-batches)"));
      }
      s.actions[static_cast<size_t>(rank)].push_back(a);
    }
  }
  return s;
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::k1F1B:
      return "1f1b";
    case ScheduleKind::kInterleaved:
      return "interleaved";
    case ScheduleKind::kZeroBubbleH1:
      return "zb-h1";
  }
  return "?";
}

ScheduleKind parse_schedule_kind(const std::string& name) {
  for (ScheduleKind k :
       {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved, ScheduleKind::kZeroBubbleH1}) {
    if (name == schedule_name(k)) return k;
  }
  throw Error(ErrorCode::kInvalidArgument, cat("unknown schedule '", name, "'; use gpipe, 1f1b, interleaved or zb-h1"));
}

Schedule make_schedule(ScheduleKind kind, int ranks, int chunks, int m) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return schedule_gpipe(ranks, m);
    case ScheduleKind::k1F1B:
      return schedule_1f1b(ranks, m);
    case ScheduleKind::kInterleaved:
      return schedule_interleaved(ranks, chunks, m);
    case ScheduleKind::kZeroBubbleH1:
      return schedule_zb_h1(ranks, m);
  }
  return schedule_1f1b(ranks, m);
}

Schedule schedule_gpipe(int ranks, int m) {
  Schedule s{ranks, ranks, m, std::vector<std::vector<Action>>(static_cast<size_t>(ranks))};
  for (int r = 0; r < ranks; ++r) {
    for (int j = 0; j < m; ++j) s.actions[static_cast<size_t>(r)].push_back({ActionType::kForward, r, j});
    for (int j = 0; j < m; ++j) s.actions[static_cast<size_t>(r)].push_back({ActionType::kBackward, r, j});
  }
  return s;
}

Schedule schedule_1f1b(int ranks, int m) {
  Schedule s{ranks, ranks, m, std::vector<std::vector<Action>>(static_cast<size_t>(ranks))};
  for (int r = 0; r < ranks; ++r) {
    auto& a = s.actions[static_cast<size_t>(r)];
    const int warmup = std::min(ranks - r - 1, m);
    int f = 0, b = 0;
    for (; f < warmup; ++f) a.push_back({ActionType::kForward, r, f});
    while (f < m) {
      a.push_back({ActionType::kForward, r, f++});
      a.push_back({ActionType::kBackward, r, b++});
    }
    while (b < m) a.push_back({ActionType::kBackward, r, b++});
  }
  return s;
}

// 1F1B's order; after each B, the oldest pending W once more than the rank defers are pending, the rest at the end.
Schedule schedule_zb_h1(int ranks, int m, const std::vector<int>& deferred) {
  if (!deferred.empty() && deferred.size() != static_cast<size_t>(ranks)) {
    throw Error(ErrorCode::kInvalidArgument, cat("zb-h1: ", deferred.size(), " deferrals for ", ranks, " ranks"));
  }
  Schedule s{ranks, ranks, m, std::vector<std::vector<Action>>(static_cast<size_t>(ranks))};
  for (int r = 0; r < ranks; ++r) {
    const int defer = deferred.empty() ? r : deferred[static_cast<size_t>(r)];
    if (defer < -1 || defer > r) {
      throw Error(ErrorCode::kInvalidArgument,
                  cat("zb-h1: rank ", r, " defers ", defer, " W's; 0 to ", r, ", or -1 not to split"));
    }
    auto& a = s.actions[static_cast<size_t>(r)];
    const int warmup = std::min(ranks - r - 1, m);
    int f = 0, b = 0, w = 0;
    const auto backward = [&] {
      a.push_back({ActionType::kBackward, r, b++});
      if (defer >= 0 && b - w > defer) a.push_back({ActionType::kWeight, r, w++});
    };
    for (; f < warmup; ++f) a.push_back({ActionType::kForward, r, f});
    while (f < m) {
      a.push_back({ActionType::kForward, r, f++});
      backward();
    }
    while (b < m) backward();
    while (defer >= 0 && w < m) a.push_back({ActionType::kWeight, r, w++});
  }
  return s;
}

// Megatron-LM's interleaved order: forwards go through the chunks in groups of `ranks` micro-batches.
Schedule schedule_interleaved(int ranks, int chunks, int m) {
  if (chunks < 1 || m % ranks != 0) {
    throw Error(ErrorCode::kInvalidArgument, cat("interleaved 1F1B needs chunks >= 1 and micro-batches (", m,
                                                 ") a multiple of the ranks (", ranks, ")"));
  }
  Schedule s{ranks, ranks * chunks, m, std::vector<std::vector<Action>>(static_cast<size_t>(ranks))};
  const int total = m * chunks;
  for (int r = 0; r < ranks; ++r) {
    auto& a = s.actions[static_cast<size_t>(r)];
    auto forward = [&](int k) {
      const int chunk = (k / ranks) % chunks;
      const int mb = (k / (ranks * chunks)) * ranks + k % ranks;
      return Action{ActionType::kForward, chunk * ranks + r, mb};
    };
    auto backward = [&](int k) {
      const int chunk = chunks - 1 - (k / ranks) % chunks;
      const int mb = (k / (ranks * chunks)) * ranks + k % ranks;
      return Action{ActionType::kBackward, chunk * ranks + r, mb};
    };
    const int warmup = std::min(total, (ranks - r - 1) * 2 + (chunks - 1) * ranks);
    int f = 0, b = 0;
    for (; f < warmup; ++f) a.push_back(forward(f));
    while (f < total) {
      a.push_back(forward(f++));
      a.push_back(backward(b++));
    }
    while (b < total) a.push_back(backward(b++));
  }
  return s;
}

Schedule lower_communication(const Schedule& in) {
  Schedule out = in;
  for (auto& list : out.actions) {
    std::vector<Action> lowered;
    for (const Action& a : list) {
      const bool forward = a.type == ActionType::kForward, backward = a.type == ActionType::kBackward;
      const int prev = a.stage - 1, next = a.stage + 1;
      const bool from_prev = prev >= 0 && in.rank_of(prev) != in.rank_of(a.stage);
      const bool to_next = next < in.stages && in.rank_of(next) != in.rank_of(a.stage);
      if (forward && from_prev) lowered.push_back({ActionType::kRecvF, a.stage, a.micro_batch});
      if (backward && to_next) lowered.push_back({ActionType::kRecvB, a.stage, a.micro_batch});
      lowered.push_back(a);
      if (forward && to_next) lowered.push_back({ActionType::kSendF, a.stage, a.micro_batch});
      if (backward && from_prev) lowered.push_back({ActionType::kSendB, a.stage, a.micro_batch});
    }
    list = std::move(lowered);
  }
  return out;
}

Schedule add_gradient_reduction(const Schedule& in) {
  Schedule out = in;
  for (auto& list : out.actions) {
    // stage -> index of its last backward on this rank, or of its last W where the backward is split
    std::map<int, size_t> last_backward;
    const std::set<int> split = split_stages(list);
    for (size_t i = 0; i < list.size(); ++i) {
      const ActionType completes = split.count(list[i].stage) ? ActionType::kWeight : ActionType::kBackward;
      if (list[i].type == completes) last_backward[list[i].stage] = i;
    }
    std::vector<Action> lowered;
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      lowered.push_back(a);
      // A stage's gradients are complete after its last backward — or after the send of that backward's
      // input gradient, when one follows, so that the reduction does not delay the previous stage.
      const auto last = last_backward.find(a.stage);
      if (last == last_backward.end()) continue;
      const bool send_follows =
          i + 1 < list.size() && list[i + 1].type == ActionType::kSendB && list[i + 1].stage == a.stage;
      if ((last->second == i && !send_follows) || (a.type == ActionType::kSendB && last->second + 1 == i)) {
        lowered.push_back({ActionType::kReduceGrad, a.stage, -1});
      }
    }
    for (const auto& [stage, idx] : last_backward) lowered.push_back({ActionType::kOptim, stage, -1});
    list = std::move(lowered);
  }
  return out;
}

int max_in_flight(const Schedule& s, int rank, int stage) {
  const auto& list = s.actions[static_cast<size_t>(rank)];
  const std::set<int> split = split_stages(list);  // their micro-batches are held until their W
  int live = 0, peak = 0;
  for (const Action& a : list) {
    if (stage >= 0 && a.stage != stage) continue;
    if (a.type == ActionType::kForward) peak = std::max(peak, ++live);
    const ActionType releases = split.count(a.stage) ? ActionType::kWeight : ActionType::kBackward;
    if (a.type == releases) --live;
  }
  return peak;
}

int max_pending_weights(const Schedule& s, int rank, int stage) {
  const auto& list = s.actions[static_cast<size_t>(rank)];
  const std::set<int> split = split_stages(list);
  int live = 0, peak = 0;
  for (const Action& a : list) {
    if (stage >= 0 && a.stage != stage) continue;
    if (a.type == ActionType::kBackward && split.count(a.stage)) peak = std::max(peak, ++live);
    if (a.type == ActionType::kWeight) --live;
  }
  return peak;
}

namespace {

// "" when each stage of the schedule either never splits its backward or has one W for each of its B's.
std::string check_split(const Schedule& s) {
  std::map<int, std::map<int, int>> b_count, w_count;  // stage -> micro-batch -> actions
  for (const auto& list : s.actions) {
    for (const Action& a : list) {
      if (a.type == ActionType::kBackward) ++b_count[a.stage][a.micro_batch];
      if (a.type == ActionType::kWeight) ++w_count[a.stage][a.micro_batch];
    }
  }
  for (const auto& [stage, ws] : w_count) {
    for (const auto& [j, n] : ws) {
      if (n != 1 || b_count[stage][j] != 1) {
        return cat("stage ", stage, " splits its backward: micro-batch ", j, " has ", b_count[stage][j], " B and ", n,
                   " W (one each)");
      }
    }
    for (const auto& [j, n] : b_count[stage]) {
      if (!ws.count(j))
        return cat("stage ", stage, " splits its backward but ", Action{ActionType::kBackward, stage, j}.str(),
                   " has no W");
    }
  }
  return "";
}

}  // namespace

std::string dry_run(const Schedule& s) {
  if (std::string bad = check_split(s); !bad.empty()) return bad;
  std::map<std::pair<int, int>, bool> f_done, b_done;  // (stage, micro-batch)
  std::map<std::pair<int, int>, bool> sent_f, sent_b;  // SEND_F / SEND_B executed
  std::vector<size_t> pos(static_cast<size_t>(s.ranks), 0);
  std::vector<std::vector<int>> step_of(static_cast<size_t>(s.ranks));  // the step each action ran in
  for (int r = 0; r < s.ranks; ++r)
    step_of[static_cast<size_t>(r)].assign(s.actions[static_cast<size_t>(r)].size(), -1);
  auto ready = [&](const Action& a) {
    if (a.type == ActionType::kForward) return a.stage == 0 || f_done[{a.stage - 1, a.micro_batch}];
    if (a.type == ActionType::kBackward) {
      return f_done[{a.stage, a.micro_batch}] && (a.stage == s.stages - 1 || b_done[{a.stage + 1, a.micro_batch}]);
    }
    if (a.type == ActionType::kWeight) return b_done[{a.stage, a.micro_batch}];
    if (a.type == ActionType::kRecvF) return sent_f[{a.stage - 1, a.micro_batch}];
    if (a.type == ActionType::kRecvB) return sent_b[{a.stage + 1, a.micro_batch}];
    return true;  // sends are eager; REDUCE_GRAD and OPTIM do not block the dry run
  };
  for (int step = 0;; ++step) {
    std::vector<Action> ran;
    bool remaining = false;
    for (int r = 0; r < s.ranks; ++r) {
      const auto& list = s.actions[static_cast<size_t>(r)];
      if (pos[static_cast<size_t>(r)] >= list.size()) continue;
      remaining = true;
      const Action& a = list[pos[static_cast<size_t>(r)]];
      if (ready(a)) {
        ran.push_back(a);
        step_of[static_cast<size_t>(r)][pos[static_cast<size_t>(r)]] = step;
        ++pos[static_cast<size_t>(r)];
      }
    }
    if (!remaining) return "";
    if (ran.empty()) {
      // Deadlock: print the grid of what ran when, and mark where each rank is stuck.
      std::string grid = "deadlock: no rank can proceed. step x rank grid (* = stuck here):\n";
      for (int r = 0; r < s.ranks; ++r) {
        grid += cat("rank ", r, ":");
        const auto& list = s.actions[static_cast<size_t>(r)];
        for (size_t i = 0; i < list.size(); ++i) {
          grid += ' ';
          grid += list[i].str();
          if (i == pos[static_cast<size_t>(r)]) grid += "*";
          if (step_of[static_cast<size_t>(r)][i] < 0 && i > pos[static_cast<size_t>(r)]) {
            grid += " ...";
            break;
          }
        }
        grid += "\n";
      }
      return grid;
    }
    for (const Action& a : ran) {
      const std::pair<int, int> key{a.stage, a.micro_batch};
      switch (a.type) {
        case ActionType::kForward:
          f_done[key] = true;
          break;
        case ActionType::kBackward:
          b_done[key] = true;
          break;
        case ActionType::kSendF:
          sent_f[key] = true;
          break;
        case ActionType::kSendB:
          sent_b[key] = true;
          break;
        default:
          break;
      }
    }
  }
}

}  // namespace h2

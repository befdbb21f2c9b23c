// The schedule IR: text round trips, generator invariants, and the dry run's deadlock detection.
#include "schedule/schedule.h"

#include <map>

#include "schedule/replay.h"
#include "test_util.h"

namespace h2 {
namespace {

using ::testing::HasSubstr;

TEST(Action, PrintsAndParses) {
  for (const char* text :
       {"2F0", "0B13", "1W4", "3SEND_F7", "1RECV_F0", "4SEND_B2", "0RECV_B11", "2REDUCE_GRAD", "5OPTIM"}) {
    EXPECT_EQ(Action::parse(text).str(), text);
  }
  EXPECT_EQ(Action::parse("2F0"), (Action{ActionType::kForward, 2, 0}));
  for (const char* bad : {"F0", "2X0", "2F", "2OPTIM3", "", "2SEND_Fx"}) {
    EXPECT_THAT(testing_util::error_of([&] { Action::parse(bad); }, ErrorCode::kInvalidArgument),
                HasSubstr("is not a schedule action"));
  }
}

// Every rank runs each of its micro-batches forward once and backward once, forward first, and 1F1B keeps at
// most ranks - r micro-batches in flight on rank r.
TEST(Generators, OneFOneBInvariants) {
  for (int p : {1, 2, 4}) {
    for (int m : {1, 3, 8}) {
      const Schedule s = schedule_1f1b(p, m);
      EXPECT_EQ(dry_run(s), "");
      for (int r = 0; r < p; ++r) {
        std::map<int, int> state;
        int live = 0, peak = 0;
        for (const Action& a : s.actions[static_cast<size_t>(r)]) {
          EXPECT_EQ(a.stage, r);
          if (a.type == ActionType::kForward) {
            EXPECT_EQ(state[a.micro_batch]++, 0);
            peak = std::max(peak, ++live);
          } else {
            EXPECT_EQ(state[a.micro_batch]++, 1);
            --live;
          }
        }
        EXPECT_EQ(state.size(), static_cast<size_t>(m));
        EXPECT_LE(peak, std::min(p - r, m));
      }
    }
  }
}

TEST(Generators, GPipeAndInterleavedComplete) {
  EXPECT_EQ(dry_run(schedule_gpipe(3, 5)), "");
  const Schedule s = schedule_interleaved(2, 3, 4);
  EXPECT_EQ(s.stages, 6);
  EXPECT_EQ(dry_run(s), "");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(s.actions[static_cast<size_t>(r)].size(), 2u * 3 * 4);
    for (const Action& a : s.actions[static_cast<size_t>(r)]) EXPECT_EQ(s.rank_of(a.stage), r);
  }
  EXPECT_THAT(testing_util::error_of([] { schedule_interleaved(2, 2, 3); }, ErrorCode::kInvalidArgument),
              HasSubstr("a multiple of the ranks"));
}

TEST(DryRun, FindsADeadlockAndMarksIt) {
  // Rank 1 waits for micro-batch 1 first, but rank 0 will only send it after receiving micro-batch 0's gradient.
  const Schedule s = Schedule::parse_csv("0,0F0,0B0,0F1,0B1\n1,1F1,1B1,1F0,1B0\n", 2, 2, 2);
  const std::string grid = dry_run(s);
  EXPECT_THAT(grid, HasSubstr("deadlock"));
  EXPECT_THAT(grid, HasSubstr("0B0*"));
  EXPECT_THAT(grid, HasSubstr("1F1*"));
}

TEST(Lowering, InsertsMatchingCommunicationAndReductions) {
  for (const Schedule& base : {schedule_1f1b(4, 6), schedule_gpipe(3, 4), schedule_interleaved(2, 2, 4)}) {
    const Schedule s = add_gradient_reduction(lower_communication(base));
    EXPECT_EQ(dry_run(s), "");
    std::map<ActionType, int> count;
    for (const auto& list : s.actions) {
      for (const Action& a : list) ++count[a.type];
    }
    const int boundaries = base.stages - 1, m = base.micro_batches;
    EXPECT_EQ(count[ActionType::kSendF], boundaries * m);
    EXPECT_EQ(count[ActionType::kRecvF], boundaries * m);
    EXPECT_EQ(count[ActionType::kSendB], boundaries * m);
    EXPECT_EQ(count[ActionType::kRecvB], boundaries * m);
    EXPECT_EQ(count[ActionType::kReduceGrad], base.stages);
    EXPECT_EQ(count[ActionType::kOptim], base.stages);
  }
  // Rank 1 of a two-stage 1F1B: receive, compute, send, and reduce once at the end before the optimizer.
  const Schedule s = add_gradient_reduction(lower_communication(schedule_1f1b(2, 1)));
  std::string rank1;
  for (const Action& a : s.actions[1]) rank1 += a.str() + " ";
  EXPECT_EQ(rank1, "1RECV_F0 1F0 1B0 1SEND_B0 1REDUCE_GRAD 1OPTIM ");
}

TEST(DryRun, FindsACommunicationDeadlock) {
  // Rank 0 waits for micro-batch 0's gradient before it sends micro-batch 0's activation.
  const Schedule s = Schedule::parse_csv("0,0F0,0RECV_B0,0SEND_F0,0B0\n1,1RECV_F0,1F0,1B0,1SEND_B0\n", 2, 2, 1);
  const std::string grid = dry_run(s);
  EXPECT_THAT(grid, HasSubstr("0RECV_B0*"));
  EXPECT_THAT(grid, HasSubstr("1RECV_F0*"));
}

TEST(Csv, RoundTripsAndRejectsMisplacedActions) {
  const Schedule s = schedule_1f1b(3, 4);
  const Schedule back = Schedule::parse_csv(s.to_csv(), 3, 3, 4);
  EXPECT_EQ(back.actions, s.actions);
  EXPECT_THAT(testing_util::error_of([] { Schedule::parse_csv("0,1F0\n", 2, 2, 1); }, ErrorCode::kInvalidArgument),
              HasSubstr("does not belong on rank 0"));
}

// A stage's activation memory follows from its schedule: 1F1B's stage r of p holds min(p - r, m) micro-batches,
// GPipe's every one of them, interleaved 1F1B (per rank, over its chunks) more than 1F1B's.
TEST(Schedule, MicroBatchesInFlight) {
  const Schedule one = schedule_1f1b(4, 8), gpipe = schedule_gpipe(4, 8), few = schedule_1f1b(4, 2);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(max_in_flight(one, r), 4 - r) << r;
    EXPECT_EQ(max_in_flight(gpipe, r), 8) << r;
    EXPECT_EQ(max_in_flight(few, r), std::min(4 - r, 2)) << r;
  }
  // Lowering adds communication and reduction, not micro-batches.
  EXPECT_EQ(max_in_flight(add_gradient_reduction(lower_communication(one)), 1), 3);
  EXPECT_GT(max_in_flight(schedule_interleaved(4, 2, 8), 0), 4);
  // Per virtual stage, counted by hand from 2 ranks x 2 chunks x 4 micro-batches (rank 0: 0F0 0F1 2F0 2F1 0F2
  // 2B0 0F3 2B1 2F2 0B0 ...; rank 1: 1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 ...): its activation slots.
  const Schedule two = schedule_interleaved(2, 2, 4);
  EXPECT_EQ(max_in_flight(two, 0, 0), 4);
  EXPECT_EQ(max_in_flight(two, 0, 2), 2);
  EXPECT_EQ(max_in_flight(two, 0), 5);
  EXPECT_EQ(max_in_flight(two, 1, 1), 3);
  EXPECT_EQ(max_in_flight(two, 1, 3), 1);
}

// ZB-H1 splits every backward into B and W, each exactly once and W after its B on the same rank; rank r defers up
// to r W's (or what it is given), and so holds up to min(p, m) micro-batches from F to W where 1F1B holds p - r.
TEST(Generators, ZeroBubbleH1SplitsEveryBackward) {
  for (int p : {1, 2, 4}) {
    for (int m : {1, 3, 8}) {
      const Schedule s = schedule_zb_h1(p, m);
      EXPECT_EQ(dry_run(s), "") << p << " ranks, " << m << " micro-batches";
      const Schedule none = schedule_zb_h1(p, m, std::vector<int>(static_cast<size_t>(p), 0));
      for (int r = 0; r < p; ++r) {
        std::map<int, std::string> order;  // micro-batch -> its actions' letters in the rank's order
        int live = 0, peak = 0;
        for (const Action& a : s.actions[static_cast<size_t>(r)]) {
          EXPECT_EQ(a.stage, r);
          order[a.micro_batch] += a.str().substr(std::to_string(r).size(), 1);
          if (a.type == ActionType::kForward) peak = std::max(peak, ++live);
          if (a.type == ActionType::kWeight) --live;
        }
        EXPECT_EQ(order.size(), static_cast<size_t>(m));
        for (const auto& [j, letters] : order) EXPECT_EQ(letters, "FBW") << "rank " << r << ", micro-batch " << j;
        EXPECT_EQ(peak, std::min(p, m)) << "rank " << r;
        EXPECT_EQ(max_in_flight(s, r), peak);
        // Between their B and their W: the r deferred and the one whose B has just run (by hand from ZB-H1's
        // order), at most every micro-batch.
        EXPECT_EQ(max_pending_weights(s, r), std::min(r + 1, m)) << "rank " << r;
        // Deferring none, each W follows its B at once: 1F1B's micro-batches in flight, one W pending at a time.
        EXPECT_EQ(max_in_flight(none, r), std::min(p - r, m)) << "rank " << r;
        EXPECT_EQ(max_pending_weights(none, r), 1) << "rank " << r;
      }
    }
  }
  // Rank 1 of two, written out: it defers one W, so micro-batch 0's waits until after micro-batch 1's B.
  const Schedule two = schedule_zb_h1(2, 3);
  std::string rank1;
  for (const Action& a : two.actions[1]) rank1 += a.str() + " ";
  EXPECT_EQ(rank1, "1F0 1B0 1F1 1B1 1W0 1F2 1B2 1W1 1W2 ");
  EXPECT_THAT(testing_util::error_of(
                  [] {
                    schedule_zb_h1(3, 4, {0, 2, 1});
                  },
                  ErrorCode::kInvalidArgument),
              HasSubstr("rank 1 defers 2 W's; 0 to 1, or -1 not to split"));
  // -1: that rank keeps its backward whole, in 1F1B's order; the others split theirs.
  const Schedule mixed = schedule_zb_h1(3, 4, {0, -1, 2});
  EXPECT_EQ(dry_run(mixed), "");
  EXPECT_EQ(mixed.actions[1], schedule_1f1b(3, 4).actions[1]);
  EXPECT_EQ(max_in_flight(mixed, 2), 3);
  EXPECT_EQ(max_pending_weights(mixed, 1), 0);  // a whole backward keeps nothing for later
  EXPECT_EQ(max_pending_weights(mixed, 2), 3);
  EXPECT_THAT(testing_util::error_of(
                  [] {
                    schedule_zb_h1(3, 4, {0, 1});
                  },
                  ErrorCode::kInvalidArgument),
              HasSubstr("2 deferrals for 3 ranks"));
}

// A split backward needs one W for each of its B's, after it; the reduction waits for the last W.
TEST(DryRun, ChecksASplitBackward) {
  EXPECT_THAT(dry_run(Schedule::parse_csv("0,0F0,0B0,0W0,0F1,0B1\n", 1, 1, 2)), HasSubstr("0B1 has no W"));
  EXPECT_THAT(dry_run(Schedule::parse_csv("0,0F0,0B0,0W0,0W0\n", 1, 1, 1)), HasSubstr("1 B and 2 W"));
  EXPECT_THAT(dry_run(Schedule::parse_csv("0,0F0,0W0,0B0\n", 1, 1, 1)), HasSubstr("0W0*"));
  const Schedule s = add_gradient_reduction(lower_communication(schedule_zb_h1(2, 2)));
  EXPECT_EQ(dry_run(s), "");
  std::string rank0, rank1;
  for (const Action& a : s.actions[0]) rank0 += a.str() + " ";
  for (const Action& a : s.actions[1]) rank1 += a.str() + " ";
  EXPECT_EQ(rank0, "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0W0 0RECV_B1 0B1 0W1 0REDUCE_GRAD 0OPTIM ");
  EXPECT_EQ(rank1, "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1W0 1W1 1REDUCE_GRAD 1OPTIM ");
}

// The replay against times worked out by hand: two ranks, two micro-batches, F = 1, B = 2, W = 1 (a whole
// backward 3), no link time.
//   1F1B   rank 0: F0 0-1, F1 1-2, B0 5-8 (after rank 1's B0, 2-5), B1 9-12 (after rank 1's B1, 6-9)  -> 12
//   ZB-H1  rank 1: F0 1-2, B0 2-4, F1 4-5, B1 5-7, W0 7-8, W1 8-9
//          rank 0: F0 0-1, F1 1-2, B0 4-6, W0 6-7, B1 7-9, W1 9-10                                   -> 10
TEST(Replay, SplitBackwardByHand) {
  std::map<Work, int> asked;
  const auto compute = [&](int, Work w) {
    ++asked[w];
    return w == Work::kForward ? 1.0 : w == Work::kBackward ? 3.0 : w == Work::kInputGradient ? 2.0 : 1.0;
  };
  const auto link = [](int) { return 0.0; };
  EXPECT_DOUBLE_EQ(replay(schedule_1f1b(2, 2), compute, link).makespan, 12.0);
  EXPECT_EQ(asked[Work::kBackward], 4);
  const ReplayResult zb = replay(schedule_zb_h1(2, 2), compute, link);
  EXPECT_DOUBLE_EQ(zb.makespan, 10.0);
  EXPECT_EQ(asked[Work::kInputGradient], 4);
  EXPECT_EQ(asked[Work::kWeightGradient], 4);
  EXPECT_DOUBLE_EQ(zb.finish[1], 9.0);
  EXPECT_DOUBLE_EQ(zb.busy[0], 2 * (1 + 2 + 1));
  EXPECT_EQ(zb.peak_in_flight[0], 2);
  EXPECT_EQ(zb.peak_in_flight[1], 2);  // micro-batch 0 held to its W, after micro-batch 1's B
}

// The paper's bubble (Qi et al. 2024, section 2.1): with F = B = W, each rank idles (p - 1)(F + B - W) under ZB-H1,
// a third of 1F1B's (p - 1)(F + B + W), so the makespans are m (F + B + W) plus those.
TEST(Replay, ZeroBubbleH1IdlesAThirdOf1F1B) {
  const auto link = [](int) { return 0.0; };
  for (auto [p, m] : {std::pair{2, 4}, {4, 8}, {4, 16}, {8, 24}}) {
    const auto one = replay(
        schedule_1f1b(p, m), [](int, Work w) { return w == Work::kForward ? 1.0 : 2.0; }, link);
    const auto zb = replay(
        schedule_zb_h1(p, m), [](int, Work) { return 1.0; }, link);
    EXPECT_DOUBLE_EQ(one.makespan, 3.0 * m + 3.0 * (p - 1)) << p << " ranks, " << m << " micro-batches";
    EXPECT_DOUBLE_EQ(zb.makespan, 3.0 * m + 1.0 * (p - 1)) << p << " ranks, " << m << " micro-batches";
  }
}

}  // namespace
}  // namespace h2

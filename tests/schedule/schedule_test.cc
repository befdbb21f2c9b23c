// The schedule IR: text round trips, generator invariants, and the dry run's deadlock detection.
#include "schedule/schedule.h"

#include <map>

#include "test_util.h"

namespace h2 {
namespace {

using ::testing::HasSubstr;

TEST(Action, PrintsAndParses) {
  for (const char* text : {"2F0", "0B13", "3SEND_F7", "1RECV_F0", "4SEND_B2", "0RECV_B11", "2REDUCE_GRAD", "5OPTIM"}) {
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

}  // namespace
}  // namespace h2

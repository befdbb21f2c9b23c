// DiComm over the in-process transport: every collective, world sizes 1-8, element counts 0, 1, odd and large,
// against exact expected values (small integers, exactly representable in f32 and bf16), plus sub-groups,
// timeouts that name the peer, and algorithm choice by size.
#include <chrono>
#include <thread>
#include <tuple>

#include "comm/collective_checks.h"
#include "comm/communicator.h"
#include "comm/run_ranks.h"
#include "comm/tensor_comm.h"
#include "device/device.h"
#include "test_util.h"

namespace h2 {
namespace {

using ::testing::HasSubstr;

using testing_util::run_ranks;

float value(int rank, size_t i) { return static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1)); }

const size_t kCounts[] = {0, 1, 1001, 1 << 16};

// Every reduction (sum, average, max) of all_reduce and reduce_scatter in f32 and bf16 (collective_checks.h), on
// 1-8 ranks, through the shared windows and by messages (no window: ring, halving-doubling, tree, recursive
// doubling), at counts 0, 1, odd and large.
TEST(Collectives, EveryReductionOfEveryCollectiveOnAndOffTheWindows) {
  for (size_t window : {size_t{1} << 20, size_t{0}}) {
    for (int n = 1; n <= 8; ++n) {
      const auto errors = run_ranks(
          n,
          [&](Communicator& c) {
            const std::string e =
                testing_util::check_every_reduction(c, std::vector<size_t>(std::begin(kCounts), std::end(kCounts)));
            ASSERT_EQ(e, "");
          },
          {}, window);
      for (const std::string& e : errors) ASSERT_EQ(e, "") << "n=" << n << " window=" << window;
    }
  }
}

// Large all-reduces, exact at odd sizes: through shared windows of 1 MiB (pieces of 128 Ki floats), and by messages
// (no window), where blocks of 1 MiB and more travel in 256 KiB messages, each reduced as it arrives.
TEST(Collectives, LargeAllReducesInChunksAreExact) {
  const size_t count = (size_t{3} << 20) + 5;
  for (size_t window : {size_t{1} << 20, size_t{0}}) {
    for (int n : {2, 3, 4}) {
      const auto errors = run_ranks(
          n,
          [&](Communicator& c) {
            std::vector<float> sum(count);
            for (size_t i = 0; i < count; ++i) sum[i] = value(c.rank(), i);
            c.all_reduce(sum.data(), count, DType::kF32, ReduceOp::kSum);
            const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
            for (size_t i = 0; i < count; ++i) {
              ASSERT_EQ(sum[i], ranks_sum * static_cast<float>(i % 7 + 1)) << "n=" << n << " i=" << i;
            }
          },
          {}, window);
      for (const std::string& e : errors) ASSERT_EQ(e, "") << "n=" << n << " window=" << window;
    }
  }
}

// One window serves every communicator and collective of a rank, in halves that alternate: overlapping groups
// (the world, then evens or odds, then the world again) take turns, in many small pieces (a 4 KiB window: 512
// floats a piece), and no rank overwrites a half that a peer is still reading.
TEST(Collectives, SharedWindowsServeOverlappingGroupsInManyPieces) {
  const size_t count = 20011;
  for (int n : {2, 3, 5}) {
    const auto errors = run_ranks(
        n,
        [&](Communicator& c) {
          Communicator parity = c.split(c.rank() % 2, c.rank());
          for (int round = 0; round < 3; ++round) {
            std::vector<float> world(count), group(count), max(count);
            for (size_t i = 0; i < count; ++i) world[i] = group[i] = max[i] = value(c.rank(), i + round);
            c.all_reduce(world.data(), count, DType::kF32, ReduceOp::kSum);
            ASSERT_STREQ(c.last_algorithm(), "shared-window");
            parity.all_reduce(group.data(), count, DType::kF32, ReduceOp::kSum);
            c.all_reduce(max.data(), count, DType::kF32, ReduceOp::kMax);
            float group_ranks = 0;  // sum of rank + 1 over this rank's parity group
            for (int r = c.rank() % 2; r < n; r += 2) group_ranks += static_cast<float>(r + 1);
            for (size_t i = 0; i < count; ++i) {
              const float unit = static_cast<float>((i + round) % 7 + 1);
              ASSERT_EQ(world[i], static_cast<float>(n * (n + 1) / 2) * unit) << "round " << round << " i=" << i;
              ASSERT_EQ(group[i], group_ranks * unit) << "round " << round << " i=" << i;
              ASSERT_EQ(max[i], static_cast<float>(n) * unit) << "round " << round << " i=" << i;
            }
            // Reduce-scatter (bf16 in, f32 sums) and all-gather through the same windows, in pieces too.
            std::vector<bf16_t> in(count * static_cast<size_t>(n)), mine(count);
            for (size_t i = 0; i < in.size(); ++i) in[i] = f32_to_bf16(value(c.rank(), i + round));
            c.reduce_scatter(mine.data(), in.data(), count, DType::kBF16, ReduceOp::kSum);
            for (size_t i = 0; i < count; ++i) {
              const size_t global = static_cast<size_t>(c.rank()) * count + i + round;
              ASSERT_EQ(bf16_to_f32(mine[i]), static_cast<float>(n * (n + 1) / 2 * static_cast<int>(global % 7 + 1)));
            }
            std::vector<float> all(count * static_cast<size_t>(n));
            c.all_gather(all.data(), world.data(), count, DType::kF32);
            for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], world[i % count]) << "round " << round;
          }
        },
        {}, 4096);
    for (const std::string& e : errors) ASSERT_EQ(e, "") << "n=" << n;
  }
}

TEST(Collectives, ReduceScatterAllGatherBroadcastBarrier) {
  for (int n = 1; n <= 8; ++n) {
    for (size_t count : kCounts) {
      const auto errors = run_ranks(n, [&](Communicator& c) {
        // reduce_scatter: rank r's block is the sum over ranks of block r.
        std::vector<float> in(count * static_cast<size_t>(n)), out(count);
        for (size_t i = 0; i < in.size(); ++i) in[i] = value(c.rank(), i);
        c.reduce_scatter(out.data(), in.data(), count, DType::kF32, ReduceOp::kSum);
        for (size_t i = 0; i < count; ++i) {
          const size_t global = static_cast<size_t>(c.rank()) * count + i;
          ASSERT_EQ(out[i], static_cast<float>(n * (n + 1) / 2) * static_cast<float>(global % 7 + 1));
        }
        // all_gather: block r is rank r's input.
        std::vector<float> mine(count), all(count * static_cast<size_t>(n));
        for (size_t i = 0; i < count; ++i) mine[i] = value(c.rank(), i);
        c.all_gather(all.data(), mine.data(), count, DType::kF32);
        for (int r = 0; r < n; ++r) {
          for (size_t i = 0; i < count; ++i) ASSERT_EQ(all[static_cast<size_t>(r) * count + i], value(r, i));
        }
        // broadcast from the last rank.
        std::vector<float> b(count, c.rank() == n - 1 ? 3.0f : -1.0f);
        c.broadcast(b.data(), count, DType::kF32, n - 1);
        for (float x : b) ASSERT_EQ(x, 3.0f);
        c.barrier();
      });
      for (const std::string& e : errors) ASSERT_EQ(e, "") << "n=" << n << " count=" << count;
    }
  }
}

TEST(Collectives, SplitFormsIndependentGroups) {
  const auto errors = run_ranks(6, [](Communicator& c) {
    Communicator sub = c.split(c.rank() % 2, -c.rank());  // evens and odds, in reverse rank order
    ASSERT_EQ(sub.size(), 3);
    ASSERT_EQ(sub.rank(), 2 - c.rank() / 2);
    float x = static_cast<float>(c.rank());
    sub.all_reduce(&x, 1, DType::kF32, ReduceOp::kSum);
    ASSERT_EQ(x, c.rank() % 2 == 0 ? 0 + 2 + 4 : 1 + 3 + 5);
    float y = 1;  // the parent still works after the split
    c.all_reduce(&y, 1, DType::kF32, ReduceOp::kSum);
    ASSERT_EQ(y, 6);
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
}

TEST(Collectives, ChoosesTheAlgorithmBySizeAndRanks) {
  // Large: through the shared windows where ranks have them; by messages, recursive halving-doubling for a power
  // of two above 2 ranks, else the ring. Small: recursive doubling for a power of two, else the tree.
  for (const auto& [n, window, large_algorithm] : {std::tuple{4, 0, "halving-doubling"},
                                                   {2, 0, "ring"},
                                                   {3, 0, "ring"},
                                                   {2, 1 << 20, "shared-window"},
                                                   {3, 1 << 20, "shared-window"}}) {
    const auto errors = run_ranks(
        n,
        [large = large_algorithm](Communicator& c) {
          std::vector<float> small(16, 1), large_data(1 << 15, 1);
          c.all_reduce(small.data(), small.size(), DType::kF32, ReduceOp::kSum);
          EXPECT_STREQ(c.last_algorithm(), c.size() == 3 ? "tree" : "recursive-doubling");
          c.all_reduce(large_data.data(), large_data.size(), DType::kF32, ReduceOp::kSum);
          EXPECT_STREQ(c.last_algorithm(), large);
          EXPECT_EQ(large_data[12345], static_cast<float>(c.size()));
        },
        {}, static_cast<size_t>(window));
    for (const std::string& e : errors) EXPECT_EQ(e, "");
  }
}

TEST(Collectives, AMissingRankTimesOutNamingIt) {
  CommOptions options;
  options.timeout = std::chrono::milliseconds(200);
  const auto errors = run_ranks(
      3,
      [](Communicator& c) {
        if (c.rank() == 2) return;  // rank 2 never joins
        float x = 1;
        c.all_reduce(&x, 1, DType::kF32, ReduceOp::kSum);
      },
      options);
  EXPECT_EQ(errors[2], "");
  EXPECT_THAT(errors[0] + errors[1], HasSubstr("waiting for rank"));
  EXPECT_THAT(errors[0] + errors[1], HasSubstr("timed out after 200 ms"));
  EXPECT_THAT(errors[0], HasSubstr("all_reduce"));
}

// WaitLonger lengthens a communicator's waits for a scope and gives the timeout back after it: rank 1 comes to two
// barriers 400 ms late; rank 0 waits it out in the first, inside the scope, and gives up on the second after the
// communicator's 100 ms.
TEST(Collectives, WaitLongerLengthensWaitsForItsScopeOnly) {
  CommOptions options;
  options.timeout = std::chrono::milliseconds(100);
  const auto errors = run_ranks(
      2,
      [](Communicator& c) {
        const auto late = [&] {
          if (c.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(400));
        };
        {
          const WaitLonger longer(c, std::chrono::seconds(20));
          EXPECT_EQ(c.options().timeout, std::chrono::seconds(20));
          late();
          c.barrier();
        }
        EXPECT_EQ(c.options().timeout, std::chrono::milliseconds(100));
        late();
        c.barrier();
      },
      options, 0);
  EXPECT_THAT(errors[0], HasSubstr("timed out after 100 ms"));
}

TEST(PointToPoint, TaggedMessagesMatchByTag) {
  const auto errors = run_ranks(2, [](Communicator& c) {
    if (c.rank() == 0) {
      const int a = 7, b = 9;
      auto s1 = c.isend(&a, 4, 1, 1);
      auto s2 = c.isend(&b, 4, 1, 2);
      s1->wait(std::chrono::seconds(5));
      s2->wait(std::chrono::seconds(5));
    } else {
      int a = 0, b = 0;
      auto r2 = c.irecv(&b, 4, 0, 2);  // posted in the other order: tags keep them apart
      auto r1 = c.irecv(&a, 4, 0, 1);
      r2->wait(std::chrono::seconds(5));
      r1->wait(std::chrono::seconds(5));
      ASSERT_EQ(a, 7);
      ASSERT_EQ(b, 9);
      int wrong = 0;
      auto bad = c.irecv(&wrong, 8, 0, 3);  // nobody sends tag 3
      EXPECT_THROW(bad->wait(std::chrono::milliseconds(50)), CommError);
    }
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
}

TEST(Collectives, HierarchicalOnlyWhenHostsAreManyAndEven) {
  // 6 ranks on 3 hosts of 2: hierarchical, exact sums; 3 ranks on hosts of 2 and 1: flat. Without windows, by ring
  // within each host and flat; with 4 KiB windows (threads share memory whatever hosts they claim), the hosts'
  // ranks reduce through windows in many pieces, each piece's block all-reduced across hosts in between (the
  // cross-host group uses the same windows, nested), and the flat case goes through the windows.
  for (const auto& [n, per_host, window, expect] :
       {std::tuple{6, 2, 0, "hierarchical"}, std::tuple{3, 2, 0, "ring"}, std::tuple{6, 2, 4096, "hierarchical"},
        std::tuple{3, 2, 4096, "shared-window"}}) {
    const auto errors = run_ranks(
        n,
        [&, n = n, per_host = per_host, expect = expect](Communicator& c) {
          c.set_hosts(cat("host", c.rank() / per_host));
          for (int round = 0; round < 2; ++round) {
            std::vector<float> v(100003);
            for (size_t i = 0; i < v.size(); ++i) v[i] = value(c.rank(), i + round);
            c.all_reduce(v.data(), v.size(), DType::kF32, ReduceOp::kSum);
            ASSERT_STREQ(c.last_algorithm(), expect);
            for (size_t i = 0; i < v.size(); ++i) {
              ASSERT_EQ(v[i], static_cast<float>(n * (n + 1) / 2 * static_cast<int>((i + round) % 7 + 1)));
            }
          }
        },
        {}, static_cast<size_t>(window));
    for (const std::string& e : errors) ASSERT_EQ(e, "") << "n=" << n << " window=" << window;
  }
}

TEST(Collectives, WorkBuffersAreReusedAcrossCalls) {
  const auto errors = run_ranks(4, [](Communicator& c) {
    std::vector<bf16_t> v(1 << 16, f32_to_bf16(1.0f));
    c.all_reduce(v.data(), v.size(), DType::kBF16, ReduceOp::kSum);
    const int64_t after_first = c.buffer_growths();
    for (int i = 0; i < 5; ++i) c.all_reduce(v.data(), v.size(), DType::kBF16, ReduceOp::kSum);
    ASSERT_EQ(c.buffer_growths(), after_first);  // no allocation per call once the buffers fit
    ASSERT_EQ(bf16_to_f32(v[0]), 4096.0f);       // 4^6
  });
  for (const std::string& e : errors) ASSERT_EQ(e, "");
}

// A device whose memory the host must not touch directly: TensorComm has to stage through host buffers.
class OpaqueDevice final : public Device {
 public:
  explicit OpaqueDevice(int index) : Device(props(index)) {}
  const Kernels& kernels() const override { throw Error(ErrorCode::kUnsupported, "no kernels"); }

 private:
  static DeviceProps props(int index) {
    DeviceProps p;
    p.name = cat("opaque:", index);
    p.backend = "test";
    p.mem_capacity_bytes = 1 << 20;
    p.host_addressable = false;
    return p;
  }
};

TEST(TensorComm, StagesTensorsOfOpaqueDevicesAndCountsTheBytes) {
  const auto errors = run_ranks(2, [](Communicator& c) {
    OpaqueDevice device(c.rank());
    TensorComm tc(c);
    Tensor t = device.empty(DType::kF32, Shape{{1000}});
    std::vector<float> host(1000, static_cast<float>(c.rank() + 1));
    device.copy_h2d(t.data(), host.data(), t.bytes());
    tc.all_reduce(t, ReduceOp::kSum);  // 4000 bytes out, 4000 back
    if (c.rank() == 0) tc.send(t, 1, 7);
    if (c.rank() == 1) tc.recv(t, 0, 7);
    device.copy_d2h(host.data(), t.data(), t.bytes());
    for (float x : host) ASSERT_EQ(x, 3.0f);
    ASSERT_EQ(tc.staged_bytes(), 3 * 4000);
  });
  for (const std::string& e : errors) ASSERT_EQ(e, "");
}

// 1F1B's crossing messages: both ranks send before either receives. A staged isend returns a request at once, from a
// copy of its own, so the tensor may be overwritten before the send completes.
TEST(TensorComm, AStagedIsendReturnsAtOnceFromItsOwnCopy) {
  const auto errors = run_ranks(2, [](Communicator& c) {
    OpaqueDevice device(c.rank());
    TensorComm tc(c);
    Tensor out = device.empty(DType::kF32, Shape{{1000}}), in = device.empty(DType::kF32, Shape{{1000}});
    std::vector<float> host(1000, static_cast<float>(c.rank() + 1));
    device.copy_h2d(out.data(), host.data(), out.bytes());
    std::unique_ptr<Request> sent = tc.isend(out, 1 - c.rank(), 9);
    ASSERT_NE(sent, nullptr);
    std::vector<float> other(1000, -1.0f);
    device.copy_h2d(out.data(), other.data(), out.bytes());  // what was sent is the copy, not this
    tc.recv(in, 1 - c.rank(), 9);
    c.wait_request(*sent, "send", 1 - c.rank());
    device.copy_d2h(host.data(), in.data(), in.bytes());
    for (float x : host) ASSERT_EQ(x, static_cast<float>(2 - c.rank()));
  });
  for (const std::string& e : errors) ASSERT_EQ(e, "");
}

}  // namespace
}  // namespace h2

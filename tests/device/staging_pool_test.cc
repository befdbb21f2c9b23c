// The staging pool: which buffers come back, which are reused, which are freed — against an allocator that counts.
#include "device/staging_pool.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace h2 {
namespace {

// Hands out distinct buffers and records every allocation and free, so a test sees exactly what the pool did.
struct CountingHost {
  std::map<char*, size_t> live;  // buffer -> bytes asked of the allocator
  int allocations = 0, frees = 0;
  StagingPool pool(size_t reserve) {
    return StagingPool(
        [this](size_t bytes) {
          char* p = new char[bytes];
          live[p] = bytes;
          ++allocations;
          return p;
        },
        [this](char* p) {
          EXPECT_EQ(live.erase(p), 1u) << "freed a buffer the allocator did not hand out, or twice";
          ++frees;
          delete[] p;
        },
        reserve);
  }
};

TEST(StagingPool, SizeClassesArePowersOfTwo) {
  EXPECT_EQ(StagingPool::size_class(0), 1u);
  EXPECT_EQ(StagingPool::size_class(1), 1u);
  EXPECT_EQ(StagingPool::size_class(1000), 1024u);
  EXPECT_EQ(StagingPool::size_class(1024), 1024u);
  EXPECT_EQ(StagingPool::size_class(1025), 2048u);
}

TEST(StagingPool, ABufferLetGoIsReusedForItsSizeClass) {
  CountingHost host;
  {
    StagingPool pool = host.pool(1 << 20);
    char* first = nullptr;
    {
      std::shared_ptr<char> a = pool.take(1000);
      first = a.get();
      EXPECT_EQ(host.live.at(first), 1024u);
    }
    EXPECT_EQ(pool.free_bytes(), 1024u);
    std::shared_ptr<char> b = pool.take(700);  // the same class (1024): the same buffer, no allocation
    EXPECT_EQ(b.get(), first);
    EXPECT_EQ(host.allocations, 1);
    EXPECT_EQ(pool.free_bytes(), 0u);
    std::shared_ptr<char> c = pool.take(2000);  // another class: a new buffer
    EXPECT_NE(c.get(), first);
    EXPECT_EQ(host.allocations, 2);
  }
  // The pool is gone and every buffer was let go: all freed, none twice.
  EXPECT_EQ(host.frees, 2);
  EXPECT_TRUE(host.live.empty());
}

TEST(StagingPool, ABufferInUseIsNeverHandedOutTwice) {
  CountingHost host;
  StagingPool pool = host.pool(1 << 20);
  std::vector<std::shared_ptr<char>> held;
  std::set<char*> seen;
  for (int i = 0; i < 8; ++i) {
    held.push_back(pool.take(4096));
    EXPECT_TRUE(seen.insert(held.back().get()).second) << "buffer " << i << " is already in use";
  }
  EXPECT_EQ(host.allocations, 8);
  held.clear();
  EXPECT_EQ(pool.free_bytes(), 8u * 4096);
}

TEST(StagingPool, KeepsNoMoreThanItsReserveAndFreesTheRest) {
  CountingHost host;
  StagingPool pool = host.pool(3000);  // room for two 1 KiB buffers and a third's 952 bytes: two are kept
  {
    std::vector<std::shared_ptr<char>> held;
    for (int i = 0; i < 4; ++i) held.push_back(pool.take(1024));
  }
  EXPECT_EQ(pool.free_bytes(), 2048u);
  EXPECT_EQ(host.frees, 2);
  EXPECT_EQ(host.live.size(), 2u);
}

TEST(StagingPool, BuffersMayOutliveThePool) {
  CountingHost host;
  std::shared_ptr<char> out;
  {
    StagingPool pool = host.pool(1 << 20);
    out = pool.take(64);
    std::shared_ptr<char> back = pool.take(64);
  }  // the pool frees what it kept; `out` is still in use
  EXPECT_EQ(host.frees, 1);
  out.reset();  // let go after the pool: freed, not kept
  EXPECT_EQ(host.frees, 2);
  EXPECT_TRUE(host.live.empty());
}

TEST(StagingPool, ThreadsTakingAndLettingGoShareItSafely) {
  CountingHost host;
  std::mutex allocator;  // the counting allocator itself is not thread-safe; the pool must be
  StagingPool pool(
      [&](size_t bytes) {
        std::lock_guard lock(allocator);
        return host.live.emplace(new char[bytes], bytes).first->first;
      },
      [&](char* p) {
        std::lock_guard lock(allocator);
        host.live.erase(p);
        delete[] p;
      },
      1 << 20);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, t] {
      for (int i = 0; i < 2000; ++i) {
        std::shared_ptr<char> a = pool.take(static_cast<size_t>(64 << (i % 3)));
        a.get()[0] = static_cast<char>(t);  // in use by this thread alone
        std::shared_ptr<char> b = pool.take(64);
        EXPECT_NE(a.get(), b.get());
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_LE(pool.free_bytes(), size_t{1} << 20);
}

}  // namespace
}  // namespace h2

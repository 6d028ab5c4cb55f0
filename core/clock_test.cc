#include "core/clock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace kforge {
namespace {

using namespace std::chrono_literals;

TEST(SystemClock, WaitsForThePredicateOrTheDeadline) {
  SystemClock clock;
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(mu);
  EXPECT_TRUE(clock.WaitFor(lock, cv, 1h, [] { return true; }));
  const auto start = clock.Now();
  EXPECT_FALSE(clock.WaitFor(lock, cv, 5ms, [] { return false; }));
  EXPECT_GE(clock.Now() - start, 5ms);
  EXPECT_GT(clock.UnixMs(), 1700000000000);
}

TEST(ManualClock, MovesOnlyWhenAdvancedAndUnixTimeWithIt) {
  ManualClock clock(1000);
  const auto t0 = clock.Now();
  EXPECT_EQ(clock.UnixMs(), 1000);
  clock.Advance(1500ms);
  EXPECT_EQ(clock.Now() - t0, 1500ms);
  EXPECT_EQ(clock.UnixMs(), 2500);
  clock.Advance(-5s);  // time does not go back
  EXPECT_EQ(clock.UnixMs(), 2500);
}

// A waiter's deadline passes when, and only when, the clock reaches it.
TEST(ManualClock, AWaitEndsAtItsDeadlineOnTheClock) {
  ManualClock clock;
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int> result{-1};
  std::thread waiter([&] {
    std::unique_lock<std::mutex> lock(mu);
    result = clock.WaitFor(lock, cv, 100ms, [] { return false; }) ? 1 : 0;
  });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  clock.Advance(99ms);
  std::this_thread::yield();
  ASSERT_TRUE(clock.AwaitWaiters(1));
  EXPECT_EQ(result.load(), -1) << "1 ms before its deadline";
  clock.Advance(1ms);
  waiter.join();
  EXPECT_EQ(result.load(), 0);
  EXPECT_EQ(clock.Waiters(), 0);
}

TEST(ManualClock, AWaitEndsWhenThePredicateHoldsWithoutTimeMoving) {
  ManualClock clock;
  std::mutex mu;
  std::condition_variable cv;
  bool ready = false;
  std::atomic<int> result{-1};
  std::thread waiter([&] {
    std::unique_lock<std::mutex> lock(mu);
    result = clock.WaitFor(lock, cv, 1h, [&] { return ready; }) ? 1 : 0;
  });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  {
    std::lock_guard<std::mutex> g(mu);
    ready = true;
  }
  cv.notify_all();
  waiter.join();
  EXPECT_EQ(result.load(), 1);
}

TEST(ManualClock, SleepForTakesNoRealTime) {
  ManualClock clock;
  std::thread sleeper([&] { clock.SleepFor(1h); });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  EXPECT_EQ(clock.NextDeadline(), 1h);
  clock.Advance(1h);
  sleeper.join();
}

TEST(ManualClock, CountsEveryWaiterAndAwaitingMoreTimesOut) {
  ManualClock clock;
  std::mutex mu;
  std::condition_variable cv_a, cv_b;
  std::thread a([&] {
    std::unique_lock<std::mutex> lock(mu);
    clock.WaitFor(lock, cv_a, 10ms, [] { return false; });
  });
  std::thread b([&] {
    std::unique_lock<std::mutex> lock(mu);
    clock.WaitFor(lock, cv_b, 20ms, [] { return false; });
  });
  ASSERT_TRUE(clock.AwaitWaiters(2));
  EXPECT_FALSE(clock.AwaitWaiters(3, 20ms));
  EXPECT_EQ(clock.NextDeadline(), 10ms);
  clock.Advance(10ms);
  // a's deadline has passed: it no longer counts, even before it leaves.
  EXPECT_EQ(clock.Waiters(), 1);
  EXPECT_EQ(clock.NextDeadline(), 10ms);
  a.join();
  ASSERT_TRUE(clock.AwaitWaiters(1));
  clock.Advance(10ms);
  b.join();
  EXPECT_EQ(clock.Waiters(), 0);
}

}  // namespace
}  // namespace kforge

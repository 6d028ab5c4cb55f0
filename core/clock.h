// Clock: where a component that waits on time reads it and waits for it, so
// that its tests move time instead of sleeping (the idea of LevelDB's Env,
// for time alone).
//
// A component given a Clock takes deadlines from Now() and waits with
// WaitUntil/WaitFor on its own mutex and condition variable, exactly where
// it would call std::condition_variable::wait_until: the wait ends when the
// predicate holds (the component notifies its condition variable as usual)
// or when the clock reaches the deadline. With the SystemClock that is the
// steady clock's wait; with a ManualClock the deadline passes only when a
// test calls Advance(), so what a component does after a heartbeat
// interval, a backoff or a pause happens when the test says, and every
// time before it provably not. UnixMs() is the wall clock, for times that
// are stored or sent; a ManualClock moves both together.
//
// Components hold a `Clock*` (borrowed; it must outlive them) that is null
// for the system's clock.
//
// Thread-safe: every method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>

namespace kforge {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Duration = std::chrono::steady_clock::duration;

  virtual ~Clock() = default;

  virtual TimePoint Now() const = 0;
  virtual int64_t UnixMs() const = 0;

  // With `lock` held on the mutex that guards what `done` reads (and that
  // `cv` is notified under), waits until done() holds or Now() reaches
  // `deadline`, as cv.wait_until(lock, deadline, done). Returns done().
  virtual bool WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                         TimePoint deadline, const std::function<bool()>& done) = 0;
  bool WaitFor(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, Duration d,
               const std::function<bool()>& done) {
    return WaitUntil(lock, cv, Now() + d, done);
  }
  // Waits `d` with nothing to wake it early: for a single-threaded retry.
  void SleepFor(Duration d);
};

// The steady clock for waits and the system clock for UnixMs.
class SystemClock final : public Clock {
 public:
  TimePoint Now() const override;
  int64_t UnixMs() const override;
  bool WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                 TimePoint deadline, const std::function<bool()>& done) override;
};

// Time that moves only when Advance() says. Tests only.
//
// A thread in WaitUntil whose deadline is still ahead is a "waiter";
// AwaitWaiters() lets a test see that the component has reached its wait
// (its deadline is then fixed) before advancing past it, and NextDeadline()
// says how long that wait is. A waiter whose deadline an Advance() passed
// no longer counts, though it may take a moment to leave its wait: so after
// an advance, AwaitWaiters waits for the component's next wait, not the one
// just ended.
class ManualClock final : public Clock {
 public:
  // Starts at 2026-01-01T00:00:00Z unless told otherwise.
  explicit ManualClock(int64_t start_unix_ms = 1767225600000);

  TimePoint Now() const override;
  int64_t UnixMs() const override;
  bool WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                 TimePoint deadline, const std::function<bool()>& done) override;

  // Moves time on by `d` (>= 0) and wakes every waiter to look at it.
  void Advance(Duration d);
  // Threads waiting now for a deadline still ahead.
  int Waiters() const;
  // Blocks, in real time up to `timeout`, until at least `n` threads wait;
  // false on timeout.
  bool AwaitWaiters(int n, std::chrono::milliseconds timeout = std::chrono::seconds(30)) const;
  // How far ahead the earliest waiter's deadline is; zero when none waits.
  Duration NextDeadline() const;

 private:
  int WaitersLocked() const;  // mu_ held

  const int64_t start_unix_ms_;
  mutable std::mutex mu_;
  mutable std::condition_variable waiters_changed_;
  Duration elapsed_{0};                              // guarded by mu_
  std::map<std::condition_variable*, int> waiting_;  // cv -> threads on it; guarded by mu_
  std::multiset<TimePoint> deadlines_;               // one per waiter; guarded by mu_
};

}  // namespace kforge

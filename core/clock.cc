#include "core/clock.h"

namespace kforge {

void Clock::SleepFor(Duration d) {
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(mu);
  WaitFor(lock, cv, d, [] { return false; });
}

Clock::TimePoint SystemClock::Now() const { return std::chrono::steady_clock::now(); }

int64_t SystemClock::UnixMs() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool SystemClock::WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                            TimePoint deadline, const std::function<bool()>& done) {
  return cv.wait_until(lock, deadline, done);
}

ManualClock::ManualClock(int64_t start_unix_ms) : start_unix_ms_(start_unix_ms) {}

Clock::TimePoint ManualClock::Now() const {
  std::lock_guard<std::mutex> g(mu_);
  return TimePoint(elapsed_);
}

int64_t ManualClock::UnixMs() const {
  std::lock_guard<std::mutex> g(mu_);
  return start_unix_ms_ + std::chrono::duration_cast<std::chrono::milliseconds>(elapsed_).count();
}

bool ManualClock::WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                            TimePoint deadline, const std::function<bool()>& done) {
  // Advance() notifies `cv` without the caller's mutex (taking it there
  // could deadlock with a caller that holds it while reading the clock), so
  // a notification can fall between the time check below and the wait: the
  // short real-time slice catches that one. The outcome never depends on
  // the slice, only how soon a waiter sees an advance.
  constexpr auto kSlice = std::chrono::milliseconds(2);
  while (!done()) {
    std::multiset<TimePoint>::iterator mine;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (TimePoint(elapsed_) >= deadline) return false;
      ++waiting_[&cv];
      mine = deadlines_.insert(deadline);
    }
    waiters_changed_.notify_all();
    cv.wait_for(lock, kSlice);
    {
      std::lock_guard<std::mutex> g(mu_);
      if (--waiting_[&cv] == 0) waiting_.erase(&cv);
      deadlines_.erase(mine);
    }
  }
  return true;
}

void ManualClock::Advance(Duration d) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (d > Duration::zero()) elapsed_ += d;
    // Under mu_: a waiter leaves `waiting_` under mu_ before its wait
    // returns, so every condition variable named here is still alive.
    for (auto& [cv, n] : waiting_) cv->notify_all();
  }
  waiters_changed_.notify_all();
}

int ManualClock::WaitersLocked() const {
  return int(std::distance(deadlines_.upper_bound(TimePoint(elapsed_)), deadlines_.end()));
}

int ManualClock::Waiters() const {
  std::lock_guard<std::mutex> g(mu_);
  return WaitersLocked();
}

bool ManualClock::AwaitWaiters(int n, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> g(mu_);
  return waiters_changed_.wait_for(g, timeout, [&] { return WaitersLocked() >= n; });
}

Clock::Duration ManualClock::NextDeadline() const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = deadlines_.upper_bound(TimePoint(elapsed_));
  return it == deadlines_.end() ? Duration::zero() : *it - TimePoint(elapsed_);
}

}  // namespace kforge

// WaitRoom: calls that wait (LeaseTask long polls, WatchJob streams) without
// holding a thread each. A waiting call is an entry here with a deadline;
// it costs memory, not a thread. One timer thread per room tells each call
// when its deadline passed; WakeAll tells every call that what it waits for
// may have happened; Close tells every call the server is stopping. The
// call itself (server.cc's reactors) decides what to do: try again on a
// pool thread, finish, write.
//
// The room also caps how many calls may wait at once: past `max_open`,
// Enter is RESOURCE_EXHAUSTED naming the config key, so a flood of calls
// is refused in the open instead of growing memory without bound.
//
// Callbacks run outside the room's lock, on a shared_ptr the room holds, so
// a waiter stays alive while one runs even if it left meanwhile; a callback
// may therefore still run (once) after Leave returns, and a waiter must
// ignore what comes after it ended. Callbacks must not block; the room's
// lock is not held while they run, so they may call the room (Leave).
//
// Transport-free (no gRPC here), thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kforge::server {

class WaitRoom {
 public:
  using Clock = std::chrono::steady_clock;

  class Waiter {
   public:
    virtual ~Waiter() = default;
    // Its deadline passed (on the room's timer thread).
    virtual void OnDeadline() = 0;
    // WakeAll was called (on the caller's thread).
    virtual void OnWake() = 0;
    // The room closed: the server is stopping (on Close's thread).
    virtual void OnClose() = 0;
  };

  // `what` names the calls in messages ("LeaseTask long polls"),
  // `limit_key` the config key of `max_open`.
  WaitRoom(std::string what, std::string limit_key, int max_open);
  ~WaitRoom();  // Close()s and ends the timer thread
  WaitRoom(const WaitRoom&) = delete;
  WaitRoom& operator=(const WaitRoom&) = delete;

  // Admits `w` until Leave(id), its deadline at `deadline`; returns its id.
  // RESOURCE_EXHAUSTED when max_open calls wait already; UNAVAILABLE once
  // closed.
  absl::StatusOr<uint64_t> Enter(std::shared_ptr<Waiter> w, Clock::time_point deadline);
  // Removes the entry (its deadline too). Idempotent.
  void Leave(uint64_t id);
  // OnWake for every waiter in the room.
  void WakeAll();
  // Refuses new entries (UNAVAILABLE) and calls OnClose for every waiter.
  // Idempotent.
  void Close();
  // Until every waiter left, or `timeout`; false on timeout.
  bool WaitEmpty(std::chrono::milliseconds timeout);

  int open() const;
  int max_open() const { return max_open_; }
  // How many times WakeAll was called: a waiter that looked before it
  // entered compares this to know whether it missed one.
  uint64_t wakes() const { return wakes_.load(); }

 private:
  struct Entry {
    std::shared_ptr<Waiter> waiter;
    std::multimap<Clock::time_point, uint64_t>::iterator deadline;
    bool timed = true;  // `deadline` is valid (not yet fired)
  };
  void Timer();

  const std::string what_;
  const std::string limit_key_;
  const int max_open_;
  std::atomic<uint64_t> wakes_{0};

  mutable std::mutex mu_;
  std::condition_variable cv_;        // the timer: earlier deadline, or stop
  std::condition_variable empty_cv_;  // an entry left
  std::map<uint64_t, Entry> entries_;                        // guarded by mu_
  std::multimap<Clock::time_point, uint64_t> deadlines_;     // guarded by mu_
  uint64_t next_id_ = 1;                                     // guarded by mu_
  bool closed_ = false;                                      // guarded by mu_
  bool stop_ = false;                                        // guarded by mu_
  std::thread timer_;
};

}  // namespace kforge::server

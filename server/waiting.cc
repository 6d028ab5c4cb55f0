#include "server/waiting.h"

#include <utility>
#include <vector>

#include <fmt/format.h>

namespace kforge::server {

WaitRoom::WaitRoom(std::string what, std::string limit_key, int max_open)
    : what_(std::move(what)), limit_key_(std::move(limit_key)), max_open_(max_open) {
  timer_ = std::thread([this] { Timer(); });
}

WaitRoom::~WaitRoom() {
  Close();
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  timer_.join();
}

absl::StatusOr<uint64_t> WaitRoom::Enter(std::shared_ptr<Waiter> w, Clock::time_point deadline) {
  std::lock_guard lock(mu_);
  if (closed_) return absl::UnavailableError("server shutting down; retry when it is back");
  if (static_cast<int>(entries_.size()) >= max_open_)
    return absl::ResourceExhaustedError(
        fmt::format("too many open {}: {} already wait ({} is {}); retry later", what_,
                    entries_.size(), limit_key_, max_open_));
  const uint64_t id = next_id_++;
  auto at = deadlines_.emplace(deadline, id);
  const bool earliest = at == deadlines_.begin();
  entries_.emplace(id, Entry{std::move(w), at});
  // The timer sleeps until the earliest deadline: an earlier one wakes it.
  if (earliest) cv_.notify_all();
  return id;
}

void WaitRoom::Leave(uint64_t id) {
  std::shared_ptr<Waiter> last;  // released outside the lock: it may be the waiter's last owner
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return;
    if (it->second.timed) deadlines_.erase(it->second.deadline);
    last = std::move(it->second.waiter);
    entries_.erase(it);
  }
  empty_cv_.notify_all();
}

void WaitRoom::WakeAll() {
  std::vector<std::shared_ptr<Waiter>> all;
  {
    ++wakes_;
    std::lock_guard lock(mu_);
    all.reserve(entries_.size());
    for (auto& [id, e] : entries_) all.push_back(e.waiter);
  }
  for (auto& w : all) w->OnWake();
}

void WaitRoom::Close() {
  std::vector<std::shared_ptr<Waiter>> all;
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    closed_ = true;
    for (auto& [id, e] : entries_) all.push_back(e.waiter);
  }
  for (auto& w : all) w->OnClose();
}

bool WaitRoom::WaitEmpty(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return empty_cv_.wait_for(lock, timeout, [&] { return entries_.empty(); });
}

int WaitRoom::open() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(entries_.size());
}

void WaitRoom::Timer() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    if (deadlines_.empty()) {
      cv_.wait(lock);
      continue;
    }
    const Clock::time_point next = deadlines_.begin()->first;
    if (Clock::now() < next) {
      cv_.wait_until(lock, next);
      continue;
    }
    std::vector<std::shared_ptr<Waiter>> due;
    const Clock::time_point now = Clock::now();
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      Entry& e = entries_.at(deadlines_.begin()->second);
      e.timed = false;
      due.push_back(e.waiter);
      deadlines_.erase(deadlines_.begin());
    }
    lock.unlock();
    for (auto& w : due) w->OnDeadline();
    due.clear();  // before the lock: a waiter's last owner may be here
    lock.lock();
  }
}

}  // namespace kforge::server

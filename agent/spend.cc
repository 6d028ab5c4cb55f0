#include "agent/spend.h"

#include <chrono>
#include <vector>

#include <fmt/format.h>

namespace kforge::agent {
namespace {

int64_t SystemNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class InMemorySpendLog final : public SpendLog {
 public:
  absl::StatusOr<int64_t> Append(const ModelCall& call) override {
    std::lock_guard lock(mu_);
    calls_.push_back(call);
    if (calls_.back().created_unix_ms == 0) calls_.back().created_unix_ms = SystemNowMs();
    return static_cast<int64_t>(calls_.size());
  }
  absl::Status Update(int64_t id, const ModelCall& call) override {
    std::lock_guard lock(mu_);
    if (id < 1 || id > static_cast<int64_t>(calls_.size()))
      return absl::NotFoundError(fmt::format("model call {} not found", id));
    const int64_t created = calls_[id - 1].created_unix_ms;
    calls_[id - 1] = call;
    calls_[id - 1].created_unix_ms = created;
    return absl::OkStatus();
  }
  absl::StatusOr<Spend> Sum(const std::string& job_id, int64_t since) override {
    std::lock_guard lock(mu_);
    Spend s;
    for (const ModelCall& c : calls_) {
      if ((!job_id.empty() && c.job_id != job_id) || c.created_unix_ms < since) continue;
      s.calls++;
      s.tokens += c.prompt_tokens + c.completion_tokens;
      s.cost_usd += c.cost_usd;
    }
    return s;
  }

 private:
  std::mutex mu_;
  std::vector<ModelCall> calls_;
};

}  // namespace

std::unique_ptr<SpendLog> MakeInMemorySpendLog() { return std::make_unique<InMemorySpendLog>(); }

SpendLedger::SpendLedger(SpendLog* log, SpendLedgerOptions options) : log_(log), options_(std::move(options)) {}

int64_t SpendLedger::Now() const { return options_.now_unix_ms ? options_.now_unix_ms() : SystemNowMs(); }

absl::StatusOr<Spend> SpendLedger::Logged(const std::string& job_id) {
  const int64_t since = job_id.empty() && options_.server_window_ms > 0 ? Now() - options_.server_window_ms : 0;
  return log_->Sum(job_id, since);
}

absl::StatusOr<Spend> SpendLedger::Room(const std::string& job_id, const SpendLimits& limits) {
  std::lock_guard lock(mu_);
  Spend room{0, -1, -1};
  auto narrow = [&](const SpendLimits& l, const std::string& who) -> absl::Status {
    if (l.none()) return absl::OkStatus();
    absl::StatusOr<Spend> spent = Logged(who);
    if (!spent.ok()) return spent.status();
    if (l.tokens > 0) {
      const int64_t left = std::max<int64_t>(0, l.tokens - spent->tokens);
      room.tokens = room.tokens < 0 ? left : std::min(room.tokens, left);
    }
    if (l.cost_usd > 0) {
      const double left = std::max(0.0, l.cost_usd - spent->cost_usd);
      room.cost_usd = room.cost_usd < 0 ? left : std::min(room.cost_usd, left);
    }
    return absl::OkStatus();
  };
  if (absl::Status s = narrow(limits, job_id); !s.ok()) return s;
  if (absl::Status s = narrow(options_.server, ""); !s.ok()) return s;
  return room;
}

absl::Status SpendLedger::Check(const SpendLimits& l, const std::string& who, const std::string& label,
                                int64_t tokens, double cost_usd) {
  if (l.none()) return absl::OkStatus();
  absl::StatusOr<Spend> spent = Logged(who);
  if (!spent.ok()) return spent.status();
  if (l.tokens > 0 && spent->tokens + tokens > l.tokens) {
    return absl::ResourceExhaustedError(fmt::format(
        "{}: {} of {} tokens spent or reserved, a request needs up to {}", label, spent->tokens, l.tokens, tokens));
  }
  if (l.cost_usd > 0 && spent->cost_usd + cost_usd > l.cost_usd) {
    return absl::ResourceExhaustedError(fmt::format(
        "{}: ${:.4f} of ${:.4f} spent or reserved, a request may cost up to ${:.4f}", label, spent->cost_usd,
        l.cost_usd, cost_usd));
  }
  return absl::OkStatus();
}

absl::StatusOr<SpendLedger::Reservation> SpendLedger::Reserve(const SpendLimits& limits, int64_t tokens,
                                                              double cost_usd, ModelCall pending) {
  std::lock_guard lock(mu_);
  const std::string& job_id = pending.job_id;
  if (absl::Status s = Check(limits, job_id, fmt::format("job {} budget", job_id.empty() ? "(none)" : job_id),
                             tokens, cost_usd);
      !s.ok())
    return s;
  const std::string window = options_.server_window_ms > 0
                                 ? fmt::format(" (last {} s)", options_.server_window_ms / 1000)
                                 : std::string();
  if (absl::Status s = Check(options_.server, "", "server budget" + window, tokens, cost_usd); !s.ok()) return s;
  // The reservation is a call in the log at its largest size: it counts for
  // every later check, in this process and after a crash.
  pending.outcome = "pending";
  pending.completion_tokens = std::max<int64_t>(0, tokens - pending.prompt_tokens);
  pending.cost_usd = cost_usd;
  if (pending.detail.empty()) pending.detail = "in flight: reserved at its largest size";
  if (pending.created_unix_ms == 0) pending.created_unix_ms = Now();
  absl::StatusOr<int64_t> id = log_->Append(pending);
  if (!id.ok()) return id.status();
  return Reservation{*id, job_id, tokens, cost_usd};
}

absl::Status SpendLedger::Settle(const Reservation& r, const ModelCall& call) {
  std::lock_guard lock(mu_);
  return log_->Update(r.call_id, call);
}

absl::StatusOr<Spend> SpendLedger::JobSpent(const std::string& job_id) {
  std::lock_guard lock(mu_);
  return log_->Sum(job_id, 0);
}

absl::StatusOr<Spend> SpendLedger::ServerSpent() {
  std::lock_guard lock(mu_);
  return Logged("");
}

}  // namespace kforge::agent

// Spend limits on model calls, per job and per server, in tokens and in
// estimated cost, and the record of every call.
//
// Every request to a model first reserves what it could cost at most (the
// prompt, estimated conservatively at 3 bytes a token, plus the completion
// limit times the choices asked for) against the job's limits and the
// server's: the reservation is written to the log as a "pending" call of
// that size, and fails when either limit could be exceeded. When the
// answer (or the error) comes, Settle() rewrites the call with its real
// usage and outcome. Limits therefore hold with requests in flight at once,
// and across a crash: a call that was in flight stays in the log at its
// reserved size. (An endpoint that reports more prompt tokens than the
// estimate can push the spend past a limit by that difference; the
// completion cannot pass its own limit.)
//
// What was spent comes from the SpendLog (the server's store: every call is
// a ModelCallRecord), so limits hold across restarts and across the
// proposers of all jobs of one server. The server limit counts the calls of
// the last `server_window_ms` (0: since the log began).
//
// Thread-safe: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"

namespace kforge::agent {

// Prices per million tokens, as configured (an estimate: providers bill
// cached and reasoning tokens in their own ways).
struct Price {
  double prompt_usd_per_mtok = 0;
  double completion_usd_per_mtok = 0;
  double Cost(int64_t prompt_tokens, int64_t completion_tokens) const {
    return (prompt_tokens * prompt_usd_per_mtok + completion_tokens * completion_usd_per_mtok) / 1e6;
  }
};

struct SpendLimits {
  int64_t tokens = 0;    // 0: no limit
  double cost_usd = 0;   // 0: no limit
  bool none() const { return tokens <= 0 && cost_usd <= 0; }
};

struct Spend {
  int64_t calls = 0;
  int64_t tokens = 0;
  double cost_usd = 0;
};

// One call to a model (mirrors storage's ModelCallRecord, which agent/ does
// not see).
struct ModelCall {
  std::string job_id;
  std::string bucket;
  std::string model;
  std::string purpose;    // "propose" | "repair"
  std::string parent_id;  // the source it was given
  int32_t attempt = 0;
  std::string prompt_hash;
  std::string prompt;
  std::string answer;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  double cost_usd = 0;
  bool usage_estimated = false;
  std::string outcome;    // "pending" | "candidate" | "refused" | "duplicate" | "error" | "dropped"
  std::string detail;
  int64_t created_unix_ms = 0;
};

// Where calls are kept. The server's implementation writes them to the
// store; InMemorySpendLog is for tests and for proposers built without one.
class SpendLog {
 public:
  virtual ~SpendLog() = default;
  // The call's id.
  virtual absl::StatusOr<int64_t> Append(const ModelCall& call) = 0;
  // Rewrites call `id` (its creation time stays).
  virtual absl::Status Update(int64_t id, const ModelCall& call) = 0;
  // Calls of `job_id` (all jobs when "") created at or after `since_unix_ms`.
  virtual absl::StatusOr<Spend> Sum(const std::string& job_id, int64_t since_unix_ms) = 0;
};

std::unique_ptr<SpendLog> MakeInMemorySpendLog();

struct SpendLedgerOptions {
  SpendLimits server;          // over all jobs
  int64_t server_window_ms = 0;  // 0: all calls ever logged
  std::function<int64_t()> now_unix_ms;  // default: the system clock
};

class SpendLedger {
 public:
  struct Reservation {
    int64_t call_id = 0;  // the pending call in the log
    std::string job_id;
    int64_t tokens = 0;
    double cost_usd = 0;
  };

  // `log` must outlive the ledger.
  SpendLedger(SpendLog* log, SpendLedgerOptions options);

  // Reserves `tokens` and `cost_usd` for `pending` (a call of
  // pending.job_id with the job's `limits`), logging it as a "pending" call
  // of that size. ResourceExhausted naming the limit ("job j3 budget: 9800
  // of 10000 tokens spent or reserved, a request needs up to 1200") when
  // the job's or the server's could be exceeded; the log's error when it
  // cannot be read or written.
  absl::StatusOr<Reservation> Reserve(const SpendLimits& limits, int64_t tokens, double cost_usd,
                                      ModelCall pending);

  // What `limits` and the server's leave for one more call of `job_id`,
  // after everything spent and reserved: tokens and cost (each -1 when
  // unlimited). For sizing a request's completion limit.
  absl::StatusOr<Spend> Room(const std::string& job_id, const SpendLimits& limits);

  // Rewrites the reserved call with `call` (its usage and cost as given).
  absl::Status Settle(const Reservation& r, const ModelCall& call);

  // Spent by a job (logged calls only) and by the server (in its window).
  absl::StatusOr<Spend> JobSpent(const std::string& job_id);
  absl::StatusOr<Spend> ServerSpent();

 private:
  absl::StatusOr<Spend> Logged(const std::string& job_id);  // mu_ held
  absl::Status Check(const SpendLimits& l, const std::string& who, const std::string& label, int64_t tokens,
                     double cost_usd);  // mu_ held
  int64_t Now() const;

  SpendLog* log_;
  const SpendLedgerOptions options_;
  // Held across each check and the write of its pending call, so that two
  // reservations cannot both see the room that only one of them fits.
  std::mutex mu_;
};

}  // namespace kforge::agent

// The worker's side of kforge.v1.WorkerService.
//
// ServerClient is the interface the worker loop talks to, in plain structs
// (task.h). GrpcServerClient is its one implementation over gRPC and the only
// code in worker/ that sees a protobuf message; tests may substitute a fake.
//
// Identity: Register returns a Session; every later call sends its token as
// "x-kforge-session" metadata, and the server acts as the worker it names.
//
// Errors: every failed RPC becomes an absl::Status with the gRPC code mapped
// one-to-one (UNAVAILABLE when the server is down or restarting,
// DEADLINE_EXCEEDED, UNAUTHENTICATED for a bad token or a session the
// server does not know, PERMISSION_DENIED or FAILED_PRECONDITION for a
// report without a live lease). The message names the call: "LeaseTask:
// failed to connect to all addresses". Retrying and re-registering is the
// caller's business (worker.h).
//
// Thread-safety: all methods may be called from several threads at once
// (the heartbeat thread and the task loop share one client).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/transport.h"
#include "gpu/usage.h"
#include "worker/task.h"

namespace kforge::worker {

class ServerClient {
 public:
  virtual ~ServerClient() = default;

  // A new session, or, when `previous` is a session the server still
  // knows (and the worker's arch and compile-only flag are unchanged), that
  // session again with the same worker id and leases.
  virtual absl::StatusOr<Session> Register(const Registration& registration,
                                           const std::optional<Session>& previous) = 0;

  // Renews the leases of `task_ids` and tells the server what the GPU is
  // doing (`usage`, when known); returns the ids the server wants stopped
  // (their job was cancelled).
  virtual absl::StatusOr<std::vector<std::string>> Heartbeat(
      const Session& session, const std::vector<std::string>& task_ids,
      const std::optional<gpu::GpuUsage>& usage) = 0;

  // Long poll: waits up to `wait` for a task; nullopt when none came.
  virtual absl::StatusOr<std::optional<TaskSpec>> LeaseTask(const Session& session,
                                                            std::chrono::milliseconds wait) = 0;

  // OK when the server recorded the result. A report the server refuses
  // (the lease ended or is another worker's, a timing below the physical
  // floor, ...) is an error and nothing of it was stored.
  virtual absl::Status ReportResult(const Session& session, const std::string& task_id,
                                    const TaskResult& result) = 0;

  // Cancels the calls in flight (a blocked long poll returns CANCELLED) and
  // makes later calls fail at once. For shutdown; not reversible.
  virtual void Shutdown() = 0;
};

struct GrpcClientOptions {
  std::string target;  // "host:port"
  std::string token;   // sent as "authorization: Bearer <token>"; empty: none
  // TLS (core/transport.h): the CA the server's certificate must chain to,
  // and a client certificate for servers that require one. Empty ca: no
  // TLS (the caller checked that the target allows it).
  ClientTlsPem tls;
  std::chrono::milliseconds call_timeout{10000};  // every call but the long poll
  // The long poll's deadline is its wait plus this much.
  std::chrono::milliseconds long_poll_slack{10000};
  // How soon the channel retries a dropped connection; kept short so a
  // restarted server is found again within seconds.
  std::chrono::milliseconds max_reconnect_backoff{2000};
};

// Creates the channel lazily: constructing never fails or blocks, even when
// the server is down.
std::unique_ptr<ServerClient> MakeGrpcServerClient(const GrpcClientOptions& options);

}  // namespace kforge::worker

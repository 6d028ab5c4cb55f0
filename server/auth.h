// Bearer-token authentication. Client tokens open KernelService, worker
// tokens open WorkerService; health and reflection stay open (see server.cc).
// And worker sessions: the secret Register issues, which says which worker
// a WorkerService call is (a worker token only says it is one of them).
//
// Worker tokens are credentials with a name, their principal: who holds
// the token (one per host, ideally). The server binds every worker to the
// principal of the token that authenticated its Register, never to anything
// the worker declares, and "another worker" for promotions means another
// principal (server/README.md). Entries are "name:token", or a plain
// "token" whose principal is derived from it (DerivedPrincipal).
//
// Policy (decided here, documented in server/README.md): the server refuses
// to start without at least one client token and one worker token unless
// --insecure-no-auth is given, so that forgetting to configure tokens can
// never silently expose the service. With auth disabled every call passes.
//
// Thread-safe: immutable after construction.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kforge::server {

enum class Role { kClient, kWorker };

// One worker credential: the bearer token and the principal it names.
struct WorkerCredential {
  std::string principal;
  std::string token;
};

// A principal name: 1 to 64 of [A-Za-z0-9._-].
bool IsPrincipalName(std::string_view name);
// The principal of a plain (unnamed) token: "token-" and the first 12 hex
// digits of its SHA-256. Stable across restarts and safe to store and log;
// 48 bits of a hash say nothing useful about a long random token.
std::string DerivedPrincipal(std::string_view token);

// Parses worker token entries (ServerOptions::worker_tokens): "name:token"
// (split at the first ':'; a name never has one) or a plain "token" (no
// ':'; principal DerivedPrincipal). INVALID_ARGUMENT naming the entry as
// `what`[i] and what is wrong: an empty entry, name or token; a name that
// is not IsPrincipalName; a name or token that an earlier entry has (one
// principal, one token: a token naming two principals would make identity
// ambiguous; a name with two tokens, two hosts sharing one identity); a
// token that core/transport.h CheckToken refuses (under 32 characters, or
// not printable ASCII). Messages never contain a token.
absl::StatusOr<std::vector<WorkerCredential>> ParseWorkerTokens(
    const std::vector<std::string>& entries, std::string_view what = "worker_tokens");

class Authenticator {
 public:
  Authenticator(std::vector<std::string> client_tokens, std::vector<WorkerCredential> workers,
                bool disabled);

  // `authorization` is the value of the "authorization" metadata, if sent.
  // UNAUTHENTICATED with a message saying what was missing or wrong.
  absl::Status Check(Role role, std::optional<std::string_view> authorization) const;
  // Check(kWorker, ...), and the principal of the worker token presented;
  // "" when auth is disabled (no credential, no principal).
  absl::StatusOr<std::string> WorkerPrincipal(
      std::optional<std::string_view> authorization) const;

  bool disabled() const { return disabled_; }

 private:
  // The index into workers_ of the token, or -1. Checks every entry.
  int FindWorker(std::string_view token) const;

  std::vector<std::string> client_tokens_;
  std::vector<WorkerCredential> workers_;
  bool disabled_;
};

// The metadata key a worker's session travels in.
inline constexpr std::string_view kSessionMetadata = "x-kforge-session";

// A new session secret: "kfs_" and 64 hex digits of a CSPRNG (OpenSSL
// RAND_bytes, 256 bits). INTERNAL when the generator fails.
absl::StatusOr<std::string> NewSessionToken();
// What the store keeps of a session: the SHA-256 hex of its token.
std::string SessionHash(std::string_view token);
// `text` with every session-shaped token ("kfs_" + 64 hex digits) replaced
// by kRedacted: a worker's session must not reach a stored message.
std::string RedactSessions(std::string_view text);

}  // namespace kforge::server

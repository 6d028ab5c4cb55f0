// Bearer-token authentication. Client tokens open KernelService, worker
// tokens open WorkerService; health and reflection stay open (see server.cc).
// And worker sessions: the secret Register issues, which says which worker
// a WorkerService call is (a worker token only says it is one of them).
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

class Authenticator {
 public:
  Authenticator(std::vector<std::string> client_tokens, std::vector<std::string> worker_tokens,
                bool disabled);

  // `authorization` is the value of the "authorization" metadata, if sent.
  // UNAUTHENTICATED with a message saying what was missing or wrong.
  absl::Status Check(Role role, std::optional<std::string_view> authorization) const;

  bool disabled() const { return disabled_; }

 private:
  std::vector<std::string> client_tokens_;
  std::vector<std::string> worker_tokens_;
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

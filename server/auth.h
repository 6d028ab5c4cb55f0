// Bearer-token authentication. Client tokens open KernelService, worker
// tokens open WorkerService; health and reflection stay open (see server.cc).
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

}  // namespace kforge::server

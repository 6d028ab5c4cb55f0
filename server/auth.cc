#include "server/auth.h"

#include <fmt/format.h>

namespace kforge::server {
namespace {

// Compares without an early exit so response timing does not reveal how
// much of a guessed token was right.
bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

bool Contains(const std::vector<std::string>& tokens, std::string_view t) {
  bool found = false;
  for (const auto& k : tokens) found |= ConstantTimeEqual(k, t);
  return found;
}

}  // namespace

Authenticator::Authenticator(std::vector<std::string> client_tokens,
                             std::vector<std::string> worker_tokens, bool disabled)
    : client_tokens_(std::move(client_tokens)),
      worker_tokens_(std::move(worker_tokens)),
      disabled_(disabled) {}

absl::Status Authenticator::Check(Role role, std::optional<std::string_view> authorization) const {
  if (disabled_) return absl::OkStatus();
  const char* service = role == Role::kClient ? "KernelService" : "WorkerService";
  const char* kind = role == Role::kClient ? "client" : "worker";
  if (!authorization || authorization->empty())
    return absl::UnauthenticatedError(fmt::format(
        "missing 'authorization: Bearer <token>' metadata: {} needs a {} token", service, kind));
  constexpr std::string_view kPrefix = "Bearer ";
  if (authorization->size() <= kPrefix.size() ||
      authorization->substr(0, kPrefix.size()) != kPrefix)
    return absl::UnauthenticatedError(fmt::format(
        "authorization metadata is not of the form 'Bearer <token>': {} needs a {} token",
        service, kind));
  const std::string_view token = authorization->substr(kPrefix.size());
  const auto& mine = role == Role::kClient ? client_tokens_ : worker_tokens_;
  if (Contains(mine, token)) return absl::OkStatus();
  const auto& other = role == Role::kClient ? worker_tokens_ : client_tokens_;
  if (Contains(other, token))
    return absl::UnauthenticatedError(
        fmt::format("the bearer token is a {} token: {} needs a {} token",
                    role == Role::kClient ? "worker" : "client", service, kind));
  return absl::UnauthenticatedError(
      fmt::format("the bearer token is not a valid {} token for {}", kind, service));
}

}  // namespace kforge::server

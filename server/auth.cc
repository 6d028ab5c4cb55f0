#include "server/auth.h"

#include <fmt/format.h>
#include <openssl/rand.h>

#include "core/hash.h"
#include "core/redact.h"

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

namespace {
constexpr std::string_view kSessionPrefix = "kfs_";
constexpr size_t kSessionHexDigits = 64;

bool IsHexDigit(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }
}  // namespace

absl::StatusOr<std::string> NewSessionToken() {
  unsigned char bytes[kSessionHexDigits / 2];
  if (RAND_bytes(bytes, sizeof bytes) != 1)
    return absl::InternalError("Register: the random generator failed; no session issued");
  std::string token(kSessionPrefix);
  for (unsigned char b : bytes) token += fmt::format("{:02x}", b);
  return token;
}

std::string SessionHash(std::string_view token) { return Sha256Hex(token); }

std::string RedactSessions(std::string_view text) {
  std::string out;
  size_t at = 0;
  for (size_t hit = text.find(kSessionPrefix); hit != std::string_view::npos;
       hit = text.find(kSessionPrefix, hit + 1)) {
    const size_t digits = hit + kSessionPrefix.size();
    size_t end = digits;
    while (end < text.size() && end - digits < kSessionHexDigits && IsHexDigit(text[end])) ++end;
    if (end - digits < kSessionHexDigits) continue;
    out.append(text.substr(at, hit - at)).append(kRedacted);
    at = end;
    hit = end - 1;
  }
  out.append(text.substr(at));
  return out;
}

}  // namespace kforge::server

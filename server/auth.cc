#include "server/auth.h"

#include <fmt/format.h>
#include <openssl/rand.h>

#include "core/hash.h"
#include "core/transport.h"
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

bool IsPrincipalName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string DerivedPrincipal(std::string_view token) {
  return "token-" + Sha256Hex(token).substr(0, 12);
}

absl::StatusOr<std::vector<WorkerCredential>> ParseWorkerTokens(
    const std::vector<std::string>& entries, std::string_view what) {
  std::vector<WorkerCredential> out;
  for (size_t i = 0; i < entries.size(); ++i) {
    auto bad = [&](std::string_view why) {
      return absl::InvalidArgumentError(fmt::format("{}[{}]: {}", what, i, why));
    };
    const std::string& e = entries[i];
    if (e.empty()) return bad("is empty");
    WorkerCredential c;
    const size_t colon = e.find(':');
    if (colon == std::string::npos) {
      c.token = e;
      c.principal = DerivedPrincipal(e);
    } else {
      c.principal = e.substr(0, colon);
      c.token = e.substr(colon + 1);
      if (c.principal.empty())
        return bad("the name before ':' is empty (write \"name:token\", or the token alone)");
      if (!IsPrincipalName(c.principal))
        return bad(fmt::format(
            "the name before ':' is not 1-64 letters, digits, '.', '_' or '-' (a plain token "
            "must not contain ':')"));
      if (c.token.empty()) return bad(fmt::format("the token after '{}:' is empty", c.principal));
    }
    if (absl::Status s = CheckToken(c.token, fmt::format("the token of '{}'", c.principal));
        !s.ok())
      return bad(std::string(s.message()));
    for (size_t j = 0; j < out.size(); ++j) {
      if (out[j].token == c.token)
        return bad(fmt::format("the token of '{}' is also {}[{}]'s ('{}'): one token names one "
                               "principal",
                               c.principal, what, j, out[j].principal));
      if (out[j].principal == c.principal)
        return bad(fmt::format("the name '{}' is also {}[{}]'s: give each worker host its own "
                               "name and token",
                               c.principal, what, j));
    }
    out.push_back(std::move(c));
  }
  return out;
}

Authenticator::Authenticator(std::vector<std::string> client_tokens,
                             std::vector<WorkerCredential> workers, bool disabled)
    : client_tokens_(std::move(client_tokens)), workers_(std::move(workers)), disabled_(disabled) {}

int Authenticator::FindWorker(std::string_view token) const {
  int found = -1;
  for (size_t i = 0; i < workers_.size(); ++i)
    if (ConstantTimeEqual(workers_[i].token, token)) found = static_cast<int>(i);
  return found;
}

absl::StatusOr<std::string> Authenticator::WorkerPrincipal(
    std::optional<std::string_view> authorization) const {
  if (disabled_) return std::string();
  if (absl::Status s = Check(Role::kWorker, authorization); !s.ok()) return s;
  const int i = FindWorker(authorization->substr(std::string_view("Bearer ").size()));
  if (i < 0) return absl::InternalError("worker token vanished between checks");
  return workers_[i].principal;
}

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
  const bool client = Contains(client_tokens_, token);
  const bool worker = FindWorker(token) >= 0;
  if (role == Role::kClient ? client : worker) return absl::OkStatus();
  if (role == Role::kClient ? worker : client)
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

#include "core/outcome.h"

#include <array>
#include <utility>

namespace kforge {
namespace {
constexpr std::array<std::pair<Outcome, std::string_view>, 6> kNames = {{
    {Outcome::kCompiled, "compiled"},
    {Outcome::kCompileError, "compile_error"},
    {Outcome::kWrong, "wrong"},
    {Outcome::kCrashed, "crashed"},
    {Outcome::kTimeout, "timeout"},
    {Outcome::kVerified, "verified"},
}};
}  // namespace

bool IsFailure(Outcome o) {
  return o == Outcome::kCompileError || o == Outcome::kWrong || o == Outcome::kCrashed ||
         o == Outcome::kTimeout;
}

std::string_view OutcomeName(Outcome o) {
  for (const auto& [v, n] : kNames)
    if (v == o) return n;
  return "unknown";
}

std::optional<Outcome> ParseOutcome(std::string_view name) {
  for (const auto& [v, n] : kNames)
    if (n == name) return v;
  return std::nullopt;
}

}  // namespace kforge

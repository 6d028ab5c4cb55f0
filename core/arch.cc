#include "core/arch.h"

#include <charconv>

#include <fmt/format.h>

#include "core/status.h"

namespace kforge {

absl::StatusOr<Arch> ParseArch(std::string_view arch) {
  if (arch.size() < 4 || arch.substr(0, 3) != "sm_")
    return Invalid("arch", fmt::format("'{}' is not of the form sm_<NN>[a], e.g. sm_90a", Excerpt(arch)));
  std::string_view num = arch.substr(3);
  Arch out;
  if (!num.empty() && num.back() == 'a') {
    out.arch_specific = true;
    num.remove_suffix(1);
  }
  int n = 0;
  auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), n);
  if (num.empty() || ec != std::errc() || end != num.data() + num.size() || n < 70 || n > 200)
    return Invalid("arch", fmt::format("'{}' names no known GPU architecture", Excerpt(arch)));
  out.major = n / 10;
  out.minor = n % 10;
  return out;
}

std::string ArchName(const Arch& arch) {
  return fmt::format("sm_{}{}", arch.number(), arch.arch_specific ? "a" : "");
}

}  // namespace kforge

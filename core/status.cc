#include "core/status.h"

#include <string>

#include <fmt/format.h>

namespace kforge {

absl::Status Invalid(std::string_view field, std::string_view why) {
  return absl::InvalidArgumentError(fmt::format("{}: {}", field, why));
}

}  // namespace kforge

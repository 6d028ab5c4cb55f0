// The INVALID_ARGUMENT status every request check returns: "field: why".
// Callers that nest fields prefix the path themselves ("shape.head_dim: ...").
#pragma once

#include <string_view>

#include "absl/status/status.h"

namespace kforge {

absl::Status Invalid(std::string_view field, std::string_view why);

}  // namespace kforge

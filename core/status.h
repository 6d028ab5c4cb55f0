// The INVALID_ARGUMENT status every request check returns: "field: why".
// Callers that nest fields prefix the path themselves ("shape.head_dim: ...").
// And how an error quotes what it refuses: never the whole input (a 10 MiB
// field must not come back as a 10 MiB message), never bytes that are not
// UTF-8 (a status message is text).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace kforge {

absl::Status Invalid(std::string_view field, std::string_view why);

// Whether `text` is well-formed UTF-8 (no overlong forms, no surrogates,
// nothing above U+10FFFF).
bool IsValidUtf8(std::string_view text);

// `text` with every byte that is not part of valid UTF-8 replaced by '?',
// everything else (control characters included) kept: what a text field on
// the wire may carry, since protobuf refuses a string that is not UTF-8.
std::string ValidUtf8(std::string_view text);

// `text` as an error may quote it: its first `max_bytes` at most, cut
// before a UTF-8 sequence rather than inside one, each byte that is not
// part of valid UTF-8 or is a control character other than tab shown as
// '?', and "... (N bytes)" appended when cut.
std::string Excerpt(std::string_view text, size_t max_bytes = 64);

}  // namespace kforge

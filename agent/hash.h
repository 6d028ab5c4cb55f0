// Content hashes used by the proposers (prompt hashes, source dedupe).
// Thread-safe: pure functions.
#pragma once

#include <string>
#include <string_view>

namespace kforge::agent {

// Lower-case hex SHA-256 of `data`.
std::string Sha256Hex(std::string_view data);

}  // namespace kforge::agent

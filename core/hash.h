// Content hashes. kforge names stored content (kernel sources, cubins,
// prompts) by the SHA-256 of its bytes, so identical content is stored once.
//
// Thread-safe: a pure function.
#pragma once

#include <string>
#include <string_view>

namespace kforge {

// SHA-256 of `data` as 64 lowercase hex digits.
std::string Sha256Hex(std::string_view data);

}  // namespace kforge

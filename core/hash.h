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

// The id of a kernel that is not in the store (the seed defaults the server
// and the runtime build from the catalog): "s-" and 24 hex digits of the
// SHA-256 of its source, manifest and compile options, so the same seed has
// the same id on every server and client and `if_none_match` works for it.
std::string ContentVariantId(std::string_view source, std::string_view manifest_json,
                             std::string_view compile_options);

}  // namespace kforge

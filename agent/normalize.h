// Source normalization: two kernel sources that differ only in comments or
// whitespace compile to the same program, so they are one candidate.
//
// NormalizeSource lexes the source as NVRTC would (translation phases 1-3,
// kernels/source_check.h: line splices, comments, every literal form) and
// writes its tokens one space apart, a directive per line (a directive ends
// at its line, so line breaks there carry meaning). Whitespace inside
// literals is kept. A source the lexer refuses (it would be refused before
// compiling anyway) is normalized by a plain pass that drops whitespace.
//
// Thread-safe: pure functions.
#pragma once

#include <string>
#include <string_view>

namespace kforge::agent {

std::string NormalizeSource(std::string_view source);

// sha256 hex of NormalizeSource(source): the dedupe key (stored with the
// variant, VariantRecord::normalized_hash).
std::string NormalizedSourceHash(std::string_view source);

}  // namespace kforge::agent

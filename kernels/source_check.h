// The preprocessing-aware rules of a variant's source: what a kernel may
// spell, checked on tokens, not on raw text.
//
// Why tokens: NVRTC resolves `#include` after line splicing, digraphs and
// macro expansion, so a regex on the raw text let `%:include`, a splice
// inside the directive name, `#include F` with F a macro, or a string
// literal that confused a comment stripper all reach /proc/self/environ.
// Here the source goes through C++ translation phases 1-3 (lines spliced,
// comments, literals of every prefix including raw strings, pp-numbers,
// punctuators including digraphs), and then:
//   - A directive is `#` or `%:` as the first token of a logical line. Only
//     `#include "kforge/attn_params.h"` (that one string literal, nothing
//     else), define, undef, if, ifdef, ifndef, elif, else, endif, error,
//     warning and an allowlist of pragmas (unroll, nounroll, once,
//     nv_diag_suppress, nv_diag_default) are allowed; every other
//     directive is rejected by name.
//   - Token pasting (`##`, `%:%:`) is rejected. Without it every identifier
//     the compiler sees after preprocessing is spelled in the source, so the
//     identifier rules below cannot be dodged with macros.
//   - Identifiers that reach files or pragmas (`__has_include`,
//     `__has_include_next`, `__has_embed`, `_Pragma`, `__pragma`, `import`)
//     and host code (main, cuda*/cu* API calls, malloc/free/new/delete,
//     printf, exit, system/popen/getenv/..., `std` outside `cuda::std`,
//     `__host__`, `__trap`) are rejected anywhere outside comments and
//     literals; a PTX `trap;` inside string literals too.
//   - Anything a compiler might read two ways is rejected rather than
//     guessed: trigraphs, a backslash followed by spaces before the end of
//     a line, carriage returns, NUL, a line splice inside a raw string,
//     unterminated comments and literals, and stray characters (`\`, `$`,
//     `@`, backtick, any byte outside ASCII) outside comments and literals.
//     Bytes outside ASCII are fine inside comments and literals, where
//     models like to write × and →, and where they cannot form a token.
// Rejections name the physical line and what was found.
//
// Thread-safe: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kforge {

// One preprocessing token after phases 1-3.
struct SourceToken {
  enum class Kind { kIdentifier, kNumber, kCharLiteral, kStringLiteral, kPunctuator };
  Kind kind = Kind::kPunctuator;
  // Spelling after line splicing; literals keep prefix, quotes and suffix.
  std::string text;
  int line = 0;              // physical line (1-based) where it starts
  bool starts_line = false;  // first token of its logical line
  bool space_before = false; // whitespace or a comment before it (for messages)
  // On the same physical line after a /* */ comment that spans lines. NVRTC
  // then takes a `#` for a directive although the standard does not.
  bool after_multiline_comment = false;
  // String literals: the characters between the quotes (a raw string's
  // between its parentheses), escapes unprocessed. Empty otherwise.
  std::string body;
};

// Phases 1-3 of `source`, or InvalidArgument naming the line of whatever
// could be read two ways (see the header comment).
absl::StatusOr<std::vector<SourceToken>> LexSource(std::string_view source);

// The directive and identifier rules over `tokens` (from LexSource).
absl::Status CheckSourceTokens(const std::vector<SourceToken>& tokens);

// LexSource + CheckSourceTokens.
absl::Status CheckSource(std::string_view source);

// Why an identifier is not allowed outside comments and literals, or "" when
// it is. Also used for -D options, whose names and values the source check
// never sees. (`std` needs its context and is checked in CheckSourceTokens.)
std::string ForbiddenIdentifier(std::string_view name);

// True when `tokens` define `extern "C" __global__ ... name(`.
bool DefinesEntryPoint(const std::vector<SourceToken>& tokens, std::string_view name);

}  // namespace kforge

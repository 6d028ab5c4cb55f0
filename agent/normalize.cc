#include "agent/normalize.h"

#include <cctype>

#include "core/hash.h"
#include "kernels/source_check.h"

namespace kforge::agent {

std::string NormalizeSource(std::string_view source) {
  absl::StatusOr<std::vector<SourceToken>> tokens = LexSource(source);
  std::string out;
  if (!tokens.ok()) {
    out.reserve(source.size());
    for (char c : source)
      if (!std::isspace(static_cast<unsigned char>(c))) out.push_back(c);
    return out;
  }
  out.reserve(source.size());
  bool in_directive = false;
  for (const SourceToken& t : *tokens) {
    if (t.starts_line) {
      const bool directive = t.text == "#" || t.text == "%:";
      // A line break only where a directive starts or ends: elsewhere a
      // newline is whitespace like any other.
      if (directive || in_directive) {
        if (!out.empty()) out.push_back('\n');
      } else if (!out.empty()) {
        out.push_back(' ');
      }
      in_directive = directive;
    } else if (!out.empty()) {
      out.push_back(' ');
    }
    out += t.text;
  }
  return out;
}

std::string NormalizedSourceHash(std::string_view source) { return Sha256Hex(NormalizeSource(source)); }

}  // namespace kforge::agent

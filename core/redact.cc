#include "core/redact.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

namespace kforge {
namespace {

bool IsNameChar(char c) {
  return std::isupper(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) ||
         c == '_';
}

// An upper-case NAME that mentions a credential word: its value follows '='.
bool CredentialName(std::string_view name) {
  static constexpr std::string_view kWords[] = {"TOKEN", "SECRET", "PASSWORD", "PASSWD",
                                                "CREDENTIAL", "KEY"};
  for (std::string_view w : kWords) {
    if (name.find(w) != std::string_view::npos) return true;
  }
  return false;
}

// A value ends at white space or a control byte (an environment block's NUL
// separators included), so redacting one entry leaves the next alone.
bool ValueChar(char c) {
  const unsigned char u = static_cast<unsigned char>(c);
  return u > 0x20 && u != 0x7f;
}

// Replaces the value of NAME=value for credential names, and of "Bearer value".
std::string RedactShapes(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  size_t i = 0;
  while (i < in.size()) {
    if (in.compare(i, 7, "Bearer ") == 0) {
      out.append("Bearer ");
      i += 7;
      size_t j = i;
      while (j < in.size() && ValueChar(in[j])) ++j;
      if (j > i) out.append(kRedacted);
      i = j;
      continue;
    }
    if (in[i] == '=' && i > 0) {
      size_t start = i;
      while (start > 0 && IsNameChar(in[start - 1])) --start;
      const std::string_view name = in.substr(start, i - start);
      if (!name.empty() && CredentialName(name)) {
        out.push_back('=');
        size_t j = i + 1;
        while (j < in.size() && ValueChar(in[j])) ++j;
        if (j > i + 1) out.append(kRedacted);
        i = j;
        continue;
      }
    }
    out.push_back(in[i]);
    ++i;
  }
  return out;
}

}  // namespace

std::string Redact(std::string_view text, std::span<const std::string> secrets) {
  std::string s(text);
  for (const std::string& secret : secrets) {
    if (secret.size() < 8) continue;
    for (size_t at = s.find(secret); at != std::string::npos; at = s.find(secret, at)) {
      s.replace(at, secret.size(), kRedacted);
      at += kRedacted.size();
    }
  }
  s = RedactShapes(s);
  for (char& c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 && c != '\n' && c != '\t' && c != '\r') c = '?';
    if (u == 0x7f) c = '?';
  }
  return s;
}

std::string ClipMiddle(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  const size_t half = max_bytes / 2;
  std::string out(text.substr(0, half));
  out += fmt::format("\n... [{} bytes cut] ...\n", text.size() - 2 * half);
  out += text.substr(text.size() - half);
  return out;
}

}  // namespace kforge

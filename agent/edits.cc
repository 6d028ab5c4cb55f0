#include "agent/edits.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

namespace kforge::agent {
namespace {

std::vector<std::string_view> Lines(std::string_view s) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find('\n', pos);
    if (end == std::string_view::npos) end = s.size();
    out.push_back(s.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

std::string_view RightTrim(std::string_view s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::string_view Trim(std::string_view s) {
  s = RightTrim(s);
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  return s;
}

// Marker lines: at least five of the character, then (for the outer ones) the word.
bool IsMarker(std::string_view line, char c, std::string_view word) {
  line = Trim(line);
  size_t n = 0;
  while (n < line.size() && line[n] == c) ++n;
  if (n < 5) return false;
  std::string_view rest = Trim(line.substr(n));
  if (word.empty()) return rest.empty();
  if (rest.size() != word.size()) return false;
  for (size_t i = 0; i < word.size(); ++i)
    if (std::toupper(static_cast<unsigned char>(rest[i])) != word[i]) return false;
  return true;
}

std::string Join(const std::vector<std::string_view>& lines, size_t from, size_t to) {
  std::string out;
  for (size_t i = from; i < to; ++i) {
    out.append(lines[i]);
    out.push_back('\n');
  }
  return out;
}

std::string FirstLine(std::string_view s) {
  s = s.substr(0, s.find('\n'));
  std::string out(Trim(s));
  if (out.size() > 100) out = out.substr(0, 100) + "...";
  return out;
}

// Positions of `needle`'s lines in `hay`'s lines, compared without trailing
// whitespace.
std::vector<size_t> FindLines(const std::vector<std::string_view>& hay,
                              const std::vector<std::string_view>& needle) {
  std::vector<size_t> at;
  if (needle.empty() || needle.size() > hay.size()) return at;
  for (size_t i = 0; i + needle.size() <= hay.size(); ++i) {
    bool match = true;
    for (size_t j = 0; j < needle.size() && match; ++j) match = RightTrim(hay[i + j]) == RightTrim(needle[j]);
    if (match) at.push_back(i);
  }
  return at;
}

}  // namespace

absl::StatusOr<ParsedEdits> ParseEdits(std::string_view text) {
  ParsedEdits out;
  std::vector<std::string_view> lines = Lines(text);
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string_view t = Trim(lines[i]);
    if (out.parent.empty() && t.size() > 7) {
      std::string head(t.substr(0, 7));
      for (char& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (head == "parent:") {
        std::string_view name = Trim(t.substr(7));
        // "parent: `v12`" and "parent: v12." happen.
        while (!name.empty() && (name.front() == '`' || name.front() == '"' || name.front() == '\'')) name.remove_prefix(1);
        while (!name.empty() && (name.back() == '`' || name.back() == '"' || name.back() == '\'' || name.back() == '.'))
          name.remove_suffix(1);
        out.parent = std::string(name);
        continue;
      }
    }
    if (!IsMarker(lines[i], '<', "SEARCH")) continue;
    const size_t number = out.edits.size() + 1;
    size_t mid = i + 1;
    while (mid < lines.size() && !IsMarker(lines[mid], '=', "")) {
      if (IsMarker(lines[mid], '<', "SEARCH") || IsMarker(lines[mid], '>', "REPLACE"))
        return absl::InvalidArgumentError(fmt::format("edit {}: no ======= line between SEARCH and REPLACE", number));
      ++mid;
    }
    if (mid == lines.size())
      return absl::InvalidArgumentError(fmt::format("edit {}: no ======= line (the answer was cut off?)", number));
    size_t end = mid + 1;
    while (end < lines.size() && !IsMarker(lines[end], '>', "REPLACE")) {
      if (IsMarker(lines[end], '<', "SEARCH"))
        return absl::InvalidArgumentError(fmt::format("edit {}: no >>>>>>> REPLACE line", number));
      ++end;
    }
    if (end == lines.size())
      return absl::InvalidArgumentError(fmt::format("edit {}: no >>>>>>> REPLACE line (the answer was cut off?)", number));
    out.edits.push_back(SearchReplace{Join(lines, i + 1, mid), Join(lines, mid + 1, end)});
    i = end;
  }
  return out;
}

absl::StatusOr<std::string> ApplyEdits(std::string_view parent, const std::vector<SearchReplace>& edits) {
  std::string current(parent);
  for (size_t e = 0; e < edits.size(); ++e) {
    const SearchReplace& edit = edits[e];
    std::vector<std::string_view> hay = Lines(current);
    std::vector<std::string_view> needle = Lines(edit.search);
    // Blank lines at either end of a SEARCH text are the model's framing.
    while (!needle.empty() && Trim(needle.front()).empty()) needle.erase(needle.begin());
    while (!needle.empty() && Trim(needle.back()).empty()) needle.pop_back();
    if (needle.empty())
      return absl::InvalidArgumentError(fmt::format("edit {}: the SEARCH text is empty", e + 1));
    std::vector<size_t> at = FindLines(hay, needle);
    if (at.empty()) {
      return absl::InvalidArgumentError(fmt::format(
          "edit {}: the SEARCH text is not in the parent (its first line: \"{}\"); copy the lines exactly",
          e + 1, FirstLine(edit.search)));
    }
    if (at.size() > 1) {
      return absl::InvalidArgumentError(fmt::format(
          "edit {}: the SEARCH text occurs {} times in the parent (its first line: \"{}\"); include more "
          "lines to make it unique",
          e + 1, at.size(), FirstLine(edit.search)));
    }
    std::string next = Join(hay, 0, at[0]);
    next += edit.replace;
    next += Join(hay, at[0] + needle.size(), hay.size());
    // Keep the parent's ending: no newline added where it had none.
    if (!current.empty() && current.back() != '\n' && !next.empty() && next.back() == '\n') next.pop_back();
    current = std::move(next);
  }
  return current;
}

std::string LineDiff(std::string_view a, std::string_view b, size_t max_lines) {
  if (a == b) return "";
  std::vector<std::string_view> x = Lines(a), y = Lines(b);
  // Common prefix and suffix first: kernels differ in a few places, and the
  // quadratic table below is then small.
  size_t pre = 0;
  while (pre < x.size() && pre < y.size() && x[pre] == y[pre]) ++pre;
  size_t suf = 0;
  while (suf < x.size() - pre && suf < y.size() - pre && x[x.size() - 1 - suf] == y[y.size() - 1 - suf]) ++suf;
  const size_t n = x.size() - pre - suf, m = y.size() - pre - suf;
  // ops: ' ' keep, '-' from a, '+' from b; with the line of a or b.
  std::vector<std::pair<char, std::string_view>> ops;
  for (size_t i = 0; i < pre; ++i) ops.push_back({' ', x[i]});
  if (n * m <= 4'000'000) {
    std::vector<std::vector<uint32_t>> lcs(n + 1, std::vector<uint32_t>(m + 1, 0));
    for (size_t i = n; i-- > 0;)
      for (size_t j = m; j-- > 0;)
        lcs[i][j] = x[pre + i] == y[pre + j] ? lcs[i + 1][j + 1] + 1 : std::max(lcs[i + 1][j], lcs[i][j + 1]);
    size_t i = 0, j = 0;
    while (i < n || j < m) {
      if (i < n && j < m && x[pre + i] == y[pre + j]) {
        ops.push_back({' ', x[pre + i]});
        ++i, ++j;
      } else if (i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1])) {
        ops.push_back({'-', x[pre + i++]});
      } else {
        ops.push_back({'+', y[pre + j++]});
      }
    }
  } else {
    // Too different to align cheaply: all of one out, all of the other in.
    for (size_t i = 0; i < n; ++i) ops.push_back({'-', x[pre + i]});
    for (size_t j = 0; j < m; ++j) ops.push_back({'+', y[pre + j]});
  }
  for (size_t i = x.size() - suf; i < x.size(); ++i) ops.push_back({' ', x[i]});

  // Hunks with 3 lines of context.
  constexpr size_t kContext = 3;
  std::string out;
  size_t lines = 0;
  size_t k = 0;
  while (k < ops.size()) {
    while (k < ops.size() && ops[k].first == ' ') ++k;
    if (k == ops.size()) break;
    size_t start = k >= kContext ? k - kContext : 0;
    size_t end = k;
    size_t quiet = 0;
    while (end < ops.size() && quiet <= 2 * kContext) {
      quiet = ops[end].first == ' ' ? quiet + 1 : 0;
      ++end;
    }
    end = std::min(ops.size(), end - (quiet > kContext ? quiet - kContext : 0));
    // Line numbers of the hunk in a and b.
    size_t la = 1, lb = 1;
    for (size_t i = 0; i < start; ++i) {
      if (ops[i].first != '+') ++la;
      if (ops[i].first != '-') ++lb;
    }
    size_t ca = 0, cb = 0;
    for (size_t i = start; i < end; ++i) {
      if (ops[i].first != '+') ++ca;
      if (ops[i].first != '-') ++cb;
    }
    out += fmt::format("@@ -{},{} +{},{} @@\n", la, ca, lb, cb);
    for (size_t i = start; i < end; ++i) {
      if (++lines > max_lines) {
        out += fmt::format("... [diff cut at {} lines]\n", max_lines);
        return out;
      }
      out.push_back(ops[i].first);
      out.append(ops[i].second);
      out.push_back('\n');
    }
    k = end;
  }
  return out;
}

}  // namespace kforge::agent

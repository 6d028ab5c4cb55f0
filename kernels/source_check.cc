#include "kernels/source_check.h"

#include <algorithm>
#include <array>
#include <set>

#include <fmt/format.h>

namespace kforge {
namespace {

using Kind = SourceToken::Kind;

absl::Status Reject(int line, const std::string& what) {
  return absl::InvalidArgumentError(fmt::format("source: line {}: {}", line, what));
}

bool IsIdentStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsIdentChar(char c) { return IsIdentStart(c) || IsDigit(c); }

// A byte as the message shows it: printable ASCII as itself, else hex.
std::string ShowByte(char c) {
  const unsigned char u = static_cast<unsigned char>(c);
  if (u >= 0x21 && u < 0x7f) return fmt::format("'{}'", c);
  return fmt::format("byte 0x{:02x}", u);
}

// ------------------------------------------------------ phases 1 and 2 ---

// The source with its line splices removed, the physical line of every
// character, and where the splices were (positions in `text`).
struct Spliced {
  std::string text;
  std::vector<int> line;         // line[i]: physical line of text[i]; one more entry at the end
  std::vector<size_t> splices;   // ascending
};

absl::StatusOr<Spliced> Splice(std::string_view src) {
  Spliced out;
  out.text.reserve(src.size());
  out.line.reserve(src.size() + 1);
  int line = 1;
  for (size_t i = 0; i < src.size(); ++i) {
    const char c = src[i];
    if (c == '\0') return Reject(line, "a NUL byte (NVRTC would stop reading there)");
    if (c == '\r') {
      return Reject(line, "a carriage return: sources use \\n line endings (compilers differ on "
                          "what a lone \\r or a backslash before \\r\\n means)");
    }
    if (c == '?' && i + 2 < src.size() && src[i + 1] == '?' &&
        std::string_view("=/'()!<>-").find(src[i + 2]) != std::string_view::npos) {
      return Reject(line, fmt::format("trigraph ??{} (trigraphs are not allowed: some "
                                      "compilers still replace them)",
                                      src[i + 2]));
    }
    if (c == '\\') {
      size_t j = i + 1;
      while (j < src.size() && (src[j] == ' ' || src[j] == '\t' || src[j] == '\v' || src[j] == '\f'))
        ++j;
      if (j < src.size() && src[j] == '\n') {
        if (j > i + 1) {
          return Reject(line, "a backslash followed by spaces at the end of the line (compilers "
                              "disagree on whether that splices lines)");
        }
        out.splices.push_back(out.text.size());
        ++line;
        i = j;
        continue;
      }
    }
    out.text.push_back(c);
    out.line.push_back(line);
    if (c == '\n') ++line;
  }
  out.line.push_back(line);
  return out;
}

// --------------------------------------------------------------- phase 3 ---

// Longest first within each length, so the first match is the longest.
constexpr std::array<std::string_view, 1> kPunct4 = {"%:%:"};
constexpr std::array<std::string_view, 5> kPunct3 = {"...", "<<=", ">>=", "->*", "<=>"};
constexpr std::array<std::string_view, 27> kPunct2 = {
    ".*", "##", "<:", ":>", "<%", "%>", "%:", "::", "->", "++", "--", "<<", ">>", "<=",
    ">=", "==", "!=", "&&", "||", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^="};
constexpr std::string_view kPunct1 = "{}[]#()<>%:;.?*+-/^&|~!=,";

size_t PunctuatorLength(std::string_view rest) {
  // C++11 [lex.pptoken]: "<::" not followed by ':' or '>' is "<" "::".
  if (rest.starts_with("<::") && (rest.size() < 4 || (rest[3] != ':' && rest[3] != '>'))) return 1;
  for (std::string_view p : kPunct4)
    if (rest.starts_with(p)) return p.size();
  for (std::string_view p : kPunct3)
    if (rest.starts_with(p)) return p.size();
  for (std::string_view p : kPunct2)
    if (rest.starts_with(p)) return p.size();
  if (!rest.empty() && kPunct1.find(rest[0]) != std::string_view::npos) return 1;
  return 0;
}

bool IsEncodingPrefix(std::string_view id) {
  return id == "u8" || id == "u" || id == "U" || id == "L";
}
bool IsRawPrefix(std::string_view id) {
  return id == "R" || id == "u8R" || id == "uR" || id == "UR" || id == "LR";
}

class Lexer {
 public:
  explicit Lexer(const Spliced& s) : s_(s), t_(s.text) {}

  absl::StatusOr<std::vector<SourceToken>> Run() {
    bool line_start = true;
    bool space = false;
    bool multiline_comment = false;
    while (pos_ < t_.size()) {
      const char c = t_[pos_];
      if (c == '\n') {
        line_start = true;
        space = true;
        multiline_comment = false;
        ++pos_;
        continue;
      }
      if (c == ' ' || c == '\t') {
        space = true;
        ++pos_;
        continue;
      }
      if (c == '/' && Peek(1) == '/') {
        while (pos_ < t_.size() && t_[pos_] != '\n') ++pos_;
        continue;
      }
      if (c == '/' && Peek(1) == '*') {
        // Newlines inside the comment do not end the logical line: phase 3
        // makes the whole comment one space.
        const size_t end = t_.find("*/", pos_ + 2);
        if (end == std::string::npos) return Reject(Line(pos_), "unterminated /* comment");
        if (t_.find('\n', pos_) < end) multiline_comment = true;
        pos_ = end + 2;
        space = true;
        continue;
      }
      const size_t start = pos_;
      absl::Status s = Token();
      if (!s.ok()) return s;
      tokens_.back().line = Line(start);
      tokens_.back().starts_line = line_start;
      tokens_.back().space_before = space;
      tokens_.back().after_multiline_comment = multiline_comment;
      line_start = false;
      space = false;
      multiline_comment = false;
    }
    return std::move(tokens_);
  }

 private:
  char Peek(size_t ahead) const {
    return pos_ + ahead < t_.size() ? t_[pos_ + ahead] : '\0';
  }
  int Line(size_t at) const { return s_.line[std::min(at, s_.line.size() - 1)]; }

  void Emit(Kind kind, size_t start, std::string body = "") {
    tokens_.push_back(SourceToken{.kind = kind,
                                  .text = t_.substr(start, pos_ - start),
                                  .body = std::move(body)});
  }

  absl::Status Token() {
    const size_t start = pos_;
    const char c = t_[pos_];
    if (IsIdentStart(c)) {
      while (pos_ < t_.size() && IsIdentChar(t_[pos_])) ++pos_;
      const std::string_view id(t_.data() + start, pos_ - start);
      if (pos_ < t_.size() && t_[pos_] == '"' && IsRawPrefix(id)) return RawString(start);
      if (pos_ < t_.size() && (t_[pos_] == '"' || t_[pos_] == '\'') && IsEncodingPrefix(id))
        return Quoted(start, t_[pos_]);
      Emit(Kind::kIdentifier, start);
      return absl::OkStatus();
    }
    if (IsDigit(c) || (c == '.' && IsDigit(Peek(1)))) {
      Number();
      Emit(Kind::kNumber, start);
      return absl::OkStatus();
    }
    if (c == '"' || c == '\'') return Quoted(start, c);
    if (size_t n = PunctuatorLength(std::string_view(t_).substr(pos_)); n > 0) {
      pos_ += n;
      Emit(Kind::kPunctuator, start);
      return absl::OkStatus();
    }
    return Reject(Line(pos_), fmt::format("{} outside a comment or literal", ShowByte(c)));
  }

  // pp-number: digit or .digit, then digits, identifier characters, '.',
  // e+ e- E+ E- p+ p- P+ P-, and ' before a digit or identifier character
  // (digit separators: without them 1'000 would open a character literal).
  void Number() {
    ++pos_;
    while (pos_ < t_.size()) {
      const char c = t_[pos_];
      if ((c == 'e' || c == 'E' || c == 'p' || c == 'P') && (Peek(1) == '+' || Peek(1) == '-')) {
        pos_ += 2;
      } else if (IsIdentChar(c) || c == '.') {
        ++pos_;
      } else if (c == '\'' && IsIdentChar(Peek(1))) {
        pos_ += 2;
      } else {
        break;
      }
    }
  }

  void Suffix() {  // a user-defined-literal suffix belongs to the literal
    while (pos_ < t_.size() && IsIdentChar(t_[pos_])) ++pos_;
  }

  // "..." or '...' (pos_ at the quote), escapes skipped, then a suffix.
  absl::Status Quoted(size_t start, char quote) {
    const char* what = quote == '"' ? "string literal" : "character literal";
    ++pos_;
    const size_t body_start = pos_;
    while (true) {
      if (pos_ >= t_.size() || t_[pos_] == '\n') {
        return Reject(Line(start), fmt::format("unterminated {}", what));
      }
      const char c = t_[pos_];
      if (c == '\\') {
        if (pos_ + 1 >= t_.size() || t_[pos_ + 1] == '\n')
          return Reject(Line(start), fmt::format("unterminated {}", what));
        pos_ += 2;
        continue;
      }
      if (c == quote) break;
      ++pos_;
    }
    std::string body = t_.substr(body_start, pos_ - body_start);
    ++pos_;
    Suffix();
    Emit(quote == '"' ? Kind::kStringLiteral : Kind::kCharLiteral, start,
         quote == '"' ? std::move(body) : "");
    return absl::OkStatus();
  }

  // R"delim( ... )delim" (pos_ at the quote). Phase 2 is undone inside a raw
  // string, so a splice there would mean one thing to us and perhaps
  // another to the compiler: rejected.
  absl::Status RawString(size_t start) {
    ++pos_;
    const size_t delim_start = pos_;
    while (pos_ < t_.size() && t_[pos_] != '(') {
      const char c = t_[pos_];
      if (c == ' ' || c == ')' || c == '\\' || c == '\t' || c == '\v' || c == '\f' || c == '\n' ||
          pos_ - delim_start >= 16) {
        return Reject(Line(start), "malformed raw string delimiter");
      }
      ++pos_;
    }
    if (pos_ >= t_.size()) return Reject(Line(start), "unterminated raw string literal");
    const std::string close = ")" + t_.substr(delim_start, pos_ - delim_start) + "\"";
    const size_t body_start = pos_ + 1;
    const size_t end = t_.find(close, body_start);
    if (end == std::string::npos) return Reject(Line(start), "unterminated raw string literal");
    pos_ = end + close.size();
    auto splice = std::lower_bound(s_.splices.begin(), s_.splices.end(), start + 1);
    if (splice != s_.splices.end() && *splice < pos_) {
      return Reject(Line(start), "a line splice (backslash-newline) inside a raw string literal");
    }
    std::string body = t_.substr(body_start, end - body_start);
    Suffix();
    Emit(Kind::kStringLiteral, start, std::move(body));
    return absl::OkStatus();
  }

  const Spliced& s_;
  const std::string& t_;
  size_t pos_ = 0;
  std::vector<SourceToken> tokens_;
};

// ------------------------------------------------------------- phase 4 ---

bool IsHash(const SourceToken& t) {
  return t.kind == Kind::kPunctuator && (t.text == "#" || t.text == "%:");
}
bool IsPaste(const SourceToken& t) {
  return t.kind == Kind::kPunctuator && (t.text == "##" || t.text == "%:%:");
}
bool Is(const SourceToken& t, std::string_view text) { return t.text == text; }

// The tokens of a directive line as the message shows them, clipped.
std::string Spell(const std::vector<SourceToken>& tokens, size_t begin, size_t end) {
  std::string s;
  for (size_t i = begin; i < end; ++i) {
    if (i > begin && tokens[i].space_before) s += ' ';
    s += tokens[i].text;
    if (s.size() > 100) {
      s.resize(100);
      s += "...";
      break;
    }
  }
  return s;
}

// Operands of `#pragma unroll`: an integral constant expression, which may
// name macros (the seeds write `#pragma unroll UNROLL`).
bool UnrollOperand(const SourceToken& t) {
  static const std::set<std::string, std::less<>> kOps = {
      "(", ")", "+", "-", "*", "/", "%", "<<", ">>", "<", ">", "<=", ">=", "==",
      "!=", "&", "|", "^", "~", "!", "&&", "||", "?", ":"};
  return t.kind == Kind::kIdentifier || t.kind == Kind::kNumber ||
         (t.kind == Kind::kPunctuator && kOps.count(t.text) != 0);
}
bool DiagOperand(const SourceToken& t) {
  return t.kind == Kind::kIdentifier || t.kind == Kind::kNumber || Is(t, ",") || Is(t, "=");
}

// `args` are the tokens after the pragma's name.
absl::Status CheckPragma(const std::vector<SourceToken>& tokens, size_t hash, size_t name,
                         size_t end) {
  const int line = tokens[hash].line;
  const std::string spelled = Spell(tokens, hash, end);
  if (name >= end || tokens[name].kind != Kind::kIdentifier) {
    return Reject(line, fmt::format("`{}`: an empty or unnamed #pragma is not allowed", spelled));
  }
  const std::string& p = tokens[name].text;
  bool (*operand)(const SourceToken&) = nullptr;
  if (p == "unroll") operand = UnrollOperand;
  else if (p == "nv_diag_suppress" || p == "nv_diag_default") operand = DiagOperand;
  else if (p == "nounroll" || p == "once") operand = [](const SourceToken&) { return false; };
  if (operand == nullptr) {
    return Reject(line, fmt::format("`{}`: #pragma {} is not allowed (allowed: unroll, nounroll, "
                                    "once, nv_diag_suppress, nv_diag_default)",
                                    spelled, p));
  }
  for (size_t i = name + 1; i < end; ++i) {
    if (!operand(tokens[i])) {
      return Reject(line, fmt::format("`{}`: \"{}\" is not allowed in #pragma {}", spelled,
                                      tokens[i].text, p));
    }
  }
  return absl::OkStatus();
}

// One directive: tokens[hash] is its `#`, tokens [hash+1, end) the rest.
absl::Status CheckDirective(const std::vector<SourceToken>& tokens, size_t hash, size_t end) {
  const int line = tokens[hash].line;
  if (hash + 1 == end) return absl::OkStatus();  // the null directive
  const SourceToken& name = tokens[hash + 1];
  const std::string spelled = Spell(tokens, hash, end);
  if (name.kind != Kind::kIdentifier) {
    return Reject(line, fmt::format("`{}` is not an allowed directive", spelled));
  }
  const std::string& d = name.text;
  if (d == "include") {
    if (end == hash + 3 && tokens[hash + 2].text == "\"kforge/attn_params.h\"") {
      return absl::OkStatus();
    }
    return Reject(line, fmt::format("`{}` is not allowed: the only include is #include "
                                    "\"kforge/attn_params.h\", spelled exactly so",
                                    spelled));
  }
  if (d == "define" || d == "undef" || d == "ifdef" || d == "ifndef") {
    if (end == hash + 2 || tokens[hash + 2].kind != Kind::kIdentifier) {
      return Reject(line, fmt::format("`{}`: #{} needs a macro name", spelled, d));
    }
    return absl::OkStatus();
  }
  if (d == "if" || d == "elif" || d == "else" || d == "endif" || d == "error" || d == "warning") {
    return absl::OkStatus();
  }
  if (d == "pragma") return CheckPragma(tokens, hash, hash + 2, end);
  return Reject(line, fmt::format("`{}`: #{} is not allowed (allowed directives: #include "
                                  "\"kforge/attn_params.h\", define, undef, if, ifdef, ifndef, "
                                  "elif, else, endif, pragma, error, warning)",
                                  spelled, d));
}

// A PTX trap or breakpoint in the joined bodies of adjacent string literals.
bool HasPtxTrap(std::string_view text) {
  for (std::string_view word : {std::string_view("trap"), std::string_view("brkpt")}) {
    for (size_t at = text.find(word); at != std::string_view::npos; at = text.find(word, at + 1)) {
      if (at > 0 && (IsIdentChar(text[at - 1]) || text[at - 1] == '.')) continue;
      size_t j = at + word.size();
      while (j < text.size() && (text[j] == ' ' || text[j] == '\t')) ++j;
      if (j < text.size() && text[j] == ';') return true;
    }
  }
  return false;
}

}  // namespace

std::string ForbiddenIdentifier(std::string_view id) {
  static const std::set<std::string, std::less<>> kFiles = {
      "__has_include", "__has_include_next", "__has_embed", "_Pragma", "__pragma", "import"};
  static const std::set<std::string, std::less<>> kHost = {
      "main",   "printf", "vprintf", "fprintf", "puts",   "malloc", "calloc", "realloc",
      "free",   "new",    "delete",  "exit",    "system", "popen",  "fopen",  "fork",
      "execl",  "execle", "execlp",  "execv",   "execve", "execvp", "dlopen", "getenv",
      "socket", "__host__", "__trap", "__brkpt", "__assertfail"};
  if (kFiles.count(id) != 0) {
    return fmt::format("\"{}\" is not allowed: it makes the preprocessor look at files or run "
                       "pragmas the source check cannot see",
                       id);
  }
  if (kHost.count(id) != 0) {
    return fmt::format("\"{}\" is not allowed (host code, printf, allocation or trap): device "
                       "code only",
                       id);
  }
  // The CUDA runtime (cudaMalloc, cudaDeviceSynchronize) and driver
  // (cuMemAlloc, cuLaunchKernel) APIs, device-side ones included.
  const bool runtime = id.starts_with("cuda") && id.size() > 4 && id[4] >= 'A' && id[4] <= 'Z';
  const bool driver = id.starts_with("cu") && id.size() > 2 && id[2] >= 'A' && id[2] <= 'Z';
  if (runtime || driver) {
    return fmt::format("\"{}\" is not allowed: CUDA API calls are host code", id);
  }
  return "";
}

absl::StatusOr<std::vector<SourceToken>> LexSource(std::string_view source) {
  absl::StatusOr<Spliced> spliced = Splice(source);
  if (!spliced.ok()) return spliced.status();
  return Lexer(*spliced).Run();
}

absl::Status CheckSourceTokens(const std::vector<SourceToken>& tokens) {
  // Directives first: each runs from its `#` to the next logical line.
  std::vector<bool> in_define(tokens.size(), false);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!tokens[i].starts_line || !IsHash(tokens[i])) continue;
    size_t end = i + 1;
    while (end < tokens.size() && !tokens[end].starts_line) ++end;
    if (absl::Status s = CheckDirective(tokens, i, end); !s.ok()) return s;
    if (i + 1 < end && tokens[i + 1].text == "define") {
      std::fill(in_define.begin() + static_cast<ptrdiff_t>(i) + 2,
                in_define.begin() + static_cast<ptrdiff_t>(end), true);
    }
  }
  std::string joined;  // bodies of the current run of adjacent string literals
  int joined_line = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const SourceToken& t = tokens[i];
    if (t.kind == Kind::kStringLiteral) {
      if (joined.empty()) joined_line = t.line;
      joined += t.body;
      const bool run_ends = i + 1 == tokens.size() || tokens[i + 1].kind != Kind::kStringLiteral;
      if (run_ends && HasPtxTrap(joined)) {
        return Reject(joined_line, "a PTX trap or brkpt instruction is not allowed");
      }
      if (run_ends) joined.clear();
      continue;
    }
    if (IsPaste(t)) {
      return Reject(t.line, fmt::format("token pasting ({}) is not allowed: every identifier must "
                                        "be spelled in the source",
                                        t.text));
    }
    if (IsHash(t) && !t.starts_line && (!in_define[i] || t.after_multiline_comment)) {
      return Reject(t.line, fmt::format("\"{}\" that does not start a line (a directive must be "
                                        "the first token of its line, not follow a comment that "
                                        "spans lines)",
                                        t.text));
    }
    if (t.kind != Kind::kIdentifier) continue;
    if (std::string why = ForbiddenIdentifier(t.text); !why.empty()) return Reject(t.line, why);
    // The host standard library; libcu++'s cuda::std is device code.
    if (t.text == "std" && !(i >= 2 && Is(tokens[i - 1], "::") && Is(tokens[i - 2], "cuda"))) {
      return Reject(t.line, "uses the host standard library (std::); device code only "
                            "(cuda::std is fine)");
    }
    // C++20 modules: `module` or `export module` starting a line is a
    // directive without a `#`.
    auto line_first = [](const SourceToken& x) { return x.starts_line || x.after_multiline_comment; };
    if (t.text == "module" &&
        (line_first(t) || (i >= 1 && line_first(tokens[i - 1]) && Is(tokens[i - 1], "export")))) {
      return Reject(t.line, "a module declaration is not allowed");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSource(std::string_view source) {
  absl::StatusOr<std::vector<SourceToken>> tokens = LexSource(source);
  if (!tokens.ok()) return tokens.status();
  return CheckSourceTokens(*tokens);
}

bool DefinesEntryPoint(const std::vector<SourceToken>& tokens, std::string_view name) {
  for (size_t i = 0; i + 2 < tokens.size(); ++i) {
    if (!Is(tokens[i], "extern") || !Is(tokens[i + 1], "\"C\"") || !Is(tokens[i + 2], "__global__"))
      continue;
    for (size_t j = i + 3; j + 1 < tokens.size() && !Is(tokens[j], ";") && !Is(tokens[j], "{");
         ++j) {
      if (tokens[j].kind == Kind::kIdentifier && tokens[j].text == name && Is(tokens[j + 1], "("))
        return true;
    }
  }
  return false;
}

}  // namespace kforge

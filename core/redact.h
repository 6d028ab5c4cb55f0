// Redaction: what kforge does to any text that came near candidate code (a
// compile log, a child's output, a crash message) before it is stored,
// logged, shown to a client or sent to a model.
//
// A hostile kernel source once made NVRTC print the worker's environment into
// its compile log, tokens included. The compile path no longer reads files,
// but text from a sandbox is still treated as possibly carrying secrets:
//   - every known secret (the tokens the process holds) is replaced wherever
//     it appears;
//   - anything shaped like a credential is replaced too: the value of an
//     environment-style assignment whose name mentions TOKEN, SECRET,
//     PASSWORD, PASSWD, CREDENTIAL or KEY, and what follows "Bearer ";
//   - NUL and other control bytes (but tab and newline) become '?', so an
//     environment block read as text cannot smuggle its separators through.
//
// Thread-safe: pure functions.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace kforge {

inline constexpr std::string_view kRedacted = "[redacted]";

// `text` with the secrets and credential-shaped values replaced by
// kRedacted. Empty secrets and secrets shorter than 8 bytes are ignored
// (they would match everywhere and are no credential).
std::string Redact(std::string_view text, std::span<const std::string> secrets = {});

// Keeps the head and the tail of a long text (compile logs put resources
// first and errors anywhere), with a note of how much was cut between them.
// The result is at most max_bytes + 48 bytes.
std::string ClipMiddle(std::string_view text, size_t max_bytes);

}  // namespace kforge

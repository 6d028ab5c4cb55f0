// Static checks on a variant before anything is compiled or launched.
//
// CheckVariant rejects variants that cannot work on the target arch or shape
// with a reason naming the offending field, so a proposer gets feedback
// without spending GPU time. It is deliberately conservative: passing it
// does not mean the variant is correct, only that it is not impossible.
//
// Thread-safe: pure function.
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "core/shape.h"
#include "kernels/source_check.h"
#include "kernels/manifest.h"

namespace kforge {

// Largest variant source accepted (bytes).
inline constexpr size_t kMaxVariantSourceBytes = 256 * 1024;

// Checks, in order: source size; the source rules of source_check.h
// (directives, includes, token pasting, host code, on the tokens of
// translation phases 1-3); the entry point is defined as extern "C"
// __global__; manifest threads (multiple of 32, 32..1024), shared memory
// against the arch limit, arch listed in manifest.archs, every feature
// available on the arch; shape: op listed, head dim listed, causal/noncausal
// and GQA supported, batch <= 65535 for the per_tile grid, deterministic
// (manifest) when the shape asks for it.
// Returns InvalidArgument with the reason, e.g.
//   "dynamic_smem_bytes: 180224 exceeds sm_80's limit of 166912".
absl::Status CheckVariant(std::string_view source, const Manifest& manifest,
                          std::string_view arch, const ShapeKey& shape);

// Checks a variant's own NVRTC options (VariantSource.compile_options,
// separated by whitespace), which come from wherever the variant came from
// and so are as untrusted as its source. Allowed: code-generation flags that
// read nothing and change no target: -use_fast_math, --fmad=, --ftz=,
// --prec-div=, --prec-sqrt= (true|false), -maxrregcount=N (1..255),
// --extra-device-vectorization, -lineinfo / --generate-line-info,
// -restrict, and -DNAME[=VALUE] / --define-macro= with NAME an identifier
// that is not reserved and VALUE a number or identifier, both passing the
// source check's identifier rules (the source check never sees them).
// Single- and double-dash spellings are both accepted. Everything else is
// rejected: include paths and pre-includes by name (they read files), -arch
// (the worker picks the target), -rdc (device linking), and anything unknown.
// Returns InvalidArgument naming the option, e.g.
//   "compile options: -I/x is not allowed: include paths read files".
absl::Status CheckCompileOptions(std::string_view options);

}  // namespace kforge

// Outcome of evaluating one kernel variant on one GPU. A candidate that fails
// to compile, is wrong, crashes or hangs is a result to record, not an error.
#pragma once

#include <optional>
#include <string_view>

namespace kforge {

enum class Outcome {
  kCompiled,      // compiled; not (yet) run: compile-only workers stop here
  kCompileError,  // NVRTC or a static check rejected it; the log says why
  kWrong,         // ran, but an output differed from the reference
  kCrashed,       // illegal address, trap, launch failure: the child died
  kTimeout,       // the watchdog killed it
  kVerified,      // every check passed; timing is meaningful
};

// The candidate ran into a wall: it did not compile, was wrong, crashed or
// hung. kCompiled and kVerified are not failures.
bool IsFailure(Outcome o);

std::string_view OutcomeName(Outcome o);  // "compiled", "compile_error", ...
std::optional<Outcome> ParseOutcome(std::string_view name);

}  // namespace kforge

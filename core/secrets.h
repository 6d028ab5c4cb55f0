// Keeping a process's own credentials out of reach of the code it runs.
//
// A token given on the command line or in the environment stays in the
// memory that /proc/<pid>/cmdline and /proc/<pid>/environ show: to every
// process of the same user (children running candidate code included) and
// to root. kforge-worker (and any binary that holds a token) therefore:
//   - takes the token from a file (ReadTokenFile) when it can;
//   - otherwise overwrites it in its argument and environment memory in
//     place once it has a copy (ScrubFromProcessMemory) and unsets the
//     variables (TakeSecretEnvironment), so those files no longer show it;
//   - makes itself non-dumpable (MakeUndumpable): no core dump holds the
//     token, and processes of the same user that are not root can neither
//     ptrace it nor read its /proc files.
// Call these early in main(), before any thread starts: they read and write
// the environment.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kforge {

// The token in `path`: its first line without surrounding whitespace.
// NotFound / PermissionDenied when it cannot be read, InvalidArgument when
// that line is empty.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// True for kforge's credential variables: KFORGE_ names that mention TOKEN.
bool IsKforgeTokenVariable(std::string_view name);

// For every environment variable whose name `is_secret` accepts: its name
// and value (returned, in environment order), then the value overwritten in
// place and the variable unset.
std::vector<std::pair<std::string, std::string>> TakeSecretEnvironment(
    const std::function<bool(std::string_view name)>& is_secret);

// Overwrites every occurrence of `secret` (when 4 bytes or longer) with '*'
// in argv[0..argc) and in this process's initial argument and environment
// memory, which /proc/self/cmdline and /proc/self/environ show.
void ScrubFromProcessMemory(int argc, char** argv, std::string_view secret);

// prctl(PR_SET_DUMPABLE, 0).
absl::Status MakeUndumpable();

}  // namespace kforge

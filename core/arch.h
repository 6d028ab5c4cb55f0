// GPU architecture names, parsed in one place. A name is "sm_" followed by
// major*10+minor (sm_80, sm_89, sm_100, sm_120), with "a" for the
// architecture-specific targets that enable wgmma/setmaxnreg (sm_90a) and
// tcgen05 (sm_100a). Everything that looks inside an arch string uses
// ParseArch; code that only compares whole names ("sm_90a") need not.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kforge {

struct Arch {
  int major = 0;               // sm_90a: 9; sm_100a: 10; sm_120: 12
  int minor = 0;               // sm_90a: 0; sm_89: 9; sm_103: 3
  bool arch_specific = false;  // the "a" suffix

  int number() const { return major * 10 + minor; }  // sm_90a: 90
};

// INVALID_ARGUMENT ("arch: ...") unless `arch` is "sm_<NN>[a]" with NN a
// known range (70 to 200).
absl::StatusOr<Arch> ParseArch(std::string_view arch);

// The name ParseArch reads back: {9, 0, true} -> "sm_90a".
std::string ArchName(const Arch& arch);

}  // namespace kforge

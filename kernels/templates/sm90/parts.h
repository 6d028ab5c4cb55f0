// The shared parts of the Hopper (sm_90a) templates, kernels/templates/sm90/
// (kernels/notes/parts.md), as the embedded texts a template's build()
// assembles its source from. NVRTC sees one self-contained source per variant:
// the knob prelude, the parts in order, then the template's kernel file; the
// parts use no #include except "kforge/attn_params.h".
//
// Thread-safe: immutable data.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kforge::templates::sm90 {

struct Part {
  std::string_view name;  // path under kernels/templates/, e.g. "sm90/ptx.cuh"
  std::string_view text;  // the file's text
};

// fwd_sm90's source after its knob prelude, in order: the parts it uses, then
// its kernel file "fwd_sm90.cuh" (always last).
const std::vector<Part>& FwdSm90Parts();

// bwd_sm90's source after its knob prelude: the PTX and wgmma parts, the
// backward's tile and dQ parts, its shared-memory layout, then its kernel
// file "bwd_sm90.cuh" (always last).
const std::vector<Part>& BwdSm90Parts();

// The texts of `parts` concatenated in order.
std::string Assemble(const std::vector<Part>& parts);

}  // namespace kforge::templates::sm90

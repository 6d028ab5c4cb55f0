// The text of kernels/include/kforge/attn_params.h, embedded once (CMake
// target kforge_attn_params) for everything that hands the header to NVRTC
// as "kforge/attn_params.h" or quotes it: gpu/ compiles and compile-cache
// keys, the kernels' compile tests, the model proposer's prompt.
#pragma once

namespace kforge::embedded {
extern const char attn_params_h[];
}  // namespace kforge::embedded

// What a compiled image holds that the kernel contract cares about, read
// from its ELF sections without loading it (ParseCubinResources in
// compile.h reads the resource figures the same way).
//
// Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kforge::gpu {

// A section of writable module-scope device memory: `.nv.global` (zeroed
// `__device__` variables) or `.nv.global.init` (initialised ones). Under
// NVRTC's -default-device, namespace-scope `constexpr` values land here too,
// a few bytes each. The symbols in it, with their offsets, let the host find
// where the section lives once the module is loaded.
struct GlobalSection {
  std::string name;
  uint64_t bytes = 0;
  std::vector<std::pair<std::string, uint64_t>> symbols;  // (symbol, offset in the section)
};

// How many bytes of them a variant may have: enough for the constants NVRTC
// places there, not for a buffer that could hold an answer.
inline constexpr int64_t kMaxModuleGlobalBytes = 1024;

// Every such section of `cubin` with a non-zero size; empty for an image
// that is no ELF file.
std::vector<GlobalSection> MutableGlobalSections(std::string_view cubin);

// Their total size. A variant may keep no state between launches (it could
// count its launches, or keep the last launch's answer for the next): the
// evaluator refuses images with more than a few constants' worth and checks
// after every launch that the rest did not change. Tables belong in
// `__constant__`.
int64_t MutableGlobalBytes(std::string_view cubin);

}  // namespace kforge::gpu

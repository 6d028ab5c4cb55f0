// The TMA tensor maps a variant asks the host for (manifest "tensor_maps",
// kernels/CONTRACT.md "Tensor maps"): which of the contract's tensors, and
// how many rows a box holds. A header of its own because two components
// read it: kernels/ (the manifest) and gpu/ (which encodes the maps with the
// driver); neither depends on the other.
#pragma once

#include <string>
#include <string_view>

namespace kforge {

struct TensorMapRequest {
  // "q", "k", "v", "o" or "dout": a packed (rows, heads, head_dim) bf16 tensor
  // the kernel reads; "dk" or "dv": one it writes (kv_heads, like k and v)
  std::string tensor;
  int box_rows = 0;  // 1..256 rows a box; a box is 64 columns (128 bytes) wide
  bool operator==(const TensorMapRequest&) const = default;
};

// Whether `tensor` is one a backward writes (dk, dv): no forward maps it.
inline bool IsBackwardOutputTensor(std::string_view tensor) {
  return tensor == "dk" || tensor == "dv";
}

// Whether `tensor` names one of the tensors above.
inline bool IsMappableTensor(std::string_view tensor) {
  return tensor == "q" || tensor == "k" || tensor == "v" || tensor == "o" || tensor == "dout" ||
         IsBackwardOutputTensor(tensor);
}

// At most this many maps a variant (a kernel parameter holds them, 128 bytes each).
inline constexpr int kMaxTensorMaps = 8;

}  // namespace kforge

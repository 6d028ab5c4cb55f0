// Part of the Hopper templates (kernels/notes/parts.md): TMA loads through
// the tensor maps the host encodes for every launch and passes as the
// kernel's second parameter (kernels/CONTRACT.md "Tensor maps": 2-D bf16
// maps over a packed tensor, boxes of 64 columns x box_rows rows, 128-byte
// swizzle, so that a box lands as one panel of a 128B-swizzled tile).
// Rows past a sequence's end are the next sequence's: a kernel masks them,
// or loads tail blocks another way.

namespace kfh {

// One CUDA tensor map as the kernel sees it: 128 opaque bytes (cuda.h, which
// defines it, cannot be included under NVRTC).
struct alignas(64) TmaMap {
  u64 w[16];
};

// This thread's arrival on `bar`, and `bytes` more for the phase to wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
               "r"(bytes)
               : "memory");
}

// The box at column c0, row c1 of `map` into shared memory at dst (1024-byte
// aligned for the 128-byte swizzle); its bytes complete on `bar`. `map` is
// the generic address of a __grid_constant__ kernel parameter.
__device__ __forceinline__ void tma_load_2d(u32 dst, const TmaMap* map, int c0, int c1, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// The 128B-swizzled panel at src (1024-byte aligned, laid out as a load of
// the box would have left it) to the box at column c0, row c1 of `map`:
// an asynchronous store in this thread's bulk group, which the caller
// commits; src stays unchanged until cp.async.bulk.wait_group.read says the
// store has read it. The box's rows must all be the writer's own: bounds
// are the tensor's, so rows past a sequence's end are the next sequence's.
__device__ __forceinline__ void tma_store_2d(const TmaMap* map, int c0, int c1, u32 src) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   map),
               "r"(c0), "r"(c1), "r"(src)
               : "memory");
}

}  // namespace kfh

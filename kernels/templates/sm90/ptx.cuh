// Part of the Hopper templates (kernels/notes/parts.md): the PTX primitives
// every sm_90a kernel uses. mbarriers, cp.async, proxy fences, named
// barriers, register reallocation, wgmma fence / commit / wait and the
// shared-memory matrix descriptor, fast exp2 / log2, bf16 packing, and the
// 128B-swizzled cp.async tile copy.
//
// Reads no knob: sizes are template arguments. KF_WAIT_LIMIT (dev harness
// only) turns mbarrier waits into bounded spins. No includes: a template's
// build() prepends this text to the kernel source.

namespace kfh {

typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned short bf16;

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }
// 16 bytes from shared memory (one ld.shared.v4).
__device__ __forceinline__ uint4 ld_shared_v4(u32 a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(a)
               : "memory");
  return v;
}

// ------------------------------------------------------------- mbarriers
__device__ __forceinline__ void mbar_init(u32 bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
// Makes the initialised barriers visible before any thread uses them.
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, int parity) {
#ifdef KF_WAIT_LIMIT
  // debug builds (dev harness only): give up instead of hanging forever on a
  // protocol bug; the results are then wrong and the harness's check fails
  for (long long n = 0;; ++n) {
    u32 ok;
    asm volatile(
        "{\n.reg .pred d;\n"
        "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 d, [%1], %2;\n"
        "selp.u32 %0, 1, 0, d;\n}\n"
        : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
    if (ok) return;
    if (n > (long long)KF_WAIT_LIMIT) return;
  }
#endif
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// ------------------------------------------------- copies, fences, barriers
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
// 4 bytes (an int), through L1 (cp.async's .cg form takes 16 only).
__device__ __forceinline__ void cp_async4(u32 dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}
// Orders this thread's generic-proxy shared-memory writes (cp.async, st.shared)
// before later async-proxy reads (wgmma).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void named_bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

// ------------------------------------------------------------------ wgmma
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across a wgmma wait.
template <int N>
__device__ __forceinline__ void reg_fence(float* r) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// K-major / MN-major 128B-swizzled smem descriptor (hopper-ptx.md section 2).
__device__ __forceinline__ u64 make_desc(u32 addr, u32 lbo_bytes, u32 sbo_bytes) {
  u64 d = 0;
  d |= (u64)((addr & 0x3FFFF) >> 4);
  d |= (u64)((lbo_bytes >> 4) & 0x3FFF) << 16;
  d |= (u64)((sbo_bytes >> 4) & 0x3FFF) << 32;
  d |= (u64)1 << 62;  // 128B swizzle
  return d;
}

// ------------------------------------------------------------------- math
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float lg2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// Two floats to bf16x2, `lo` in the low half.
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// ------------------------------------------------------ swizzled tile copy
// Copies ROWS x D bf16 (global rows `row_stride` elements apart) into a
// 128B-swizzled tile: D/64 panels of ROWS x 128 B, panel p at p * ROWS * 128.
// Rows >= valid_rows are zero-filled (`safe` is read instead of src). Run by
// NTHR threads, this one being `t`; UNROLL unrolls the row loop.
template <int D, int ROWS, int NTHR, int UNROLL>
__device__ __forceinline__ void load_tile(u32 dst, const bf16* src, long long row_stride,
                                          int valid_rows, int t, const bf16* safe) {
  constexpr int CPR = D / 8;       // 16-byte chunks per row
  constexpr int RPI = NTHR / CPR;  // rows per iteration
  static_assert(NTHR % CPR == 0 && ROWS % RPI == 0, "tile rows must divide among threads");
  const int ch = t % CPR;
  int r = t / CPR;
  const int cc = ch & 7;
  dst += (ch >> 3) * (ROWS * 128) + r * 128;
  const bf16* s = src + (long long)r * row_stride + ch * 8;
  const long long step = (long long)RPI * row_stride;
#pragma unroll UNROLL
  for (int i = 0; i < ROWS / RPI; ++i) {
    const bool ok = r < valid_rows;
    cp_async16(dst + ((cc ^ (r & 7)) << 4), ok ? s : safe, ok ? 16 : 0);
    r += RPI;
    dst += RPI * 128;
    s += step;
  }
}

}  // namespace kfh

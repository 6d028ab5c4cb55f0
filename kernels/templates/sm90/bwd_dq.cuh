// Part of the Hopper templates (kernels/notes/parts.md): the backward's dQ
// path. Each step's dQ slice goes from the accumulators into a staging
// buffer in shared memory and from there, by one bulk reduce-add, into
// dq_accum; the key block that completes a query block converts its rows to
// bf16 dQ. D head dims, BM query rows a step, two consumer warpgroups of 128
// threads (256 in all) with 64 keys each.
#include "kforge/attn_params.h"

namespace kfh {

// How the two consumers split a step's dQ = dS K (BM x D): BM = 128, consumer
// w takes rows 64w.. (all keys); BM = 64 at D = 128, head dims 64w.. (all
// keys); otherwise (BM = 64, D = 64) all of it from its own 64 keys, and
// both add. The kernel's dQ wgmma and add_dq both follow this.
// (constexpr functions, not constants: under -default-device a constant at
// namespace or class scope becomes device memory, and changed the cubins)
template <int D, int BM>
__device__ __forceinline__ constexpr bool dq_split_rows() { return BM == 128; }
template <int D, int BM>
__device__ __forceinline__ constexpr bool dq_split_cols() { return BM == 64 && D == 128; }

// Adds `bytes` (a multiple of 16) of fp32 from shared memory into global
// memory, asynchronously (bulk async-group of this thread).
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, u32 src, u32 bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
               "r"(src), "r"(bytes)
               : "memory");
}
// Copies `bytes` (a multiple of 16) from shared memory to global memory,
// asynchronously (bulk async-group of this thread): a query block's first
// visitor's slice where dq_accum is not zeroed (bwd_sm90 KF_DQW).
__device__ __forceinline__ void bulk_copy_f32(float* dst, u32 src, u32 bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst),
               "r"(src), "r"(bytes)
               : "memory");
}
// The flag protocol of KF_DQW: the claimer releases its ready bit after its
// copy is complete; a visitor acquires it (by the claim's atomic, or a load
// here) before its reduce-add.
__device__ __forceinline__ int atom_or_acquire(int* a, int v) {
  int old;
  asm volatile("atom.acquire.gpu.global.or.b32 %0, [%1], %2;\n" : "=r"(old) : "l"(a), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ void red_or_release(int* a, int v) {
  asm volatile("red.release.gpu.global.or.b32 [%0], %1;\n" ::"l"(a), "r"(v) : "memory");
}
// Raises `bit` of the claimer's flag once this thread's bulk copies are
// complete (after bulk_wait_all): the proxy fence orders their writes, made
// by the async proxy, before the generic release a visitor acquires.
__device__ __forceinline__ void publish_dq_ready(int* flag, int bit) {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
  red_or_release(flag, bit);
}
// bwd_sm90 KF_DET: adds `v` to the count of a query block's completed adds
// once this thread's bulk reduce-adds are complete (after bulk_wait_all),
// ordered as publish_dq_ready's bit.
__device__ __forceinline__ void publish_dq_added(int* word, int v) {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(word), "r"(v) : "memory");
}
__device__ __forceinline__ int ld_relaxed(const int* a) {
  int v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(a) : "memory");
  return v;
}
__device__ __forceinline__ int ld_acquire(const int* a) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(a) : "memory");
  return v;
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// This thread's bulk operations have read their shared memory.
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// This thread's bulk operations are complete, and their global writes ordered
// (async proxy to generic) before this thread's later accesses.
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// dq_accum (the variant's own scratch) is kept in a layout of its own, so
// that a consumer's 64 x 64 slice of a step is one contiguous range and one
// bulk reduce-add: 64-column panels (h, column / 64), each total_q rows of 64
// floats, and within a row the 16-byte chunk k of columns 4k..4k+3 stored at
// chunk k ^ ((row & 7) << 1) (row counted from the sequence's first query),
// so that the staging stores of a half-warp (4 rows x 4 column pairs) hit 32
// distinct banks. The sums are unscaled (write_dq scales). dq_panel_row:
// where the row's 64 floats of column c's panel start; dq_panel_offset: the
// 4-column chunk holding column c (c % 4 == 0).
template <int D>
__device__ __forceinline__ long long dq_panel_row(const KfAttnParams& p, int q0, int row, int h,
                                                  int c) {
  return ((long long)(h * (D / 64) + (c >> 6)) * p.total_q + q0 + row) * 64;
}
template <int D>
__device__ __forceinline__ long long dq_panel_offset(const KfAttnParams& p, int q0, int row, int h,
                                                     int c) {
  return dq_panel_row<D>(p, q0, row, h, c) + 4 * (((c & 63) >> 2) ^ ((row & 7) << 1));
}

// dQ rows [m0, m0 + BM) of head h (clamped to the sequence), converted from
// dq_accum (scaled here) or zeros; by the 256 consumer threads. With
// kRestore (bwd_sm90 KF_DQZ) the dq_accum rows read are zeroed again, so the
// host need not zero dq_accum before the next launch. Every load is
// issued before the first store: the compiler cannot tell that dq and
// dq_accum do not overlap, so a load-convert-store loop would wait for each
// load in turn (four round trips a query block).
template <int D, int BM, bool kRestore = false>
__device__ __forceinline__ void write_dq(const KfAttnParams& p, int q0, int lq, int m0, int h, bool zero, int ct) {
  constexpr int kChunks = D / 8;  // 8-column chunks per row
  constexpr int kIters = BM * kChunks / 256;
  static_assert(BM * kChunks % 256 == 0, "write_dq: the chunks must divide among 256 threads");
  const int rows = lq - m0 < BM ? lq - m0 : BM;
  float4 a[kIters], b[kIters];
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
    const int i = ct + 256 * k;
    const int r = i / kChunks;
    a[k] = b[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (!zero && r < rows) {
      const float* src = p.dq_accum + dq_panel_offset<D>(p, q0, m0 + r, h, (i % kChunks) * 8);
      a[k] = __ldcg((const float4*)src);
      b[k] = __ldcg((const float4*)(src + 4));
    }
  }
  const float sc = p.softmax_scale;
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
    const int i = ct + 256 * k;
    const int r = i / kChunks;
    if (r < rows) {
      const long long off = ((long long)(q0 + m0 + r) * p.heads + h) * D + (i % kChunks) * 8;
      *(uint4*)((bf16*)p.dq + off) =
          make_uint4(pack_bf16(a[k].x * sc, a[k].y * sc), pack_bf16(a[k].z * sc, a[k].w * sc),
                     pack_bf16(b[k].x * sc, b[k].y * sc), pack_bf16(b[k].z * sc, b[k].w * sc));
      if constexpr (kRestore) {
        if (!zero) {
          float* const src = p.dq_accum + dq_panel_offset<D>(p, q0, m0 + r, h, (i % kChunks) * 8);
          __stcg((float4*)src, make_float4(0.f, 0.f, 0.f, 0.f));
          __stcg((float4*)(src + 4), make_float4(0.f, 0.f, 0.f, 0.f));
        }
      }
    }
  }
}

// This consumer's 64 x 64 slice of dQ (the unscaled accumulators: row
// r0 = 16 * warp + lane / 4 holds dq[4j], dq[4j+1] at columns 8j + cq, +1 and
// row r0 + 8 dq[4j+2], dq[4j+3]) added into dq_accum rows m0.. of head h
// (rows past the sequence left out), by the 128 threads of consumer w: into
// the warpgroup's staging buffer `sdq` in dq_accum's layout
// (dq_panel_offset), then one bulk reduce-add of rows x 256 B by one thread.
// The caller keeps the buffer free: its previous bulk read is waited for
// (bulk_wait_read) before the barrier that precedes this call. The slice is
// dq_split_rows / dq_split_cols's. Named barrier 2 + w.
// With kMayStore and `store` (the query block has no other key block: the
// slice is the whole sum), the 128 threads store it as scaled bf16 into dQ
// instead, 16 bytes a thread, from the staging buffer; the caller then keeps
// the buffer until every thread of the warpgroup has read it (the next
// step's consumer barrier, or a warpgroup barrier before other use).
// With `own` (bwd_sm90 KF_DQW: the query block's claimer, first to visit
// it) the slice is copied into dq_accum rather than added.
template <int D, int BM, bool kMayStore = false>
__device__ __forceinline__ void add_dq(const KfAttnParams& p, const float* dq, int q0, int lq,
                                       int m0, int h, int w, int warp, int lane, u32 sdq,
                                       bool store = false, bool own = false) {
  const int row0 = m0 + (dq_split_rows<D, BM>() ? 64 * w : 0);  // first row of the slice
  const int col0 = dq_split_cols<D, BM>() ? 64 * w : 0;         // first head dim of the slice
  {
    // Row rl = 16 warp + lane / 4 gets dq[4j], dq[4j + 1] (columns 8j + 2 (lane % 4), +1),
    // row rl + 8 (2048 B on, same permutation) dq[4j + 2], dq[4j + 3]. Chunk 2j + x
    // (x = (lane % 4) / 2) goes to chunk (2j + x) ^ 2 (rl % 8), i.e. byte
    // 32 (j ^ (rl % 8)) + 16 x: the thread's address for j = 0 XOR 32 j. (The
    // base goes through an opaque move each step, so that ptxas does not keep
    // eight loop-invariant addresses live over the tile.)
    const int rl = 16 * warp + (lane >> 2);
    u32 a = sdq + rl * 256 + ((rl & 7) << 5) + ((lane & 2) << 3) + ((lane & 1) << 3);
    asm volatile("mov.b32 %0, %0;\n" : "+r"(a));
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};\nst.shared.v2.f32 [%0+2048], {%3, %4};\n" ::"r"(
                       a ^ (u32)(j << 5)),
                   "f"(dq[4 * j]), "f"(dq[4 * j + 1]), "f"(dq[4 * j + 2]), "f"(dq[4 * j + 3])
                   : "memory");
    }
  }
  fence_proxy_async();  // the generic-proxy stores, before the bulk (async proxy) read
  // (every thread waits: with the others only arriving, ptxas 13.0 spilled
  // 128-144 B in this kernel)
  named_bar_sync(2 + w, 128);
  if constexpr (kMayStore) {
    if (store) {
      // Thread t: 16-byte chunk t % 8 (columns 8c..8c+7, the staged fp32
      // chunks 2c and 2c + 1) of rows t / 8 + 16k, whose row % 8 is t / 8 % 8
      // for every k. (The addresses go through an opaque move: ptxas would
      // otherwise keep them live over the tile, and spilled at D = 128.)
      const int t = 32 * warp + lane;
      const int c = t & 7;
      const int rows = lq - row0 < 64 ? lq - row0 : 64;
      const float sc = p.softmax_scale;
      const int sw = ((t >> 3) & 7) << 1;
      u32 at = sdq + (t >> 3) * 256;
      u32 ca = ((2 * c) ^ sw) << 4, cb = ((2 * c + 1) ^ sw) << 4;
      asm volatile("mov.b32 %0, %0;\nmov.b32 %1, %1;\nmov.b32 %2, %2;\n" : "+r"(at), "+r"(ca), "+r"(cb));
      const long long ld = (long long)p.heads * D;
      bf16* out = (bf16*)p.dq + ((long long)(q0 + row0 + (t >> 3)) * p.heads + h) * D + col0 + 8 * c;
#pragma unroll 1
      for (int k = 0; k < 4; ++k) {
        if ((t >> 3) + 16 * k < rows) {
          const uint4 a = ld_shared_v4(at + k * 4096 + ca);
          const uint4 b = ld_shared_v4(at + k * 4096 + cb);
          auto f = [sc](u32 x) { return __uint_as_float(x) * sc; };
          *(uint4*)(out + k * 16 * ld) =
              make_uint4(pack_bf16(f(a.x), f(a.y)), pack_bf16(f(a.z), f(a.w)),
                         pack_bf16(f(b.x), f(b.y)), pack_bf16(f(b.z), f(b.w)));
        }
      }
      return;
    }
  }
  if (warp == 0 && lane == 0) {
    const int rows = lq - row0 < 64 ? lq - row0 : 64;
    if (rows > 0) {
      float* const dst = p.dq_accum + dq_panel_row<D>(p, q0, row0, h, col0);
      if (own) {
        bulk_copy_f32(dst, sdq, (u32)rows * 256u);
      } else {
        bulk_reduce_add_f32(dst, sdq, (u32)rows * 256u);
      }
      bulk_commit();
    }
  }
}

}  // namespace kfh

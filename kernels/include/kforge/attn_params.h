// The kernel contract's parameter block: the one struct every jagged
// attention variant receives, shared by host code and NVRTC-compiled sources.
//
// Rules for this header (it is compiled by NVRTC inside every variant):
//  - plain C-compatible data only, no includes, no host-only code;
//  - fixed-width fields so host (g++) and device (NVRTC) agree on the layout
//    (static_asserts at the bottom pin it);
//  - fields are only ever added at the end: stored variants depend on it.
//
// Tensors are packed jagged batches, row-major and contiguous:
//   q, o, do, dq : (total_q, heads,    head_dim) bf16
//   k, v, dk, dv : (total_k, kv_heads, head_dim) bf16
//   lse, delta   : (heads, total_q) fp32; lse is the natural-log log-sum-exp
//                  of the scaled scores of each query row (-inf for a row with
//                  no keys, whose output is 0).
// Sequence b has queries cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1 and keys
// cu_seqlens_k[b] .. cu_seqlens_k[b+1]-1 (self-attention passes the same
// array twice). Query head h reads kv head h / (heads / kv_heads).
// Causal masks are bottom-right aligned: query i of a sequence with Lq
// queries and Lk keys sees keys j <= i + (Lk - Lq).
#ifndef KFORGE_ATTN_PARAMS_H_
#define KFORGE_ATTN_PARAMS_H_

#define KFORGE_CONTRACT_VERSION 1

struct KfAttnParams {
  // Inputs and outputs (device pointers).
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  const int* cu_seqlens_q;  // batch + 1 entries
  const int* cu_seqlens_k;  // batch + 1 entries

  // Sizes. max_seqlen_* are host-known upper bounds (no device-to-host sync).
  int batch;
  int heads;
  int kv_heads;
  int head_dim;
  int max_seqlen_q;
  int max_seqlen_k;
  int total_q;
  int total_k;

  float softmax_scale;       // usually 1/sqrt(head_dim)
  float softmax_scale_log2;  // softmax_scale * log2(e), for exp2-based softmax
  int causal;                // 0 or 1

  // Persistent scheduling (grid policy "persistent"): the host builds a list
  // of non-empty tiles, longest work first; each entry is one int4
  // {batch index, head, query tile index, pack}. pack is 0 except for
  // variants whose manifest sets pack_short: then pack = n >= 1 means the
  // tile holds the n consecutive short sequences batch..batch+n-1 (query
  // tile index 0), each row attending only to its own sequence's keys.
  // Kernels take tiles from tile_counter with atomicAdd; the host zeroes it
  // before every launch.
  const int* tiles;
  int num_tiles;
  int* tile_counter;

  // Scratch memory the manifest asked for; zeroed by the host before a launch.
  void* workspace;
  long long workspace_bytes;

  // Backward only (forward variants ignore these).
  const void* dout;  // (total_q, heads, head_dim)
  void* dq;
  void* dk;
  void* dv;
  float* delta;      // rowsum(dO * O), (heads, total_q)
  float* dq_accum;   // fp32 (total_q, heads, head_dim) accumulation buffer
  int _reserved[8];
};

#if defined(__cplusplus) && !defined(__CUDACC_RTC__)
static_assert(sizeof(void*) == 8, "kforge needs a 64-bit host");
#endif

#endif  // KFORGE_ATTN_PARAMS_H_

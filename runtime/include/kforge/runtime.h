/* libkforge_runtime: kforge's tuned jagged attention kernels as a function
 * call. C ABI (C99 and C++), stable across kforge versions: structs start
 * with their size and only ever grow at the end.
 *
 * A kf_runtime gets each kernel once and keeps it. For a call it computes
 * the shape bucket on the host (the server's own rule, core/shape.h), then
 * takes the kernel from, in order:
 *   1. its in-process cache;
 *   2. the kernel packs it was given (`kforge export`), then its on-disk
 *      cache (kernels fetched earlier, by this or another process);
 *   3. the kforge server over gRPC (GetKernel with if_none_match, so asking
 *      again for a kernel it holds costs a few hundred bytes);
 *   4. the built-in seed kernel for the shape, compiled here with NVRTC.
 * A kernel is only used for shapes inside the sizes it may be served for
 * (its extent). See runtime/README.md for caches, policies and costs.
 *
 * Launches are asynchronous on the caller's stream: no call synchronises
 * the device or copies anything back to the host. Kernels with a persistent
 * tile list (most tuned forward kernels, every backward kernel) need the
 * offsets on the host to build that list; pass them in cu_seqlens_*_host
 * (a data loader has them there). Without them such a kernel is refused
 * with KF_ERR_NEEDS_HOST_OFFSETS rather than copied back in secret.
 *
 * Thread-safety: a kf_runtime may be used from any number of threads at
 * once, on any streams. kf_last_error() is per thread.
 *
 * Tensors are packed jagged batches, row-major and contiguous, bf16:
 *   q, o, dout, dq : (total_q, heads,    head_dim)
 *   k, v, dk, dv   : (total_k, kv_heads, head_dim)
 *   lse            : (heads, total_q) fp32, natural-log log-sum-exp of the
 *                    scaled scores (-inf for a row that sees no key).
 * Every tensor starts on a 16-byte boundary (as cudaMalloc and PyTorch's
 * allocator give; a view at another offset is refused with
 * KF_ERR_INVALID_ARGUMENT naming it), the device offsets on a 4-byte one.
 * Sequence b has queries cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1 and keys
 * cu_seqlens_k[b] .. cu_seqlens_k[b+1]-1. Query head h reads kv head
 * h / (heads / kv_heads). Causal masks are bottom-right aligned: query i of
 * a sequence with Lq queries and Lk keys sees keys j <= i + (Lk - Lq).
 */
#ifndef KFORGE_RUNTIME_H_
#define KFORGE_RUNTIME_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KF_RUNTIME_ABI_VERSION 1

#if defined(__GNUC__)
#define KF_API __attribute__((visibility("default")))
#else
#define KF_API
#endif

typedef enum kf_status {
  KF_OK = 0,
  /* A null pointer, a bad size, offsets that disagree with the sizes. */
  KF_ERR_INVALID_ARGUMENT = 1,
  /* No kernel for this arch, dtype, head dim or op: callers fall back to
   * another implementation (the Python package uses varlen_attn). */
  KF_ERR_UNSUPPORTED = 2,
  /* The kernel needs a tile list built from host offsets: pass
   * cu_seqlens_q_host (and cu_seqlens_k_host for cross attention). */
  KF_ERR_NEEDS_HOST_OFFSETS = 3,
  /* No CUDA driver or device (kernels can still be resolved with an arch). */
  KF_ERR_NO_DEVICE = 4,
  /* A CUDA driver call failed; after a fault the context may be unusable. */
  KF_ERR_CUDA = 5,
  /* The kforge server failed or refused (only returned under
   * KF_POLICY_STRICT; otherwise the next source is used). */
  KF_ERR_SERVER = 6,
  /* A kernel pack is missing, not a pack, truncated or damaged. */
  KF_ERR_PACK = 7,
  /* A kernel did not compile for this GPU (NVRTC). */
  KF_ERR_COMPILE = 8,
  KF_ERR_INTERNAL = 9
} kf_status;

typedef enum kf_policy {
  /* A source that fails (server down, refused) is skipped and the next one
   * used; the seed kernel is the last resort. */
  KF_POLICY_FALLBACK = 0,
  /* A configured server that fails is an error (KF_ERR_SERVER). */
  KF_POLICY_STRICT = 1
} kf_policy;

typedef enum kf_dtype { KF_DTYPE_BF16 = 1, KF_DTYPE_FP16 = 2, KF_DTYPE_FP32 = 3 } kf_dtype;

typedef enum kf_op { KF_OP_FORWARD = 1, KF_OP_BACKWARD = 2 } kf_op;

typedef struct kf_runtime kf_runtime;

typedef struct kf_runtime_options {
  uint32_t struct_size;       /* sizeof(kf_runtime_options) */
  const char* server;         /* "host:port" of kforge-server; NULL or "": none */
  const char* token;          /* client bearer token; NULL: none */
  const char* cache_dir;      /* on-disk kernel cache (created); NULL: none */
  const char* const* packs;   /* kernel pack files, searched in order */
  size_t num_packs;
  kf_policy policy;
  /* NVRTC target to resolve kernels for ("sm_90a"); NULL: the device's.
   * Lets kernels be fetched and compiled on a machine without a GPU. */
  const char* arch;
  int server_timeout_ms;      /* per GetKernel call; default 10000 */
  /* After a server failure, the server is not asked again for this long
   * (the fallback kernel is used meanwhile); default 30. */
  int server_retry_s;
  /* A kernel that came from the server is re-checked with if_none_match
   * once it is older than this (a few hundred bytes when unchanged);
   * 0: never; default 600. */
  int revalidate_s;
} kf_runtime_options;

/* Defaults: no server, no cache, no packs, fallback policy, the device's arch. */
KF_API void kf_runtime_options_init(kf_runtime_options* options);

/* Creates a runtime. Every pack is read and checked here: a missing or
 * damaged one fails the call (KF_ERR_PACK) with the reason in
 * kf_last_error(). Without a CUDA driver it still succeeds (kernels can be
 * resolved for options.arch); launches then fail with KF_ERR_NO_DEVICE. */
KF_API kf_status kf_runtime_create(const kf_runtime_options* options, kf_runtime** out);
/* Frees the runtime (NULL is fine). Work it launched must have finished. */
KF_API void kf_runtime_destroy(kf_runtime* runtime);

typedef struct kf_attention_args {
  uint32_t struct_size; /* sizeof(kf_attention_args) */
  int device;           /* CUDA ordinal of every pointer below */
  void* stream;         /* cudaStream_t / CUstream; NULL: the legacy default stream */
  kf_dtype dtype;       /* only KF_DTYPE_BF16 has kernels */

  int batch;            /* sequences */
  int heads;            /* query heads */
  int kv_heads;         /* key/value heads, dividing heads; 0: heads */
  int head_dim;
  int64_t total_q;      /* query rows: q's first dimension */
  int64_t total_k;      /* key rows; 0 with self-attention: total_q */
  /* Longest sequences. Exact when host offsets are not given (they choose
   * the bucket and the grid); with host offsets they may be upper bounds. */
  int max_seqlen_q;
  int max_seqlen_k;     /* 0 with self-attention: max_seqlen_q */
  float softmax_scale;  /* 0: 1/sqrt(head_dim) */
  int causal;           /* 0 or 1 */

  /* Offsets, batch + 1 int32 prefix sums starting at 0. Device copies (what
   * the kernel reads) and/or host copies (for tile lists; when only host
   * copies are given the runtime uploads them, asynchronously). A null or
   * equal cu_seqlens_k (and cu_seqlens_k_host) means self-attention. */
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  const int32_t* cu_seqlens_q_host;
  const int32_t* cu_seqlens_k_host;

  const void* q;
  const void* k;
  const void* v;
  /* Forward writes o and lse (lse may be NULL when not needed); backward
   * reads them (the forward's own outputs). */
  void* o;
  float* lse;
  /* Backward only. */
  const void* dout;
  void* dq;
  void* dk;
  void* dv;
  /* Backward only, 0 or 1: 1 asks for a bitwise deterministic kernel (the
   * same dq, dk and dv in every launch on the same inputs), a bucket of its
   * own; KF_ERR_UNSUPPORTED where none exists (today: head dims other than
   * 64 and 128). Read
   * only by kf_attention_backward and by prepare/supported for
   * KF_OP_BACKWARD; the forward is always deterministic. Added after the
   * first release: a caller whose struct_size ends before it gets 0. */
  int deterministic;
} kf_attention_args;

/* Sets struct_size, device 0, dtype bf16; everything else 0 / NULL. */
KF_API void kf_attention_args_init(kf_attention_args* args);

/* o, lse = attention(q, k, v), enqueued on args->stream. */
KF_API kf_status kf_attention_forward(kf_runtime* runtime, const kf_attention_args* args);
/* dq, dk, dv from dout, enqueued on args->stream (one kernel launch after
 * zeroing the scratch the kernel accumulates into). */
KF_API kf_status kf_attention_backward(kf_runtime* runtime, const kf_attention_args* args);

typedef struct kf_kernel_info {
  uint32_t struct_size;  /* sizeof(kf_kernel_info) */
  char variant_id[64];   /* "v12" (tuned, from the server's store) or "s-..." (seed) */
  char bucket[192];      /* the request's bucket */
  char kernel_bucket[192]; /* the bucket the kernel won, "" for a seed */
  char source[16];       /* where it came from: "pack", "disk", "server", "seed" */
  char arch[16];
  char entry_point[64];
  int tuned;             /* the request bucket's own verified winner */
  int persistent;        /* needs a tile list (host offsets) */
  int cubin_bytes;
} kf_kernel_info;

/* Resolves (fetches or compiles) the kernel for args and op without
 * launching, and loads it when there is a device: warms the caches before
 * a training loop, and says which kernel a call will run. Only the sizes
 * of args are read (pointers may be NULL). info may be NULL. */
KF_API kf_status kf_attention_prepare(kf_runtime* runtime, const kf_attention_args* args,
                                      kf_op op, kf_kernel_info* info);

/* Whether a kernel exists for args' device arch, dtype, head dim, head
 * layout and mask, whatever the batch: KF_OK when a pack holds one of that
 * kind or a catalog template serves it, KF_ERR_UNSUPPORTED (with the reason
 * in kf_last_error()) when not. Fetches, compiles and launches nothing: the
 * cheap check a caller makes to pick its own fallback. Sizes and pointers
 * of args are not read (batch, lengths and offsets may be 0 / NULL). */
KF_API kf_status kf_attention_supported(kf_runtime* runtime, const kf_attention_args* args,
                                        kf_op op);

typedef struct kf_runtime_stats {
  uint32_t struct_size;      /* sizeof(kf_runtime_stats) */
  uint64_t calls;            /* forward + backward + prepare */
  uint64_t memory_hits;      /* kernel found in the in-process cache */
  uint64_t pack_hits;
  uint64_t disk_hits;
  uint64_t server_requests;  /* GetKernel calls made */
  uint64_t server_not_modified;
  uint64_t server_kernels;   /* full kernels received */
  uint64_t server_errors;
  uint64_t seed_compiles;    /* seeds compiled here (not found compiled on disk) */
  uint64_t seed_disk_hits;   /* seeds found compiled in the disk cache */
  uint64_t module_loads;     /* cubins loaded into a context */
  uint64_t plans_built;      /* tile lists built (a batch seen first) */
  uint64_t plan_hits;        /* tile lists reused */
  uint64_t launches;
} kf_runtime_stats;

KF_API kf_status kf_runtime_get_stats(const kf_runtime* runtime, kf_runtime_stats* stats);

/* The message of this thread's last failed call ("" when none). Valid until
 * the thread's next kf_ call. */
KF_API const char* kf_last_error(void);
/* "KF_ERR_UNSUPPORTED", ... */
KF_API const char* kf_status_name(kf_status status);
/* KF_RUNTIME_ABI_VERSION of the loaded library. */
KF_API int kf_runtime_abi_version(void);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* KFORGE_RUNTIME_H_ */

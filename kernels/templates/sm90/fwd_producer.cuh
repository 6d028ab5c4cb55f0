// Part of the Hopper templates (kernels/notes/parts.md): fwd_sm90's producer
// mainloop, the warpgroup that fills the K/V ring (fwd_ring.cuh).
//
// Each of its 4 warps owns one stream of items: K (even warps) or V (odd
// warps) blocks of item parity warp >> 1, so up to 4 tiles are in flight.
// Per item: wait for the stage to be free, 16-byte cp.async copies in the
// 128B-swizzle layout wgmma reads (rows past the sequence zero-filled),
// cp.async.wait_all, fence.proxy.async, arrive on the stage's full barrier.
// Key blocks go from the tile's last (masked) one down to block 0, the order
// the consumers read them in. No TMA: the contract has no tensor maps.
#include "kforge/attn_params.h"

namespace kfh {

template <int D, int BM, int BN, int S>
struct FwdProducer {
  int par;            // this warp's item parity
  const bf16* base;   // p.k or p.v
  u32 sbuf;           // the K or V ring
  u32 full, empty;    // its barriers
  long long ld;       // global row stride (elements)

  __device__ __forceinline__ FwdProducer(const KfAttnParams& p, const FwdSmem& m, int warp) {
    const int kv = warp & 1;  // 0: K stream, 1: V stream
    par = warp >> 1;
    base = (const bf16*)(kv ? p.v : p.k);
    sbuf = kv ? m.v : m.k;
    full = kv ? m.full_v : m.full_k;
    empty = kv ? m.empty_v : m.empty_k;
    ld = (long long)p.kv_heads * D;
  }

  // This warp's items of a tile whose first item is `it`.
  __device__ __forceinline__ void load(const KfAttnParams& p, const QueryTileGeom& g, int it,
                                       int lane) const {
    constexpr KfFwdSm90Layout L = kf_fwd_sm90_layout(D, BM, BN, S);
    int j = (it & 1) == par ? 0 : 1;
    for (; j < g.nb; j += 2) {
      const int gi = it + j;
      const int stage = ring_stage<S>(gi);
      const int phase = ring_phase<S>(gi);
      mbar_wait(empty + 8 * stage, phase ^ 1);
      const int n0 = (g.nb - 1 - j) * BN;
      const bf16* src = base + ((long long)(g.k0 + n0) * p.kv_heads + g.hk) * D;
      load_tile<D, BN, 32, 4>(sbuf + stage * L.kv_bytes, src, ld, g.Lk - n0, lane, base);
      cp_async_wait_all();
      fence_proxy_async();
      mbar_arrive(full + 8 * stage);
    }
  }
};

}  // namespace kfh

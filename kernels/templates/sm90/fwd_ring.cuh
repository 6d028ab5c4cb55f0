// Part of the Hopper templates (kernels/notes/parts.md): fwd_sm90's shared
// memory as addresses (from KfFwdSm90Layout, layout.h) and the protocol of
// its K/V ring.
//
// Items: a CTA numbers the K/V blocks of all its tiles in order (item gi =
// block j of a tile whose first item is `it`, gi = it + j); item gi uses
// stage gi % S in phase (gi / S) & 1. Per stage, separately for K and V:
//   full  (32 arrivals): the producer warp that copied the tile, after
//         cp.async.wait_all + fence.proxy.async;
//   empty (8 arrivals): one per consumer warp, after the wgmma that read it
//         has completed. The producer waits on the opposite parity, so a
//         fresh ring starts free.
// Releases are in order and each producer warp's previous item is gi - 2, so
// no waiter is ever more than one phase ahead (holds for S >= 2).

namespace kfh {

struct FwdSmem {
  u32 q;                  // Q tile (warpgroup w at q + w * q_wg_bytes; QAHEAD=2's second
                          // buffer at q + q_bytes)
  u32 k, v;               // stage s at + s * kv_bytes
  u32 full_k, full_v;     // mbarrier of stage s at + 8 * s
  u32 empty_k, empty_v;
};

// Addresses from the dynamic shared memory's 1024-aligned base.
template <int D, int BM, int BN, int S, int QB = 1>
__device__ __forceinline__ FwdSmem fwd_smem(u32 base) {
  constexpr KfFwdSm90Layout L = kf_fwd_sm90_layout(D, BM, BN, S, 0, QB);
  FwdSmem m;
  m.q = base + L.q;
  m.k = base + L.k;
  m.v = base + L.v;
  m.full_k = base + L.full_k;
  m.full_v = base + L.full_v;
  m.empty_k = base + L.empty_k;
  m.empty_v = base + L.empty_v;
  return m;
}

// By one thread, before a CTA-wide barrier.
template <int S>
__device__ __forceinline__ void fwd_ring_init(const FwdSmem& m) {
  for (int s = 0; s < S; ++s) {
    mbar_init(m.full_k + 8 * s, 32);
    mbar_init(m.full_v + 8 * s, 32);
    mbar_init(m.empty_k + 8 * s, 8);
    mbar_init(m.empty_v + 8 * s, 8);
  }
  mbar_fence_init();
}

template <int S>
__device__ __forceinline__ int ring_stage(int gi) { return gi % S; }
template <int S>
__device__ __forceinline__ int ring_phase(int gi) { return (gi / S) & 1; }

}  // namespace kfh

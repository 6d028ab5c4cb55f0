// Part of the Hopper templates (kernels/notes/parts.md): which keys a row of
// a packed tile sees. A packed tile (manifest pack_short; kernels/CONTRACT.md)
// holds a run of consecutive short sequences as if they were one; each row
// must still see only its own member's keys, under the causal mask
// bottom-right aligned within that member. The rule lives here once, for the
// forward's packed query tiles and the backward's packed key tiles.
// Windows are tile-local key indices packed as lo | hi << 16 (lo <= key < hi;
// a packed tile has at most 128 keys).
#include "kforge/attn_params.h"

namespace kfh {

// Row i of a member with lq queries whose keys are [ks, ks + lk).
__device__ __forceinline__ int member_key_window(bool causal, int i, int lq, int ks, int lk) {
  int seen = lk;
  if (causal) {
    const int c = i + lk - lq + 1;
    seen = c < 0 ? 0 : (c < lk ? c : lk);
  }
  return ks | ((ks + seen) << 16);
}

// Forward: row r (counted from tab_q[0]) of the packed tile that holds the
// n sequences whose offsets are tab_q[0 .. n] and tab_k[0 .. n] (the
// run's entries of cu_seqlens_q / cu_seqlens_k, or a copy of them in shared
// memory). A binary search over the members: empty members start where the
// next one does, so the last member starting at or before the row is its
// own. Rows past the run see no key.
__device__ __forceinline__ int packed_row_window(bool causal, int n, int r, const int* tab_q,
                                                 const int* tab_k) {
  const int token = tab_q[0] + r;
  if (token >= tab_q[n]) return 0;
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (tab_q[mid] <= token) lo = mid; else hi = mid - 1;
  }
  const int sq = tab_q[lo], sk = tab_k[lo];
  return member_key_window(causal, token - sq, tab_q[lo + 1] - sq, sk - tab_k[0],
                           tab_k[lo + 1] - sk);
}

}  // namespace kfh

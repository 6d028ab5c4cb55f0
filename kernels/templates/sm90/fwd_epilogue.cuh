// Part of the Hopper templates (kernels/notes/parts.md): the forward
// epilogue of one warpgroup's 64 rows: O normalised in registers and stored
// as bf16 (4-byte bf16x2 stores straight from the wgmma accumulator layout,
// softmax.cuh), and the natural-log LSE per row by the quad's first thread.
// Rows without keys get O = 0 and LSE = -inf. Rows past the sequence end
// are not written.
#include "kforge/attn_params.h"

namespace kfh {

// row0: the warpgroup's first (sequence-local) row; r_lo, cq, lane as in
// FwdConsumer; o: D / 2 accumulators.
template <int D>
__device__ __forceinline__ void fwd_epilogue(const KfAttnParams& p, const QueryTileGeom& g,
                                             const Tile& tile, int row0, int r_lo, int cq,
                                             int lane, float sl2, const float* o,
                                             OnlineSoftmax& sm) {
  sm.finish();
  const float inv_lo = OnlineSoftmax::inverse(sm.l_lo);
  const float inv_hi = OnlineSoftmax::inverse(sm.l_hi);
  const int qr_lo = row0 + r_lo, qr_hi = qr_lo + 8;
  bf16* obase = (bf16*)p.o;
  if (qr_lo < g.Lq) {
    u32* dst = (u32*)(obase + ((long long)(g.q0 + qr_lo) * p.heads + tile.h) * D + cq);
#pragma unroll
    for (int i = 0; i < D / 2; i += 4) dst[(i >> 2) * 4] = pack_bf16(o[i] * inv_lo, o[i + 1] * inv_lo);
    if ((lane & 3) == 0)
      p.lse[(long long)tile.h * p.total_q + g.q0 + qr_lo] = OnlineSoftmax::lse(sm.m_lo, sm.l_lo, sl2);
  }
  if (qr_hi < g.Lq) {
    u32* dst = (u32*)(obase + ((long long)(g.q0 + qr_hi) * p.heads + tile.h) * D + cq);
#pragma unroll
    for (int i = 2; i < D / 2; i += 4) dst[(i >> 2) * 4] = pack_bf16(o[i] * inv_hi, o[i + 1] * inv_hi);
    if ((lane & 3) == 0)
      p.lse[(long long)tile.h * p.total_q + g.q0 + qr_hi] = OnlineSoftmax::lse(sm.m_hi, sm.l_hi, sl2);
  }
}

}  // namespace kfh

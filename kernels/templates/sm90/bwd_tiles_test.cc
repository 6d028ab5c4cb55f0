// The backward's tile part (sm90/bwd_tiles.cuh) run on the host against
// BuildKeyTiles' lists: for every packed key tile, the row windows the
// consumers build (packed_key_window over the members' offsets, as the
// kernel lays them out) must be exactly each row's visible keys, computed
// here the plain way, so that the kernel's block-diagonal mask is checked on
// every length pattern without a GPU. The GPU tests (EvalGpu.BwdSm90Verifies)
// check the whole kernel.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/schedule.h"
#include "kernels/templates/bwd_sm90_layout.h"
#include "kernels/templates/sm90/parts_host_test.h"

namespace kforge {
namespace {

using testing::Batch;

TEST(BwdTilesPart, PackedRowWindowsAreEachRowsOwnVisibleKeys) {
  std::mt19937 rng(7);
  int packed_tiles = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const bool cross = trial % 2 == 1, causal = trial % 4 >= 2;
    const Batch bt = testing::DrawShortBatch(rng, 300, cross);
    const int heads = 4, kv_heads = 2;
    auto kt = BuildKeyTiles(bt.cu_q, bt.cu_k, heads, kv_heads, 64, 128, causal,
                            TileOrder::kGrouped, true);
    ASSERT_TRUE(kt.ok()) << kt.status();
    const std::vector<int32_t> list = PackTiles(kt->tiles);
    KfAttnParams p{};
    p.cu_seqlens_q = bt.cu_q.data();
    p.cu_seqlens_k = bt.cu_k.data();
    p.heads = heads;
    p.kv_heads = kv_heads;
    p.causal = causal;
    p.tiles = list.data();
    p.num_tiles = static_cast<int>(kt->tiles.size());
    for (int idx = 0; idx < p.num_tiles; ++idx) {
      kfh::KeyTile T;
      ASSERT_TRUE((kfh::key_tile<64, 128>(p, idx, T)));
      if (!T.pack) continue;
      ++packed_tiles;
      // What the kernel relies on: one key block, at most 128 rows (the
      // window table), every query block visited.
      ASSERT_LE(T.lq, 128);
      ASSERT_LE(T.lk, 128);
      EXPECT_EQ(T.block, 0);
      EXPECT_EQ(T.m_first, 0);
      EXPECT_EQ(T.steps, T.group * ((T.lq + 63) / 64));
      int tab_q[kf_bwd_sm90_pack_entries()], tab_k[kf_bwd_sm90_pack_entries()];
      for (int j = 0; j <= T.pack; ++j) {
        tab_q[j] = bt.cu_q[T.b + j] - T.q0;
        tab_k[j] = bt.cu_k[T.b + j] - T.k0;
      }
      for (int r = 0; r < T.lq; ++r) {
        const int w = kfh::packed_key_window(p, T, r, tab_q, tab_k);
        const int lo = w & 0xffff, hi = w >> 16;
        // The plain rule: row r's sequence s, its position i, keys j <= i + Lk - Lq.
        int s = T.b;
        while (bt.cu_q[s + 1] <= T.q0 + r) ++s;
        const int i = T.q0 + r - bt.cu_q[s];
        const int lq = bt.cu_q[s + 1] - bt.cu_q[s], lk = bt.cu_k[s + 1] - bt.cu_k[s];
        for (int c = 0; c < T.lk; ++c) {
          const int key = T.k0 + c;
          const bool own = key >= bt.cu_k[s] && key < bt.cu_k[s + 1];
          const bool want = own && (!causal || key - bt.cu_k[s] <= i + lk - lq);
          ASSERT_EQ(c >= lo && c < hi, want)
              << "trial " << trial << " tile " << idx << " row " << r << " key " << c;
        }
      }
    }
  }
  EXPECT_GT(packed_tiles, 100);
}

}  // namespace
}  // namespace kforge

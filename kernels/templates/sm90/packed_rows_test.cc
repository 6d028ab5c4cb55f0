// The forward's packed-tile part (sm90/packed_rows.cuh) run on the host
// against BuildTiles' lists: for every packed query tile, the window
// packed_row_window gives each of the tile's 128 rows (from the offsets
// themselves here; the kernel searches a copy of them in shared memory) must be exactly the
// keys that row may see, computed here the plain way, so fwd_sm90's
// block-diagonal mask (PACK=1) is checked on every length pattern without a
// GPU. The GPU tests (EvalGpu) check the whole kernel.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/schedule.h"
#include "kernels/templates/sm90/parts_host_test.h"

namespace kforge {
namespace {

TEST(PackedRowsPart, ForwardRowWindowsAreEachRowsOwnVisibleKeys) {
  std::mt19937 rng(11);
  int packed_tiles = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const bool cross = trial % 2 == 1, causal = trial % 4 >= 2;
    const testing::Batch bt = testing::DrawShortBatch(rng, 300, cross);
    const std::vector<int32_t>& cu_q = bt.cu_q;
    const std::vector<int32_t>& cu_k = bt.cu_k;
    auto tiles = BuildTiles(cu_q, cu_k, 2, 128, 128, causal, /*pack_short=*/true);
    ASSERT_TRUE(tiles.ok()) << tiles.status();
    for (const TileWork& t : *tiles) {
      if (t.pack == 0) continue;
      ++packed_tiles;
      const int b = t.batch, n = t.pack;
      const int q0 = cu_q[b], k0 = cu_k[b];
      // What the kernel relies on: one key block of at most 128 keys.
      ASSERT_LE(cu_q[b + n] - q0, 128);
      ASSERT_LE(cu_k[b + n] - k0, 128);
      for (int r = 0; r < 128; ++r) {
        const int w = kfh::packed_row_window(causal, n, r, cu_q.data() + b, cu_k.data() + b);
        const int lo = w & 0xffff, hi = w >> 16;
        const int token = q0 + r;
        for (int c = 0; c < 128; ++c) {
          bool want = false;
          if (token < cu_q[b + n]) {
            // The plain rule: row's sequence s, its position i, keys j <= i + Lk - Lq.
            int s = b;
            while (cu_q[s + 1] <= token) ++s;
            const int i = token - cu_q[s];
            const int lq = cu_q[s + 1] - cu_q[s], lk = cu_k[s + 1] - cu_k[s];
            const int key = k0 + c;
            const bool own = key >= cu_k[s] && key < cu_k[s + 1];
            want = own && (!causal || key - cu_k[s] <= i + lk - lq);
          }
          ASSERT_EQ(c >= lo && c < hi, want)
              << "trial " << trial << " tile b=" << b << " n=" << n << " row " << r << " key " << c;
        }
      }
    }
  }
  EXPECT_GT(packed_tiles, 100);
}

}  // namespace
}  // namespace kforge

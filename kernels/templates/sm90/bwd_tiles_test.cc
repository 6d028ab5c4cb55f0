// The backward's tile part (sm90/bwd_tiles.cuh) run on the host against
// BuildKeyTiles' lists: for every packed key tile, the row windows the
// consumers build (packed_key_window over the members' offsets, as the
// kernel lays them out) must be exactly each row's visible keys, computed
// here the plain way, so that the kernel's block-diagonal mask is checked on
// every length pattern without a GPU. The GPU tests (EvalGpu.BwdSm90Verifies)
// check the whole kernel.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "kernels/catalog.h"
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

// Split key tiles (bwd_sm90 SPLIT=1): the kernel's own counting rule, replayed
// over a whole plan with split halves. Each half takes steps [i0, i1); at a
// head's last step within its half it counts its key block into the query
// blocks its steps of that head visited (key_tile_block). Every (query block,
// head) must end at exactly key_blocks_into key blocks, the count at which
// the kernel converts dQ (once: no more, no fewer), and the two halves of a
// pair must take every step of the tile once.
TEST(BwdTilesPart, SplitHalvesCountEveryQueryBlockOnce) {
  int splits_seen = 0;
  // kv heads 2: a split falls between two query heads' steps; 4 (no GQA):
  // inside one head's.
  for (const int kv_heads : {2, 4})
  for (const bool causal : {false, true}) {
    // one long sequence among tiny ones (powerlaw_short's shape, smaller)
    std::vector<int32_t> cu = {0, 1500};
    for (int b = 0; b < 400; ++b) cu.push_back(cu.back() + 1 + b % 7);
    cu.push_back(cu.back() + 700);
    const int heads = 4;
    // the template's own manifest (grouped tiles, packed runs, split slots)
    auto v = Instantiate(
        "bwd_sm90", {{"BLOCK_M", 64}, {"BLOCK_N", 128}, {"STAGES", 2}, {"ORDER", 1}, {"SPLIT", 1}},
        128);
    ASSERT_TRUE(v.ok()) << v.status();
    const Manifest& m = v->manifest;
    auto plan = PlanLaunch(m, cu, {}, heads, causal, "sm_90a", 132, 1, kv_heads);
    ASSERT_TRUE(plan.ok()) << plan.status();
    KfAttnParams p{};
    p.cu_seqlens_q = cu.data();
    p.cu_seqlens_k = cu.data();
    p.heads = heads;
    p.kv_heads = kv_heads;
    p.causal = causal;
    p.tiles = plan->tiles.data();
    p.num_tiles = plan->num_tiles;
    std::map<int64_t, int> count;                    // (qbase + m) * heads + h -> key blocks
    std::map<int, std::vector<std::pair<int, int>>> halves;  // slot -> [i0, i1) of each half
    for (int idx = 0; idx < p.num_tiles; ++idx) {
      kfh::KeyTile T;
      ASSERT_TRUE((kfh::key_tile<64, 128, true>(p, idx, T)));
      if (T.block < 0 || T.pack) continue;
      if (T.half) halves[T.slot].push_back({T.i0, T.i1});
      std::vector<int> order;  // the steps in the half's own order
      for (int u = 0; u < T.i1 - T.i0; ++u) order.push_back(kfh::key_tile_step(T, u));
      std::vector<int> sorted = order;
      std::sort(sorted.begin(), sorted.end());
      for (int u = 0; u < T.i1 - T.i0; ++u) ASSERT_EQ(sorted[u], T.i0 + u) << "a step twice";
      if (T.half == 2) EXPECT_GT(order.front(), order.back()) << "half 2 walks backwards";
      std::set<int> heads_ended;
      for (const int i : order) {
        int lo = 0, hi = 0;
        if (!kfh::head_steps_end(T, i, lo, hi)) continue;
        const int h = T.g * T.group + i / T.visited;
        EXPECT_TRUE(heads_ended.insert(h).second) << "head " << h << " ended twice";
        // every step of [lo, hi) is taken by the time its head ends
        const auto at = [&](int j) { return std::find(order.begin(), order.end(), j); };
        for (int j = lo; j < hi; ++j) {
          EXPECT_TRUE(at(j) <= at(i)) << "step " << j << " after its head's end";
          EXPECT_EQ(j / T.visited, i / T.visited) << "step " << j << " of another head";
        }
        for (int j = lo; j < hi; ++j) {
          const int mm = kfh::key_tile_block<64, 128, true>(p, T, j);
          ++count[(int64_t{T.qbase} + mm) * heads + h];
        }
      }
    }
    EXPECT_GT(halves.size(), 0u) << "the long sequence's key tiles were not split";
    splits_seen += static_cast<int>(halves.size());
    for (const auto& [slot, hs] : halves) {
      ASSERT_EQ(hs.size(), 2u) << "slot " << slot;
      EXPECT_EQ(hs[0].first, 0);
      EXPECT_EQ(hs[0].second, hs[1].first);
      EXPECT_GT(hs[1].second, hs[1].first);
    }
    // Every plain sequence's query blocks: the count the kernel converts at.
    int64_t qbase = 0;
    for (size_t b = 0; b + 1 < cu.size(); ++b) {
      const int lq = cu[b + 1] - cu[b];
      const int blocks = (lq + 63) / 64;
      if (lq > 128) {  // not packed
        for (int mm = 0; mm < blocks; ++mm) {
          for (int h = 0; h < heads; ++h) {
            const int want = kfh::key_blocks_into<64, 128>(lq, lq, mm, causal);
            EXPECT_EQ(count[(qbase + mm) * heads + h], want)
                << "sequence " << b << " block " << mm << " head " << h;
          }
        }
      }
      qbase += blocks;
    }
    // The workspace holds the pairs after the counters' area.
    EXPECT_EQ(plan->workspace_bytes,
              SplitAreaOffset(0, cu.back(), static_cast<int64_t>(cu.size()) - 1, heads, 64) +
                  static_cast<int64_t>(halves.size()) * (256 + m.split_slot_bytes));
  }
  EXPECT_GT(splits_seen, 0);
}

}  // namespace
}  // namespace kforge

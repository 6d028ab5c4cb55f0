#include "kernels/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <random>
#include <set>
#include <tuple>

namespace kforge {
namespace {

TEST(ScheduleTest, EmptySequencesAreSkipped) {
  const std::vector<int32_t> cu = {0, 0, 5, 5, 70};  // lengths 0, 5, 0, 65
  auto tiles = BuildTiles(cu, {}, /*heads=*/2, /*tile_m=*/64, /*tile_n=*/64, false);
  ASSERT_TRUE(tiles.ok()) << tiles.status();
  // sequence 1: 1 tile, sequence 3: 2 tiles; times 2 heads.
  EXPECT_EQ(tiles->size(), 6u);
  for (const auto& t : *tiles) EXPECT_TRUE(t.batch == 1 || t.batch == 3);
}

TEST(ScheduleTest, CausalWorkCountsOnlyVisibleKeyBlocks) {
  // Self-attention, L = 256, tiles 64x64: block m sees key blocks 0..m.
  for (int m = 0; m < 4; ++m) EXPECT_EQ(TileKeyBlocks(256, 256, m, 64, 64, true), m + 1);
  EXPECT_EQ(TileKeyBlocks(256, 256, 0, 64, 64, false), 4);
  // Bottom-right alignment: 64 queries over 256 keys see every key block.
  EXPECT_EQ(TileKeyBlocks(64, 256, 0, 64, 64, true), 4);
  // More queries than keys: the first rows see no key at all.
  EXPECT_EQ(TileKeyBlocks(256, 64, 0, 64, 64, true), 0);
  EXPECT_EQ(TileKeyBlocks(256, 64, 3, 64, 64, true), 1);
  // Partial last tile: rows 64..99 of L=100 see keys < 100 -> 2 blocks of 64.
  EXPECT_EQ(TileKeyBlocks(100, 100, 1, 64, 64, true), 2);
  EXPECT_EQ(TileKeyBlocks(0, 0, 0, 64, 64, false), 0);
}

TEST(ScheduleTest, LongestWorkFirstWithStableTies) {
  const std::vector<int32_t> cu = {0, 10, 300, 310};  // lengths 10, 290, 10
  auto tiles = BuildTiles(cu, {}, 1, 64, 64, true);
  ASSERT_TRUE(tiles.ok());
  for (size_t i = 1; i < tiles->size(); ++i) EXPECT_GE((*tiles)[i - 1].work, (*tiles)[i].work);
  EXPECT_EQ(tiles->front().batch, 1);
  EXPECT_EQ(tiles->front().m_block, 4);
  // Ties keep (sequence, query block) order: sequence 0 before sequence 2.
  for (size_t i = 1; i < tiles->size(); ++i) {
    if ((*tiles)[i - 1].work == (*tiles)[i].work) {
      EXPECT_LE((*tiles)[i - 1].batch, (*tiles)[i].batch);
    }
  }
}

TEST(ScheduleTest, TilesWithNoVisibleKeysAreKept) {
  const std::vector<int32_t> cq = {0, 128};
  const std::vector<int32_t> ck = {0, 0};
  auto tiles = BuildTiles(cq, ck, 1, 64, 64, false);
  ASSERT_TRUE(tiles.ok());
  EXPECT_EQ(tiles->size(), 2u);  // rows must still be written (zeros, LSE -inf)
  EXPECT_EQ(tiles->front().work, 1);
}

TEST(ScheduleTest, RejectsBadOffsets) {
  const std::vector<int32_t> bad = {0, 5, 3};
  auto t = BuildTiles(bad, {}, 1, 64, 64, false);
  EXPECT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("cu_seqlens_q[2]"), std::string::npos);
  const std::vector<int32_t> bad0 = {1, 5};
  EXPECT_FALSE(BuildTiles(bad0, {}, 1, 64, 64, false).ok());
  const std::vector<int32_t> cq = {0, 5}, ck = {0, 5, 6};
  EXPECT_FALSE(BuildTiles(cq, ck, 1, 64, 64, false).ok());
}

TEST(ScheduleTest, PackTilesIsInt4) {
  std::vector<TileWork> t = {{3, 1, 2, 9}};
  EXPECT_EQ(PackTiles(t), (std::vector<int32_t>{3, 1, 2, 0}));
}

Manifest TestManifest(GridPolicy g) {
  Manifest m;
  m.threads = 256;
  m.dynamic_smem_bytes = 96 * 1024;
  m.grid = g;
  m.tile_m = 128;
  m.tile_n = 64;
  m.archs = {"sm_90a"};
  m.head_dims = {128};
  return m;
}

TEST(ScheduleTest, PersistentGridIsSmsTimesCtas) {
  std::vector<int32_t> cu = {0};
  for (int b = 0; b < 100; ++b) cu.push_back(cu.back() + 1000);
  auto plan = PlanLaunch(TestManifest(GridPolicy::kPersistent), cu, {}, 4, false, "sm_90a", 132);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->grid[0], 132u * 2);  // 96 KB + 1 KB twice in 228 KB
  EXPECT_EQ(plan->num_tiles, 100 * 4 * 8);
  EXPECT_EQ(plan->tiles.size(), 4u * plan->num_tiles);
  // Fewer tiles than CTA slots: one CTA per tile.
  std::vector<int32_t> small = {0, 10};
  plan = PlanLaunch(TestManifest(GridPolicy::kPersistent), small, {}, 1, false, "sm_90a", 132, 1);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->grid[0], 1u);
}

// The static round-robin reads entry t * grid + c as CTA c's t-th tile; a
// balanced list must hold every tile once, end each CTA's list with a stop
// entry where it is shorter, and leave no CTA more than one tile's work
// above the least loaded (greedy longest-first).
TEST(ScheduleTest, BalancedListDealsEveryTileOnceToTheLeastLoadedCta) {
  // One long sequence (16 tiles of 17 units) among many tiny ones (2 units).
  std::vector<int32_t> cu = {0, 2048};
  for (int b = 0; b < 100; ++b) cu.push_back(cu.back() + 1 + b % 5);
  Manifest m = TestManifest(GridPolicy::kPersistent);
  m.tile_n = 128;
  m.tile_order = TileOrder::kBalanced;
  auto lpt = BuildTiles(cu, {}, 4, 128, 128, false);
  ASSERT_TRUE(lpt.ok());
  auto plan = PlanLaunch(m, cu, {}, 4, false, "sm_90a", 132, 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const int grid = static_cast<int>(plan->grid[0]);
  ASSERT_EQ(grid, 132);
  ASSERT_EQ(plan->num_tiles % grid, 0);
  ASSERT_EQ(plan->tiles.size(), 4u * plan->num_tiles);
  std::map<std::array<int32_t, 4>, int> seen;
  std::vector<int64_t> load(grid, 0);
  std::vector<bool> stopped(grid, false);
  for (int i = 0; i < plan->num_tiles; ++i) {
    const int32_t* e = plan->tiles.data() + 4 * i;
    const int c = i % grid;
    if (e[0] < 0) {
      stopped[c] = true;
      continue;
    }
    EXPECT_FALSE(stopped[c]) << "CTA " << c << " has a tile after its stop entry";
    ++seen[{e[0], e[1], e[2], e[3]}];
    load[c] += TileKeyBlocks(cu[e[0] + 1] - cu[e[0]], cu[e[0] + 1] - cu[e[0]], e[2], 128, 128,
                             false) + 1;
  }
  EXPECT_EQ(seen.size(), lpt->size());
  for (const auto& [tile, n] : seen) EXPECT_EQ(n, 1);
  const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
  EXPECT_LE(*hi - *lo, 17) << "the heaviest CTA is more than one long tile above the lightest";
  // The long tiles each went to a CTA of their own, with nothing after them.
  int long_alone = 0;
  for (int c = 0; c < grid; ++c) long_alone += load[c] == 17 && plan->tiles[4 * (grid + c)] < 0;
  EXPECT_EQ(long_alone, 4 * 16);
}

TEST(ScheduleTest, BalanceTilesOfOneListIsTheInput) {
  const std::vector<TileWork> tiles = {{0, 0, 0, 5, 0}, {1, 0, 0, 3, 0}};
  const auto out = BalanceTiles(tiles, 1);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].batch, 1);
  // Two lists, three tiles: list 0 gets 5, list 1 gets 3 then 2; list 0 stops.
  const std::vector<TileWork> three = {{0, 0, 0, 5, 0}, {1, 0, 0, 3, 0}, {2, 0, 0, 2, 0}};
  const auto two = BalanceTiles(three, 2);
  ASSERT_EQ(two.size(), 4u);
  EXPECT_EQ(two[0].batch, 0);
  EXPECT_EQ(two[1].batch, 1);
  EXPECT_EQ(two[2].batch, -1);
  EXPECT_EQ(two[3].batch, 2);
}

TEST(ScheduleTest, PerTileGridIsBlocksHeadsBatch) {
  std::vector<int32_t> cu = {0, 10, 300};
  auto plan = PlanLaunch(TestManifest(GridPolicy::kPerTile), cu, {}, 4, true, "sm_90a", 132);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->grid, (std::array<unsigned, 3>{3, 4, 2}));
  EXPECT_TRUE(plan->tiles.empty());
  EXPECT_EQ(plan->threads, 256u);
}

TEST(ScheduleTest, EmptyBatchIsMarkedEmpty) {
  std::vector<int32_t> cu = {0, 0, 0};
  auto plan = PlanLaunch(TestManifest(GridPolicy::kPersistent), cu, {}, 4, true, "sm_90a", 132);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->empty);
}

}  // namespace
}  // namespace kforge

namespace kforge {
namespace {

TEST(ScheduleTest, PacksRunsOfShortSequences) {
  // lengths 3, 0, 5, 100, 2, 2, 60 with tile 64: {3,0,5} pack (3 members incl. the empty one),
  // 100 is two plain tiles, {2,2} pack, 60 would overflow {2,2}+60 = 64 -> fits exactly.
  std::vector<int32_t> cu = {0};
  for (int l : {3, 0, 5, 100, 2, 2, 60}) cu.push_back(cu.back() + l);
  auto tiles = BuildTiles(cu, {}, 1, 64, 64, false, /*pack_short=*/true);
  ASSERT_TRUE(tiles.ok()) << tiles.status();
  std::vector<std::pair<int, int>> got;  // (batch, pack)
  for (const auto& t : *tiles) got.push_back({t.batch, t.pack});
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<std::pair<int, int>>{{0, 3}, {3, 0}, {3, 0}, {4, 3}}));
  int64_t rows = 0;
  for (const auto& t : *tiles) {
    if (t.pack > 0) rows += cu[t.batch + t.pack] - cu[t.batch];
  }
  EXPECT_EQ(rows, 8 + 64);
}

TEST(ScheduleTest, PackingIsOffForPerTileAndByDefault) {
  std::vector<int32_t> cu = {0, 1, 2, 3};
  auto tiles = BuildTiles(cu, {}, 1, 64, 64, false);
  ASSERT_TRUE(tiles.ok());
  EXPECT_EQ(tiles->size(), 3u);
  for (const auto& t : *tiles) EXPECT_EQ(t.pack, 0);
}

TEST(ScheduleTest, LoneShortSequenceStaysPlain) {
  std::vector<int32_t> cu = {0, 10, 200};
  auto tiles = BuildTiles(cu, {}, 1, 64, 64, false, true);
  ASSERT_TRUE(tiles.ok());
  for (const auto& t : *tiles) EXPECT_EQ(t.pack, 0);
  EXPECT_EQ(tiles->size(), 1u + 3u);
}

}  // namespace
}  // namespace kforge

namespace kforge {
namespace {
TEST(ScheduleTest, GroupedOrderKeepsASequencesTilesTogether) {
  const std::vector<int32_t> cu = {0, 200, 500, 520};  // 200, 300, 20
  auto tiles = BuildTiles(cu, {}, 2, 64, 64, true, false, TileOrder::kGrouped);
  ASSERT_TRUE(tiles.ok());
  // Groups: (1,h) longest, then (0,h), then (2,h); inside a group work descends.
  std::vector<std::pair<int, int>> order;
  for (const auto& t : *tiles) {
    if (order.empty() || order.back() != std::make_pair(t.batch, t.head)) {
      order.push_back({t.batch, t.head});
    }
  }
  EXPECT_EQ(order, (std::vector<std::pair<int, int>>{{1, 0}, {1, 1}, {0, 0}, {0, 1}, {2, 0}, {2, 1}}));
  for (size_t i = 1; i < tiles->size(); ++i) {
    const auto& a = (*tiles)[i - 1];
    const auto& b = (*tiles)[i];
    if (a.batch == b.batch && a.head == b.head) EXPECT_GE(a.work, b.work);
  }
}
}  // namespace
}  // namespace kforge

namespace kforge {
namespace {

// Replays what a key-major kernel does with the tiles: each key tile adds
// into the query blocks it visits (first row that sees its first key, to the
// end), and the count every (query block, head) receives must be the one the
// kernel waits for (TileKeyBlocks); blocks that receive none have a zero tile.
TEST(KeyMajorTiles, EveryQueryBlockIsCompletedExactlyOnce) {
  struct Case {
    std::vector<int32_t> cu_q, cu_k;
    bool causal;
  };
  const std::vector<Case> cases = {
      {{0, 100, 100, 350, 351}, {}, true},
      {{0, 100, 100, 350, 351}, {}, false},
      {{0, 70, 70, 300, 305}, {0, 0, 90, 100, 400}, true},   // Lk = 0, Lq = 0, Lq > Lk, Lq < Lk
      {{0, 70, 70, 300, 305}, {0, 0, 90, 100, 400}, false},
  };
  const int heads = 4, kv_heads = 2, tm = 64, tn = 32;
  for (const TileOrder order : {TileOrder::kLongestFirst, TileOrder::kGrouped, TileOrder::kKeyLevels})
  for (const auto& c : cases) {
    auto kt = BuildKeyTiles(c.cu_q, c.cu_k, heads, kv_heads, tm, tn, c.causal, order);
    ASSERT_TRUE(kt.ok()) << kt.status();
    const std::vector<int32_t>& cu_k = c.cu_k.empty() ? c.cu_q : c.cu_k;
    std::map<std::pair<int64_t, int>, int> got;  // (query block, head) -> adds
    std::set<std::pair<int64_t, int>> zeroed;
    std::set<std::tuple<int, int, int>> key_tiles;
    for (const TileWork& t : kt->tiles) {
      const int64_t lq = c.cu_q[t.batch + 1] - c.cu_q[t.batch];
      const int64_t lk = cu_k[t.batch + 1] - cu_k[t.batch];
      if (t.m_block < 0) {
        zeroed.insert({t.pack + (-1 - t.m_block), t.head});
        continue;
      }
      key_tiles.insert({t.batch, t.head, t.m_block});
      const int64_t n0 = int64_t{t.m_block} * tn;
      const int64_t first = c.causal ? std::max<int64_t>(0, n0 - (lk - lq)) : 0;
      if (first >= lq) continue;
      for (int64_t m = first / tm; m < (lq + tm - 1) / tm; ++m) {
        for (int h = t.head * (heads / kv_heads); h < (t.head + 1) * (heads / kv_heads); ++h) {
          got[{t.pack + m, h}]++;
        }
      }
    }
    int64_t qbase = 0;
    for (size_t b = 0; b + 1 < c.cu_q.size(); ++b) {
      const int64_t lq = c.cu_q[b + 1] - c.cu_q[b], lk = cu_k[b + 1] - cu_k[b];
      for (int64_t nb = 0; nb < (lk + tn - 1) / tn; ++nb) {
        for (int g = 0; g < kv_heads; ++g) {
          EXPECT_TRUE(key_tiles.count({int(b), g, int(nb)})) << "seq " << b << " key block " << nb;
        }
      }
      for (int64_t m = 0; m < (lq + tm - 1) / tm; ++m) {
        const int64_t want = TileKeyBlocks(lq, lk, m, tm, tn, c.causal);
        for (int h = 0; h < heads; ++h) {
          const auto key = std::make_pair(qbase + m, h);
          EXPECT_EQ(got.count(key) ? got[key] : 0, want) << "seq " << b << " block " << m;
          EXPECT_EQ(zeroed.count(key) == 1, want == 0) << "seq " << b << " block " << m;
        }
      }
      qbase += (lq + tm - 1) / tm;
    }
    EXPECT_EQ(kt->query_blocks, qbase);
  }
}

// Grouped: the key tiles of one (sequence, kv head) are adjacent, heaviest
// first inside; heavier groups first; the zero-dQ tiles come last. The same
// tiles as the longest-first list, in another order.
TEST(KeyMajorTiles, GroupedOrderKeepsASequencesKeyBlocksTogether) {
  const std::vector<int32_t> cu_q = {0, 300, 300, 1000, 1100}, cu_k = {0, 250, 340, 1040, 1040};
  const int heads = 4, kv_heads = 2;
  auto lpt = BuildKeyTiles(cu_q, cu_k, heads, kv_heads, 64, 128, true);
  auto grouped = BuildKeyTiles(cu_q, cu_k, heads, kv_heads, 64, 128, true, TileOrder::kGrouped);
  ASSERT_TRUE(lpt.ok() && grouped.ok());
  auto key = [](const TileWork& t) { return std::make_tuple(t.batch, t.head, t.m_block, t.work, t.pack); };
  std::multiset<std::tuple<int, int, int, int64_t, int>> a, b;
  for (const auto& t : lpt->tiles) a.insert(key(t));
  for (const auto& t : grouped->tiles) b.insert(key(t));
  EXPECT_EQ(a, b);
  std::set<std::pair<int, int>> closed;  // groups already left
  std::pair<int, int> current = {-1, -1};
  int64_t last_total = INT64_MAX, total = 0, last_work = INT64_MAX;
  bool zeros = false;
  std::map<std::pair<int, int>, int64_t> totals;
  for (const auto& t : grouped->tiles) if (t.m_block >= 0) totals[{t.batch, t.head}] += t.work;
  for (const auto& t : grouped->tiles) {
    if (t.m_block < 0) {
      zeros = true;
      continue;
    }
    EXPECT_FALSE(zeros) << "a key tile after the zero-dQ tiles";
    const std::pair<int, int> g = {t.batch, t.head};
    if (g != current) {
      EXPECT_FALSE(closed.count(g)) << "group (" << g.first << ", " << g.second << ") split";
      if (current.first >= 0) closed.insert(current);
      current = g;
      total = totals[g];
      EXPECT_LE(total, last_total);
      last_total = total;
      last_work = INT64_MAX;
    }
    EXPECT_LE(t.work, last_work);
    last_work = t.work;
  }
}

// Grouped, given the grid: a batch of a few long causal sequences (each group
// one sequence and head, 32 key blocks of 64 down to 2 steps) has its last
// groups, at most 12 and at most one round of the grid's work, dealt longest
// tile first; every group before them stays whole, in the same place. Without
// the grid (ctas 0) the list is the plain grouped one.
TEST(KeyMajorTiles, GroupedOrderDealsItsTailLongestFirst) {
  std::vector<int32_t> cu = {0};
  for (int b = 0; b < 32; ++b) cu.push_back(cu.back() + 4096 - 13 * b);
  const int heads = 4, ctas = 132;
  auto plain = BuildKeyTiles(cu, {}, heads, heads, 64, 128, true, TileOrder::kGrouped);
  auto dealt = BuildKeyTiles(cu, {}, heads, heads, 64, 128, true, TileOrder::kGrouped, false, ctas);
  ASSERT_TRUE(plain.ok() && dealt.ok());
  ASSERT_EQ(plain->tiles.size(), dealt->tiles.size());
  auto key = [](const TileWork& t) { return std::make_tuple(t.batch, t.head, t.m_block, t.work, t.pack); };
  std::multiset<std::tuple<int, int, int, int64_t, int>> a, b;
  for (const auto& t : plain->tiles) a.insert(key(t));
  for (const auto& t : dealt->tiles) b.insert(key(t));
  EXPECT_EQ(a, b);
  // The tail starts with the group of the first tile that differs.
  size_t first = 0;
  while (first < plain->tiles.size() && key(plain->tiles[first]) == key(dealt->tiles[first])) ++first;
  ASSERT_LT(first, plain->tiles.size()) << "the tail was not dealt";
  auto group = [&](size_t i) { return std::make_pair(plain->tiles[i].batch, plain->tiles[i].head); };
  while (first > 0 && group(first - 1) == group(first)) --first;
  ASSERT_GT(first, 0u) << "every group was dealt";
  std::set<std::pair<int, int>> tail_groups;
  int64_t tail_work = 0, heaviest = 0;
  for (const auto& t : plain->tiles) heaviest = std::max(heaviest, t.work);
  for (size_t i = first; i < dealt->tiles.size(); ++i) {
    const TileWork& t = dealt->tiles[i];
    tail_groups.insert({t.batch, t.head});
    tail_work += t.work;
    if (i > first) EXPECT_LE(t.work, dealt->tiles[i - 1].work) << "tile " << i;
  }
  EXPECT_GE(tail_groups.size(), 2u);
  EXPECT_LE(tail_groups.size(), 12u);
  EXPECT_LE(tail_work, ctas * heaviest);
  // Key block j of a group still comes after j - 1 (works fall with j).
  std::map<std::pair<int, int>, int> next;
  for (const auto& t : dealt->tiles) {
    const int due = next[std::make_pair(t.batch, t.head)]++;
    EXPECT_EQ(t.m_block, due) << "sequence " << t.batch << " head " << t.head;
  }
}

// What bwd_sm90's dQ counting and DET=1's ordered dQ adds need to be free of
// deadlock (CONTRACT.md "Backward"): in the "lpt" and "grouped" orders key block
// j of a (sequence, kv head) comes after key block j - 1; in "levels" (DET=1's
// adds go last key block first) after key block j + 1. And "levels" deals the
// groups key block by key block, last first: without a causal mask a few groups
// at a time (with room for all eight groups of four sequences, 24 CTAs over a
// mean of 9 steps a tile: 8 groups at once, every last key block, then every
// third one; with 9 CTAs, three groups at a time); with one, and key blocks
// two query blocks wide, a group at a time.
TEST(KeyMajorTiles, EveryOrderPutsKeyBlocksInTheOrderOfTheAdds) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<int32_t> cu_q = {0}, cu_k = {0};
    for (int b = 0; b < 12; ++b) {
      const int len = rng() % 4 == 0 ? static_cast<int>(rng() % 1500) : static_cast<int>(rng() % 200);
      cu_q.push_back(cu_q.back() + len);
      cu_k.push_back(cu_k.back() + (trial % 2 ? static_cast<int>(rng() % 1500) : len));
    }
    const bool causal = trial % 3 != 0;
    for (const TileOrder order : {TileOrder::kLongestFirst, TileOrder::kGrouped, TileOrder::kKeyLevels}) {
      for (const bool pack : {false, true}) {
        auto kt = BuildKeyTiles(cu_q, trial % 2 ? cu_k : std::vector<int32_t>{}, 4, 2, 64, 128,
                                causal, order, pack);
        ASSERT_TRUE(kt.ok()) << kt.status();
        // (sequence, kv head) -> the key blocks in list order
        std::map<std::pair<int, int>, std::vector<int>> seen;
        for (const TileWork& t : kt->tiles) {
          if (t.m_block < 0 || t.pack < 0) continue;  // zero-dQ tiles, packed runs
          seen[{t.batch, t.head}].push_back(t.m_block);
        }
        for (auto& [group, blocks] : seen) {
          if (order == TileOrder::kKeyLevels) std::reverse(blocks.begin(), blocks.end());
          for (size_t j = 0; j < blocks.size(); ++j) {
            EXPECT_EQ(blocks[j], static_cast<int>(j))
                << "trial " << trial << " order " << TileOrderName(order) << " seq " << group.first;
          }
        }
      }
    }
  }
  const std::vector<int32_t> cu = {0, 512, 1024, 1536, 2048};
  auto levels = BuildKeyTiles(cu, {}, 2, 2, 64, 128, false, TileOrder::kKeyLevels, false, 24);
  ASSERT_TRUE(levels.ok()) << levels.status();
  ASSERT_EQ(levels->tiles.size(), 32u);
  for (size_t i = 0; i < levels->tiles.size(); ++i) {
    EXPECT_EQ(levels->tiles[i].m_block, static_cast<int>(3 - i / 8)) << i;
  }
  levels = BuildKeyTiles(cu, {}, 2, 2, 64, 128, false, TileOrder::kKeyLevels, false, 9);
  ASSERT_TRUE(levels.ok()) << levels.status();
  std::vector<int> blocks, groups;
  for (const TileWork& t : levels->tiles) {
    blocks.push_back(t.m_block);
    groups.push_back(2 * t.batch + t.head);
  }
  EXPECT_EQ(blocks, (std::vector<int>{3, 3, 3, 2, 2, 2, 1, 1, 1, 0, 0, 0, 3, 3, 3, 2, 2, 2,
                                      1, 1, 1, 0, 0, 0, 3, 3, 2, 2, 1, 1, 0, 0}));
  EXPECT_EQ(groups, (std::vector<int>{0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5,
                                      3, 4, 5, 3, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7}));
  // Causal: one group at a time, its key blocks last first, heavier groups first.
  levels = BuildKeyTiles(cu, {}, 2, 2, 64, 128, true, TileOrder::kKeyLevels, false, 9);
  ASSERT_TRUE(levels.ok()) << levels.status();
  blocks.clear();
  groups.clear();
  for (const TileWork& t : levels->tiles) {
    blocks.push_back(t.m_block);
    groups.push_back(2 * t.batch + t.head);
  }
  std::vector<int> want_blocks, want_groups;
  for (int g = 0; g < 8; ++g) {
    for (int j = 3; j >= 0; --j) {
      want_blocks.push_back(j);
      want_groups.push_back(g);
    }
  }
  EXPECT_EQ(blocks, want_blocks);
  EXPECT_EQ(groups, want_groups);
  // Causal with key blocks one query block wide: dealt as without a mask.
  levels = BuildKeyTiles(cu, {}, 2, 2, 128, 128, true, TileOrder::kKeyLevels, false, 9);
  ASSERT_TRUE(levels.ok()) << levels.status();
  ASSERT_GE(levels->tiles.size(), 2u);
  EXPECT_EQ(levels->tiles[0].m_block, 3);
  EXPECT_EQ(levels->tiles[1].m_block, 3);
  EXPECT_NE(2 * levels->tiles[0].batch + levels->tiles[0].head,
            2 * levels->tiles[1].batch + levels->tiles[1].head);
}

// pack_short: runs of consecutive short sequences become one tile {b, g, 0,
// -n} per kv head: n >= 2, at most tile_n queries and keys in all and
// kMaxKeyPack sequences, no empty sequence at its end. Every other sequence
// keeps its key blocks and zero-dQ tiles (the replay above still holds for
// them), a packed one has neither, and the counters keep their places.
// Only a few heavy key tiles are split (more than half the CTAs' worth would
// fill the GPU anyway), each into two halves of its steps with one slot.
TEST(KeyMajorTiles, OnlyAFewHeavyTilesAreSplit) {
  std::vector<int32_t> one_long = {0, 2048};
  for (int b = 0; b < 500; ++b) one_long.push_back(one_long.back() + 1 + b % 5);
  auto kt = BuildKeyTiles(one_long, {}, 4, 4, 64, 128, false, TileOrder::kGrouped, true);
  ASSERT_TRUE(kt.ok());
  std::vector<TileWork> tiles = kt->tiles;
  const int splits = SplitHeavyKeyTiles(tiles, 132);
  EXPECT_EQ(splits, 16 * 4);  // the 2048-key sequence's 16 key blocks x 4 kv heads
  EXPECT_EQ(tiles.size(), kt->tiles.size() + 16 * 4);
  std::map<int, int64_t> work_of_slot;
  for (const TileWork& t : tiles) {
    const int half = (t.head >> 16) & 3;
    if (half == 0) continue;
    EXPECT_EQ(t.batch, 0);
    EXPECT_LT(t.head & 0xffff, 4);
    work_of_slot[t.head >> 18] += t.work - 1;
  }
  ASSERT_EQ(work_of_slot.size(), 64u);
  for (const auto& [slot, steps] : work_of_slot) EXPECT_EQ(steps, 32 * 4 / 4) << slot;
  // 256 sequences of 2048: hundreds of heavy tiles, none split.
  std::vector<int32_t> dense = {0};
  for (int b = 0; b < 256; ++b) dense.push_back(dense.back() + 2048);
  kt = BuildKeyTiles(dense, {}, 4, 4, 64, 128, false, TileOrder::kGrouped, true);
  ASSERT_TRUE(kt.ok());
  tiles = kt->tiles;
  EXPECT_EQ(SplitHeavyKeyTiles(tiles, 132), 0);
  EXPECT_EQ(tiles.size(), kt->tiles.size());
}

// The heavy tiles split only where the halves shorten the list. A lone long
// sequence (v8: 147.6 -> 101.3 us) splits; beside it another long sequence
// and thousands of short ones, which keep every SM busy as long as the
// unsplit tiles run, it does not (powerlaw_short's case: 176-177 us with the
// SPLIT=0 kernel against 179-180 split, notes/bwd.md v14). With a causal mask
// the lone one still splits.
TEST(KeyMajorTiles, HeavyTilesSplitOnlyWhereTheListGetsShorter) {
  auto splits = [](std::vector<int32_t> lengths, bool causal = false) {
    std::vector<int32_t> cu = {0};
    for (int32_t l : lengths) cu.push_back(cu.back() + l);
    auto kt = BuildKeyTiles(cu, {}, 4, 4, 64, 128, causal, TileOrder::kGrouped, true);
    EXPECT_TRUE(kt.ok());
    std::vector<TileWork> tiles = kt->tiles;
    const int n = SplitHeavyKeyTiles(tiles, 132);
    if (n == 0) EXPECT_EQ(tiles.size(), kt->tiles.size());
    return n;
  };
  EXPECT_EQ(splits({1929}), 16 * 4);
  std::vector<int32_t> crowded = {1929, 862};
  for (int b = 0; b < 4000; ++b) crowded.push_back(1 + b % 5);
  EXPECT_EQ(splits(crowded), 0);
  std::vector<int32_t> alone = {1929};
  for (int b = 0; b < 200; ++b) alone.push_back(1 + b % 5);
  EXPECT_EQ(splits(alone), 16 * 4);
  EXPECT_GT(splits(alone, /*causal=*/true), 0);
}

TEST(KeyMajorTiles, PackedRunsHoldEachShortSequenceOnce) {
  std::vector<int32_t> lq = {5, 0, 7, 1, 300, 3, 0, 64, 64, 1, 200, 0, 0, 9, 0, 2};
  std::vector<int32_t> lk = {5, 0, 7, 0, 300, 9, 4, 60, 70, 1, 50, 0, 0, 9, 0, 2};
  for (int i = 0; i < 300; ++i) {  // a long run of tiny ones: capped at kMaxKeyPack
    lq.push_back(i % 3 == 0 ? 0 : 1);
    lk.push_back(i % 3 == 0 ? 0 : 1);
  }
  std::vector<int32_t> cu_q = {0}, cu_k = {0};
  for (size_t i = 0; i < lq.size(); ++i) {
    cu_q.push_back(cu_q.back() + lq[i]);
    cu_k.push_back(cu_k.back() + lk[i]);
  }
  const int heads = 4, kv_heads = 2, tm = 64, tn = 128;
  for (const bool causal : {false, true}) {
    auto plain = BuildKeyTiles(cu_q, cu_k, heads, kv_heads, tm, tn, causal);
    auto packed = BuildKeyTiles(cu_q, cu_k, heads, kv_heads, tm, tn, causal,
                                TileOrder::kGrouped, true);
    ASSERT_TRUE(plain.ok() && packed.ok());
    EXPECT_EQ(packed->query_blocks, plain->query_blocks);
    std::map<int, int> in_run;  // sequence -> its run's first sequence
    int runs = 0;
    for (const TileWork& t : packed->tiles) {
      if (t.pack >= 0) continue;
      const int n = -t.pack;
      ASSERT_GE(n, 2);
      EXPECT_LE(n, kMaxKeyPack);
      EXPECT_EQ(t.m_block, 0);
      EXPECT_LE(cu_q[t.batch + n] - cu_q[t.batch], tn);
      EXPECT_LE(cu_k[t.batch + n] - cu_k[t.batch], tn);
      EXPECT_GT(lq[t.batch + n - 1] + lk[t.batch + n - 1], 0) << "a run ends with an empty sequence";
      EXPECT_EQ(t.work, (cu_q[t.batch + n] - cu_q[t.batch] + tm - 1) / tm * (heads / kv_heads) + 1);
      if (t.head == 0) {
        ++runs;
        for (int b = t.batch; b < t.batch + n; ++b) {
          EXPECT_FALSE(in_run.count(b)) << "sequence " << b << " in two runs";
          in_run[b] = t.batch;
        }
      }
    }
    EXPECT_GE(runs, 4);
    EXPECT_EQ(in_run.count(4), 0u);   // 300 keys: plain
    EXPECT_EQ(in_run.count(10), 0u);  // 200 queries: plain
    EXPECT_EQ(in_run.count(0), 1u);
    EXPECT_EQ(in_run.count(3), 1u);   // 1 query, no key
    EXPECT_EQ(in_run.count(6), 1u);   // keys, no query
    // Every kv head has each run once, and the other tiles are the plain
    // list's, less those of packed sequences.
    std::multiset<std::tuple<int, int, int>> want, got;
    for (const TileWork& t : plain->tiles) {
      if (!in_run.count(t.batch)) want.insert({t.batch, t.head, t.m_block});
    }
    std::map<int, int> heads_of_run;
    for (const TileWork& t : packed->tiles) {
      if (t.pack < 0) {
        heads_of_run[t.batch] |= 1 << t.head;
      } else {
        EXPECT_FALSE(in_run.count(t.batch)) << "a packed sequence has a tile of its own";
        got.insert({t.batch, t.head, t.m_block});
      }
    }
    EXPECT_EQ(got, want);
    for (const auto& [b, mask] : heads_of_run) EXPECT_EQ(mask, (1 << kv_heads) - 1) << b;
  }
}

TEST(KeyMajorTiles, PlanSizesTheCountersAndNeedsThePersistentGrid) {
  Manifest m;
  m.threads = 128;
  m.grid = GridPolicy::kPersistent;
  m.tile_m = 64;
  m.tile_n = 64;
  m.ops = {"bwd"};
  m.key_major = true;
  const std::vector<int32_t> cu = {0, 100, 228};  // 2 + 2 query blocks
  auto plan = PlanLaunch(m, cu, {}, 8, true, "sm_90a", 132, 1, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->workspace_bytes, 4 * 8 * 4);
  EXPECT_EQ(plan->num_tiles, (2 + 2) * 4);  // key blocks per sequence x kv heads
  m.grid = GridPolicy::kPerTile;
  EXPECT_FALSE(PlanLaunch(m, cu, {}, 8, true, "sm_90a", 132, 1, 4).ok());
}

}  // namespace
}  // namespace kforge

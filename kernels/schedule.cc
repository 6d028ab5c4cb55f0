#include "kernels/schedule.h"

#include <algorithm>
#include <climits>
#include <map>
#include <queue>

#include <fmt/format.h>

namespace kforge {
namespace {

absl::Status CheckOffsets(std::span<const int32_t> cu, const char* name) {
  if (cu.size() < 1) return absl::InvalidArgumentError(fmt::format("{}: empty", name));
  if (cu[0] != 0) {
    return absl::InvalidArgumentError(fmt::format("{}[0]: {} must be 0", name, cu[0]));
  }
  for (size_t i = 1; i < cu.size(); ++i) {
    if (cu[i] < cu[i - 1]) {
      return absl::InvalidArgumentError(
          fmt::format("{}[{}]: {} is less than the previous offset {}", name, i, cu[i], cu[i - 1]));
    }
  }
  return absl::OkStatus();
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// What both tile builders need: valid offsets of equal length (cu_k empty
// means self-attention and becomes cu_q), heads > 0 and a positive tile.
absl::Status CheckTileInputs(std::span<const int32_t> cu_q, std::span<const int32_t>& cu_k,
                             int heads, int tile_m, int tile_n) {
  if (auto s = CheckOffsets(cu_q, "cu_seqlens_q"); !s.ok()) return s;
  if (cu_k.empty()) cu_k = cu_q;
  if (auto s = CheckOffsets(cu_k, "cu_seqlens_k"); !s.ok()) return s;
  if (cu_k.size() != cu_q.size()) {
    return absl::InvalidArgumentError(fmt::format(
        "cu_seqlens_k: {} entries, cu_seqlens_q has {}", cu_k.size(), cu_q.size()));
  }
  if (heads <= 0) return absl::InvalidArgumentError(fmt::format("heads: {} must be > 0", heads));
  if (tile_m <= 0 || tile_n <= 0) {
    return absl::InvalidArgumentError(fmt::format("tile: {}x{} must be positive", tile_m, tile_n));
  }
  return absl::OkStatus();
}

// TileOrder::kGrouped: the tiles of one (sequence, head) adjacent, heaviest
// first inside, groups by descending total work; tiles with m_block < 0 (the
// key-major zero-dQ tiles, one unit of work each) last, in their order.
void SortGrouped(std::vector<TileWork>& tiles) {
  std::map<std::pair<int32_t, int32_t>, int64_t> total;
  for (const auto& t : tiles) {
    if (t.m_block >= 0) total[{t.batch, t.head}] += t.work;
  }
  std::stable_sort(tiles.begin(), tiles.end(), [&](const TileWork& a, const TileWork& b) {
    const bool za = a.m_block < 0, zb = b.m_block < 0;
    if (za != zb) return zb;
    if (za) return false;
    const int64_t wa = total[{a.batch, a.head}], wb = total[{b.batch, b.head}];
    if (wa != wb) return wa > wb;
    if (a.batch != b.batch) return a.batch < b.batch;
    if (a.head != b.head) return a.head < b.head;
    return a.work > b.work;
  });
}

// TileOrder::kKeyLevels (ordered dQ adds: manifest deterministic). The
// (sequence, kv head) groups by descending total work, each group's key blocks
// last first (the order of the adds: bwd_sm90 and bwd_mma DET=1),
// dealt `g` groups at a time, key block by key block: the last key block of
// each of the g groups, then the one before it of each, and so on; then the
// packed runs and the zero-dQ tiles, longest first. So key block j of a group
// comes g - 1 tiles or so after key block j + 1, which a persistent grid starts
// a few steps later. Without a mask every key block visits the query blocks
// from the first, so j needs j + 1 a step ahead, plus the step its add takes
// to be published: g is 3 steps, in tiles (the CTAs over a tile's mean work in
// steps). Under a causal mask, with key blocks at least two query blocks wide,
// key block j + 1 reaches each query block two steps after key block j does
// (it starts further on), so a group's key blocks may start together
// (`together`; with blocks one query block wide that room is a single step,
// dealt apart as the measured form is): g = 1, the grouped order's L2
// footprint (the levels of 12 groups at once, in key order, ran
// hstu_prod_causal 1.65x slower than the grouped list: notes/bwd.md v21, v23).
// Few groups run at once, so the Q, dO and dq_accum rows they visit stay in L2.
void SortKeyLevels(std::vector<TileWork>& tiles, int ctas, bool together) {
  std::map<std::pair<int32_t, int32_t>, std::vector<TileWork>> by_group;
  std::vector<std::pair<int32_t, int32_t>> groups;  // in list order
  std::map<std::pair<int32_t, int32_t>, int64_t> total;
  std::vector<TileWork> rest;
  int64_t work = 0, plain = 0;
  for (const TileWork& t : tiles) {
    if (t.m_block < 0 || t.pack < 0) {
      rest.push_back(t);
      continue;
    }
    auto& g = by_group[{t.batch, t.head}];
    if (g.empty()) groups.push_back({t.batch, t.head});
    g.push_back(t);  // key block order: the list is built so
    total[{t.batch, t.head}] += t.work;
    work += t.work;
    ++plain;
  }
  std::stable_sort(groups.begin(), groups.end(),
                   [&](const auto& a, const auto& b) { return total[a] > total[b]; });
  const int64_t mean = plain > 0 ? std::max<int64_t>(1, work / plain) : 1;
  const int64_t deal =
      together ? 1 : std::clamp<int64_t>(CeilDiv(3 * std::max(ctas, 1), mean), 1, 64);
  tiles.clear();
  for (size_t first = 0; first < groups.size(); first += static_cast<size_t>(deal)) {
    const size_t last = std::min(groups.size(), first + static_cast<size_t>(deal));
    for (size_t j = 0;; ++j) {
      bool any = false;
      for (size_t g = first; g < last; ++g) {
        const auto& list = by_group[groups[g]];
        if (j < list.size()) {
          tiles.push_back(list[list.size() - 1 - j]);
          any = true;
        }
      }
      if (!any) break;
    }
  }
  std::stable_sort(rest.begin(), rest.end(),
                   [](const TileWork& a, const TileWork& b) { return a.work > b.work; });
  tiles.insert(tiles.end(), rest.begin(), rest.end());
}

// Key-major packing: the end e of the run of consecutive sequences from b
// that share one key block (e == b + 1: no run). A member has at most tile_n
// queries and tile_n keys, and the run's summed queries and keys stay within
// tile_n; sequences with neither are absorbed (not at the run's end); a run
// has at most kMaxKeyPack sequences, the table the kernel keeps of them.
int KeyPackEnd(std::span<const int32_t> cu_q, std::span<const int32_t> cu_k, int b, int tile_n) {
  const int batch = static_cast<int>(cu_q.size()) - 1;
  int64_t rows = 0, keys = 0;
  int e = b, members = 0;
  while (e < batch && e - b < kMaxKeyPack) {
    const int64_t q = cu_q[e + 1] - cu_q[e], k = cu_k[e + 1] - cu_k[e];
    if (q > tile_n || k > tile_n || rows + q > tile_n || keys + k > tile_n) break;
    rows += q;
    keys += k;
    if (q + k > 0) ++members;
    ++e;
  }
  while (e > b && cu_q[e] == cu_q[e - 1] && cu_k[e] == cu_k[e - 1]) --e;
  return members >= 2 ? e : b + 1;
}

// The finish time of the last of `ctas` CTAs that take `tiles` in list
// order, each the next tile when it frees (the kernel's tile counter), in
// tenths of a step: a step costs 10 (a split half's 13), and a tile's own
// start and end (its head's end, its dK/dV stores) 17 more, a packed run's
// 24, a zero-dQ tile 10 in all. Measured on powerlaw_short (bwd_sm90's
// timeline, notes/bwd.md v15, v17, v18): a long tile's step ~3.9 us and its
// ends ~6.7 us; a packed run 17.0 us for 1.9 steps. (With 10 for every
// tile's ends the model split the long tiles of powerlaw_short's causal
// form, which ran 11% slower than unsplit, v18.) Taken in parts (Take), so
// that two lists sharing a prefix simulate it once.
class TileCounterModel {
 public:
  explicit TileCounterModel(int ctas) {
    for (int c = 0; c < std::max(ctas, 1); ++c) free_at_.push(0);
  }
  void Take(std::span<const TileWork> tiles) {
    for (const TileWork& t : tiles) {
      const bool half = t.m_block >= 0 && t.pack >= 0 && (t.head >> 16) != 0;
      const int64_t steps = t.work - 1;
      const int64_t cost = t.m_block < 0 ? 10
                           : half        ? 13 * steps + 17
                           : t.pack < 0  ? 10 * steps + 24
                                         : 10 * steps + 17;
      const int64_t end = free_at_.top() + cost;
      free_at_.pop();
      free_at_.push(end);
      last_ = std::max(last_, end);
    }
  }
  int64_t last() const { return last_; }

 private:
  std::priority_queue<int64_t, std::vector<int64_t>, std::greater<>> free_at_;
  int64_t last_ = 0;
};

// The model's end for a whole list.
int64_t ListMakespan(std::span<const TileWork> tiles, int ctas) {
  TileCounterModel model(ctas);
  model.Take(tiles);
  return model.last();
}

// TileOrder::kGrouped, key-major: the list's tail dealt longest first. A group
// (one sequence and kv head) runs its key blocks side by side, and its
// longest key block starts with it, so the last group to start ends one
// longest tile (plus the conversions of every query block it completes)
// after it started, while the CTAs around it run out of tiles. So the
// groups at the list's end, as many as one round of the grid can take (their
// work at most `ctas` of the heaviest tile's), go out longest tile first:
// their long key blocks start together and the short ones fill in behind.
// Only where few groups end the list (at most kTailGroups: their Q, dO and
// dq_accum rows are in flight at once, and must still fit in L2), and where
// the model of the tile counter finishes the list sooner. (hstu_prod_causal:
// 9 groups of 32 key blocks, the model's end 1.0% sooner with the
// conversions counted, 0.6% without; notes/bwd.md v22.)
inline constexpr int kTailGroups = 12;
void DealGroupedTail(std::vector<TileWork>& tiles, int ctas) {
  if (ctas <= 0) return;  // no grid given: the plain grouped order
  int64_t heaviest = 0;
  size_t end = 0;  // the zero-dQ tiles (SortGrouped put them last) start at `end`
  while (end < tiles.size() && tiles[end].m_block >= 0) heaviest = std::max(heaviest, tiles[end++].work);
  const int64_t budget = ctas * heaviest;
  size_t first = end;  // the tail's first tile
  int64_t work = 0;
  int groups = 0;
  while (first > 0) {
    size_t g = first - 1;  // the group that ends at `first`
    int64_t gw = tiles[g].work;
    while (g > 0 && tiles[g - 1].batch == tiles[first - 1].batch &&
           tiles[g - 1].head == tiles[first - 1].head) {
      gw += tiles[--g].work;
    }
    if (work + gw > budget || groups == kTailGroups) break;
    work += gw;
    ++groups;
    first = g;
  }
  if (groups < 2) return;
  const std::span<TileWork> all(tiles);
  const auto tail = all.subspan(first, end - first);
  std::vector<TileWork> dealt(tail.begin(), tail.end());
  std::stable_sort(dealt.begin(), dealt.end(),
                   [](const TileWork& a, const TileWork& b) { return a.work > b.work; });
  TileCounterModel before(ctas);
  before.Take(all.first(first));
  TileCounterModel after = before;  // the same prefix, dealt tail
  before.Take(all.subspan(first));
  after.Take(dealt);
  after.Take(all.subspan(end));
  if (after.last() < before.last()) std::copy(dealt.begin(), dealt.end(), tail.begin());
}

}  // namespace

int64_t TileKeyBlocks(int64_t lq, int64_t lk, int64_t m_block, int tile_m, int tile_n,
                      bool causal) {
  int64_t n_end = lk;
  if (causal) {
    // The tile's last row (clamped to the sequence) sees keys < row + 1 + (lk - lq).
    const int64_t last_row = std::min(lq, (m_block + 1) * tile_m) - 1;
    n_end = std::clamp<int64_t>(last_row + 1 + (lk - lq), 0, lk);
  }
  return CeilDiv(n_end, tile_n);
}

absl::StatusOr<std::vector<TileWork>> BuildTiles(std::span<const int32_t> cu_q,
                                                 std::span<const int32_t> cu_k, int heads,
                                                 int tile_m, int tile_n, bool causal,
                                                 bool pack_short, TileOrder order) {
  if (auto s = CheckTileInputs(cu_q, cu_k, heads, tile_m, tile_n); !s.ok()) return s;
  std::vector<TileWork> tiles;
  const int batch = static_cast<int>(cu_q.size()) - 1;
  for (int b = 0; b < batch; ++b) {
    const int64_t lq = cu_q[b + 1] - cu_q[b];
    const int64_t lk = cu_k[b + 1] - cu_k[b];
    if (pack_short && lq >= 1 && lq <= tile_m && lk <= tile_m) {
      // Greedy run of consecutive short sequences.
      int e = b + 1;
      int64_t rows = lq, keys = lk;
      int members = 1;
      while (e < batch && e - b < kMaxQueryPack) {
        const int64_t q2 = cu_q[e + 1] - cu_q[e], k2 = cu_k[e + 1] - cu_k[e];
        if (q2 == 0 && k2 == 0) {
          ++e;
          continue;
        }
        if (q2 < 1 || q2 > tile_m || k2 > tile_m || rows + q2 > tile_m || keys + k2 > tile_m) break;
        rows += q2;
        keys += k2;
        ++members;
        ++e;
      }
      if (members > 1) {
        // Trailing absorbed empty sequences are left out of the pack.
        while (cu_q[e] == cu_q[e - 1] && cu_k[e] == cu_k[e - 1]) --e;
        const int64_t work = CeilDiv(keys, tile_n) + 1;
        for (int h = 0; h < heads; ++h) tiles.push_back({b, h, 0, work, e - b});
        b = e - 1;
        continue;
      }
    }
    const int64_t m_blocks = CeilDiv(lq, tile_m);
    for (int64_t mb = 0; mb < m_blocks; ++mb) {
      const int64_t work = TileKeyBlocks(lq, lk, mb, tile_m, tile_n, causal) + 1;
      for (int h = 0; h < heads; ++h) {
        tiles.push_back({b, h, static_cast<int32_t>(mb), work, 0});
      }
    }
  }
  if (order == TileOrder::kGrouped) {
    SortGrouped(tiles);
    return tiles;
  }
  std::stable_sort(tiles.begin(), tiles.end(),
                   [](const TileWork& a, const TileWork& b) { return a.work > b.work; });
  return tiles;
}

absl::StatusOr<KeyMajorTiles> BuildKeyTiles(std::span<const int32_t> cu_q,
                                            std::span<const int32_t> cu_k, int heads,
                                            int kv_heads, int tile_m, int tile_n, bool causal,
                                            TileOrder order, bool pack_short, int ctas) {
  if (auto s = CheckTileInputs(cu_q, cu_k, heads, tile_m, tile_n); !s.ok()) return s;
  if (kv_heads <= 0) kv_heads = heads;
  if (heads % kv_heads != 0) {
    return absl::InvalidArgumentError(
        fmt::format("heads: {} must be a multiple of kv_heads {}", heads, kv_heads));
  }
  const int group = heads / kv_heads;
  KeyMajorTiles out;
  const int batch = static_cast<int>(cu_q.size()) - 1;
  for (int b = 0; b < batch; ++b) {
    const int64_t lq = cu_q[b + 1] - cu_q[b];
    const int64_t lk = cu_k[b + 1] - cu_k[b];
    const int64_t shift = lk - lq;
    if (pack_short) {
      const int e = KeyPackEnd(cu_q, cu_k, b, tile_n);
      if (e > b + 1) {
        // One key block holds the run's keys; its query rows are visited in
        // blocks of tile_m. Every member's query blocks still count in qbase
        // (the counters of a packed run go unused: nothing else adds into its
        // rows, so its tile converts them itself).
        const int64_t rows = cu_q[e] - cu_q[b];
        for (int m = b; m < e; ++m) out.query_blocks += CeilDiv(cu_q[m + 1] - cu_q[m], tile_m);
        if (out.query_blocks > INT32_MAX) {
          return absl::InvalidArgumentError("cu_seqlens_q: too many query blocks");
        }
        for (int g = 0; g < kv_heads; ++g) {
          out.tiles.push_back({b, g, 0, CeilDiv(rows, tile_m) * group + 1, -(e - b)});
        }
        b = e - 1;
        continue;
      }
    }
    const int64_t qbase = out.query_blocks;
    const int64_t m_blocks = CeilDiv(lq, tile_m);
    out.query_blocks += m_blocks;
    if (qbase > INT32_MAX) return absl::InvalidArgumentError("cu_seqlens_q: too many query blocks");
    for (int64_t nb = 0; nb < CeilDiv(lk, tile_n); ++nb) {
      // Query rows i see key n0 when i >= n0 - shift (causal); all otherwise.
      const int64_t first_row = causal ? std::max<int64_t>(0, nb * tile_n - shift) : 0;
      const int64_t visited = first_row >= lq ? 0 : m_blocks - first_row / tile_m;
      for (int g = 0; g < kv_heads; ++g) {
        out.tiles.push_back({b, g, static_cast<int32_t>(nb), visited * group + 1,
                             static_cast<int32_t>(qbase)});
      }
    }
    for (int64_t mb = 0; mb < m_blocks; ++mb) {
      if (TileKeyBlocks(lq, lk, mb, tile_m, tile_n, causal) > 0) continue;
      for (int h = 0; h < heads; ++h) {
        out.tiles.push_back({b, h, static_cast<int32_t>(-1 - mb), 1, static_cast<int32_t>(qbase)});
      }
    }
  }
  if (order == TileOrder::kGrouped) {
    SortGrouped(out.tiles);
    DealGroupedTail(out.tiles, ctas);
    return out;
  }
  if (order == TileOrder::kKeyLevels) {
    SortKeyLevels(out.tiles, ctas, causal && tile_n >= 2 * tile_m);
    return out;
  }
  std::stable_sort(out.tiles.begin(), out.tiles.end(),
                   [](const TileWork& a, const TileWork& b) { return a.work > b.work; });
  return out;
}


int SplitHeavyKeyTiles(std::vector<TileWork>& tiles, int ctas) {
  auto plain = [](const TileWork& t) { return t.m_block >= 0 && t.pack >= 0; };
  int64_t w_max = 0;
  for (const auto& t : tiles) {
    if (plain(t)) w_max = std::max(w_max, t.work);
  }
  if (w_max < 9) return 0;  // under 8 steps: not worth a partial's round trip
  int64_t heavy = 0;
  for (const auto& t : tiles) heavy += plain(t) && 2 * t.work >= w_max;
  if (heavy > ctas / 2 || heavy > kMaxSplits) return 0;
  std::vector<TileWork> out;
  out.reserve(tiles.size() + heavy);
  int slot = 0;
  for (const auto& t : tiles) {
    if (!(plain(t) && 2 * t.work >= w_max)) {
      out.push_back(t);
      continue;
    }
    const int64_t steps = t.work - 1, first = steps / 2;
    for (int half = 1; half <= 2; ++half) {
      TileWork h = t;
      h.head = t.head | half << 16 | slot << 18;
      h.work = (half == 1 ? first : steps - first) + 1;
      out.push_back(h);
    }
    ++slot;
  }
  // Only where the halves shorten the list: tiles go to CTAs in list order
  // (the tile counter), and a half's step costs 1.3 of a whole tile's (a
  // split half of powerlaw_short's 1929-key sequence takes ~6 us a step,
  // ~4.7 unsplit: notes/bwd.md v8, v14). So the lone long sequence splits
  // (its makespan halves: 147.6 -> 101.3 us), and powerlaw_short, whose
  // other long sequences and packed runs keep every SM busy as long as the
  // unsplit tiles run, does not (the SPLIT=0 kernel 176-177 us against 179-180
  // split on an H100; unsplit in the SPLIT=1 kernel 171.8 on an H200, v14),
  // nor its causal form, whose long tiles have half the steps beside the
  // same packed runs (124.7 us unsplit against 139.3 split, v18). By a
  // twentieth at least: where the model's two lists end that close, the
  // halves' partial round trips are not worth it.
  if (20 * ListMakespan(out, ctas) > 19 * ListMakespan(tiles, ctas)) return 0;
  tiles = std::move(out);
  return slot;
}

int64_t SplitAreaOffset(int64_t fixed_bytes, int64_t total_q, int64_t batch, int heads,
                        int tile_m) {
  const int64_t counters = 4 * int64_t{heads} * (total_q / tile_m + batch + 1);
  return fixed_bytes + (counters + 255) / 256 * 256;
}

std::vector<TileWork> BalanceTiles(std::span<const TileWork> tiles, int lists) {
  if (lists <= 1 || tiles.empty()) return {tiles.begin(), tiles.end()};
  using Load = std::pair<int64_t, int>;  // (work so far, list)
  std::priority_queue<Load, std::vector<Load>, std::greater<>> least;
  for (int c = 0; c < lists; ++c) least.push({0, c});
  std::vector<std::vector<size_t>> dealt(lists);
  size_t rounds = 0;
  for (size_t i = 0; i < tiles.size(); ++i) {
    const auto [work, c] = least.top();
    least.pop();
    dealt[c].push_back(i);
    rounds = std::max(rounds, dealt[c].size());
    least.push({work + tiles[i].work, c});
  }
  std::vector<TileWork> out(rounds * lists, kStopTile);
  for (int c = 0; c < lists; ++c) {
    for (size_t t = 0; t < dealt[c].size(); ++t) out[t * lists + c] = tiles[dealt[c][t]];
  }
  return out;
}

std::vector<int32_t> PackTiles(std::span<const TileWork> tiles) {
  std::vector<int32_t> out;
  out.reserve(tiles.size() * 4);
  for (const auto& t : tiles) {
    out.insert(out.end(), {t.batch, t.head, t.m_block, t.pack});
  }
  return out;
}

absl::StatusOr<LaunchPlan> PlanLaunch(const Manifest& m, std::span<const int32_t> cu_q,
                                      std::span<const int32_t> cu_k, int heads, bool causal,
                                      std::string_view arch, int num_sms, int ctas_per_sm,
                                      int kv_heads) {
  absl::StatusOr<std::vector<TileWork>> tiles;
  int64_t counter_bytes = 0;
  // CTAs per SM of a persistent grid (the largest grid: num_sms * per_sm)
  const int per_sm = ctas_per_sm > 0 ? ctas_per_sm : EstimateCtasPerSm(m, arch);
  if (m.key_major) {
    if (m.grid != GridPolicy::kPersistent) {
      return absl::InvalidArgumentError("manifest: key_major needs the persistent grid");
    }
    auto key_tiles = BuildKeyTiles(cu_q, cu_k, heads, kv_heads, m.tile_m, m.tile_n, causal,
                                   m.tile_order, m.pack_short, std::max(num_sms, 1) * per_sm);
    if (!key_tiles.ok()) return key_tiles.status();
    counter_bytes = key_tiles->query_blocks * heads * int64_t{4};
    tiles = std::move(key_tiles->tiles);
    if (m.split_slot_bytes > 0 && num_sms > 0) {  // (key_major: persistent)
      if (heads >= 65536 || kv_heads >= 65536) {
        return absl::InvalidArgumentError(
            fmt::format("heads: {} does not fit a split key tile's 16-bit head", heads));
      }
      // Against the largest grid, not the tiles' count: the grid grows with
      // the halves (a lone long sequence has fewer tiles than SMs, and its
      // split halves fill the idle ones).
      const int splits = SplitHeavyKeyTiles(*tiles, num_sms * per_sm);
      if (splits > 0) {
        // The counters get the area the kernel can find the split pairs after.
        const int64_t base = SplitAreaOffset(0, cu_q.back(), static_cast<int64_t>(cu_q.size()) - 1,
                                             heads, m.tile_m);
        counter_bytes = base + splits * (256 + m.split_slot_bytes);
      }
    }
  } else {
    tiles = BuildTiles(cu_q, cu_k, heads, m.tile_m, m.tile_n, causal,
                       m.pack_short && m.grid == GridPolicy::kPersistent, m.tile_order);
  }
  if (!tiles.ok()) return tiles.status();
  LaunchPlan plan;
  plan.threads = static_cast<unsigned>(m.threads);
  plan.dynamic_smem_bytes = m.dynamic_smem_bytes;
  plan.num_tiles = static_cast<int>(tiles->size());
  for (const auto& t : *tiles) plan.total_work += t.work;
  plan.empty = tiles->empty();
  const int64_t batch = static_cast<int64_t>(cu_q.size()) - 1;
  if (m.grid == GridPolicy::kPerTile) {
    int64_t max_q = 0;
    for (int64_t b = 0; b < batch; ++b) max_q = std::max<int64_t>(max_q, cu_q[b + 1] - cu_q[b]);
    if (batch > 65535 || heads > 65535) {
      return absl::InvalidArgumentError(fmt::format(
          "batch: {} sequences exceed the per_tile grid's limit of 65535; use a persistent variant",
          batch));
    }
    plan.grid = {static_cast<unsigned>(std::max<int64_t>(1, CeilDiv(max_q, m.tile_m))),
                 static_cast<unsigned>(heads), static_cast<unsigned>(std::max<int64_t>(1, batch))};
  } else {
    if (num_sms <= 0) {
      return absl::InvalidArgumentError(fmt::format("num_sms: {} must be > 0", num_sms));
    }
    const int64_t grid = std::min<int64_t>(std::max(plan.num_tiles, 1),
                                           static_cast<int64_t>(num_sms) * per_sm);
    plan.grid = {static_cast<unsigned>(grid), 1, 1};
    if (m.tile_order == TileOrder::kBalanced && !m.key_major) {
      // The list the kernel reads has the stop entries too.
      *tiles = BalanceTiles(*tiles, static_cast<int>(grid));
      plan.num_tiles = static_cast<int>(tiles->size());
    }
    plan.tiles = PackTiles(*tiles);
  }
  // Per-tile bytes for every entry the kernel reads (a balanced list's stop
  // entries too); key-major counters after the fixed bytes.
  plan.workspace_bytes = m.workspace_fixed_bytes + m.workspace_per_tile_bytes * plan.num_tiles +
                         counter_bytes;
  return plan;
}

}  // namespace kforge

#include "worker/eval/batches.h"

#include <algorithm>
#include <cmath>

#include "fmt/format.h"

namespace kforge::eval {
namespace {

std::vector<int> ToOffsets(const std::vector<int>& lengths) {
  std::vector<int> cu = {0};
  for (int l : lengths) cu.push_back(cu.back() + l);
  return cu;
}

// A length in [2, max] that is odd and no multiple of 64 when max allows.
int AwkwardLength(std::mt19937_64& rng, int max) {
  if (max <= 2) return max;
  std::uniform_int_distribution<int> dist(2, max);
  for (int tries = 0; tries < 16; ++tries) {
    int l = dist(rng);
    if (l % 2 == 1 && l % 64 != 0) return l;
  }
  return max % 2 == 1 ? max : max - 1;
}

// Hostile lengths for one check batch: max, 0, 1 and awkward ones, shuffled.
std::vector<int> HostileLengths(std::mt19937_64& rng, int count, int max) {
  std::vector<int> lengths = {max, 0, 1};
  while (int(lengths.size()) < count) lengths.push_back(AwkwardLength(rng, max));
  lengths.resize(count);
  std::shuffle(lengths.begin(), lengths.end(), rng);
  return lengths;
}

// `count` lengths in [1, max] with mean about `mean`; the first is `max`.
std::vector<int> StatLengths(std::mt19937_64& rng, int64_t count, int64_t max, double mean) {
  std::vector<int> lengths(count);
  mean = std::clamp(mean, 1.0, double(max));
  if (2 * mean - 1 <= double(max)) {
    // Uniform on [1, 2 mean - 1] has the mean and stays under max.
    std::uniform_int_distribution<int64_t> dist(1, std::max<int64_t>(1, int64_t(2 * mean - 1)));
    for (auto& l : lengths) l = int(dist(rng));
  } else {
    // Mean close to max: uniform on [2 mean - max, max].
    std::uniform_int_distribution<int64_t> dist(std::max<int64_t>(1, int64_t(2 * mean - max)), max);
    for (auto& l : lengths) l = int(dist(rng));
  }
  if (lengths.empty()) return lengths;
  lengths[0] = int(max);
  // A draw's total strays from count * mean by a few percent, and the time
  // of a batch follows its total: nudge every length but the first (the
  // max) by the same step until the total is the shape's, as far as the
  // bounds [1, max] allow.
  const int64_t target = std::llround(mean * double(count));
  int64_t sum = 0;
  for (int l : lengths) sum += l;
  for (int pass = 0; pass < 16 && sum != target && count > 1; ++pass) {
    const int64_t gap = target - sum;
    const int64_t step = gap / (count - 1) + (gap > 0 ? 1 : -1);
    for (int64_t i = 1; i < count && sum != target; ++i) {
      const int64_t d = step > 0 ? std::min(step, target - sum) : std::max(step, target - sum);
      const int64_t next = std::clamp<int64_t>(lengths[i] + d, 1, max);
      sum += next - lengths[i];
      lengths[i] = int(next);
    }
  }
  return lengths;
}

// A stable seed from the key's statistics (FNV-1a over their text).
uint64_t KeySeed(const ShapeKey& key) {
  const std::string text = fmt::format(
      "{} {} {} {} {} {} {} {} {} {} {}", int(key.op), key.head_dim, key.heads, key.kv_heads,
      key.causal, key.cross, key.batch, key.max_len_q, key.total_q, key.max_len_k, key.total_k);
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace

reference::JaggedShape HeadLayout(const ShapeKey& key) {
  reference::JaggedShape s;
  s.heads = key.heads;
  s.kv_heads = key.kv_heads > 0 ? key.kv_heads : key.heads;
  s.head_dim = key.head_dim;
  s.causal = key.causal;
  return s;
}

reference::JaggedShape CheckBatch(const ShapeKey& key, uint64_t seed, int index) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 0x100 + uint64_t(index));
  reference::JaggedShape s = HeadLayout(key);
  const int max_q = int(std::clamp<int64_t>(key.max_len_q, 1, kCheckMaxLen));
  const int count = 5 + index % 4;
  std::vector<int> lq = HostileLengths(rng, count, max_q);
  s.cu_q = ToOffsets(lq);
  if (key.cross) {
    const int max_k = int(std::clamp<int64_t>(key.max_len_k > 0 ? key.max_len_k : key.max_len_q,
                                              1, kCheckMaxLen));
    std::vector<int> lk = HostileLengths(rng, count, max_k);
    // Make sure some sequence has Lq != Lk with both non-empty.
    for (int b = 0; b < count; ++b) {
      if (lq[b] > 0 && lk[b] > 0 && lq[b] != lk[b]) break;
      if (b == count - 1) {
        lq[0] = std::max(1, max_q / 2 + 1);
        lk[0] = std::max(1, max_k / 3 + 1) + (max_k > 4 ? 2 : 0);
        if (lq[0] == lk[0]) lk[0] = lk[0] > 1 ? lk[0] - 1 : 2;
        s.cu_q = ToOffsets(lq);
      }
    }
    s.cu_k = ToOffsets(lk);
  } else {
    s.cu_k = s.cu_q;
  }
  return s;
}

absl::StatusOr<reference::JaggedShape> TimingBatch(const ShapeKey& key,
                                                   std::span<const int32_t> cu_q,
                                                   std::span<const int32_t> cu_k) {
  reference::JaggedShape s = HeadLayout(key);
  if (!cu_q.empty()) {
    s.cu_q.assign(cu_q.begin(), cu_q.end());
    s.cu_k = cu_k.empty() ? s.cu_q : std::vector<int>(cu_k.begin(), cu_k.end());
  } else {
    if (key.batch < 1 || key.max_len_q < 1) {
      return absl::InvalidArgumentError(
          fmt::format("timing batch needs batch >= 1 and max_len_q >= 1 (got {} and {})",
                      key.batch, key.max_len_q));
    }
    std::mt19937_64 rng(KeySeed(key));
    const double mean_q = key.total_q > 0 ? double(key.total_q) / key.batch : key.max_len_q / 2.0;
    s.cu_q = ToOffsets(StatLengths(rng, key.batch, key.max_len_q, mean_q));
    if (key.cross) {
      const int64_t max_k = key.max_len_k > 0 ? key.max_len_k : key.max_len_q;
      const double mean_k = key.total_k > 0 ? double(key.total_k) / key.batch : max_k / 2.0;
      s.cu_k = ToOffsets(StatLengths(rng, key.batch, max_k, mean_k));
    } else {
      s.cu_k = s.cu_q;
    }
  }
  if (absl::Status st = reference::ValidateJaggedShape(s); !st.ok()) return st;
  const int64_t elements = int64_t(std::max(s.total_q(), s.total_k())) * s.heads * s.head_dim;
  if (elements > kMaxEvalElements) {
    return absl::InvalidArgumentError(fmt::format(
        "timing batch too large to evaluate: {} elements per tensor (limit {})", elements,
        kMaxEvalElements));
  }
  return s;
}

std::vector<uint16_t> RandomBf16(size_t n, std::mt19937_64& rng) {
  // Inputs for a 500k-token batch are ~10^9 values: std::normal_distribution
  // took ~20 s of every evaluation there. One splitmix64 step per value, its
  // four 16-bit quarters summed (Irwin-Hall, mean 2, variance 1/3), gives a
  // near-normal unit-variance value about 20x faster; the seed still comes
  // from `rng`, so inputs stay fresh per check.
  uint64_t state = rng();
  std::vector<uint16_t> out(n);
  for (auto& x : out) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float sum = float(z & 0xffff) + float((z >> 16) & 0xffff) + float((z >> 32) & 0xffff) +
                      float(z >> 48);
    x = reference::FloatToBf16((sum * (1.0f / 65536.0f) - 2.0f) * 1.7320508f);
  }
  return out;
}

}  // namespace kforge::eval

#include "worker/eval/batches.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "fmt/format.h"
#include "fmt/ranges.h"

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

uint64_t SplitMix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Uniform(std::mt19937_64& rng, double lo, double hi) {
  return std::uniform_real_distribution<double>(lo, hi)(rng);
}

float DefaultScale(int head_dim) { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }

// The three ways check inputs are drawn, in the order check problems cycle
// through them.
InputStyle CheckStyle(int index) {
  InputStyle s;
  switch (index % 3) {
    case 0:
      break;  // plain N(0, 1)
    case 1:
      s.outlier_period = 257;
      s.outlier_magnitude = 32;
      break;
    case 2:
      // Scores in the hundreds: exp without the running max overflows, and a
      // kernel that clamps or saturates its inputs is far off.
      s.q_scale = 4;
      s.k_scale = 4;
      s.v_scale = 8;
      s.dout_scale = 4;
      s.outlier_period = 509;
      s.outlier_magnitude = 64;
      break;
  }
  return s;
}

// The softmax scale of check problem `index`: the usual 1/sqrt(D) only on
// the first, smaller and larger ones after it.
float CheckScale(std::mt19937_64& rng, int index, int head_dim) {
  const double base = DefaultScale(head_dim);
  switch (index) {
    case 0: return float(base);
    case 1: return float(base * Uniform(rng, 0.3, 0.7));
    case 2: return float(base * Uniform(rng, 1.5, 3.0));
    default: return float(base * std::exp2(Uniform(rng, -2.0, 2.0)));
  }
}

// Every length 0..cover, shuffled and dealt to `count` lists, each with the
// longest length, 0, 1 and two awkward lengths added.
std::vector<std::vector<int>> DealLengths(std::mt19937_64& rng, int count, int cover, int longest) {
  std::vector<int> all(size_t(cover) + 1);
  for (int l = 0; l <= cover; ++l) all[size_t(l)] = l;
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<std::vector<int>> lists(static_cast<size_t>(count));
  for (size_t i = 0; i < all.size(); ++i) lists[i % size_t(count)].push_back(all[i]);
  for (auto& l : lists) {
    l.push_back(longest);
    l.push_back(0);
    l.push_back(1);
    l.push_back(AwkwardLength(rng, longest));
    l.push_back(AwkwardLength(rng, longest));
    std::shuffle(l.begin(), l.end(), rng);
  }
  return lists;
}

std::string Lengths(const std::vector<int>& cu) {
  std::vector<int> l;
  for (size_t b = 0; b + 1 < cu.size() && l.size() < 12; ++b) l.push_back(cu[b + 1] - cu[b]);
  return fmt::format("[{}{}]", fmt::join(l, ","), cu.size() > 13 ? ",..." : "");
}

// Q/K/V elements and reference work of a batch, for the corner's budgets.
int64_t PairCount(const reference::JaggedShape& s) {
  int64_t pairs = 0;
  for (int b = 0; b < s.batch(); ++b) {
    const int64_t lq = s.cu_q[size_t(b) + 1] - s.cu_q[size_t(b)];
    const int64_t lk = s.cu_k[size_t(b) + 1] - s.cu_k[size_t(b)];
    pairs += lq * lk;
  }
  return pairs;
}

// The reference spends ~800 flops per (query, key, head) pair at D = 128
// (two score passes and the weighted sum, fp32 on CUDA cores): 2^42 pairs x
// dims keeps the corner's reference to seconds.
constexpr int64_t kCornerMaxPairDims = int64_t{1} << 42;

}  // namespace

std::string InputStyle::Describe() const {
  if (plain()) return "plain";
  std::string s = fmt::format("scales q {:g} k {:g} v {:g} do {:g}", q_scale, k_scale, v_scale,
                              dout_scale);
  if (outlier_period > 0)
    s += fmt::format(", outliers 1/{} up to {:g}", outlier_period, outlier_magnitude);
  return s;
}

std::string ProblemSpec::Describe() const {
  const char* role_name = role == ProblemRole::kCheck    ? "check"
                          : role == ProblemRole::kTiming ? "timing"
                          : role == ProblemRole::kCorner ? "corner"
                                                         : "gate";
  return fmt::format("{} problem B={} total_q={} max_q={} max_k={} scale {:.4g} ({}){} lq={}",
                     role_name, shape.batch(), shape.total_q(), shape.max_q(), shape.max_k(),
                     shape.scale(), style.Describe(),
                     grid_ctas > 0 ? fmt::format(", {} CTAs", grid_ctas) : "", Lengths(shape.cu_q));
}

int CoverageLength(int largest_tile, int64_t bucket_max_len) {
  const int64_t cover = 2 * std::max(largest_tile, 128);
  return int(std::clamp<int64_t>(std::min<int64_t>(cover, bucket_max_len), 1, kCheckMaxLen));
}

int GateLongest(int largest_tile) { return std::max(4 * std::max(largest_tile, 1), 512); }

std::vector<ProblemSpec> CheckProblems(const ShapeKey& key, uint64_t seed, int count,
                                       int largest_tile, int longest) {
  count = std::max(count, 3);
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 0x100);
  const Bucket bucket = BucketOf(key);
  const int cap = longest > 0 ? std::min(longest, kCheckMaxLen) : kCheckMaxLen;
  const int longest_q = int(std::clamp<int64_t>(bucket.max_q, 1, cap));
  const int longest_k = int(std::clamp<int64_t>(bucket.max_k, 1, cap));
  std::vector<std::vector<int>> lq =
      DealLengths(rng, count, CoverageLength(largest_tile, bucket.max_q), longest_q);
  std::vector<std::vector<int>> lk;
  if (key.cross) lk = DealLengths(rng, count, CoverageLength(largest_tile, bucket.max_k), longest_k);

  std::vector<ProblemSpec> out;
  for (int i = 0; i < count; ++i) {
    ProblemSpec p;
    p.role = ProblemRole::kCheck;
    p.shape = HeadLayout(key);
    p.shape.softmax_scale = CheckScale(rng, i, key.head_dim);
    p.style = CheckStyle(i);
    if (i == 1) p.grid_ctas = 1;
    if (i == 2) p.grid_ctas = 2 + int(rng() % 2);
    std::vector<int>& q = lq[size_t(i)];
    p.shape.cu_q = ToOffsets(q);
    if (key.cross) {
      // Pair the key lengths at random with the query lengths; the lists
      // differ in size when the two coverages do.
      std::vector<int> k = lk[size_t(i)];
      while (k.size() < q.size()) k.push_back(AwkwardLength(rng, longest_k));
      std::shuffle(k.begin(), k.end(), rng);
      k.resize(q.size());
      bool differs = false;
      for (size_t b = 0; b < q.size(); ++b) differs |= q[b] > 0 && k[b] > 0 && q[b] != k[b];
      if (!differs) {
        q[0] = std::max(1, longest_q / 2 + 1);
        k[0] = std::max(1, longest_k / 3 + 1) + (longest_k > 4 ? 2 : 0);
        if (q[0] == k[0]) k[0] = k[0] > 1 ? k[0] - 1 : 2;
        p.shape.cu_q = ToOffsets(q);
      }
      p.shape.cu_k = ToOffsets(k);
    } else {
      p.shape.cu_k = p.shape.cu_q;
    }
    out.push_back(std::move(p));
  }
  return out;
}

absl::StatusOr<ProblemSpec> TimingProblem(const ShapeKey& key, std::span<const int32_t> cu_q,
                                          std::span<const int32_t> cu_k, uint64_t seed) {
  absl::StatusOr<reference::JaggedShape> shape = TimingBatch(key, cu_q, cu_k);
  if (!shape.ok()) return shape.status();
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 0x200);
  ProblemSpec p;
  p.role = ProblemRole::kTiming;
  p.shape = *std::move(shape);
  p.shape.softmax_scale = float(DefaultScale(key.head_dim) * std::exp2(Uniform(rng, -1.0, 1.0)));
  p.style.outlier_period = 1021;
  p.style.outlier_magnitude = 16;
  return p;
}

ProblemSpec CornerProblem(const ShapeKey& key, uint64_t seed, int64_t max_q_elements) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 0x300);
  const SizeExtent e = BucketExtent(BucketOf(key));
  const int64_t per_token = int64_t(key.heads) * key.head_dim;
  double fraction = 1.0;
  if (e.total_q * per_token > max_q_elements)
    fraction = double(max_q_elements) / double(e.total_q * per_token);
  ProblemSpec p;
  p.role = ProblemRole::kCorner;
  p.style = InputStyle{};
  for (int attempt = 0; attempt < 6; ++attempt) {
    const int64_t total_q = std::max<int64_t>(1, int64_t(double(e.total_q) * fraction));
    const int64_t total_k = std::max<int64_t>(1, int64_t(double(e.total_k) * fraction));
    const int64_t batch = std::min({e.batch, total_q, key.cross ? total_k : total_q});
    p.shape = HeadLayout(key);
    p.shape.softmax_scale = float(DefaultScale(key.head_dim) * std::exp2(Uniform(rng, -1.0, 1.0)));
    const int64_t max_q = std::min(e.max_len_q, total_q);
    p.shape.cu_q = ToOffsets(StatLengths(rng, batch, max_q, double(total_q) / double(batch)));
    if (key.cross) {
      const int64_t max_k = std::min(e.max_len_k, total_k);
      p.shape.cu_k = ToOffsets(StatLengths(rng, batch, max_k, double(total_k) / double(batch)));
    } else {
      p.shape.cu_k = p.shape.cu_q;
    }
    const double work = double(PairCount(p.shape)) * double(key.heads) * key.head_dim;
    if (work <= double(kCornerMaxPairDims)) break;
    // Fewer tokens at the same batch size and maximum length: the extent
    // then says how far the kernel was really verified.
    fraction *= std::max(0.1, double(kCornerMaxPairDims) / work);
  }
  return p;
}

ProblemSpec SampledCheckProblem(const ShapeKey& key, uint64_t seed, int largest_tile) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 0x600);
  const Bucket bucket = BucketOf(key);
  const int tile = std::max(largest_tile, 1);
  auto lengths_for = [&](int64_t bucket_max) {
    const int cover = CoverageLength(tile, bucket_max);
    const int longest = int(std::clamp<int64_t>(bucket_max, 1, GateLongest(tile)));
    std::vector<int> l = {0, 1, 2, longest};
    for (int m = 1; m * tile <= cover + 1; ++m)
      for (int d : {-1, 0, 1}) l.push_back(std::clamp(m * tile + d, 0, cover));
    for (int i = 0; i < 8; ++i) l.push_back(std::uniform_int_distribution<int>(1, std::max(1, cover))(rng));
    std::shuffle(l.begin(), l.end(), rng);
    return l;
  };
  ProblemSpec p;
  p.role = ProblemRole::kCheck;
  p.shape = HeadLayout(key);
  p.shape.softmax_scale = DefaultScale(key.head_dim);
  // A persistent kernel runs these tiles on two or three CTAs, one after
  // another: a hazard between one tile's end and the next tile's start in
  // the same CTA (shared memory reused across tiles) exists only where a CTA
  // runs several tiles, which a small batch on a whole GPU's grid seldom
  // makes. The tiles are few, so the sanitizer's cost stays small.
  p.grid_ctas = 2 + int(rng() % 2);
  std::vector<int> q = lengths_for(bucket.max_q);
  p.shape.cu_q = ToOffsets(q);
  if (key.cross) {
    std::vector<int> k = lengths_for(bucket.max_k);
    k.resize(q.size(), AwkwardLength(rng, int(std::clamp<int64_t>(bucket.max_k, 1, kCheckMaxLen))));
    // Cross attention with the query and key lengths of a sequence apart.
    std::rotate(k.begin(), k.begin() + 1, k.end());
    p.shape.cu_k = ToOffsets(k);
  } else {
    p.shape.cu_k = p.shape.cu_q;
  }
  return p;
}

ProblemSpec GateProblem(const ShapeKey& key, uint64_t seed, int64_t max_tokens, int64_t longest) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 0x400);
  ProblemSpec p;
  p.role = ProblemRole::kGate;
  p.shape = HeadLayout(key);
  p.shape.softmax_scale = float(DefaultScale(key.head_dim) * std::exp2(Uniform(rng, -1.0, 1.0)));
  p.style.outlier_period = 1021;
  p.style.outlier_magnitude = 16;
  max_tokens = std::max<int64_t>(max_tokens, 1);
  const int64_t cap = longest > 0 ? longest : std::numeric_limits<int64_t>::max();
  const int64_t total_q = std::clamp<int64_t>(key.total_q, 1, max_tokens);
  const int64_t batch = std::clamp<int64_t>(key.batch, 1, total_q);
  const int64_t max_q = std::clamp<int64_t>(std::min(key.max_len_q, cap), 1, total_q);
  p.shape.cu_q = ToOffsets(StatLengths(rng, batch, max_q, double(total_q) / double(batch)));
  if (key.cross) {
    const int64_t total_k = std::clamp<int64_t>(key.total_k, batch, std::max(max_tokens, batch));
    const int64_t max_k = std::clamp<int64_t>(std::min(key.max_len_k, cap), 1, total_k);
    p.shape.cu_k = ToOffsets(StatLengths(rng, batch, max_k, double(total_k) / double(batch)));
  } else {
    p.shape.cu_k = p.shape.cu_q;
  }
  return p;
}

SizeExtent ExtentOf(const reference::JaggedShape& s) {
  return SizeExtent{.batch = s.batch(),
                    .max_len_q = s.max_q(),
                    .max_len_k = s.max_k(),
                    .total_q = s.total_q(),
                    .total_k = s.total_k()};
}

SizeExtent MaxExtent(const SizeExtent& a, const SizeExtent& b) {
  return SizeExtent{.batch = std::max(a.batch, b.batch),
                    .max_len_q = std::max(a.max_len_q, b.max_len_q),
                    .max_len_k = std::max(a.max_len_k, b.max_len_k),
                    .total_q = std::max(a.total_q, b.total_q),
                    .total_k = std::max(a.total_k, b.total_k)};
}

reference::JaggedShape HeadLayout(const ShapeKey& key) {
  reference::JaggedShape s;
  s.heads = key.heads;
  s.kv_heads = key.kv_heads > 0 ? key.kv_heads : key.heads;
  s.head_dim = key.head_dim;
  s.causal = key.causal;
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

void StyleBf16(std::span<uint16_t> values, float scale, uint64_t seed, uint32_t period,
               float magnitude) {
  // eval_kernels.cu's kf_style_bf16 repeats these float operations one by
  // one, so the two agree bit for bit.
  for (size_t i = 0; i < values.size(); ++i) {
    float x = reference::Bf16ToFloat(values[i]) * scale;
    if (period > 0) {
      const uint64_t z = SplitMix(seed ^ (uint64_t(i) * 0xd1b54a32d192ed03ull));
      if (z % period == 0) {
        const float u = float((z >> 32) & 0xffff) * (1.0f / 65536.0f);
        const float half = 0.5f * u;
        const float m = magnitude * (0.5f + half);
        x = (z >> 63) ? -m : m;
      }
    }
    values[i] = reference::FloatToBf16(x);
  }
}

}  // namespace kforge::eval

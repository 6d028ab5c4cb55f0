// kforge-bench-attn: times kforge's jagged attention forward variants on the
// benchmark shapes (bench/shapes.json, lengths drawn by lengths.py with the
// anchors' rule), after checking each against the GPU reference.
//
//   kforge-bench-attn --lengths lengths.json [--out results.json]
//                     [--only a,b] [--reps 20] [--variants default|sweep]
//
// Per shape: every candidate (template x knobs) is NVRTC-compiled for the GPU
// found, checked on a hostile small batch (lengths 0, 1, tile +-1, cross,
// GQA, both masks) and on a prefix of the benchmark batch against the fp32
// reference, then timed: 3 warm-ups, then `reps` runs each preceded by an
// L2 flush, CUDA events around the launch alone, median reported.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <future>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpu/compile.h"
#include "gpu/gpu.h"
#include "kernels/catalog.h"
#include "kernels/check.h"
#include "kernels/schedule.h"
#include "worker/reference/gpu_reference.h"

namespace kforge::bench {
namespace {

using nlohmann::json;

// Device helpers: random fill, comparison against the reference.
constexpr const char* kHelperSource = R"(
#include "kforge/attn_params.h"
__device__ __forceinline__ unsigned kf_hash(unsigned long long x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
  return (unsigned)x;
}
// Uniform on [-sqrt(3), sqrt(3)] (variance 1), as bf16 bits.
extern "C" __global__ void kf_fill(unsigned short* p, long long n, unsigned long long seed) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    float u = (kf_hash(seed * 0x9E3779B97F4A7C15ULL + i) >> 8) * (1.0f / 16777216.0f);
    float f = (2.f * u - 1.f) * 1.7320508f;
    p[i] = (unsigned short)(__float_as_uint(f) >> 16);
  }
}
__device__ __forceinline__ void kf_amax(float* a, float v) {
  atomicMax((int*)a, __float_as_int(v));  // v >= 0
}
// out: [0] max |o - ref|, [1] max |ref|, [2] non-finite o, [3] max |lse - ref| (finite ref),
//      [4] lse mismatches where ref is -inf or got is NaN.
extern "C" __global__ void kf_compare(const unsigned short* o, const float* ref_o, long long n_o,
                                      const float* lse, long long lse_stride, const float* ref_lse,
                                      int rows, int heads, float* out) {
  float e = 0.f, m = 0.f, bad = 0.f, el = 0.f, badl = 0.f;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n_o;
       i += (long long)gridDim.x * blockDim.x) {
    float g = __uint_as_float(((unsigned)o[i]) << 16);
    float r = ref_o[i];
    if (!isfinite(g)) bad += 1.f; else e = fmaxf(e, fabsf(g - r));
    m = fmaxf(m, fabsf(r));
  }
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (long long)rows * heads;
       i += (long long)gridDim.x * blockDim.x) {
    int h = (int)(i / rows), r = (int)(i % rows);
    float g = lse[h * lse_stride + r], x = ref_lse[i];
    if (isinf(x) && x < 0) { if (!(isinf(g) && g < 0)) badl += 1.f; }
    else if (!isfinite(g)) badl += 1.f;
    else el = fmaxf(el, fabsf(g - x));
  }
  kf_amax(out + 0, e); kf_amax(out + 1, m); kf_amax(out + 3, el);
  if (bad > 0.f) atomicAdd(out + 2, bad);
  if (badl > 0.f) atomicAdd(out + 4, badl);
}
)";

#define BENCH_TRY(expr)                     \
  do {                                      \
    absl::Status _s = (expr);               \
    if (!_s.ok()) return _s;                \
  } while (0)

struct Problem {
  std::string name;
  int heads = 0, kv_heads = 0, head_dim = 0;
  bool causal = false, cross = false;
  std::vector<int32_t> cu_q, cu_k;
  double flops = 0;
  int max_q() const {
    int m = 0;
    for (size_t i = 1; i < cu_q.size(); ++i) m = std::max(m, cu_q[i] - cu_q[i - 1]);
    return m;
  }
  int max_k() const {
    int m = 0;
    for (size_t i = 1; i < cu_k.size(); ++i) m = std::max(m, cu_k[i] - cu_k[i - 1]);
    return m;
  }
};

double CountFlops(const std::vector<int32_t>& cu_q, const std::vector<int32_t>& cu_k, int heads,
                  int d, bool causal) {
  double pairs = 0;
  for (size_t b = 0; b + 1 < cu_q.size(); ++b) {
    const double lq = cu_q[b + 1] - cu_q[b], lk = cu_k[b + 1] - cu_k[b];
    if (!causal) {
      pairs += lq * lk;
    } else {
      for (int64_t i = 0; i < static_cast<int64_t>(lq); ++i) {
        pairs += std::clamp<double>(i + 1 + (lk - lq), 0, lk);
      }
    }
  }
  return 4.0 * pairs * d * heads;
}

Problem MakeProblem(std::string name, int heads, int kv_heads, int d, bool causal,
                    const std::vector<int>& lq, const std::vector<int>& lk) {
  Problem p;
  p.name = std::move(name);
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.head_dim = d;
  p.causal = causal;
  p.cross = lq != lk;
  p.cu_q = {0};
  p.cu_k = {0};
  for (int x : lq) p.cu_q.push_back(p.cu_q.back() + x);
  for (int x : lk) p.cu_k.push_back(p.cu_k.back() + x);
  p.flops = CountFlops(p.cu_q, p.cu_k, heads, d, causal);
  return p;
}

struct Candidate {
  Variant variant;
  std::string label;
  gpu::Module module;
  gpu::Kernel kernel;
  gpu::FunctionResources res;
  int regs = 0;
  int local_bytes = 0;
  double compile_ms = 0;
  std::string error;  // compile or load failure
  bool hostile_ok = true;
  std::string hostile_detail;
};

std::string Label(const Variant& v) {
  std::string s = v.template_name;
  for (const auto& [k, x] : v.knobs) s += fmt::format(" {}={}", k, x);
  return s;
}

class Bench {
 public:
  Bench(const gpu::Driver& driver, const gpu::DeviceInfo& info, gpu::Stream stream)
      : driver_(driver), info_(info), stream_(std::move(stream)) {}

  absl::Status Init() {
    auto ref = reference::GpuReference::Create(driver_, info_.arch);
    if (!ref.ok()) return ref.status();
    ref_ = std::move(*ref);
    gpu::CompileRequest req;
    req.source = kHelperSource;
    req.arch = info_.arch;
    req.name = "bench_helpers.cu";
    auto c = gpu::Compile(req);
    if (!c.ok()) return c.status();
    if (!c->ok) return absl::InternalError("bench helpers do not compile:\n" + c->log);
    auto m = gpu::Module::Load(driver_, c->cubin);
    if (!m.ok()) return m.status();
    helpers_ = std::move(*m);
    auto f = helpers_.GetKernel("kf_fill");
    if (!f.ok()) return f.status();
    fill_ = *f;
    auto cmp = helpers_.GetKernel("kf_compare");
    if (!cmp.ok()) return cmp.status();
    compare_ = *cmp;
    auto flush = gpu::DeviceBuffer::Allocate(driver_, size_t{256} << 20);
    if (!flush.ok()) return flush.status();
    flush_ = std::move(*flush);
    auto counter = gpu::DeviceBuffer::Allocate(driver_, 256);
    if (!counter.ok()) return counter.status();
    counter_ = std::move(*counter);
    auto stats = gpu::DeviceBuffer::Allocate(driver_, 64);
    if (!stats.ok()) return stats.status();
    stats_ = std::move(*stats);
    return absl::OkStatus();
  }

  // Compiles and loads every candidate (compiles in parallel).
  void Prepare(std::vector<Candidate>& cands) {
    std::vector<std::future<absl::StatusOr<gpu::CompileResult>>> jobs;
    for (auto& c : cands) {
      jobs.push_back(std::async(std::launch::async, [&c, this] {
        gpu::CompileRequest req;
        req.source = c.variant.source;
        req.arch = info_.arch;
        req.name = c.variant.template_name + ".cu";
        return gpu::Compile(req);
      }));
    }
    for (size_t i = 0; i < cands.size(); ++i) {
      auto& c = cands[i];
      auto r = jobs[i].get();
      if (!r.ok()) {
        c.error = std::string(r.status().message());
        continue;
      }
      c.compile_ms = r->compile_ms;
      c.res = r->total;
      if (!r->ok) {
        c.error = "compile error:\n" + r->log.substr(0, 2000);
        continue;
      }
      auto m = gpu::Module::Load(driver_, r->cubin);
      if (!m.ok()) {
        c.error = std::string(m.status().message());
        continue;
      }
      c.module = std::move(*m);
      auto k = c.module.GetKernel(c.variant.entry_point);
      if (!k.ok()) {
        c.error = std::string(k.status().message());
        continue;
      }
      c.kernel = *k;
      if (auto s = c.kernel.SetMaxDynamicSharedMemory(c.variant.manifest.dynamic_smem_bytes);
          !s.ok()) {
        c.error = std::string(s.message());
        continue;
      }
      auto attr = c.kernel.Attributes();
      if (attr.ok()) {
        c.regs = attr->num_regs;
        c.local_bytes = attr->local_bytes;
      }
    }
  }

  // Device buffers of one problem.
  struct Data {
    gpu::DeviceBuffer q, k, v, o, lse, cu_q, cu_k, ref_o, ref_lse, tiles;
    int ref_rows = 0;  // rows of the checked prefix
    int ref_batch = 0;
  };

  absl::Status Fill(gpu::DeviceBuffer& b, uint64_t seed) {
    long long n = static_cast<long long>(b.size() / 2);
    if (n == 0) return absl::OkStatus();
    uint64_t ptr = b.address();
    void* args[] = {&ptr, &n, &seed};
    return fill_.LaunchRaw(args, {1024}, {256}, 0, stream_);
  }

  absl::StatusOr<Data> Upload(const Problem& pr, int max_check_rows) {
    Data d;
    const size_t tq = pr.cu_q.back(), tk = pr.cu_k.back();
    auto alloc = [&](gpu::DeviceBuffer& b, size_t bytes) -> absl::Status {
      auto x = gpu::DeviceBuffer::Allocate(driver_, std::max<size_t>(bytes, 16));
      if (!x.ok()) return x.status();
      b = std::move(*x);
      return absl::OkStatus();
    };
    const size_t D = pr.head_dim;
    BENCH_TRY(alloc(d.q, tq * pr.heads * D * 2));
    BENCH_TRY(alloc(d.k, tk * pr.kv_heads * D * 2));
    BENCH_TRY(alloc(d.v, tk * pr.kv_heads * D * 2));
    BENCH_TRY(alloc(d.o, tq * pr.heads * D * 2));
    BENCH_TRY(alloc(d.lse, tq * pr.heads * 4));
    BENCH_TRY(alloc(d.cu_q, pr.cu_q.size() * 4));
    BENCH_TRY(alloc(d.cu_k, pr.cu_k.size() * 4));
    BENCH_TRY(Fill(d.q, 11));
    BENCH_TRY(Fill(d.k, 22));
    BENCH_TRY(Fill(d.v, 33));
    BENCH_TRY(d.cu_q.Upload(std::span<const int32_t>(pr.cu_q), stream_));
    BENCH_TRY(d.cu_k.Upload(std::span<const int32_t>(pr.cu_k), stream_));
    // The checked prefix: the longest prefix of sequences within max_check_rows (>= 1 sequence).
    int nb = 1;
    const int batch = static_cast<int>(pr.cu_q.size()) - 1;
    while (nb < batch && pr.cu_q[nb + 1] <= max_check_rows) ++nb;
    d.ref_batch = std::min(nb, batch);
    d.ref_rows = pr.cu_q[d.ref_batch];
    BENCH_TRY(alloc(d.ref_o, size_t(d.ref_rows) * pr.heads * D * 4));
    BENCH_TRY(alloc(d.ref_lse, size_t(d.ref_rows) * pr.heads * 4));
    KfAttnParams p = Params(pr, d);
    p.o = d.ref_o.get();
    p.lse = d.ref_lse.as<float>();
    p.batch = d.ref_batch;
    p.total_q = d.ref_rows;
    p.total_k = pr.cu_k[d.ref_batch];
    BENCH_TRY(ref_->Forward(p, stream_));
    BENCH_TRY(stream_.Synchronize());
    return d;
  }

  KfAttnParams Params(const Problem& pr, const Data& d) const {
    KfAttnParams p{};
    p.q = d.q.get();
    p.k = d.k.get();
    p.v = d.v.get();
    p.o = d.o.get();
    p.lse = d.lse.as<float>();
    p.cu_seqlens_q = d.cu_q.as<int>();
    p.cu_seqlens_k = d.cu_k.as<int>();
    p.batch = static_cast<int>(pr.cu_q.size()) - 1;
    p.heads = pr.heads;
    p.kv_heads = pr.kv_heads;
    p.head_dim = pr.head_dim;
    p.max_seqlen_q = pr.max_q();
    p.max_seqlen_k = pr.max_k();
    p.total_q = pr.cu_q.back();
    p.total_k = pr.cu_k.back();
    p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(pr.head_dim));
    p.softmax_scale_log2 = p.softmax_scale * 1.4426950408889634f;
    p.causal = pr.causal ? 1 : 0;
    p.tile_counter = counter_.as<int>();
    return p;
  }

  int CtasPerSm(const Candidate& c) const {
    const Manifest& m = c.variant.manifest;
    int by_regs = 32;
    if (c.regs > 0) {
      const int per_warp = ((c.regs * 32 + 255) / 256) * 256;
      by_regs = (65536 / per_warp) / (m.threads / 32);
    }
    return std::max(1, std::min(by_regs, EstimateCtasPerSm(m, info_.arch)));
  }

  struct Launch {
    LaunchPlan plan;
    KfAttnParams params;
  };

  absl::StatusOr<Launch> Plan(const Candidate& c, const Problem& pr, Data& d) {
    auto plan = PlanLaunch(c.variant.manifest, pr.cu_q, pr.cu_k, pr.heads, pr.causal, info_.arch,
                           info_.sm_count, CtasPerSm(c));
    if (!plan.ok()) return plan.status();
    Launch l{*std::move(plan), Params(pr, d)};
    if (!l.plan.tiles.empty()) {
      if (d.tiles.size() < l.plan.tiles.size() * 4) {
        auto t = gpu::DeviceBuffer::Allocate(driver_, l.plan.tiles.size() * 4);
        if (!t.ok()) return t.status();
        d.tiles = std::move(*t);
      }
      BENCH_TRY(d.tiles.Upload(std::span<const int32_t>(l.plan.tiles), stream_));
      l.params.tiles = d.tiles.as<int>();
      l.params.num_tiles = l.plan.num_tiles;
    }
    return l;
  }

  absl::Status Run(const Candidate& c, const Launch& l) {
    BENCH_TRY(counter_.Fill32(0, stream_));
    if (l.plan.empty) return absl::OkStatus();
    return c.kernel.Launch(l.params, {l.plan.grid[0], l.plan.grid[1], l.plan.grid[2]},
                           {l.plan.threads}, l.plan.dynamic_smem_bytes, stream_);
  }

  struct CheckResult {
    bool pass = false;
    double max_abs = 0, max_ref = 0, lse_abs = 0;
    double nonfinite = 0, lse_bad = 0;
    std::string error;
  };

  CheckResult Check(const Candidate& c, const Problem& pr, Data& d) {
    CheckResult r;
    auto l = Plan(c, pr, d);
    if (!l.ok()) {
      r.error = std::string(l.status().message());
      return r;
    }
    auto fail = [&](absl::Status s) {
      r.error = std::string(s.message());
      return r;
    };
    if (auto s = d.o.Fill8(0xff, stream_); !s.ok()) return fail(s);  // NaN poison
    if (auto s = d.lse.Fill8(0xff, stream_); !s.ok()) return fail(s);
    if (auto s = stats_.Fill8(0, stream_); !s.ok()) return fail(s);
    if (auto s = Run(c, *l); !s.ok()) return fail(s);
    uint64_t o = d.o.address(), ro = d.ref_o.address(), lse = d.lse.address(),
             rl = d.ref_lse.address(), out = stats_.address();
    long long n_o = static_cast<long long>(d.ref_rows) * pr.heads * pr.head_dim;
    long long stride = pr.cu_q.back();
    int rows = d.ref_rows, heads = pr.heads;
    void* args[] = {&o, &ro, &n_o, &lse, &stride, &rl, &rows, &heads, &out};
    if (auto s = compare_.LaunchRaw(args, {264}, {256}, 0, stream_); !s.ok()) return fail(s);
    float st[5] = {};
    if (auto s = stats_.Download(std::span<float>(st, 5), stream_); !s.ok()) return fail(s);
    r.max_abs = st[0];
    r.max_ref = st[1];
    r.nonfinite = st[2];
    r.lse_abs = st[3];
    r.lse_bad = st[4];
    r.pass = r.nonfinite == 0 && r.lse_bad == 0 && r.max_abs <= 2e-2 * std::max(1.0, r.max_ref) &&
             r.lse_abs <= 1e-3;
    return r;
  }

  // Median microseconds over `reps` runs, each after an L2 flush.
  absl::StatusOr<double> Time(const Candidate& c, const Problem& pr, Data& d, int reps) {
    auto l = Plan(c, pr, d);
    if (!l.ok()) return l.status();
    for (int i = 0; i < 3; ++i) BENCH_TRY(Run(c, *l));
    BENCH_TRY(stream_.Synchronize());
    std::vector<gpu::Event> starts, ends;
    for (int i = 0; i < reps; ++i) {
      auto a = gpu::Event::Create(driver_);
      auto b = gpu::Event::Create(driver_);
      if (!a.ok()) return a.status();
      if (!b.ok()) return b.status();
      starts.push_back(std::move(*a));
      ends.push_back(std::move(*b));
    }
    for (int i = 0; i < reps; ++i) {
      BENCH_TRY(flush_.Fill32(static_cast<uint32_t>(i), stream_));
      BENCH_TRY(counter_.Fill32(0, stream_));
      BENCH_TRY(starts[i].Record(stream_));
      if (!l->plan.empty) {
        BENCH_TRY(c.kernel.Launch(l->params, {l->plan.grid[0], l->plan.grid[1], l->plan.grid[2]},
                                  {l->plan.threads}, l->plan.dynamic_smem_bytes, stream_));
      }
      BENCH_TRY(ends[i].Record(stream_));
    }
    BENCH_TRY(stream_.Synchronize());
    std::vector<double> us;
    for (int i = 0; i < reps; ++i) {
      auto ms = gpu::Event::ElapsedMs(starts[i], ends[i]);
      if (!ms.ok()) return ms.status();
      us.push_back(*ms * 1000.0);
    }
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  }

  const gpu::DeviceInfo& info() const { return info_; }

 private:
  const gpu::Driver& driver_;
  gpu::DeviceInfo info_;
  gpu::Stream stream_;
  std::unique_ptr<reference::GpuReference> ref_;
  gpu::Module helpers_;
  gpu::Kernel fill_, compare_;
  gpu::DeviceBuffer flush_, counter_, stats_;
};

std::vector<std::map<std::string, int>> MmaSweep(const std::string& mode, int d) {
  using K = std::map<std::string, int>;
  if (mode == "default") return {};
  std::vector<K> out = {
      {{"BLOCK_M", 128}, {"WARPS", 8}, {"BLOCK_N", 64}, {"STAGES", 2}, {"PERSISTENT", 1}},
      {{"BLOCK_M", 64}, {"WARPS", 4}, {"BLOCK_N", 64}, {"STAGES", 2}, {"PERSISTENT", 1}},
      {{"BLOCK_M", 64}, {"WARPS", 4}, {"BLOCK_N", 64}, {"STAGES", 2}, {"PERSISTENT", 1}, {"PACK", 0}},
      {{"BLOCK_M", 64}, {"WARPS", 4}, {"BLOCK_N", 32}, {"STAGES", 2}, {"PERSISTENT", 1}},
      {{"BLOCK_M", 64}, {"WARPS", 4}, {"BLOCK_N", 64}, {"STAGES", 2}, {"PERSISTENT", 1}, {"MIN_BLOCKS", 3}},
      {{"BLOCK_M", 128}, {"WARPS", 8}, {"BLOCK_N", 64}, {"STAGES", 2}, {"PERSISTENT", 0}},
  };
  if (d <= 128) {
    out.push_back({{"BLOCK_M", 128}, {"WARPS", 8}, {"BLOCK_N", 128}, {"STAGES", 2}, {"PERSISTENT", 1}});
    out.push_back({{"BLOCK_M", 64}, {"WARPS", 4}, {"BLOCK_N", 128}, {"STAGES", 2}, {"PERSISTENT", 1}});
    out.push_back({{"BLOCK_M", 128}, {"WARPS", 8}, {"BLOCK_N", 128}, {"STAGES", 2}, {"PERSISTENT", 1},
                   {"ORDER", 1}});
  }
  if (d == 64) {
    out.push_back({{"BLOCK_M", 128}, {"WARPS", 8}, {"BLOCK_N", 64}, {"STAGES", 2}, {"PERSISTENT", 1},
                   {"MIN_BLOCKS", 2}});
    out.push_back({{"BLOCK_M", 128}, {"WARPS", 8}, {"BLOCK_N", 128}, {"STAGES", 1}, {"PERSISTENT", 1},
                   {"MIN_BLOCKS", 2}});
  }
  return out;
}

ShapeKey KeyOf(const Problem& pr, const std::string& arch) {
  ShapeKey k;
  k.head_dim = pr.head_dim;
  k.heads = pr.heads;
  k.kv_heads = pr.kv_heads;
  k.causal = pr.causal;
  k.cross = pr.cross;
  k.arch = arch;
  k.batch = static_cast<int64_t>(pr.cu_q.size()) - 1;
  k.max_len_q = pr.max_q();
  k.max_len_k = pr.max_k();
  k.total_q = pr.cu_q.back();
  k.total_k = pr.cu_k.back();
  return k;
}

// Candidates for a head dim: the mma sweep plus every other template's defaults.
std::vector<Candidate> MakeCandidates(const Problem& pr, const std::string& arch,
                                      const std::string& mode, const std::string& templates) {
  auto wanted = [&](const std::string& t) {
    return templates.empty() || ("," + templates + ",").find("," + t + ",") != std::string::npos;
  };
  std::vector<Candidate> out;
  const ShapeKey key = KeyOf(pr, arch);
  auto add = [&](absl::StatusOr<Variant> v) {
    if (!v.ok()) {
      std::fprintf(stderr, "  skip candidate: %s\n", std::string(v.status().message()).c_str());
      return;
    }
    if (!wanted(v->template_name)) return;
    if (auto s = CheckVariant(v->source, v->manifest, arch, key); !s.ok()) {
      std::fprintf(stderr, "  static check rejects %s: %s\n", Label(*v).c_str(),
                   std::string(s.message()).c_str());
      return;
    }
    for (const auto& c : out) {
      if (c.variant.template_name == v->template_name && c.variant.knobs == v->knobs) return;
    }
    Candidate c;
    c.label = Label(*v);
    c.variant = *std::move(v);
    out.push_back(std::move(c));
  };
  // The same kernel with the grouped tile order (host-side only), for templates
  // without an order knob.
  auto add_grouped = [&](absl::StatusOr<Variant> v) {
    if (!v.ok() || !wanted(v->template_name) || v->manifest.grid != GridPolicy::kPersistent) return;
    if (!CheckVariant(v->source, v->manifest, arch, key).ok()) return;
    Candidate c;
    c.variant = *std::move(v);
    c.variant.manifest.tile_order = TileOrder::kGrouped;
    c.variant.manifest_json = ManifestToJson(c.variant.manifest);
    c.label = Label(c.variant) + " +grouped";
    out.push_back(std::move(c));
  };
  add(DefaultVariant(key));
  for (const auto& t : ListTemplates()) {
    if (std::find(t.archs.begin(), t.archs.end(), arch) == t.archs.end()) continue;
    if (std::find(t.head_dims.begin(), t.head_dims.end(), pr.head_dim) == t.head_dims.end()) continue;
    add(Instantiate(t.name, DefaultKnobs(t.name, key), pr.head_dim));
    if (t.name != "fwd_mma" && pr.max_q() > 512) {
      auto k = DefaultKnobs(t.name, key);
      if (k.count("PERSISTENT")) k["PERSISTENT"] = 1;
      add(Instantiate(t.name, k, pr.head_dim));
      add_grouped(Instantiate(t.name, k, pr.head_dim));
    }
    if (t.name == "fwd_mma") {
      for (const auto& k : MmaSweep(mode, pr.head_dim)) add(Instantiate(t.name, k, pr.head_dim));
    }
  }
  return out;
}

std::vector<Problem> HostileProblems(int d) {
  const std::vector<int> lq = {0, 1, 63, 64, 65, 127, 128, 129, 200, 300, 517, 1000, 2049, 7};
  const std::vector<int> lk = {5, 0, 100, 64, 300, 1, 128, 129, 70, 3, 400, 1000, 64, 2000};
  std::vector<Problem> out;
  // Many short sequences: packed tiles (rows of several sequences in one tile).
  std::vector<int> sq, sk;
  for (int i = 0; i < 90; ++i) {
    sq.push_back(i % 7);
    sk.push_back((i * 3) % 5);
  }
  sq.push_back(70);
  sk.push_back(9);
  for (bool causal : {false, true}) {
    out.push_back(MakeProblem(fmt::format("hostile_short_self_{}", causal ? "causal" : "full"), 4,
                              2, d, causal, sq, sq));
    out.push_back(MakeProblem(fmt::format("hostile_short_cross_{}", causal ? "causal" : "full"), 4,
                              4, d, causal, sq, sk));
  }
  for (bool causal : {false, true}) {
    out.push_back(MakeProblem(fmt::format("hostile_self_{}", causal ? "causal" : "full"), 4, 2, d,
                              causal, lq, lq));
    out.push_back(MakeProblem(fmt::format("hostile_cross_{}", causal ? "causal" : "full"), 4, 1, d,
                              causal, lq, lk));
  }
  return out;
}

int Main(int argc, char** argv) {
  std::string lengths_path = "lengths.json", out_path, only, mode = "sweep", templates;
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--lengths") lengths_path = next();
    else if (a == "--out") out_path = next();
    else if (a == "--only") only = next();
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--variants") mode = next();
    else if (a == "--templates") templates = next();
    else {
      std::fprintf(stderr, "usage: kforge-bench-attn --lengths F [--out F] [--only a,b] [--reps N] [--variants default|sweep] [--templates a,b]\n");
      return 2;
    }
  }
  std::ifstream in(lengths_path);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", lengths_path.c_str());
    return 1;
  }
  json shapes = json::parse(in, nullptr, false);
  if (shapes.is_discarded()) {
    std::fprintf(stderr, "%s is not JSON\n", lengths_path.c_str());
    return 1;
  }
  auto driver = gpu::Driver::Load();
  if (!driver.ok()) {
    std::fprintf(stderr, "%s\n", std::string(driver.status().message()).c_str());
    return 1;
  }
  auto ctx = (*driver)->OpenContext(0);
  auto info = (*driver)->GetDeviceInfo(0);
  auto stream = gpu::Stream::Create(**driver);
  if (!ctx.ok() || !info.ok() || !stream.ok()) {
    std::fprintf(stderr, "no usable GPU\n");
    return 1;
  }
  std::printf("GPU %s (%s, %d SMs)\n", info->name.c_str(), info->arch.c_str(), info->sm_count);
  Bench bench(**driver, *info, std::move(*stream));
  if (auto s = bench.Init(); !s.ok()) {
    std::fprintf(stderr, "init: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  const std::string arch = info->arch;

  json results = json::array();
  struct Row {
    std::string shape, best;
    double us = 0, tflops = 0;
  };
  std::vector<Row> rows;
  std::map<int, std::map<std::string, std::string>> hostile_verdict;  // d -> label -> "" ok / reason

  for (const auto& s : shapes) {
    const std::string name = s["name"];
    if (!only.empty() && ("," + only + ",").find("," + name + ",") == std::string::npos) continue;
    Problem pr = MakeProblem(name, s["H"], s["H"], s["D"], s["causal"],
                             s["lq"].get<std::vector<int>>(), s["lk"].get<std::vector<int>>());
    std::printf("\n== %s: B=%zu H=%d D=%d causal=%d tokens_q=%d max_q=%d GFLOP=%.1f\n",
                name.c_str(), pr.cu_q.size() - 1, pr.heads, pr.head_dim, pr.causal, pr.cu_q.back(),
                pr.max_q(), pr.flops / 1e9);
    std::fflush(stdout);
    std::vector<Candidate> cands = MakeCandidates(pr, arch, mode, templates);
    bench.Prepare(cands);

    // Hostile correctness batches, once per (head dim, candidate).
    auto& verdicts = hostile_verdict[pr.head_dim];
    for (auto& c : cands) {
      if (!c.error.empty()) continue;
      auto it = verdicts.find(c.label);
      if (it == verdicts.end()) {
        std::string why;
        for (const Problem& hp : HostileProblems(pr.head_dim)) {
          auto d = bench.Upload(hp, 1 << 20);
          if (!d.ok()) {
            why = fmt::format("{}: {}", hp.name, std::string(d.status().message()));
            break;
          }
          auto r = bench.Check(c, hp, *d);
          if (!r.pass) {
            why = fmt::format("{}: {} max_abs={:.3g} (ref max {:.3g}) nonfinite={} lse_abs={:.3g} lse_bad={}",
                              hp.name, r.error, r.max_abs, r.max_ref, r.nonfinite, r.lse_abs,
                              r.lse_bad);
            break;
          }
        }
        it = verdicts.emplace(c.label, why).first;
      }
      c.hostile_ok = it->second.empty();
      c.hostile_detail = it->second;
    }

    auto data = bench.Upload(pr, 65536);
    if (!data.ok()) {
      std::printf("  upload failed: %s\n", std::string(data.status().message()).c_str());
      continue;
    }
    json jshape = {{"shape", name}, {"tokens_q", pr.cu_q.back()}, {"tokens_k", pr.cu_k.back()},
                   {"fwd_gflop", pr.flops / 1e9}, {"checked_rows", data->ref_rows},
                   {"variants", json::array()}};
    Row best{name, "", 0, 0};
    for (auto& c : cands) {
      json jv = {{"variant", c.label}, {"template", c.variant.template_name},
                 {"knobs", c.variant.knobs}, {"manifest", json::parse(c.variant.manifest_json)},
                 {"regs", c.regs}, {"local_bytes", c.local_bytes},
                 {"spill_stores", c.res.spill_stores_bytes}, {"compile_ms", c.compile_ms}};
      if (!c.error.empty()) {
        jv["error"] = c.error;
        std::printf("  %-70s ERROR %s\n", c.label.c_str(), c.error.substr(0, 300).c_str());
        jshape["variants"].push_back(jv);
        continue;
      }
      auto chk = bench.Check(c, pr, *data);
      jv["check"] = {{"pass", chk.pass}, {"max_abs", chk.max_abs}, {"lse_abs", chk.lse_abs},
                     {"nonfinite", chk.nonfinite}, {"lse_bad", chk.lse_bad}, {"error", chk.error}};
      jv["hostile_ok"] = c.hostile_ok;
      if (!c.hostile_ok) jv["hostile_detail"] = c.hostile_detail;
      auto us = chk.error.empty() ? bench.Time(c, pr, *data, reps)
                                  : absl::StatusOr<double>(absl::InternalError(chk.error));
      const bool verified = chk.pass && c.hostile_ok;
      if (us.ok()) {
        const double tf = pr.flops / (*us * 1e-6) / 1e12;
        jv["us"] = *us;
        jv["tflops"] = tf;
        std::printf("  %-70s %s %9.1f us %7.1f TFLOP/s  regs=%d err=%.2g lse=%.2g%s\n",
                    c.label.c_str(), verified ? "OK " : "BAD", *us, tf, c.regs, chk.max_abs,
                    chk.lse_abs, c.hostile_ok ? "" : ("  hostile: " + c.hostile_detail).c_str());
        if (verified && (best.us == 0 || *us < best.us)) best = {name, c.label, *us, tf};
      } else {
        jv["error"] = std::string(us.status().message());
        std::printf("  %-70s FAILED %s\n", c.label.c_str(),
                    std::string(us.status().message()).c_str());
      }
      std::fflush(stdout);
      jshape["variants"].push_back(jv);
    }
    jshape["best"] = {{"variant", best.best}, {"us", best.us}, {"tflops", best.tflops}};
    results.push_back(jshape);
    rows.push_back(best);
  }
  std::printf("\nshape | best verified variant | us | TFLOP/s\n");
  for (const auto& r : rows) {
    std::printf("%s | %s | %.1f | %.1f\n", r.shape.c_str(), r.best.c_str(), r.us, r.tflops);
  }
  if (!out_path.empty()) {
    std::ofstream(out_path) << json{{"gpu", info->name}, {"arch", arch}, {"shapes", results}}.dump(1);
  }
  return 0;
}

}  // namespace
}  // namespace kforge::bench

int main(int argc, char** argv) { return kforge::bench::Main(argc, argv); }

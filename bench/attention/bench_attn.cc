// kforge-bench-attn: times kforge's jagged attention variants, forward and/or
// backward, on the benchmark shapes (bench/shapes.json, lengths drawn by
// lengths.py with the anchors' rule), after checking each against the GPU
// reference. `--help` lists the options.
//
// Per shape and op: every candidate (template x knobs, from the catalog's
// templates of that op) is NVRTC-compiled for the GPU found (once per source:
// shapes share compiles), checked on a hostile small batch (lengths 0, 1,
// tile +-1, cross, GQA, both masks) and on a prefix of the benchmark batch
// against the fp32 reference, then timed: 3 warm-ups, then `reps` runs each
// preceded by an L2 flush, CUDA events around the launch alone, median
// reported. Backward: the events also enclose the one memset of the scratch
// the contract has the host zero (tile counter, workspace, delta, dq_accum),
// because every backward call pays it (the runtime issues it per launch);
// delta = rowsum(dO o O) and the dQ conversion are inside the variant's one
// launch (CONTRACT.md, "Backward"). Backward FLOPs = 2.5 x forward FLOPs.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpu/compile.h"
#include "gpu/gpu.h"
#include "kernels/catalog.h"
#include "kernels/check.h"
#include "kernels/schedule.h"
#include "worker/eval/compare.h"
#include "worker/eval/device_tools.h"
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
// dst[h * rows + r] = src[h * src_stride + r]: the (heads, total_q) LSE of a
// batch's first `rows` query rows as a (heads, rows) array of their own.
extern "C" __global__ void kf_gather_lse(const float* src, long long src_stride, float* dst,
                                         int rows, int heads) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (long long)rows * heads;
       i += (long long)gridDim.x * blockDim.x) {
    dst[i] = src[(i / rows) * src_stride + i % rows];
  }
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

// What the timing loop measured, in microseconds: the median (the reported
// figure) and the quartiles (their distance is the spread the search's
// tables use to tell a real difference from noise).
struct Timed {
  double median = 0, q1 = 0, q3 = 0;
  std::vector<double> runs;  // every timed run, in launch order (drift shows here)
};

struct Candidate {
  Variant variant;
  std::string label;
  // Shared with every other shape's candidate of the same source and
  // manifest (Bench keeps them): a compile is made once per run.
  std::shared_ptr<gpu::Module> module;
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
    auto gather = helpers_.GetKernel("kf_gather_lse");
    if (!gather.ok()) return gather.status();
    gather_lse_ = *gather;
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

  // Compiles and loads every candidate, `jobs` compiles at a time; a
  // candidate whose source and manifest an earlier shape's had reuses that
  // compile. A bounded pool rather than a thread per candidate: `--variants
  // all` has hundreds, and NVRTC's memory and the cores are what bound it.
  void Prepare(std::vector<Candidate>& cands, int jobs) {
    auto key = [](const Candidate& c) { return c.variant.manifest_json + "\n" + c.variant.source; };
    std::vector<Candidate*> todo;
    std::set<std::string> queued;
    for (auto& c : cands) {
      if (!compiled_.count(key(c)) && queued.insert(key(c)).second) todo.push_back(&c);
    }
    std::vector<absl::StatusOr<gpu::CompileResult>> results(todo.size(),
                                                            absl::UnknownError("not compiled"));
    std::atomic<size_t> next{0};
    std::vector<std::thread> pool;
    const size_t threads = std::clamp<size_t>(jobs, 1, std::max<size_t>(1, todo.size()));
    for (size_t w = 0; w < threads && !todo.empty(); ++w) {
      pool.emplace_back([&] {
        for (size_t i; (i = next.fetch_add(1)) < todo.size();) {
          gpu::CompileRequest req;
          req.source = todo[i]->variant.source;
          const auto& ops = todo[i]->variant.manifest.ops;
          if (trace_ && std::find(ops.begin(), ops.end(), "bwd") != ops.end())
            req.source = "#define KF_TRACE 1\n" + req.source;
          req.arch = info_.arch;
          req.name = todo[i]->variant.template_name + ".cu";
          results[i] = gpu::Compile(req);
        }
      });
    }
    for (auto& t : pool) t.join();
    for (size_t i = 0; i < todo.size(); ++i) {
      Candidate& c = *todo[i];
      Load(c, std::move(results[i]));
      compiled_[key(c)] = c;
    }
    for (auto& c : cands) {
      const Candidate& done = compiled_.at(key(c));
      c.module = done.module;
      c.kernel = done.kernel;
      c.res = done.res;
      c.regs = done.regs;
      c.local_bytes = done.local_bytes;
      c.compile_ms = done.compile_ms;
      c.error = done.error;
    }
  }

  void Load(Candidate& c, absl::StatusOr<gpu::CompileResult> r) {
    if (!r.ok()) {
      c.error = std::string(r.status().message());
      return;
    }
    c.compile_ms = r->compile_ms;
    c.res = r->total;
    if (!r->ok) {
      c.error = "compile error:\n" + r->log.substr(0, 2000);
      return;
    }
    auto m = gpu::Module::Load(driver_, r->cubin);
    if (!m.ok()) {
      c.error = std::string(m.status().message());
      return;
    }
    c.module = std::make_shared<gpu::Module>(*std::move(m));
    auto k = c.module->GetKernel(c.variant.entry_point);
    if (!k.ok()) {
      c.error = std::string(k.status().message());
      return;
    }
    c.kernel = *k;
    if (auto s = c.kernel.SetMaxDynamicSharedMemory(c.variant.manifest.dynamic_smem_bytes);
        !s.ok()) {
      c.error = std::string(s.message());
      return;
    }
    auto attr = c.kernel.Attributes();
    if (attr.ok()) {
      c.regs = attr->num_regs;
      c.local_bytes = attr->local_bytes;
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
    std::vector<gpu::TensorMap> maps;  // the manifest's tensor maps, encoded before timing
  };

  absl::StatusOr<Launch> Plan(const Candidate& c, const Problem& pr, Data& d) {
    auto plan = PlanLaunch(c.variant.manifest, pr.cu_q, pr.cu_k, pr.heads, pr.causal, info_.arch,
                           info_.sm_count, CtasPerSm(c));
    if (!plan.ok()) return plan.status();
    Launch l{*std::move(plan), Params(pr, d), {}};
    auto maps = gpu::EncodeAttnTensorMaps(driver_, l.params, c.variant.manifest.tensor_maps);
    if (!maps.ok()) return maps.status();
    l.maps = *std::move(maps);
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
    return c.kernel.Launch(l.params, l.maps, {l.plan.grid[0], l.plan.grid[1], l.plan.grid[2]},
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
  absl::StatusOr<Timed> Time(const Candidate& c, const Problem& pr, Data& d, int reps) {
    auto l = Plan(c, pr, d);
    if (!l.ok()) return l.status();
    return TimeLoop(
        reps, [&] { return counter_.Fill32(0, stream_); },
        [&]() -> absl::Status {
          if (l->plan.empty) return absl::OkStatus();
          return c.kernel.Launch(l->params, l->maps,
                                 {l->plan.grid[0], l->plan.grid[1], l->plan.grid[2]},
                                 {l->plan.threads}, l->plan.dynamic_smem_bytes, stream_);
        });
  }

  // 3 warm-ups of (untimed, timed), then `reps` times: L2 flush, `untimed`,
  // then `timed` between two events. The median and quartiles in microseconds.
  absl::StatusOr<Timed> TimeLoop(int reps, const std::function<absl::Status()>& untimed,
                                  const std::function<absl::Status()>& timed) {
    for (int i = 0; i < 3; ++i) {
      BENCH_TRY(untimed());
      BENCH_TRY(timed());
    }
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
      BENCH_TRY(untimed());
      BENCH_TRY(starts[i].Record(stream_));
      BENCH_TRY(timed());
      BENCH_TRY(ends[i].Record(stream_));
    }
    BENCH_TRY(stream_.Synchronize());
    std::vector<double> us;
    for (int i = 0; i < reps; ++i) {
      auto ms = gpu::Event::ElapsedMs(starts[i], ends[i]);
      if (!ms.ok()) return ms.status();
      us.push_back(*ms * 1000.0);
    }
    std::vector<double> runs = us;
    std::sort(us.begin(), us.end());
    return Timed{us[us.size() / 2], us[us.size() / 4], us[(3 * us.size()) / 4], std::move(runs)};
  }

  // ------------------------------------------------------------ backward ---
  // Inputs as the evaluator makes them (worker/eval/eval.cc): random Q, K, V,
  // dO; O (rounded to bf16) and LSE from the reference forward of the whole
  // batch. The reference backward runs on the checked prefix only.
  struct BwdData {
    gpu::DeviceBuffer q, k, v, dout, o, lse, cu_q, cu_k, dq, dk, dv, scratch, tiles;
    gpu::DeviceBuffer ref_dq, ref_dk, ref_dv;  // fp32, the checked prefix
    int ref_batch = 0, ref_rows = 0, ref_keys = 0;
  };

  absl::StatusOr<BwdData> UploadBwd(const Problem& pr, int max_check_rows) {
    if (tools_ == nullptr) {
      auto t = eval::DeviceTools::Create(driver_, info_.arch);
      if (!t.ok()) return t.status();
      tools_ = *std::move(t);
    }
    BwdData d;
    auto alloc = [&](gpu::DeviceBuffer& b, size_t bytes) -> absl::Status {
      auto x = gpu::DeviceBuffer::Allocate(driver_, std::max<size_t>(bytes, 16));
      if (!x.ok()) return x.status();
      b = std::move(*x);
      return absl::OkStatus();
    };
    const size_t tq = pr.cu_q.back(), tk = pr.cu_k.back(), D = pr.head_dim;
    const size_t q_elems = tq * pr.heads * D, k_elems = tk * pr.kv_heads * D;
    for (auto* b : {&d.q, &d.dout, &d.o, &d.dq}) BENCH_TRY(alloc(*b, q_elems * 2));
    for (auto* b : {&d.k, &d.v, &d.dk, &d.dv}) BENCH_TRY(alloc(*b, k_elems * 2));
    BENCH_TRY(alloc(d.lse, tq * pr.heads * 4));
    BENCH_TRY(alloc(d.cu_q, pr.cu_q.size() * 4));
    BENCH_TRY(alloc(d.cu_k, pr.cu_k.size() * 4));
    BENCH_TRY(Fill(d.q, 11));
    BENCH_TRY(Fill(d.k, 22));
    BENCH_TRY(Fill(d.v, 33));
    BENCH_TRY(Fill(d.dout, 44));
    BENCH_TRY(d.cu_q.Upload(std::span<const int32_t>(pr.cu_q), stream_));
    BENCH_TRY(d.cu_k.Upload(std::span<const int32_t>(pr.cu_k), stream_));
    {
      gpu::DeviceBuffer o32;
      BENCH_TRY(alloc(o32, q_elems * 4));
      KfAttnParams p = BwdParams(pr, d);
      p.o = o32.get();
      BENCH_TRY(ref_->Forward(p, stream_));
      BENCH_TRY(tools_->ToBf16(d.o, o32, q_elems, stream_));
      BENCH_TRY(stream_.Synchronize());  // before o32 is freed
    }
    int nb = 1;
    const int batch = static_cast<int>(pr.cu_q.size()) - 1;
    while (nb < batch && pr.cu_q[nb + 1] <= max_check_rows) ++nb;
    d.ref_batch = std::min(nb, batch);
    d.ref_rows = pr.cu_q[d.ref_batch];
    d.ref_keys = pr.cu_k[d.ref_batch];
    BENCH_TRY(alloc(d.ref_dq, size_t(d.ref_rows) * pr.heads * D * 4));
    BENCH_TRY(alloc(d.ref_dk, size_t(d.ref_keys) * pr.kv_heads * D * 4));
    BENCH_TRY(alloc(d.ref_dv, size_t(d.ref_keys) * pr.kv_heads * D * 4));
    // The prefix as a batch of its own: its rows come first in every
    // row-major tensor, but LSE and delta are (heads, rows), so LSE is gathered.
    gpu::DeviceBuffer lse_p, delta_p;
    BENCH_TRY(alloc(lse_p, size_t(d.ref_rows) * pr.heads * 4));
    BENCH_TRY(alloc(delta_p, size_t(d.ref_rows) * pr.heads * 4));
    {
      uint64_t src = d.lse.address(), dst = lse_p.address();
      long long stride = static_cast<long long>(tq);
      int rows = d.ref_rows, heads = pr.heads;
      void* args[] = {&src, &stride, &dst, &rows, &heads};
      BENCH_TRY(gather_lse_.LaunchRaw(args, {264}, {256}, 0, stream_));
    }
    KfAttnParams bp = BwdParams(pr, d);
    bp.batch = d.ref_batch;
    bp.total_q = d.ref_rows;
    bp.total_k = d.ref_keys;
    bp.lse = lse_p.as<float>();
    bp.delta = delta_p.as<float>();
    bp.dq = d.ref_dq.get();
    bp.dk = d.ref_dk.get();
    bp.dv = d.ref_dv.get();
    BENCH_TRY(ref_->Backward(bp, stream_));
    BENCH_TRY(stream_.Synchronize());  // before lse_p and delta_p are freed
    return d;
  }

  KfAttnParams BwdParams(const Problem& pr, const BwdData& d) const {
    KfAttnParams p{};
    p.q = d.q.get();
    p.k = d.k.get();
    p.v = d.v.get();
    p.o = d.o.get();
    p.lse = d.lse.as<float>();
    p.dout = d.dout.get();
    p.dq = d.dq.get();
    p.dk = d.dk.get();
    p.dv = d.dv.get();
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
    return p;
  }

  struct BwdLaunch {
    LaunchPlan plan;
    KfAttnParams params;
    std::vector<gpu::TensorMap> maps;  // the manifest's tensor maps, encoded before timing
    uint64_t scratch = 0;  // the range zeroed before every launch
    size_t scratch_bytes = 0;
    size_t accum_bytes = 0;  // dq_accum's, last in the scratch
  };

  // The launch as the evaluator and the runtime make it: CTAs per SM from
  // the manifest or the occupancy calculator, the key-major tile list
  // (PlanLaunch with kv_heads), and the scratch the contract has the host
  // zero laid out in one range, as runtime/launcher.cc does, so that one
  // memset clears it.
  absl::StatusOr<BwdLaunch> PlanBwd(const Candidate& c, const Problem& pr, BwdData& d) {
    const Manifest& m = c.variant.manifest;
    int ctas_per_sm = m.ctas_per_sm;
    if (ctas_per_sm <= 0 && m.grid == GridPolicy::kPersistent) {
      auto fit = c.kernel.MaxActiveBlocksPerSm(m.threads, m.dynamic_smem_bytes);
      if (fit.ok() && *fit == 0) {
        return absl::InvalidArgumentError(fmt::format(
            "{} threads with {} B of dynamic shared memory do not fit on one SM", m.threads,
            m.dynamic_smem_bytes));
      }
      if (fit.ok()) ctas_per_sm = *fit;
    }
    auto plan = PlanLaunch(m, pr.cu_q, pr.cu_k, pr.heads, pr.causal, info_.arch, info_.sm_count,
                           ctas_per_sm, pr.kv_heads);
    if (!plan.ok()) return plan.status();
    BwdLaunch l{*std::move(plan), BwdParams(pr, d), {}};
    auto maps = gpu::EncodeAttnTensorMaps(driver_, l.params, m.tensor_maps);
    if (!maps.ok()) return maps.status();
    l.maps = *std::move(maps);
    auto align = [](size_t x) { return (x + 255) / 256 * 256; };
    const size_t tq = pr.cu_q.back();
    const size_t counter_at = 0;
    const size_t workspace_at = counter_at + align(16);
    const size_t delta_at = workspace_at + align(size_t(l.plan.workspace_bytes));
    const size_t accum_at = delta_at + align(tq * pr.heads * 4);
    l.accum_bytes = tq * pr.heads * pr.head_dim * 4;
    const size_t end = accum_at + align(l.accum_bytes);
    // dq_accum is last, so a variant that zeroes none of it (zero_dq_accum
    // false) has the memset stop before it, as the runtime's does; so does
    // one that leaves it zero (restores_dq_accum), which gets it zeroed once
    // here instead, as the runtime zeroes it once per scratch
    const bool per_launch = m.zero_dq_accum && !m.restores_dq_accum;
    l.scratch_bytes = per_launch ? end : accum_at;
    if (d.scratch.size() < end) {
      d.scratch = gpu::DeviceBuffer{};
      auto b = gpu::DeviceBuffer::Allocate(driver_, end);
      if (!b.ok()) return b.status();
      d.scratch = std::move(*b);
    }
    l.scratch = d.scratch.address();
    auto at = [&](size_t off) { return reinterpret_cast<void*>(l.scratch + off); };
    l.params.tile_counter = static_cast<int*>(at(counter_at));
    l.params.workspace = l.plan.workspace_bytes > 0 ? at(workspace_at) : nullptr;
    l.params.workspace_bytes = l.plan.workspace_bytes;
    l.params.delta = static_cast<float*>(at(delta_at));
    l.params.dq_accum = static_cast<float*>(at(accum_at));
    if (m.restores_dq_accum) {
      BENCH_TRY(gpu::FillAsync8(driver_, l.scratch + accum_at, 0, l.accum_bytes, stream_));
    }
    if (!l.plan.tiles.empty()) {
      if (d.tiles.size() < l.plan.tiles.size() * 4) {
        d.tiles = gpu::DeviceBuffer{};
        auto t = gpu::DeviceBuffer::Allocate(driver_, l.plan.tiles.size() * 4);
        if (!t.ok()) return t.status();
        d.tiles = std::move(*t);
      }
      BENCH_TRY(d.tiles.Upload(std::span<const int32_t>(l.plan.tiles), stream_));
      l.params.tiles = d.tiles.as<int>();
    }
    l.params.num_tiles = l.plan.num_tiles;
    return l;
  }

  // One backward call: the scratch memset, then the launch.
  absl::Status RunBwd(const Candidate& c, const BwdLaunch& l) {
    BENCH_TRY(gpu::FillAsync8(driver_, l.scratch, 0, l.scratch_bytes, stream_));
    if (l.plan.empty) return absl::OkStatus();
    return c.kernel.Launch(l.params, l.maps, {l.plan.grid[0], l.plan.grid[1], l.plan.grid[2]},
                           {l.plan.threads}, l.plan.dynamic_smem_bytes, stream_);
  }

  struct BwdCheck {
    bool pass = false;
    std::vector<eval::OutputCheck> outputs;  // dQ, dK, dV on the checked prefix
    std::string error;   // the launch could not be made
    std::string detail;  // the first failing output's reason
  };

  // dQ, dK, dV (poisoned with NaN first) against the reference on the
  // checked prefix, judged by the evaluator's tolerance policy (TOLERANCE.md).
  BwdCheck CheckBwd(const Candidate& c, const Problem& pr, BwdData& d) {
    BwdCheck r;
    auto fail = [&](const absl::Status& s) {
      r.error = std::string(s.message());
      return r;
    };
    auto l = PlanBwd(c, pr, d);
    if (!l.ok()) return fail(l.status());
    for (auto* b : {&d.dq, &d.dk, &d.dv}) {
      if (auto s = b->Fill32(eval::kPoisonBf16Pair, stream_); !s.ok()) return fail(s);
    }
    if (!c.variant.manifest.zero_dq_accum) {
      // (the memset stops before dq_accum: NaN there shows a read of an
      // element the variant did not write first)
      if (auto s = gpu::FillAsync32(driver_, reinterpret_cast<uint64_t>(l->params.dq_accum),
                                    eval::kPoisonF32, l->accum_bytes / 4, stream_);
          !s.ok())
        return fail(s);
    }
    if (auto s = RunBwd(c, *l); !s.ok()) return fail(s);
    if (auto s = stream_.Synchronize(); !s.ok()) return fail(s);
    if (c.variant.manifest.restores_dq_accum) {
      // it said it gives dq_accum back zeroed: every word, or the next
      // launch would add into its leftovers (tools_: made by UploadBwd)
      auto nz = tools_->CountNonZero32(
          {reinterpret_cast<uint64_t>(l->params.dq_accum), l->accum_bytes}, stream_);
      if (!nz.ok()) return fail(nz.status());
      r.detail = eval::JudgeDqAccumRestored(*nz, l->accum_bytes / 4);
      if (!r.detail.empty()) return r;  // pass stays false
    }
    const std::span<const int> cu_q(pr.cu_q.data(), size_t(d.ref_batch) + 1);
    const std::span<const int> cu_k(pr.cu_k.data(), size_t(d.ref_batch) + 1);
    const size_t D = pr.head_dim;
    struct Out {
      const char* name;
      const gpu::DeviceBuffer *got, *ref;
      size_t n;
      eval::Layout layout;
    };
    const Out outs[] = {
        {"dQ", &d.dq, &d.ref_dq, size_t(d.ref_rows) * pr.heads * D, {cu_q, pr.heads, pr.head_dim}},
        {"dK", &d.dk, &d.ref_dk, size_t(d.ref_keys) * pr.kv_heads * D,
         {cu_k, pr.kv_heads, pr.head_dim}},
        {"dV", &d.dv, &d.ref_dv, size_t(d.ref_keys) * pr.kv_heads * D,
         {cu_k, pr.kv_heads, pr.head_dim}},
    };
    r.pass = true;
    for (const Out& o : outs) {
      auto t = tools_->TallyBf16(*o.got, *o.ref, o.n, stream_);
      if (!t.ok()) return fail(t.status());
      r.outputs.push_back(eval::JudgeBf16(o.name, *t, o.n, o.layout));
      if (!r.outputs.back().pass && r.pass) {
        r.pass = false;
        r.detail = r.outputs.back().detail;
      }
    }
    return r;
  }

  absl::StatusOr<Timed> TimeBwd(const Candidate& c, const Problem& pr, BwdData& d, int reps) {
    auto l = PlanBwd(c, pr, d);
    if (!l.ok()) return l.status();
    return TimeLoop(
        reps, [] { return absl::OkStatus(); }, [&] { return RunBwd(c, *l); });
  }

  // One launch of the traced build (--trace-dir) with the trace buffer
  // set, after an L2 flush as in TimeLoop: the events to stem.bin (raw
  // little-endian u64 pairs, [CTA][role][event]), what reading them needs
  // to stem.json. NOT_FOUND when the candidate's module has no kf_trace
  // (its template has no trace points).
  absl::Status TraceBwd(const Candidate& c, const Problem& pr, BwdData& d,
                        const std::string& stem, const std::string& shape) {
    auto g = c.module->GetGlobal("kf_trace");
    if (!g.ok()) return g.status();
    auto l = PlanBwd(c, pr, d);
    if (!l.ok()) return l.status();
    constexpr uint64_t kCap = 4096, kRoles = 3;
    const uint64_t ctas = l->plan.grid[0];
    auto buf = gpu::DeviceBuffer::Allocate(driver_, ctas * kRoles * kCap * 16);
    if (!buf.ok()) return buf.status();
    BENCH_TRY(buf->Fill8(0, stream_));
    const uint64_t on[2] = {buf->address(), kCap}, off[2] = {0, 0};
    BENCH_TRY(gpu::CopyToDeviceAsync(driver_, g->address, on, sizeof on, stream_));
    BENCH_TRY(flush_.Fill32(12345u, stream_));
    BENCH_TRY(RunBwd(c, *l));
    BENCH_TRY(gpu::CopyToDeviceAsync(driver_, g->address, off, sizeof off, stream_));
    std::vector<uint64_t> host(buf->size() / 8);
    BENCH_TRY(buf->Download(std::span<uint64_t>(host), stream_));
    std::ofstream bin(stem + ".bin", std::ios::binary);
    bin.write(reinterpret_cast<const char*>(host.data()), host.size() * 8);
    if (!bin) return absl::InternalError("cannot write " + stem + ".bin");
    json meta = {{"shape", shape}, {"variant", c.label}, {"ctas", ctas}, {"roles", kRoles},
                 {"cap", kCap}, {"heads", pr.heads}, {"kv_heads", pr.kv_heads},
                 {"head_dim", pr.head_dim}, {"causal", pr.causal}, {"cu_q", pr.cu_q},
                 {"cu_k", pr.cu_k}, {"tiles", l->plan.tiles}, {"num_tiles", l->plan.num_tiles},
                 {"sm_count", info_.sm_count}};
    std::ofstream js(stem + ".json");
    js << meta.dump() << "\n";
    return js ? absl::OkStatus() : absl::InternalError("cannot write " + stem + ".json");
  }

  void set_trace(bool on) { trace_ = on; }
  const gpu::DeviceInfo& info() const { return info_; }

 private:
  bool trace_ = false;
  const gpu::Driver& driver_;
  gpu::DeviceInfo info_;
  gpu::Stream stream_;
  std::unique_ptr<reference::GpuReference> ref_;
  std::unique_ptr<eval::DeviceTools> tools_;  // backward's checks; made on first use
  gpu::Module helpers_;
  gpu::Kernel fill_, compare_, gather_lse_;
  gpu::DeviceBuffer flush_, counter_, stats_;
  std::map<std::string, Candidate> compiled_;  // by manifest + source
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

ShapeKey KeyOf(const Problem& pr, const std::string& arch, Op op = Op::kForward) {
  ShapeKey k;
  k.op = op;
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

bool HasOp(const TemplateInfo& t, const std::string& op) {
  return std::find(t.ops.begin(), t.ops.end(), op) != t.ops.end();
}

std::vector<std::string> SplitList(const std::string& list, char sep = ',') {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= list.size()) {
    size_t comma = std::min(list.find(sep, at), list.size());
    if (comma > at) out.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

// The --templates filter as it applies to one op: the listed templates of
// that op, or "" (no filter) when the list names none of them, so that
// `--op both --templates fwd_sm90` narrows the forward and leaves the
// backward its every template.
std::string FilterFor(const std::string& templates, const std::string& op) {
  std::string out;
  for (const auto& t : ListTemplates()) {
    const auto names = SplitList(templates);
    if (HasOp(t, op) && std::find(names.begin(), names.end(), t.name) != names.end()) {
      out += (out.empty() ? "" : ",") + t.name;
    }
  }
  return out;
}

// Every knob setting of a template: the product of its knobs' values, in
// the catalog's knob order (the last knob varies fastest).
std::vector<std::map<std::string, int>> AllSettings(const TemplateInfo& t) {
  std::vector<std::map<std::string, int>> out = {{}};
  for (const auto& k : t.knobs) {
    std::vector<std::map<std::string, int>> next;
    for (const auto& partial : out) {
      for (int v : k.values) {
        auto x = partial;
        x[k.name] = v;
        next.push_back(std::move(x));
      }
    }
    out = std::move(next);
  }
  return out;
}

// What `--variants all` made of each template's knob space for one shape:
// settings in the product, refused by the template's validate(), refused by
// the static check (kernels/check.h), kept. The kept ones are the space the
// builtin proposer searches for the bucket (agent/catalog_template_source.cc
// refuses the same two ways).
struct SpaceStats {
  struct PerTemplate {
    int product = 0, refused_validate = 0, refused_check = 0, kept = 0;
  };
  std::map<std::string, PerTemplate> templates;
};

json SpaceJson(const SpaceStats& s) {
  json j = json::object();
  int kept = 0;
  for (const auto& [name, t] : s.templates) {
    j["templates"][name] = {{"product", t.product}, {"refused_validate", t.refused_validate},
                            {"refused_check", t.refused_check}, {"kept", t.kept}};
    kept += t.kept;
  }
  j["kept"] = kept;
  return j;
}

// `--variants all` for one op: every setting of every template of that op
// serving the arch and head dim that the template's validate() accepts and
// the static check passes for the shape, templates in catalog order. Only
// knob settings: no "+grouped" manifest edits, which the search never makes.
std::vector<Candidate> EverySetting(const Problem& pr, const std::string& arch, const std::string& op,
                                    const std::string& templates, const ShapeKey& key,
                                    SpaceStats* space) {
  const auto names = SplitList(templates);
  std::vector<Candidate> out;
  for (const auto& t : ListTemplates()) {
    if (!HasOp(t, op)) continue;
    if (!names.empty() && std::find(names.begin(), names.end(), t.name) == names.end()) continue;
    if (std::find(t.archs.begin(), t.archs.end(), arch) == t.archs.end()) continue;
    if (std::find(t.head_dims.begin(), t.head_dims.end(), pr.head_dim) == t.head_dims.end()) continue;
    SpaceStats::PerTemplate counts;
    for (const auto& knobs : AllSettings(t)) {
      ++counts.product;
      absl::StatusOr<Variant> v = Instantiate(t.name, knobs, pr.head_dim);
      if (!v.ok()) {
        ++counts.refused_validate;
        continue;
      }
      if (!CheckVariant(v->source, v->manifest, arch, key).ok()) {
        ++counts.refused_check;
        continue;
      }
      ++counts.kept;
      Candidate c;
      c.label = Label(*v);
      c.variant = *std::move(v);
      out.push_back(std::move(c));
    }
    if (space != nullptr) space->templates[t.name] = counts;
  }
  return out;
}

// Candidates for a head dim: the mma sweep plus every other template's defaults.
// --settings "tmpl:K=V,K=V;tmpl:K=V": knob settings to time beside the mode's
// candidates, each over its template's defaults for the shape. "" when the
// text parses, else what is wrong (ParseArgs reports it before any GPU work).
struct Setting {
  std::string template_name;
  std::map<std::string, int> knobs;
};
std::string ParseSettings(const std::string& text, std::vector<Setting>* out) {
  for (const auto& entry : SplitList(text, ';')) {
    const size_t colon = entry.find(':');
    if (colon == std::string::npos) return fmt::format("--settings: {} has no 'template:'", entry);
    Setting st;
    st.template_name = entry.substr(0, colon);
    for (const auto& kv : SplitList(entry.substr(colon + 1))) {
      const size_t eq = kv.find('=');
      int v = 0;
      if (eq == std::string::npos ||
          std::from_chars(kv.data() + eq + 1, kv.data() + kv.size(), v).ec != std::errc()) {
        return fmt::format("--settings: {} is not KNOB=INTEGER", kv);
      }
      st.knobs[kv.substr(0, eq)] = v;
    }
    if (out) out->push_back(std::move(st));
  }
  return "";
}
std::vector<Setting> g_settings;  // --settings, parsed once by ParseArgs

// The --settings entries of template t, over `defaults`.
std::vector<std::map<std::string, int>> ExtraSettings(const std::string& t,
                                                      const std::map<std::string, int>& defaults) {
  std::vector<std::map<std::string, int>> out;
  for (const auto& st : g_settings) {
    if (st.template_name != t) continue;
    auto k = defaults;
    for (const auto& [name, v] : st.knobs) k[name] = v;
    out.push_back(std::move(k));
  }
  return out;
}

std::vector<Candidate> MakeCandidates(const Problem& pr, const std::string& arch,
                                      const std::string& mode, const std::string& templates_arg,
                                      SpaceStats* space = nullptr) {
  const std::string templates = FilterFor(templates_arg, "fwd");
  if (mode == "all") return EverySetting(pr, arch, "fwd", templates, KeyOf(pr, arch), space);
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
    if (!HasOp(t, "fwd")) continue;  // backward templates have their own candidates
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
    for (const auto& k : ExtraSettings(t.name, DefaultKnobs(t.name, key)))
      add(Instantiate(t.name, k, pr.head_dim));
  }
  return out;
}

// Knob settings of a template to try besides its defaults, from its knob
// space alone (so a new backward template needs no code here): the whole
// product when it is small, else each knob moved off its default in turn.
std::vector<std::map<std::string, int>> KnobSweep(const TemplateInfo& t,
                                                  const std::map<std::string, int>& defaults) {
  constexpr size_t kMaxProduct = 24;
  size_t product = 1;
  for (const auto& k : t.knobs) product *= std::max<size_t>(1, k.values.size());
  if (product <= kMaxProduct) return AllSettings(t);
  std::vector<std::map<std::string, int>> out;
  for (const auto& k : t.knobs) {
    for (int v : k.values) {
      auto x = defaults;
      if (x[k.name] == v) continue;
      x[k.name] = v;
      out.push_back(std::move(x));
    }
  }
  return out;
}

// Backward candidates: every catalog template whose ops include "bwd" and
// that serves the arch and head dim, at its default knobs (the served
// default first), and with `sweep` its KnobSweep. Settings the template
// refuses (e.g. too much shared memory) are skipped quietly.
std::vector<Candidate> MakeBwdCandidates(const Problem& pr, const std::string& arch,
                                         const std::string& mode, const std::string& templates_arg,
                                         SpaceStats* space = nullptr) {
  const std::string templates = FilterFor(templates_arg, "bwd");
  if (mode == "all") {
    return EverySetting(pr, arch, "bwd", templates, KeyOf(pr, arch, Op::kBackward), space);
  }
  const auto names = SplitList(templates);
  auto wanted = [&](const std::string& t) {
    return names.empty() || std::find(names.begin(), names.end(), t) != names.end();
  };
  std::vector<Candidate> out;
  const ShapeKey key = KeyOf(pr, arch, Op::kBackward);
  auto add = [&](absl::StatusOr<Variant> v, bool loud) {
    if (!v.ok()) {
      if (loud) std::fprintf(stderr, "  skip candidate: %s\n", std::string(v.status().message()).c_str());
      return;
    }
    if (!wanted(v->template_name)) return;
    if (auto s = CheckVariant(v->source, v->manifest, arch, key); !s.ok()) {
      if (loud) {
        std::fprintf(stderr, "  static check rejects %s: %s\n", Label(*v).c_str(),
                     std::string(s.message()).c_str());
      }
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
  if (auto v = DefaultVariant(key); v.ok()) add(std::move(v), true);
  for (const auto& t : ListTemplates()) {
    if (!HasOp(t, "bwd")) continue;
    if (std::find(t.archs.begin(), t.archs.end(), arch) == t.archs.end()) continue;
    if (std::find(t.head_dims.begin(), t.head_dims.end(), pr.head_dim) == t.head_dims.end()) continue;
    const auto defaults = DefaultKnobs(t.name, key);
    add(Instantiate(t.name, defaults, pr.head_dim), true);
    if (mode == "sweep") {
      for (const auto& k : KnobSweep(t, defaults)) {
        // (a deterministic setting only where the shape asks for one, as the
        // tuner has it; --settings still times one anywhere)
        absl::StatusOr<Variant> v = Instantiate(t.name, k, pr.head_dim);
        if (v.ok() && v->manifest.deterministic && !key.deterministic) continue;
        add(std::move(v), false);
      }
    }
    for (const auto& k : ExtraSettings(t.name, defaults)) add(Instantiate(t.name, k, pr.head_dim), true);
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

constexpr int kAllModeReps = 10;

// --cool-ms: the GPU idles (the previous work was synchronised by the check)
// so that the next candidate's timed runs start from the power budget the
// last one's did (notes/bwd.md v13: the 700 W cap lowered the clocks of the
// second variant of a long backward by up to 20%).
void CoolDown(int ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

constexpr const char* kUsage =
    "usage: kforge-bench-attn [--lengths F] [--out F] [--op fwd|bwd|both] [--only a,b]\n"
    "                         [--reps N] [--variants default|sweep|all] [--templates a,b]\n"
    "                         [--settings \"tmpl:K=V,K=V;...\"] [--jobs N] [--cool-ms N]\n"
    "                         [--trace-dir D] [--list-candidates [--arch sm_90a]] [--help]\n"
    "  --lengths F     shapes with their drawn lengths (lengths.py); default lengths.json\n"
    "  --out F         write every candidate's result as JSON (rows carry \"op\")\n"
    "  --op            fwd (default), bwd, or both (per shape: forward, then backward)\n"
    "  --only a,b      only these shapes\n"
    "  --reps N        timed runs per candidate, 1..10000 (default 20, 10 with --variants all);\n"
    "                  median and quartiles reported\n"
    "  --cool-ms N     idle N ms (0..60000) before each candidate's timed runs, so that each\n"
    "                  starts from the same power budget: a long kernel run back to back\n"
    "                  reaches the board's power cap, and a candidate timed right after\n"
    "                  another then runs at lower clocks (default 0)\n"
    "  --variants      sweep (default): knob sweeps; default: each template's default knobs;\n"
    "                  all: every knob setting of every template serving the shape that the\n"
    "                  template accepts and the static check passes (the builtin proposer's\n"
    "                  whole space), each with its outcome, for search-efficiency tables\n"
    "  --jobs N        parallel NVRTC compiles, 1..256 (default: the CPU count)\n"
    "  --templates a,b only these catalog templates; applied per op, and an op none of whose\n"
    "                  templates is named keeps them all (--op both --templates fwd_sm90\n"
    "                  narrows the forward only)\n"
    "  --settings S    also time these knob settings (each over its template's defaults for\n"
    "                  the shape), e.g. \"bwd_sm90:ORDER=0;fwd_sm90:BLOCK_N=64,STAGES=3\"\n"
    "                  (with --variants all every setting is timed already)\n"
    "  --trace-dir D   development: compile backward candidates with KF_TRACE=1 (the\n"
    "                  templates that have it stamp the time at points of each tile's life)\n"
    "                  and, after timing each, write one traced launch to D/<shape>.<n>.bin\n"
    "                  with a .json beside it (tile list, lengths); timings are the traced\n"
    "                  build's. kernels/dev/trace_bwd.py reads them\n"
    "  --list-candidates  print each shape's candidates and exit (no GPU; --arch picks the\n"
    "                  target, default sm_90a); with --out, also as JSON (the run's layout,\n"
    "                  without results)\n";

struct Options {
  std::string lengths = "lengths.json", out, only, mode = "sweep", templates, op = "fwd";
  std::string trace_dir;  // --trace-dir: traced backward builds, one trace per candidate
  std::string arch = "sm_90a";  // --list-candidates only; a GPU run uses the GPU's
  int reps = 0;  // 0: 20, or kAllModeReps with --variants all
  int cool_ms = 0;  // idle before each candidate's timed runs
  int jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool list = false, help = false;
  bool fwd() const { return op == "fwd" || op == "both"; }
  bool bwd() const { return op == "bwd" || op == "both"; }
};

// "" when the arguments are usable, else why not (checked before any GPU
// work, so a typo costs nothing on the device).
std::string ParseArgs(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      o.help = true;
      continue;
    }
    if (a == "--list-candidates") {
      o.list = true;
      continue;
    }
    static const std::set<std::string> kValued = {"--lengths", "--out", "--only", "--reps",
                                                  "--variants", "--templates", "--op", "--arch",
                                                  "--jobs", "--settings", "--cool-ms",
                                                  "--trace-dir"};
    if (!kValued.count(a)) return fmt::format("unknown argument {}", a);
    if (i + 1 >= argc) return fmt::format("{} needs a value", a);
    const std::string v = argv[++i];
    if (a == "--lengths") o.lengths = v;
    else if (a == "--out") o.out = v;
    else if (a == "--only") o.only = v;
    else if (a == "--arch") o.arch = v;
    else if (a == "--templates") o.templates = v;
    else if (a == "--trace-dir") o.trace_dir = v;
    else if (a == "--settings") {
      if (auto why = ParseSettings(v, &g_settings); !why.empty()) return why;
    }
    else if (a == "--op") {
      if (v != "fwd" && v != "bwd" && v != "both") return "--op must be fwd, bwd or both, not " + v;
      o.op = v;
    } else if (a == "--variants") {
      if (v != "default" && v != "sweep" && v != "all")
        return "--variants must be default, sweep or all, not " + v;
      o.mode = v;
    } else if (a == "--reps" || a == "--jobs") {
      int n = 0;
      auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      const int most = a == "--reps" ? 10000 : 256;
      if (ec != std::errc() || end != v.data() + v.size() || n < 1 || n > most)
        return fmt::format("{} must be an integer in 1..{}, not {}", a, most, v);
      (a == "--reps" ? o.reps : o.jobs) = n;
    } else if (a == "--cool-ms") {
      int n = -1;
      auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (ec != std::errc() || end != v.data() + v.size() || n < 0 || n > 60000)
        return fmt::format("--cool-ms must be an integer in 0..60000, not {}", v);
      o.cool_ms = n;
    }
  }
  // Hundreds of settings a shape: fewer runs each keep the whole space inside
  // one device call; the quartiles in the output say how noisy that is.
  if (o.reps == 0) o.reps = o.mode == "all" ? kAllModeReps : 20;
  std::vector<std::string> known;
  for (const auto& t : ListTemplates()) known.push_back(t.name);
  for (const auto& t : SplitList(o.templates)) {
    if (std::find(known.begin(), known.end(), t) == known.end()) {
      return fmt::format("--templates: {} is not in this build's catalog (it has {})", t,
                         fmt::join(known, ", "));
    }
  }
  return "";
}

using Verdicts = std::map<int, std::map<std::string, std::string>>;  // d -> label -> "" ok / reason

struct Row {
  std::string op, shape, best;
  double us = 0, tflops = 0;
};

json VariantJson(const Candidate& c) {
  return {{"variant", c.label}, {"template", c.variant.template_name},
          {"knobs", c.variant.knobs}, {"manifest", json::parse(c.variant.manifest_json)},
          {"regs", c.regs}, {"local_bytes", c.local_bytes},
          {"spill_stores", c.res.spill_stores_bytes}, {"compile_ms", c.compile_ms}};
}

// The evaluator's outcome names (core/outcome.h) for what happened to a
// candidate here, so that a table of results reads as a worker's would: a
// module that does not load is a compile error there too; a launch or
// timing failure is a crash; a failed check (benchmark prefix or hostile
// batches) is a wrong result.
void SetOutcome(json& jv, const Candidate& c, bool check_pass, const std::string& launch_error,
                bool timed) {
  std::string outcome;
  if (!c.error.empty()) outcome = "compile_error";
  else if (!launch_error.empty() || !timed) outcome = "crashed";
  else if (!check_pass || !c.hostile_ok) outcome = "wrong";
  else outcome = "verified";
  jv["outcome"] = outcome;
}

void SetTimes(json& jv, const Timed& t, double flops) {
  jv["us"] = t.median;
  jv["us_q1"] = t.q1;
  jv["us_q3"] = t.q3;
  jv["us_runs"] = t.runs;
  jv["tflops"] = flops / (t.median * 1e-6) / 1e12;
}

// Calls `save` after every `every` variants of a shape, so that a run cut
// short by its cap keeps what it measured of a long shape too.
using Progress = std::function<void(const json& partial_shape)>;

// One shape's forward candidates: checked, timed. Fills `best`. The hostile
// batches are uploaded (with their reference answers) once per head dim and
// shared by every candidate; each check poisons the outputs first, so a
// candidate never sees another's results.
json BenchForward(Bench& bench, const Problem& pr, const Options& o, Verdicts& hostile_verdict,
                  std::map<int, std::vector<std::pair<Problem, absl::StatusOr<Bench::Data>>>>& hostile_data,
                  Row& best, const Progress& progress) {
  const std::string& name = pr.name;
  const std::string arch = bench.info().arch;
  SpaceStats space;
  std::vector<Candidate> cands = MakeCandidates(pr, arch, o.mode, o.templates, &space);
  bench.Prepare(cands, o.jobs);

  // Hostile correctness batches, once per (head dim, candidate).
  auto& verdicts = hostile_verdict[pr.head_dim];
  auto& hostile = hostile_data[pr.head_dim];
  for (auto& c : cands) {
    if (!c.error.empty()) continue;
    auto it = verdicts.find(c.label);
    if (it == verdicts.end()) {
      if (hostile.empty()) {
        for (Problem& hp : HostileProblems(pr.head_dim)) {
          auto d = bench.Upload(hp, 1 << 20);
          hostile.emplace_back(std::move(hp), std::move(d));
        }
      }
      std::string why;
      for (auto& [hp, d] : hostile) {
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

  best = {"fwd", name, "", 0, 0};
  auto data = bench.Upload(pr, 65536);
  if (!data.ok()) {
    std::printf("  upload failed: %s\n", std::string(data.status().message()).c_str());
    return nullptr;
  }
  json jshape = {{"shape", name}, {"op", "fwd"}, {"head_dim", pr.head_dim},
                 {"tokens_q", pr.cu_q.back()}, {"tokens_k", pr.cu_k.back()},
                 {"fwd_gflop", pr.flops / 1e9}, {"checked_rows", data->ref_rows},
                 {"mode", o.mode}, {"reps", o.reps}, {"variants", json::array()}};
  if (o.mode == "all") jshape["space"] = SpaceJson(space);
  for (size_t i = 0; i < cands.size(); ++i) {
    Candidate& c = cands[i];
    json jv = VariantJson(c);
    if (!c.error.empty()) {
      jv["error"] = c.error;
      SetOutcome(jv, c, false, "", false);
      std::printf("  %-70s ERROR %s\n", c.label.c_str(), c.error.substr(0, 300).c_str());
      jshape["variants"].push_back(jv);
      continue;
    }
    auto chk = bench.Check(c, pr, *data);
    jv["check"] = {{"pass", chk.pass}, {"max_abs", chk.max_abs}, {"lse_abs", chk.lse_abs},
                   {"nonfinite", chk.nonfinite}, {"lse_bad", chk.lse_bad}, {"error", chk.error}};
    jv["hostile_ok"] = c.hostile_ok;
    if (!c.hostile_ok) jv["hostile_detail"] = c.hostile_detail;
    if (chk.error.empty()) CoolDown(o.cool_ms);
    auto us = chk.error.empty() ? bench.Time(c, pr, *data, o.reps)
                                : absl::StatusOr<Timed>(absl::InternalError(chk.error));
    const bool verified = chk.pass && c.hostile_ok;
    SetOutcome(jv, c, chk.pass, chk.error, us.ok());
    if (us.ok()) {
      SetTimes(jv, *us, pr.flops);
      const double tf = jv["tflops"];
      std::printf("  %-70s %s %9.1f us %7.1f TFLOP/s  regs=%d err=%.2g lse=%.2g%s\n",
                  c.label.c_str(), verified ? "OK " : "BAD", us->median, tf, c.regs, chk.max_abs,
                  chk.lse_abs, c.hostile_ok ? "" : ("  hostile: " + c.hostile_detail).c_str());
      if (verified && (best.us == 0 || us->median < best.us)) {
        best = {"fwd", name, c.label, us->median, tf};
      }
    } else {
      jv["error"] = std::string(us.status().message());
      std::printf("  %-70s FAILED %s\n", c.label.c_str(),
                  std::string(us.status().message()).c_str());
    }
    std::fflush(stdout);
    jshape["variants"].push_back(jv);
    if (progress && (i + 1) % 32 == 0) progress(jshape);
  }
  jshape["best"] = {{"variant", best.best}, {"us", best.us}, {"tflops", best.tflops}};
  return jshape;
}

json CheckJson(const Bench::BwdCheck& chk) {
  json j = {{"pass", chk.pass}, {"error", chk.error}, {"detail", chk.detail}};
  for (const auto& oc : chk.outputs) {
    j[oc.output] = {{"pass", oc.pass}, {"rel_l2", oc.rel_l2}, {"max_abs", oc.max_abs},
                    {"bound_max_abs", oc.bound_max_abs}, {"unwritten", oc.unwritten},
                    {"nonfinite", oc.nonfinite}};
  }
  return j;
}

// One shape's backward candidates: checked (hostile batches, then the
// benchmark batch's prefix), timed. Fills `best`.
json BenchBackward(Bench& bench, const Problem& pr, const Options& o, Verdicts& hostile_verdict,
                   Row& best, const Progress& progress) {
  const std::string& name = pr.name;
  const std::string arch = bench.info().arch;
  const double flops = 2.5 * pr.flops;
  best = {"bwd", name, "", 0, 0};
  SpaceStats space;
  std::vector<Candidate> cands = MakeBwdCandidates(pr, arch, o.mode, o.templates, &space);
  if (cands.empty()) std::printf("  no backward candidate for this shape on %s\n", arch.c_str());
  bench.Prepare(cands, o.jobs);

  // Hostile batches (made once here, with their reference gradients),
  // checked once per (head dim, candidate).
  auto& verdicts = hostile_verdict[pr.head_dim];
  std::vector<Problem> hostile;
  std::vector<absl::StatusOr<Bench::BwdData>> hostile_data;
  for (auto& c : cands) {
    if (!c.error.empty()) continue;
    auto it = verdicts.find(c.label);
    if (it == verdicts.end()) {
      if (hostile.empty()) {
        hostile = HostileProblems(pr.head_dim);
        for (const Problem& hp : hostile) hostile_data.push_back(bench.UploadBwd(hp, 1 << 20));
      }
      std::string why;
      for (size_t i = 0; i < hostile.size(); ++i) {
        const Problem& hp = hostile[i];
        auto& d = hostile_data[i];
        if (!d.ok()) {
          why = fmt::format("{}: {}", hp.name, std::string(d.status().message()));
          break;
        }
        auto r = bench.CheckBwd(c, hp, *d);
        if (!r.pass) {
          why = fmt::format("{}: {}", hp.name, r.error.empty() ? r.detail : r.error);
          break;
        }
      }
      it = verdicts.emplace(c.label, why).first;
    }
    c.hostile_ok = it->second.empty();
    c.hostile_detail = it->second;
  }

  auto data = bench.UploadBwd(pr, 65536);
  if (!data.ok()) {
    std::printf("  upload failed: %s\n", std::string(data.status().message()).c_str());
    return nullptr;
  }
  json jshape = {{"shape", name}, {"op", "bwd"}, {"tokens_q", pr.cu_q.back()},
                 {"tokens_k", pr.cu_k.back()}, {"fwd_gflop", pr.flops / 1e9},
                 {"bwd_gflop", flops / 1e9}, {"checked_rows", data->ref_rows},
                 {"head_dim", pr.head_dim}, {"mode", o.mode}, {"reps", o.reps},
                 {"variants", json::array()}};
  if (o.mode == "all") jshape["space"] = SpaceJson(space);
  if (auto v = DefaultVariant(KeyOf(pr, arch, Op::kBackward)); v.ok())
    jshape["default_variant"] = Label(*v);
  for (size_t i = 0; i < cands.size(); ++i) {
    Candidate& c = cands[i];
    json jv = VariantJson(c);
    if (!c.error.empty()) {
      jv["error"] = c.error;
      SetOutcome(jv, c, false, "", false);
      std::printf("  %-70s ERROR %s\n", c.label.c_str(), c.error.substr(0, 300).c_str());
      jshape["variants"].push_back(jv);
      continue;
    }
    auto chk = bench.CheckBwd(c, pr, *data);
    jv["check"] = CheckJson(chk);
    jv["hostile_ok"] = c.hostile_ok;
    if (!c.hostile_ok) jv["hostile_detail"] = c.hostile_detail;
    if (chk.error.empty()) CoolDown(o.cool_ms);
    auto us = chk.error.empty() ? bench.TimeBwd(c, pr, *data, o.reps)
                                : absl::StatusOr<Timed>(absl::InternalError(chk.error));
    const bool verified = chk.pass && c.hostile_ok;
    SetOutcome(jv, c, chk.pass, chk.error, us.ok());
    if (us.ok()) {
      SetTimes(jv, *us, flops);
      const double tf = jv["tflops"];
      std::string errs;
      for (const auto& oc : chk.outputs) errs += fmt::format(" {}={:.2g}", oc.output, oc.rel_l2);
      std::printf("  %-70s %s %9.1f us %7.1f TFLOP/s  regs=%d rel_l2%s%s%s\n", c.label.c_str(),
                  verified ? "OK " : "BAD", us->median, tf, c.regs, errs.c_str(),
                  chk.pass ? "" : ("  " + chk.detail).c_str(),
                  c.hostile_ok ? "" : ("  hostile: " + c.hostile_detail).c_str());
      if (verified && (best.us == 0 || us->median < best.us)) {
        best = {"bwd", name, c.label, us->median, tf};
      }
    } else {
      jv["error"] = std::string(us.status().message());
      std::printf("  %-70s FAILED %s\n", c.label.c_str(),
                  std::string(us.status().message()).c_str());
    }
    if (!o.trace_dir.empty() && us.ok()) {
      const std::string stem = fmt::format("{}/{}.{}", o.trace_dir, name, i);
      const absl::Status t = bench.TraceBwd(c, pr, *data, stem, name);
      std::printf("    trace %s: %s\n", stem.c_str(),
                  t.ok() ? "written" : std::string(t.message()).c_str());
    }
    std::fflush(stdout);
    jshape["variants"].push_back(jv);
    if (progress && (i + 1) % 32 == 0) progress(jshape);
  }
  jshape["best"] = {{"variant", best.best}, {"us", best.us}, {"tflops", best.tflops}};
  return jshape;
}

int Main(int argc, char** argv) {
  Options o;
  if (const std::string why = ParseArgs(argc, argv, o); !why.empty()) {
    std::fprintf(stderr, "kforge-bench-attn: %s (see --help)\n", why.c_str());
    return 2;
  }
  if (o.help) {
    std::printf("%s", kUsage);
    return 0;
  }
  std::ifstream in(o.lengths);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", o.lengths.c_str());
    return 1;
  }
  json shapes = json::parse(in, nullptr, false);
  if (shapes.is_discarded() || !shapes.is_array()) {
    std::fprintf(stderr, "%s is not a JSON array of shapes\n", o.lengths.c_str());
    return 1;
  }
  std::vector<Problem> problems;
  for (const auto& s : shapes) {
    try {
      const std::string name = s.at("name");
      if (!o.only.empty() && ("," + o.only + ",").find("," + name + ",") == std::string::npos)
        continue;
      // KVH: key/value heads (grouped-query attention), H when absent.
      const int heads = s.at("H");
      problems.push_back(MakeProblem(name, heads, s.value("KVH", heads), s.at("D"), s.at("causal"),
                                     s.at("lq").get<std::vector<int>>(),
                                     s.at("lk").get<std::vector<int>>()));
    } catch (const json::exception& e) {
      std::fprintf(stderr, "%s: a shape lacks name, H, D, causal, lq or lk: %s\n",
                   o.lengths.c_str(), e.what());
      return 1;
    }
  }

  if (o.list) {  // what would run, without a GPU
    json listed = json::array();
    for (const Problem& pr : problems) {
      for (const std::string op : {"fwd", "bwd"}) {
        if ((op == "fwd" && !o.fwd()) || (op == "bwd" && !o.bwd())) continue;
        SpaceStats space;
        const auto cands = op == "fwd" ? MakeCandidates(pr, o.arch, o.mode, o.templates, &space)
                                       : MakeBwdCandidates(pr, o.arch, o.mode, o.templates, &space);
        std::printf("%s %s: %zu candidates\n", op.c_str(), pr.name.c_str(), cands.size());
        json jshape = {{"shape", pr.name}, {"op", op}, {"head_dim", pr.head_dim},
                       {"mode", o.mode}, {"variants", json::array()}};
        if (o.mode == "all") jshape["space"] = SpaceJson(space);
        for (const auto& c : cands) {
          std::printf("  %s\n", c.label.c_str());
          jshape["variants"].push_back(VariantJson(c));
        }
        listed.push_back(std::move(jshape));
      }
    }
    if (!o.out.empty()) {
      std::ofstream(o.out) << json{{"arch", o.arch}, {"op", o.op}, {"shapes", listed}}.dump(1);
    }
    return 0;
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
  bench.set_trace(!o.trace_dir.empty());
  if (!o.trace_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.trace_dir, ec);
    if (ec) {
      std::fprintf(stderr, "--trace-dir %s: %s\n", o.trace_dir.c_str(), ec.message().c_str());
      return 1;
    }
  }
  if (auto s = bench.Init(); !s.ok()) {
    std::fprintf(stderr, "init: %s\n", std::string(s.message()).c_str());
    return 1;
  }

  json results = json::array();
  std::vector<Row> rows;
  Verdicts fwd_verdicts, bwd_verdicts;
  std::map<int, std::vector<std::pair<Problem, absl::StatusOr<Bench::Data>>>> fwd_hostile;
  // Rewritten after every (shape, op): run.sh caps this process, and a run
  // cut short should still leave what it measured for report.py.
  // `partial`: the shape being measured, so far (--variants all saves every
  // 32 variants; a shape of several hundred takes a while).
  auto save = [&](const json& partial = nullptr) {
    if (o.out.empty()) return;
    json shapes = results;
    if (!partial.is_null()) shapes.push_back(partial);
    const std::string tmp = o.out + ".tmp";
    std::ofstream(tmp) << json{{"gpu", info->name}, {"arch", info->arch}, {"op", o.op},
                               {"shapes", shapes}}.dump(1);
    std::rename(tmp.c_str(), o.out.c_str());
  };
  const Progress progress = [&](const json& partial) { save(partial); };
  for (const Problem& pr : problems) {
    std::printf("\n== %s: B=%zu H=%d D=%d causal=%d tokens_q=%d max_q=%d GFLOP=%.1f\n",
                pr.name.c_str(), pr.cu_q.size() - 1, pr.heads, pr.head_dim, pr.causal,
                pr.cu_q.back(), pr.max_q(), pr.flops / 1e9);
    std::fflush(stdout);
    if (o.fwd()) {
      if (o.bwd()) std::printf("-- fwd\n");
      Row best;
      json j = BenchForward(bench, pr, o, fwd_verdicts, fwd_hostile, best, progress);
      if (!j.is_null()) {
        results.push_back(j);
        rows.push_back(best);
        save();
      }
    }
    if (o.bwd()) {
      std::printf("-- bwd (GFLOP=%.1f)\n", 2.5 * pr.flops / 1e9);
      std::fflush(stdout);
      Row best;
      json j = BenchBackward(bench, pr, o, bwd_verdicts, best, progress);
      if (!j.is_null()) {
        results.push_back(j);
        rows.push_back(best);
        save();
      }
    }
  }
  std::printf("\nop | shape | best verified variant | us | TFLOP/s\n");
  for (const auto& r : rows) {
    std::printf("%s | %s | %s | %.1f | %.1f\n", r.op.c_str(), r.shape.c_str(), r.best.c_str(),
                r.us, r.tflops);
  }
  save();
  return 0;
}

}  // namespace
}  // namespace kforge::bench

int main(int argc, char** argv) { return kforge::bench::Main(argc, argv); }

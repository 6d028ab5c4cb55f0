#include "worker/eval/eval.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include "fmt/format.h"
#include "kernels/schedule.h"
#include "worker/eval/batches.h"
#include "worker/eval/compare.h"
#include "worker/eval/device_tools.h"
#include "worker/reference/gpu_reference.h"

namespace kforge::eval {
namespace {

using reference::JaggedShape;

#define KF_RETURN_IF_ERROR(expr)               \
  do {                                         \
    if (absl::Status kf_s = (expr); !kf_s.ok()) return kf_s; \
  } while (0)

constexpr float kLog2e = 1.4426950408889634f;

// Device copies of one problem's inputs: `pristine` for the reference and
// for restoring, `candidate` for the candidate to read (and maybe scribble on).
struct InputSet {
  gpu::DeviceBuffer q, k, v, cu_q, cu_k, dout, o, lse;

  // Every buffer, in one order, for copying a set buffer by buffer.
  std::array<gpu::DeviceBuffer*, 8> Buffers() { return {&q, &k, &v, &cu_q, &cu_k, &dout, &o, &lse}; }
  std::array<const gpu::DeviceBuffer*, 8> Buffers() const {
    return {&q, &k, &v, &cu_q, &cu_k, &dout, &o, &lse};
  }
};

// One batch with its inputs and the reference's answers, all on the device:
// a 500k-token batch is gigabytes, too slow to move through the host.
struct Problem {
  JaggedShape shape;
  bool backward = false;
  std::string label;  // "check 1 (B=5 ...)" or "timing batch (...)"
  InputSet pristine, candidate;
  // The reference's answers (fp32): O and LSE forward; dQ, dK, dV backward.
  gpu::DeviceBuffer ref_o, ref_lse, ref_dq, ref_dk, ref_dv;
  // Their digest, taken before any candidate ran: a candidate that writes
  // outside its outputs must not be able to grade itself.
  uint64_t ref_fingerprint = 0;
};

// What one candidate writes (poisoned before every launch) and its scratch.
struct OutputSet {
  gpu::DeviceBuffer o, lse, dq, dk, dv, delta, dq_accum;
  gpu::DeviceBuffer tiles, tile_counter, workspace;
  LaunchPlan plan;
};

struct LoadedCandidate {
  gpu::Module module;
  gpu::Kernel kernel;
  Manifest manifest;
};

template <typename T>
absl::StatusOr<gpu::DeviceBuffer> UploadNew(const gpu::Driver& driver, const std::vector<T>& host,
                                            const gpu::Stream& stream) {
  absl::StatusOr<gpu::DeviceBuffer> buf = gpu::DeviceBuffer::Allocate(driver, host.size() * sizeof(T));
  if (!buf.ok()) return buf.status();
  KF_RETURN_IF_ERROR(buf->CopyFromHost(host.data(), host.size() * sizeof(T), stream));
  return buf;
}

template <typename T>
absl::Status DownloadInto(const gpu::DeviceBuffer& buf, std::vector<T>& host, size_t n,
                          const gpu::Stream& stream) {
  host.resize(n);
  return buf.Download(std::span<T>(host), stream);
}

KfAttnParams BaseParams(const JaggedShape& s) {
  KfAttnParams p{};
  p.batch = s.batch();
  p.heads = s.heads;
  p.kv_heads = s.kv_heads;
  p.head_dim = s.head_dim;
  p.max_seqlen_q = s.max_q();
  p.max_seqlen_k = s.max_k();
  p.total_q = s.total_q();
  p.total_k = s.total_k();
  p.softmax_scale = s.scale();
  p.softmax_scale_log2 = s.scale() * kLog2e;
  p.causal = s.causal ? 1 : 0;
  return p;
}

void SetInputs(KfAttnParams& p, const InputSet& in, bool backward) {
  p.q = in.q.get();
  p.k = in.k.get();
  p.v = in.v.get();
  p.cu_seqlens_q = in.cu_q.as<int>();
  p.cu_seqlens_k = in.cu_k.as<int>();
  if (backward) {
    p.o = in.o.get();
    p.lse = in.lse.as<float>();
    p.dout = in.dout.get();
  }
}

EvalResult MakeResult(Outcome o, std::string message) {
  EvalResult r;
  r.outcome = o;
  r.message = std::move(message);
  r.reference_version = ReferenceVersion();
  return r;
}

// The checks of one run, folded into the result's worst output.
struct Verdict {
  bool pass = true;
  std::vector<OutputCheck> checks;
};

void Fold(const Verdict& v, const std::string& label, ErrorMetrics& errors, bool& failed,
          std::string& message) {
  for (const OutputCheck& c : v.checks) {
    const bool first_failure = !c.pass && !failed;
    const bool worse = c.rel_l2 > errors.rel_l2 || std::isnan(c.rel_l2);
    if (first_failure || (!failed && worse)) {
      errors.worst_output = c.output;
      errors.rel_l2 = c.rel_l2;
      errors.max_abs = c.max_abs;
      errors.detail = c.pass ? "" : fmt::format("{}: {}", label, c.detail);
    }
    if (first_failure) {
      failed = true;
      message = fmt::format("wrong: {}", errors.detail);
    }
  }
}

using Clock = std::chrono::steady_clock;

// "prepare 2.1 s, run 0.4 s": where an evaluation's wall time went (inputs
// and reference answers, then the candidate's checks and timing), for the
// tuning reports.
std::string Phases(Clock::time_point began, Clock::time_point prepared, Clock::time_point done) {
  auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  return fmt::format("prepare {:.2f} s, run {:.2f} s", seconds(prepared - began),
                     seconds(done - prepared));
}

}  // namespace

std::string ReferenceVersion() {
  return fmt::format("{}+{}", reference::kReferenceVersion, kTolerancePolicyVersion);
}

Timing Summarize(std::vector<double> s) {
  Timing t;
  if (s.empty()) return t;
  std::sort(s.begin(), s.end());
  auto at = [&](double q) {
    double pos = q * double(s.size() - 1);
    size_t lo = size_t(std::floor(pos)), hi = size_t(std::ceil(pos));
    return s[lo] + (s[hi] - s[lo]) * (pos - double(lo));
  };
  t.samples = int(s.size());
  t.min_us = s.front();
  t.max_us = s.back();
  t.median_us = at(0.5);
  t.p25_us = at(0.25);
  t.p75_us = at(0.75);
  return t;
}

struct Evaluator::Impl {
  const gpu::Driver* driver = nullptr;
  std::unique_ptr<gpu::Context> context;
  gpu::DeviceInfo info;
  std::unique_ptr<reference::GpuReference> ref;
  std::unique_ptr<DeviceTools> tools;
  gpu::Stream stream;
  gpu::DeviceBuffer l2_flush;
  uint32_t flush_value = 0;

  // ------------------------------------------------------------ problems ---

  // A device copy of `src` (same sizes).
  absl::StatusOr<InputSet> Clone(const InputSet& src) {
    InputSet dst;
    const auto from = src.Buffers();
    const auto to = dst.Buffers();
    for (size_t i = 0; i < from.size(); ++i) {
      if (from[i]->size() == 0) continue;
      KF_RETURN_IF_ERROR(AllocInto(*to[i], from[i]->size()));
      KF_RETURN_IF_ERROR(to[i]->CopyFromDevice(*from[i], from[i]->size(), stream));
    }
    return dst;
  }

  // Copies the pristine inputs over the candidate's.
  absl::Status Restore(Problem& p) {
    const auto from = std::as_const(p.pristine).Buffers();
    const auto to = p.candidate.Buffers();
    for (size_t i = 0; i < from.size(); ++i) {
      if (from[i]->size() > 0) {
        KF_RETURN_IF_ERROR(to[i]->CopyFromDevice(*from[i], from[i]->size(), stream));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<gpu::DeviceBuffer> Alloc(size_t bytes) {
    return gpu::DeviceBuffer::Allocate(*driver, bytes);
  }

  absl::Status AllocInto(gpu::DeviceBuffer& b, size_t bytes) {
    absl::StatusOr<gpu::DeviceBuffer> x = Alloc(bytes);
    if (!x.ok()) return x.status();
    b = *std::move(x);
    return absl::OkStatus();
  }

  // `n` fresh random bf16 values (RandomBf16's, generated on the device).
  absl::Status RandomInto(gpu::DeviceBuffer& b, size_t n, std::mt19937_64& rng) {
    KF_RETURN_IF_ERROR(AllocInto(b, n * 2));
    return tools->FillRandomBf16(b, n, rng(), stream);
  }

  absl::StatusOr<uint64_t> ReferenceFingerprint(const Problem& p) {
    uint64_t digest = 0;
    int index = 0;
    for (const gpu::DeviceBuffer* b : {&p.ref_o, &p.ref_lse, &p.ref_dq, &p.ref_dk, &p.ref_dv}) {
      ++index;
      if (b->size() == 0) continue;
      absl::StatusOr<uint64_t> f = tools->Fingerprint(*b, stream);
      if (!f.ok()) return f.status();
      digest ^= *f * (0x9e3779b97f4a7c15ull + 2 * uint64_t(index));
    }
    return digest;
  }

  // Fresh inputs, the reference's answers and the candidate's copy of the
  // inputs, all on the device. With `ref_time`, the reference launch the
  // candidate will be compared with (forward or backward) is timed.
  absl::StatusOr<Problem> MakeProblem(JaggedShape shape, bool backward, std::mt19937_64& rng,
                                      std::string label, std::optional<Timing>* ref_time) {
    Problem p;
    p.shape = std::move(shape);
    p.backward = backward;
    p.label = fmt::format("{} ({})", label, p.shape.Describe());
    const JaggedShape& s = p.shape;
    // Same draws in the same order as the host-side RandomBf16 calls had.
    KF_RETURN_IF_ERROR(RandomInto(p.pristine.q, s.q_elems(), rng));
    KF_RETURN_IF_ERROR(RandomInto(p.pristine.k, s.k_elems(), rng));
    KF_RETURN_IF_ERROR(RandomInto(p.pristine.v, s.k_elems(), rng));
    if (backward) KF_RETURN_IF_ERROR(RandomInto(p.pristine.dout, s.q_elems(), rng));
    for (auto [host, dev] : {std::pair{&s.cu_q, &p.pristine.cu_q}, std::pair{&s.cu_k, &p.pristine.cu_k}}) {
      absl::StatusOr<gpu::DeviceBuffer> b = UploadNew(*driver, *host, stream);
      if (!b.ok()) return b.status();
      *dev = *std::move(b);
    }

    absl::StatusOr<gpu::Event> start = gpu::Event::Create(*driver);
    absl::StatusOr<gpu::Event> end = gpu::Event::Create(*driver);
    if (!start.ok()) return start.status();
    if (!end.ok()) return end.status();

    // Forward reference (backward needs its O and LSE as inputs).
    KF_RETURN_IF_ERROR(AllocInto(p.ref_o, s.q_elems() * sizeof(float)));
    KF_RETURN_IF_ERROR(AllocInto(p.ref_lse, s.lse_elems() * sizeof(float)));
    KfAttnParams params = BaseParams(s);
    SetInputs(params, p.pristine, false);
    params.o = p.ref_o.get();
    params.lse = p.ref_lse.as<float>();
    if (ref_time != nullptr && !backward) KF_RETURN_IF_ERROR(start->Record(stream));
    KF_RETURN_IF_ERROR(ref->Forward(params, stream));
    if (ref_time != nullptr && !backward) KF_RETURN_IF_ERROR(end->Record(stream));
    if (backward) {
      KF_RETURN_IF_ERROR(AllocInto(p.pristine.o, s.q_elems() * 2));
      KF_RETURN_IF_ERROR(tools->ToBf16(p.pristine.o, p.ref_o, s.q_elems(), stream));
      p.pristine.lse = std::move(p.ref_lse);
      p.ref_o = gpu::DeviceBuffer{};
      gpu::DeviceBuffer delta;
      KF_RETURN_IF_ERROR(AllocInto(delta, s.lse_elems() * sizeof(float)));
      KF_RETURN_IF_ERROR(AllocInto(p.ref_dq, s.q_elems() * sizeof(float)));
      KF_RETURN_IF_ERROR(AllocInto(p.ref_dk, s.k_elems() * sizeof(float)));
      KF_RETURN_IF_ERROR(AllocInto(p.ref_dv, s.k_elems() * sizeof(float)));
      KfAttnParams bp = BaseParams(s);
      SetInputs(bp, p.pristine, true);
      bp.delta = delta.as<float>();
      bp.dq = p.ref_dq.get();
      bp.dk = p.ref_dk.get();
      bp.dv = p.ref_dv.get();
      if (ref_time != nullptr) KF_RETURN_IF_ERROR(start->Record(stream));
      KF_RETURN_IF_ERROR(ref->Backward(bp, stream));
      if (ref_time != nullptr) KF_RETURN_IF_ERROR(end->Record(stream));
      KF_RETURN_IF_ERROR(stream.Synchronize());  // before `delta` is freed
    }
    absl::StatusOr<InputSet> copy = Clone(p.pristine);
    if (!copy.ok()) return copy.status();
    p.candidate = *std::move(copy);
    absl::StatusOr<uint64_t> digest = ReferenceFingerprint(p);  // synchronises
    if (!digest.ok()) return digest.status();
    p.ref_fingerprint = *digest;
    if (ref_time != nullptr) {
      absl::StatusOr<float> ms = gpu::Event::ElapsedMs(*start, *end);
      if (!ms.ok()) return ms.status();
      *ref_time = Summarize({*ms * 1000.0});
    }
    return p;
  }

  // Check batches 0 .. count - 1 of `req`, with inputs and answers; with
  // `ref_time`, the reference launch on the last one is timed.
  absl::StatusOr<std::vector<Problem>> MakeChecks(const EvalRequest& req, int count,
                                                  std::mt19937_64& rng,
                                                  std::optional<Timing>* ref_time) {
    const bool backward = req.shape.op == Op::kBackward;
    std::vector<Problem> checks;
    for (int i = 0; i < count; ++i) {
      absl::StatusOr<Problem> p =
          MakeProblem(CheckBatch(req.shape, req.seed, i), backward, rng,
                      fmt::format("check {}", i), i == count - 1 ? ref_time : nullptr);
      if (!p.ok()) return p.status();
      checks.push_back(*std::move(p));
    }
    return checks;
  }

  absl::Status FlushL2() {
    if (l2_flush.size() == 0) return absl::OkStatus();
    return l2_flush.Fill32(++flush_value, stream);
  }

  // ---------------------------------------------------------- candidates ---

  // Loads the image; a failure is the candidate's (compile_error) result.
  std::optional<EvalResult> Load(const Candidate& c, LoadedCandidate& out,
                                 std::optional<gpu::CompileResult>& compiled) {
    std::string image = c.cubin;
    if (image.empty()) {
      gpu::CompileRequest req;
      req.source = c.source;
      req.arch = info.arch;
      req.extra_options = c.extra_options;
      req.name = "candidate.cu";
      absl::StatusOr<gpu::CompileResult> r = gpu::Compile(req);
      if (!r.ok()) return MakeResult(Outcome::kCompileError, std::string(r.status().message()));
      compiled = *r;
      if (!r->ok) {
        EvalResult e = MakeResult(Outcome::kCompileError, "compile error");
        e.compile = compiled;
        return e;
      }
      image = r->cubin;
    }
    absl::StatusOr<gpu::Module> module = gpu::Module::Load(*driver, image);
    if (!module.ok()) {
      return MakeResult(Outcome::kCompileError,
                      fmt::format("cubin does not load: {}", std::string(module.status().message())));
    }
    out.module = *std::move(module);
    absl::StatusOr<gpu::Kernel> kernel = out.module.GetKernel(c.manifest.entry_point);
    if (!kernel.ok()) {
      return MakeResult(Outcome::kCompileError, std::string(kernel.status().message()));
    }
    out.kernel = *std::move(kernel);
    out.manifest = c.manifest;
    // Static shared memory counts against the 48 KB a launch gets without
    // opting in, so exactly 48 KB of dynamic plus a few static bytes fails
    // with CUDA_ERROR_INVALID_VALUE: opt in whenever there is any.
    if (c.manifest.dynamic_smem_bytes > 0) {
      absl::Status s = out.kernel.SetMaxDynamicSharedMemory(c.manifest.dynamic_smem_bytes);
      if (!s.ok()) {
        return MakeResult(Outcome::kCompileError,
                        fmt::format("dynamic shared memory {} B rejected: {}",
                                    c.manifest.dynamic_smem_bytes, std::string(s.message())));
      }
    }
    return std::nullopt;
  }

  // Output buffers and the launch plan of `c` on `p`. An unplannable launch
  // (manifest vs batch) is the candidate's compile_error, reported in `why`.
  absl::StatusOr<OutputSet> MakeOutputs(const LoadedCandidate& c, const Problem& p,
                                        std::string& why) {
    const JaggedShape& s = p.shape;
    OutputSet out;
    // Persistent grids: as many CTAs per SM as really fit (registers
    // included), unless the manifest names a number.
    int ctas_per_sm = c.manifest.ctas_per_sm;
    if (ctas_per_sm <= 0 && c.manifest.grid == GridPolicy::kPersistent) {
      absl::StatusOr<int> fit =
          c.kernel.MaxActiveBlocksPerSm(c.manifest.threads, c.manifest.dynamic_smem_bytes);
      if (fit.ok() && *fit == 0) {
        why = fmt::format("launch plan: {} threads with {} B of dynamic shared memory do not fit "
                          "on one SM",
                          c.manifest.threads, c.manifest.dynamic_smem_bytes);
        return out;
      }
      if (fit.ok()) ctas_per_sm = *fit;
    }
    absl::StatusOr<LaunchPlan> plan = PlanLaunch(c.manifest, s.cu_q, s.cu_k, s.heads, s.causal,
                                                 info.arch, info.sm_count, ctas_per_sm,
                                                 s.kv_heads);
    if (!plan.ok()) {
      why = fmt::format("launch plan: {}", std::string(plan.status().message()));
      return out;
    }
    out.plan = *std::move(plan);
    auto alloc = [&](gpu::DeviceBuffer& b, size_t bytes) -> absl::Status {
      absl::StatusOr<gpu::DeviceBuffer> x = Alloc(bytes);
      if (!x.ok()) return x.status();
      b = *std::move(x);
      return absl::OkStatus();
    };
    if (p.backward) {
      KF_RETURN_IF_ERROR(alloc(out.dq, s.q_elems() * 2));
      KF_RETURN_IF_ERROR(alloc(out.dk, s.k_elems() * 2));
      KF_RETURN_IF_ERROR(alloc(out.dv, s.k_elems() * 2));
      KF_RETURN_IF_ERROR(alloc(out.delta, s.lse_elems() * 4));
      KF_RETURN_IF_ERROR(alloc(out.dq_accum, s.q_elems() * 4));
    } else {
      KF_RETURN_IF_ERROR(alloc(out.o, s.q_elems() * 2));
      KF_RETURN_IF_ERROR(alloc(out.lse, s.lse_elems() * 4));
    }
    KF_RETURN_IF_ERROR(alloc(out.tiles, out.plan.tiles.size() * sizeof(int32_t)));
    KF_RETURN_IF_ERROR(out.tiles.CopyFromHost(out.plan.tiles.data(),
                                              out.plan.tiles.size() * sizeof(int32_t), stream));
    KF_RETURN_IF_ERROR(alloc(out.tile_counter, 16));
    KF_RETURN_IF_ERROR(alloc(out.workspace, size_t(out.plan.workspace_bytes)));
    KF_RETURN_IF_ERROR(stream.Synchronize());
    return out;
  }

  // Poison + scratch zeroing + (optionally) input restore, then the launch,
  // bracketed by `start`/`end` when given. Asynchronous.
  absl::Status Launch(const LoadedCandidate& c, Problem& p, OutputSet& out, bool restore,
                      bool flush, gpu::Event* start, gpu::Event* end) {
    if (flush) KF_RETURN_IF_ERROR(FlushL2());
    if (restore) KF_RETURN_IF_ERROR(Restore(p));
    for (gpu::DeviceBuffer* b : {&out.o, &out.dq, &out.dk, &out.dv}) {
      if (b->size() > 0) KF_RETURN_IF_ERROR(b->Fill32(kPoisonBf16Pair, stream));
    }
    if (out.lse.size() > 0) KF_RETURN_IF_ERROR(out.lse.Fill32(kPoisonF32, stream));
    for (gpu::DeviceBuffer* b : {&out.delta, &out.dq_accum, &out.tile_counter, &out.workspace}) {
      if (b->size() > 0) KF_RETURN_IF_ERROR(b->Fill8(0, stream));
    }
    KfAttnParams params = BaseParams(p.shape);
    SetInputs(params, p.candidate, p.backward);
    if (p.backward) {
      params.dq = out.dq.get();
      params.dk = out.dk.get();
      params.dv = out.dv.get();
      params.delta = out.delta.as<float>();
      params.dq_accum = out.dq_accum.as<float>();
    } else {
      params.o = out.o.get();
      params.lse = out.lse.as<float>();
    }
    params.tiles = out.plan.tiles.empty() ? nullptr : out.tiles.as<int>();
    params.num_tiles = out.plan.num_tiles;
    params.tile_counter = out.tile_counter.as<int>();
    params.workspace = out.plan.workspace_bytes > 0 ? out.workspace.get() : nullptr;
    params.workspace_bytes = out.plan.workspace_bytes;
    if (start != nullptr) KF_RETURN_IF_ERROR(start->Record(stream));
    if (!out.plan.empty) {
      KF_RETURN_IF_ERROR(c.kernel.Launch(
          params, {out.plan.grid[0], out.plan.grid[1], out.plan.grid[2]}, {out.plan.threads},
          out.plan.dynamic_smem_bytes, stream));
    }
    if (end != nullptr) KF_RETURN_IF_ERROR(end->Record(stream));
    return absl::OkStatus();
  }

  // The candidate's outputs, downloaded (synchronises).
  struct Downloaded {
    std::vector<uint16_t> o, dq, dk, dv;
    std::vector<float> lse;
  };

  absl::StatusOr<Downloaded> Download(const Problem& p, const OutputSet& out) {
    Downloaded d;
    const JaggedShape& s = p.shape;
    if (p.backward) {
      KF_RETURN_IF_ERROR(DownloadInto(out.dq, d.dq, s.q_elems(), stream));
      KF_RETURN_IF_ERROR(DownloadInto(out.dk, d.dk, s.k_elems(), stream));
      KF_RETURN_IF_ERROR(DownloadInto(out.dv, d.dv, s.k_elems(), stream));
    } else {
      KF_RETURN_IF_ERROR(DownloadInto(out.o, d.o, s.q_elems(), stream));
      KF_RETURN_IF_ERROR(DownloadInto(out.lse, d.lse, s.lse_elems(), stream));
    }
    return d;
  }

  // Every output of `out` against the reference's, tallied on the device
  // and judged on the host. Synchronises: a fault of the candidate's
  // surfaces here as an error.
  absl::StatusOr<Verdict> Check(const Problem& p, const OutputSet& out) {
    const JaggedShape& s = p.shape;
    Layout q_rows{s.cu_q, s.heads, s.head_dim, false};
    Layout k_rows{s.cu_k, s.kv_heads, s.head_dim, false};
    Layout lse_rows{s.cu_q, s.heads, 1, true};
    Verdict v;
    auto bf16 = [&](const char* name, const gpu::DeviceBuffer& got, const gpu::DeviceBuffer& want,
                    size_t n, const Layout& layout) -> absl::Status {
      absl::StatusOr<Tally> t = tools->TallyBf16(got, want, n, stream);
      if (!t.ok()) return t.status();
      v.checks.push_back(JudgeBf16(name, *t, n, layout));
      return absl::OkStatus();
    };
    if (p.backward) {
      KF_RETURN_IF_ERROR(bf16("dQ", out.dq, p.ref_dq, s.q_elems(), q_rows));
      KF_RETURN_IF_ERROR(bf16("dK", out.dk, p.ref_dk, s.k_elems(), k_rows));
      KF_RETURN_IF_ERROR(bf16("dV", out.dv, p.ref_dv, s.k_elems(), k_rows));
    } else {
      KF_RETURN_IF_ERROR(bf16("O", out.o, p.ref_o, s.q_elems(), q_rows));
      absl::StatusOr<Tally> t = tools->TallyLse(out.lse, p.ref_lse, s.lse_elems(), stream);
      if (!t.ok()) return t.status();
      v.checks.push_back(JudgeLse(*t, s.lse_elems(), lse_rows));
    }
    absl::StatusOr<uint64_t> digest = ReferenceFingerprint(p);
    if (!digest.ok()) return digest.status();
    if (*digest != p.ref_fingerprint) {
      OutputCheck c;
      c.output = "reference";
      c.pass = false;
      c.detail = "the reference's answers changed while the candidate ran: it writes outside "
                 "its outputs";
      v.checks.insert(v.checks.begin(), c);
    }
    for (const auto& c : v.checks) v.pass = v.pass && c.pass;
    return v;
  }

  // The first output of `a` and `b` whose bits differ, described; "" if none.
  static std::string BitDifference(const Problem& p, const Downloaded& a, const Downloaded& b) {
    const JaggedShape& s = p.shape;
    auto describe = [&](const char* name, long long at, const Layout& layout) {
      return fmt::format("{} differs at {}", name, layout.Describe(size_t(at)));
    };
    Layout q_rows{s.cu_q, s.heads, s.head_dim, false};
    Layout k_rows{s.cu_k, s.kv_heads, s.head_dim, false};
    Layout lse_rows{s.cu_q, s.heads, 1, true};
    long long at;
    if ((at = FirstBitDifference<uint16_t>(a.o, b.o)) >= 0) return describe("O", at, q_rows);
    if ((at = FirstBitDifference<float>(a.lse, b.lse)) >= 0) return describe("LSE", at, lse_rows);
    if ((at = FirstBitDifference<uint16_t>(a.dq, b.dq)) >= 0) return describe("dQ", at, q_rows);
    if ((at = FirstBitDifference<uint16_t>(a.dk, b.dk)) >= 0) return describe("dK", at, k_rows);
    if ((at = FirstBitDifference<uint16_t>(a.dv, b.dv)) >= 0) return describe("dV", at, k_rows);
    return "";
  }

  static EvalResult Crashed(const absl::Status& s, std::string_view when) {
    EvalResult r = MakeResult(Outcome::kCrashed, fmt::format("{}: {}", when, std::string(s.message())));
    r.context_lost = true;
    return r;
  }

  // Verification on the check problems; nullopt when all passed. `errors`
  // accumulates the worst output.
  std::optional<EvalResult> Verify(const LoadedCandidate& c, std::vector<Problem>& checks,
                                   ErrorMetrics& errors, std::string& notes) {
    bool failed = false;
    std::string message;
    for (size_t i = 0; i < checks.size(); ++i) {
      Problem& p = checks[i];
      std::string why;
      absl::StatusOr<OutputSet> out = MakeOutputs(c, p, why);
      if (!out.ok()) return Crashed(out.status(), "allocating outputs");
      if (!why.empty()) return MakeResult(Outcome::kCompileError, why);
      if (absl::Status s = Launch(c, p, *out, true, false, nullptr, nullptr); !s.ok()) {
        return Crashed(s, fmt::format("launch on {}", p.label));
      }
      absl::StatusOr<Verdict> verdict = Check(p, *out);
      if (!verdict.ok()) return Crashed(verdict.status(), fmt::format("running on {}", p.label));
      Fold(*verdict, p.label, errors, failed, message);
      if (failed) {
        EvalResult r = MakeResult(Outcome::kWrong, message);
        r.errors = errors;
        return r;
      }
      if (i != 0) continue;
      // Check batches are small (kCheckMaxLen): their outputs can come to the
      // host for the bitwise comparison.
      absl::StatusOr<Downloaded> first = Download(p, *out);
      if (!first.ok()) return Crashed(first.status(), fmt::format("running on {}", p.label));
      // Same inputs again: the outputs must not depend on leftovers.
      if (absl::Status s = Launch(c, p, *out, true, false, nullptr, nullptr); !s.ok()) {
        return Crashed(s, fmt::format("repeat launch on {}", p.label));
      }
      absl::StatusOr<Downloaded> second = Download(p, *out);
      if (!second.ok()) return Crashed(second.status(), fmt::format("repeat on {}", p.label));
      std::string diff = BitDifference(p, *first, *second);
      if (!diff.empty()) {
        if (!p.backward) {
          EvalResult r = MakeResult(
              Outcome::kWrong,
              fmt::format("wrong: not deterministic: two runs on the same input of {}: {}",
                          p.label, diff));
          errors.detail = r.message;
          r.errors = errors;
          return r;
        }
        notes += fmt::format("; backward not bitwise deterministic ({})", diff);
      }
      absl::StatusOr<Verdict> again = Check(p, *out);
      if (!again.ok()) return Crashed(again.status(), fmt::format("repeat on {}", p.label));
      Fold(*again, p.label + " repeat", errors, failed, message);
      if (failed) {
        EvalResult r = MakeResult(Outcome::kWrong, message);
        r.errors = errors;
        return r;
      }
    }
    return std::nullopt;
  }

  // Timed launches of each candidate on `timing`, interleaved when several
  // (A B B A A B ...). Fills samples; then checks each one's last output.
  absl::Status TimeInterleaved(std::vector<const LoadedCandidate*> cands,
                               std::vector<OutputSet*> outs, Problem& timing,
                               const EvalOptions& o, std::vector<std::vector<double>>& samples,
                               std::string& fault_when) {
    const size_t n = cands.size();
    samples.assign(n, {});
    for (int w = 0; w < o.warmup; ++w) {
      for (size_t c = 0; c < n; ++c) {
        fault_when = "warm-up launch";
        KF_RETURN_IF_ERROR(Launch(*cands[c], timing, *outs[c], false, o.flush_l2, nullptr, nullptr));
      }
    }
    std::vector<gpu::Event> starts, ends;
    for (size_t i = 0; i < n * size_t(o.iterations); ++i) {
      absl::StatusOr<gpu::Event> a = gpu::Event::Create(*driver);
      absl::StatusOr<gpu::Event> b = gpu::Event::Create(*driver);
      if (!a.ok()) return a.status();
      if (!b.ok()) return b.status();
      starts.push_back(*std::move(a));
      ends.push_back(*std::move(b));
    }
    std::vector<size_t> owner;
    for (int it = 0; it < o.iterations; ++it) {
      for (size_t k = 0; k < n; ++k) {
        size_t c = (it % 2 == 0) ? k : n - 1 - k;
        size_t e = owner.size();
        owner.push_back(c);
        fault_when = "timed launch";
        KF_RETURN_IF_ERROR(
            Launch(*cands[c], timing, *outs[c], false, o.flush_l2, &starts[e], &ends[e]));
      }
    }
    fault_when = "timed launches";
    KF_RETURN_IF_ERROR(stream.Synchronize());
    for (size_t e = 0; e < owner.size(); ++e) {
      absl::StatusOr<float> ms = gpu::Event::ElapsedMs(starts[e], ends[e]);
      if (!ms.ok()) return ms.status();
      samples[owner[e]].push_back(*ms * 1000.0);
    }
    return absl::OkStatus();
  }
};

Evaluator::Evaluator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Evaluator::~Evaluator() = default;

const gpu::DeviceInfo& Evaluator::device() const { return impl_->info; }

absl::StatusOr<std::unique_ptr<Evaluator>> Evaluator::Create(const gpu::Driver& driver,
                                                             int ordinal,
                                                             gpu::CompileCache* cache) {
  auto impl = std::make_unique<Impl>();
  impl->driver = &driver;
  absl::StatusOr<std::unique_ptr<gpu::Context>> ctx = driver.OpenContext(ordinal);
  if (!ctx.ok()) return ctx.status();
  impl->context = *std::move(ctx);
  absl::StatusOr<gpu::DeviceInfo> info = driver.GetDeviceInfo(ordinal);
  if (!info.ok()) return info.status();
  impl->info = *info;
  absl::StatusOr<std::unique_ptr<reference::GpuReference>> ref =
      reference::GpuReference::Create(driver, impl->info.arch, cache);
  if (!ref.ok()) return ref.status();
  impl->ref = *std::move(ref);
  absl::StatusOr<std::unique_ptr<DeviceTools>> tools =
      DeviceTools::Create(driver, impl->info.arch, cache);
  if (!tools.ok()) return tools.status();
  impl->tools = *std::move(tools);
  absl::StatusOr<gpu::Stream> stream = gpu::Stream::Create(driver);
  if (!stream.ok()) return stream.status();
  impl->stream = *std::move(stream);
  absl::StatusOr<gpu::DeviceBuffer> flush =
      gpu::DeviceBuffer::Allocate(driver, size_t(std::max(impl->info.l2_bytes, 1 << 20)) * 2);
  if (!flush.ok()) return flush.status();
  impl->l2_flush = *std::move(flush);
  return std::unique_ptr<Evaluator>(new Evaluator(std::move(impl)));
}

absl::StatusOr<EvalResult> Evaluator::Evaluate(const EvalRequest& req,
                                               const ReferenceCallback& on_reference) {
  Impl& m = *impl_;
  KF_RETURN_IF_ERROR(m.context->MakeCurrent());
  const EvalOptions& o = req.options;
  const bool backward = req.shape.op == Op::kBackward;

  const auto began = Clock::now();
  LoadedCandidate cand;
  std::optional<gpu::CompileResult> compiled;
  if (std::optional<EvalResult> bad = m.Load(req.candidate, cand, compiled)) return *bad;
  absl::StatusOr<gpu::KernelAttributes> attrs = cand.kernel.Attributes();
  if (!attrs.ok()) return attrs.status();

  // Everything the reference must answer, before any candidate launch.
  std::mt19937_64 rng(req.seed ^ 0x6b666f7267650001ull);
  absl::StatusOr<std::vector<Problem>> made = m.MakeChecks(req, o.checks, rng, nullptr);
  if (!made.ok()) return made.status();
  std::vector<Problem>& checks = *made;
  absl::StatusOr<JaggedShape> timing_shape =
      TimingBatch(req.shape, req.cu_seqlens_q, req.cu_seqlens_k);
  if (!timing_shape.ok()) return timing_shape.status();
  std::optional<Timing> ref_time;
  absl::StatusOr<Problem> timing =
      m.MakeProblem(*std::move(timing_shape), backward, rng, "last timed launch", &ref_time);
  if (!timing.ok()) return timing.status();
  const auto prepared = Clock::now();
  const int launches = o.checks + 1 + o.warmup + o.iterations;
  if (on_reference) on_reference(ref_time->median_us / 1000.0, launches);

  ErrorMetrics errors;
  std::string notes;
  std::optional<EvalResult> verdict = m.Verify(cand, checks, errors, notes);
  auto finish = [&](EvalResult r) {
    r.compile = compiled;
    r.attributes = *attrs;
    r.reference_timing = *ref_time;
    return r;
  };
  if (verdict.has_value()) return finish(*std::move(verdict));

  std::string why;
  absl::StatusOr<OutputSet> out = m.MakeOutputs(cand, *timing, why);
  if (!out.ok()) return finish(Impl::Crashed(out.status(), "allocating outputs"));
  if (!why.empty()) return finish(MakeResult(Outcome::kCompileError, why));
  std::vector<std::vector<double>> samples;
  std::string when;
  if (absl::Status s = m.TimeInterleaved({&cand}, {&*out}, *timing, o, samples, when); !s.ok()) {
    return finish(Impl::Crashed(s, when));
  }
  absl::StatusOr<Verdict> last = m.Check(*timing, *out);
  if (!last.ok()) return finish(Impl::Crashed(last.status(), "checking the last timed output"));
  bool failed = false;
  std::string message;
  Fold(*last, timing->label, errors, failed, message);
  if (failed) {
    EvalResult r = MakeResult(Outcome::kWrong, message);
    r.errors = errors;
    return finish(std::move(r));
  }
  EvalResult r = MakeResult(Outcome::kVerified, "");
  r.errors = errors;
  r.timing = Summarize(samples[0]);
  r.message = fmt::format("verified on {} checks + last timed launch; median {:.2f} us "
                          "(min {:.2f}, max {:.2f}, n {}); reference {:.2f} us; {}{}",
                          o.checks, r.timing->median_us, r.timing->min_us, r.timing->max_us,
                          r.timing->samples, ref_time->median_us,
                          Phases(began, prepared, Clock::now()), notes);
  return finish(std::move(r));
}

absl::StatusOr<EvalResult> Evaluator::CheckOnly(const EvalRequest& req,
                                                const ReferenceCallback& on_reference) {
  Impl& m = *impl_;
  KF_RETURN_IF_ERROR(m.context->MakeCurrent());
  const EvalOptions& o = req.options;
  LoadedCandidate cand;
  std::optional<gpu::CompileResult> compiled;
  if (std::optional<EvalResult> bad = m.Load(req.candidate, cand, compiled)) return *bad;
  absl::StatusOr<gpu::KernelAttributes> attrs = cand.kernel.Attributes();
  if (!attrs.ok()) return attrs.status();

  std::mt19937_64 rng(req.seed ^ 0x6b666f7267650001ull);  // Evaluate's check inputs
  std::optional<Timing> ref_time;
  const int count = std::max(1, o.checks);
  absl::StatusOr<std::vector<Problem>> made = m.MakeChecks(req, count, rng, &ref_time);
  if (!made.ok()) return made.status();
  std::vector<Problem>& checks = *made;
  if (on_reference) on_reference(ref_time->median_us / 1000.0, count + 1);
  ErrorMetrics errors;
  std::string notes;
  std::optional<EvalResult> verdict = m.Verify(cand, checks, errors, notes);
  EvalResult r = verdict.has_value() ? *std::move(verdict) : MakeResult(Outcome::kVerified, "");
  if (r.outcome == Outcome::kVerified) {
    r.errors = errors;
    r.message = fmt::format("passed {} checks (not timed){}", count, notes);
  }
  r.compile = compiled;
  r.attributes = *attrs;
  r.reference_timing = ref_time;
  return r;
}

absl::StatusOr<RetimeResult> Evaluator::Retime(const EvalRequest& req, const Candidate& incumbent,
                                               const ReferenceCallback& on_reference) {
  Impl& m = *impl_;
  KF_RETURN_IF_ERROR(m.context->MakeCurrent());
  const EvalOptions& o = req.options;  // Retime verifies on one check batch each
  const bool backward = req.shape.op == Op::kBackward;

  RetimeResult result;
  LoadedCandidate loaded[2];
  const Candidate* cands[2] = {&req.candidate, &incumbent};
  EvalResult* results[2] = {&result.candidate, &result.incumbent};
  std::optional<gpu::CompileResult> compiled[2];
  for (int i = 0; i < 2; ++i) {
    if (std::optional<EvalResult> bad = m.Load(*cands[i], loaded[i], compiled[i])) {
      *results[i] = *bad;
    }
  }
  if (results[0]->outcome == Outcome::kCompileError || results[1]->outcome == Outcome::kCompileError) {
    for (int i = 0; i < 2; ++i) {
      if (results[i]->outcome != Outcome::kCompileError) {
        *results[i] = MakeResult(Outcome::kCompiled, "not timed: the other kernel failed to load");
      }
    }
    return result;
  }

  std::mt19937_64 rng(req.seed ^ 0x6b666f7267650002ull);
  absl::StatusOr<std::vector<Problem>> made = m.MakeChecks(req, 1, rng, nullptr);
  if (!made.ok()) return made.status();
  std::vector<Problem>& checks = *made;
  absl::StatusOr<JaggedShape> timing_shape =
      TimingBatch(req.shape, req.cu_seqlens_q, req.cu_seqlens_k);
  if (!timing_shape.ok()) return timing_shape.status();
  std::optional<Timing> ref_time;
  absl::StatusOr<Problem> timing =
      m.MakeProblem(*std::move(timing_shape), backward, rng, "last timed launch", &ref_time);
  if (!timing.ok()) return timing.status();
  if (on_reference) on_reference(ref_time->median_us / 1000.0, 2 * (2 + o.warmup + o.iterations));

  for (int i = 0; i < 2; ++i) {
    ErrorMetrics errors;
    std::string notes;
    if (std::optional<EvalResult> bad = m.Verify(loaded[i], checks, errors, notes)) {
      *results[i] = *std::move(bad);
      if (results[i]->context_lost) return result;
    } else {
      *results[i] = MakeResult(Outcome::kVerified, "");
      results[i]->errors = errors;
    }
    results[i]->compile = compiled[i];
    results[i]->reference_timing = *ref_time;
  }
  if (result.candidate.outcome != Outcome::kVerified || result.incumbent.outcome != Outcome::kVerified) {
    return result;
  }

  std::string why0, why1;
  absl::StatusOr<OutputSet> out0 = m.MakeOutputs(loaded[0], *timing, why0);
  absl::StatusOr<OutputSet> out1 = m.MakeOutputs(loaded[1], *timing, why1);
  if (!out0.ok()) return out0.status();
  if (!out1.ok()) return out1.status();
  if (!why0.empty() || !why1.empty()) {
    if (!why0.empty()) result.candidate = MakeResult(Outcome::kCompileError, why0);
    if (!why1.empty()) result.incumbent = MakeResult(Outcome::kCompileError, why1);
    return result;
  }
  std::vector<std::vector<double>> samples;
  std::string when;
  if (absl::Status s = m.TimeInterleaved({&loaded[0], &loaded[1]}, {&*out0, &*out1}, *timing, o,
                                         samples, when);
      !s.ok()) {
    result.candidate = Impl::Crashed(s, when);
    result.incumbent = result.candidate;
    return result;
  }
  OutputSet* outs[2] = {&*out0, &*out1};
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<Verdict> last = m.Check(*timing, *outs[i]);
    if (!last.ok()) {
      *results[i] = Impl::Crashed(last.status(), "checking the last timed output");
      return result;
    }
    bool failed = false;
    std::string message;
    Fold(*last, timing->label, results[i]->errors, failed, message);
    if (failed) {
      results[i]->outcome = Outcome::kWrong;
      results[i]->message = message;
      continue;
    }
    results[i]->timing = Summarize(samples[i]);
  }
  if (result.candidate.timing && result.incumbent.timing) {
    const Timing& a = *result.candidate.timing;
    const Timing& b = *result.incumbent.timing;
    result.spread_us = std::max(a.p75_us - a.p25_us, b.p75_us - b.p25_us);
    result.candidate_wins = a.median_us < b.median_us - result.spread_us;
    for (int i = 0; i < 2; ++i) {
      const Timing& t = *results[i]->timing;
      results[i]->message = fmt::format("retimed interleaved: median {:.2f} us (min {:.2f}, max "
                                        "{:.2f}, n {})",
                                        t.median_us, t.min_us, t.max_us, t.samples);
    }
  }
  return result;
}

}  // namespace kforge::eval

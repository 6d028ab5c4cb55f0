#include "worker/eval/eval.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <utility>

#include "fmt/format.h"
#include "gpu/cubin.h"
#include "kernels/schedule.h"
#include "worker/eval/batches.h"
#include "worker/eval/compare.h"
#include "worker/eval/device_tools.h"
#include "worker/eval/launches.h"
#include "worker/reference/gpu_reference.h"

namespace kforge::eval {
namespace {

using reference::JaggedShape;

#define KF_RETURN_IF_ERROR(expr)                             \
  do {                                                       \
    if (absl::Status kf_s = (expr); !kf_s.ok()) return kf_s; \
  } while (0)

constexpr float kLog2e = 1.4426950408889634f;
// Bumped whenever what a candidate must pass gets stronger: results verified
// by an older evaluator name an older version.
constexpr std::string_view kChecksVersion = "checks-3";

// One problem's inputs on the device. The candidate reads them and nothing
// writes them once they are made: after every launch their fingerprints are
// checked, so a kernel that changes an input (even in a way that leaves the
// next launch's answer the same) fails rather than being restored.
struct InputSet {
  gpu::DeviceBuffer q, k, v, cu_q, cu_k, dout, o, lse;

  std::array<const gpu::DeviceBuffer*, 8> Buffers() const {
    return {&q, &k, &v, &cu_q, &cu_k, &dout, &o, &lse};
  }
};
constexpr std::array<const char*, 8> kInputNames = {"Q",  "K",  "V", "cu_seqlens_q",
                                                    "cu_seqlens_k", "dO", "O", "LSE"};

// One problem with its inputs and the reference's answers (fp32), all on the
// device: a 500k-token batch is gigabytes, too slow to move through the host.
struct Problem {
  ProblemSpec spec;
  bool backward = false;
  InputSet in;
  gpu::DeviceBuffer ref_o, ref_lse, ref_dq, ref_dk, ref_dv;
  // Digests taken before any candidate ran: a candidate that writes outside
  // its outputs must not be able to grade itself or change its inputs.
  uint64_t ref_fingerprint = 0;
  std::vector<uint64_t> input_fingerprints;

  const JaggedShape& shape() const { return spec.shape; }
};

// What one candidate writes on one problem (poisoned before every launch)
// and its scratch.
struct OutputSet {
  gpu::DeviceBuffer o, lse, dq, dk, dv, delta, dq_accum;
  gpu::DeviceBuffer tiles, tile_counter, workspace;
  LaunchPlan plan;
  int accum_fills = 0;  // dq_accum garbage fills so far (zero_dq_accum false)
  int output_fills = 0;  // launches whose outputs were prepared so far
  // dq_accum is zero now: the last launch, by a variant that restores it
  // (restores_dq_accum), was checked to leave every word zero
  bool accum_zero = false;

  // The outputs the contract has the candidate write, in a fixed order.
  std::vector<const gpu::DeviceBuffer*> Written(bool backward) const {
    if (backward) return {&dq, &dk, &dv};
    return {&o, &lse};
  }
};

struct LoadedCandidate {
  gpu::Module module;
  gpu::Kernel kernel;
  Manifest manifest;
  // The module's writable globals (constants NVRTC placed there, or state a
  // variant tries to keep) and their digests after its first launch: with
  // lazy module loading the driver may fill them in only then. From there on
  // they must not change (a variant that changes them once, at its first
  // launch, gains nothing: every launch's outputs are checked).
  std::vector<gpu::DeviceRegion> state;
  std::optional<std::vector<uint64_t>> state_fingerprints;
};


// One candidate on one problem.
struct Slot {
  bool planned = false;
  OutputSet out;
  uint64_t tiles_fingerprint = 0;
  // The digests of the outputs of its previous launch on this problem.
  std::optional<std::vector<uint64_t>> last_outputs;
};

// One candidate under evaluation.
struct Contender {
  LoadedCandidate* candidate = nullptr;
  std::vector<Slot> slots;            // one per problem
  std::optional<EvalResult> verdict;  // set once it failed
  ErrorMetrics errors;                // the worst output so far
  std::vector<double> samples;        // timed launches, microseconds
  std::string notes;                  // e.g. backward not bitwise deterministic
  int launches = 0;
};

template <typename T>
absl::StatusOr<gpu::DeviceBuffer> UploadNew(const gpu::Driver& driver, const std::vector<T>& host,
                                            const gpu::Stream& stream) {
  absl::StatusOr<gpu::DeviceBuffer> buf = gpu::DeviceBuffer::Allocate(driver, host.size() * sizeof(T));
  if (!buf.ok()) return buf.status();
  KF_RETURN_IF_ERROR(buf->CopyFromHost(host.data(), host.size() * sizeof(T), stream));
  return buf;
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

EvalResult Crashed(const absl::Status& s, std::string_view when) {
  EvalResult r = MakeResult(Outcome::kCrashed, fmt::format("{}: {}", when, std::string(s.message())));
  r.context_lost = true;
  return r;
}

// The largest of a launch's output checks, folded into `errors`.
void FoldWorst(const std::vector<OutputCheck>& checks, ErrorMetrics& errors) {
  for (const OutputCheck& c : checks) {
    if (c.rel_l2 > errors.rel_l2 || std::isnan(c.rel_l2) || errors.worst_output.empty()) {
      errors.worst_output = c.output;
      errors.rel_l2 = c.rel_l2;
      errors.max_abs = c.max_abs;
    }
  }
}

// Bytes of device memory per element of Q a problem takes in this process
// (inputs, the reference's fp32 answers, two candidates' outputs and
// scratch): the corner problem is sized from it.
int BytesPerQElement(bool backward) { return backward ? 48 : 16; }

using Clock = std::chrono::steady_clock;

// "prepare 2.1 s, run 0.4 s": where an evaluation's wall time went (inputs
// and reference answers, then the candidate's launches and checks), for the
// tuning reports.
std::string Phases(Clock::time_point began, Clock::time_point prepared, Clock::time_point done) {
  auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  return fmt::format("prepare {:.2f} s, run {:.2f} s", seconds(prepared - began),
                     seconds(done - prepared));
}

}  // namespace

std::string ReferenceVersion() {
  return fmt::format("{}+{}+{}", reference::kReferenceVersion, kTolerancePolicyVersion,
                     kChecksVersion);
}

struct Evaluator::Impl {
  const gpu::Driver* driver = nullptr;
  std::unique_ptr<gpu::Context> context;
  gpu::DeviceInfo info;
  std::unique_ptr<reference::GpuReference> ref;
  std::unique_ptr<DeviceTools> tools;
  gpu::Stream stream;
  gpu::Event start, end;
  gpu::DeviceBuffer l2_flush;
  uint32_t flush_value = 0;
  // Draws what the outputs and an unzeroed dq_accum hold before a launch
  // and seeds the random fills; from the OS, so no two evaluations leave the
  // same garbage and no variant can learn the order.
  std::mt19937_64 fill_rng{std::random_device{}()};

  // ------------------------------------------------------------ problems ---

  absl::Status AllocInto(gpu::DeviceBuffer& b, size_t bytes, size_t offset = 0) {
    absl::StatusOr<gpu::DeviceBuffer> x = gpu::DeviceBuffer::Allocate(*driver, bytes, offset);
    if (!x.ok()) return x.status();
    b = *std::move(x);
    return absl::OkStatus();
  }

  // A tensor a variant reads or writes (q, k, v, o, lse, dout, dq, dk, dv)
  // of a check problem starts 16 bytes past cuMemAlloc's 256-byte alignment:
  // the contract promises 16 (CONTRACT.md "Parameters"), and a caller's view
  // can start exactly there, so a variant that assumes more is wrong here,
  // where it faults in a child process, not in a caller's. The others keep
  // cuMemAlloc's alignment: the timing problem's as the allocators callers
  // use give it (a row 16 bytes off a 32-byte L2 sector touches one more
  // sector), so that it is timed as it is used; the sanitizer gate's so that
  // memcheck sees a read just before a tensor (the 16 bytes before it would
  // be the allocation's). Scratch keeps the runtime's 256.
  static constexpr size_t kTensorOffset = 16;
  absl::Status AllocTensorInto(gpu::DeviceBuffer& b, size_t bytes, const ProblemSpec& spec) {
    return AllocInto(b, bytes, spec.role == ProblemRole::kCheck ? kTensorOffset : 0);
  }

  // `n` fresh random bf16 values (RandomBf16's, generated on the device),
  // then scaled and given outliers as `scale` and the problem's style say,
  // at the problem's alignment (AllocTensorInto).
  absl::Status RandomInto(gpu::DeviceBuffer& b, size_t n, float scale, const ProblemSpec& spec,
                          std::mt19937_64& rng) {
    const InputStyle& style = spec.style;
    KF_RETURN_IF_ERROR(AllocTensorInto(b, n * 2, spec));
    KF_RETURN_IF_ERROR(tools->FillRandomBf16(b, n, rng(), stream));
    const uint64_t outlier_seed = rng();
    if (scale == 1 && style.outlier_period == 0) return absl::OkStatus();
    return tools->StyleBf16(b, n, scale, outlier_seed, style.outlier_period,
                            style.outlier_magnitude, stream);
  }

  // The reference's answers, in the order their digests combine.
  static std::array<const gpu::DeviceBuffer*, 5> ReferenceBuffers(const Problem& p) {
    return {&p.ref_o, &p.ref_lse, &p.ref_dq, &p.ref_dk, &p.ref_dv};
  }
  static uint64_t CombineReference(std::span<const uint64_t> digests) {
    uint64_t digest = 0;
    for (size_t i = 0; i < digests.size(); ++i)
      digest ^= digests[i] * (0x9e3779b97f4a7c15ull + 2 * (i + 1));
    return digest;
  }

  absl::StatusOr<uint64_t> ReferenceFingerprint(const Problem& p) {
    absl::StatusOr<std::vector<uint64_t>> f = tools->Fingerprints(ReferenceBuffers(p), stream);
    if (!f.ok()) return f.status();
    return CombineReference(*f);
  }

  // Fresh inputs and the reference's answers, all on the device. With
  // `ref_time`, the reference launch the candidate is compared with (forward
  // or backward) is timed.
  absl::StatusOr<Problem> MakeProblem(ProblemSpec spec, bool backward, std::mt19937_64& rng,
                                      std::optional<Timing>* ref_time) {
    Problem p;
    p.spec = std::move(spec);
    p.backward = backward;
    const JaggedShape& s = p.shape();
    const InputStyle& st = p.spec.style;
    KF_RETURN_IF_ERROR(RandomInto(p.in.q, s.q_elems(), st.q_scale, p.spec, rng));
    KF_RETURN_IF_ERROR(RandomInto(p.in.k, s.k_elems(), st.k_scale, p.spec, rng));
    KF_RETURN_IF_ERROR(RandomInto(p.in.v, s.k_elems(), st.v_scale, p.spec, rng));
    if (backward) KF_RETURN_IF_ERROR(RandomInto(p.in.dout, s.q_elems(), st.dout_scale, p.spec, rng));
    for (auto [host, dev] : {std::pair{&s.cu_q, &p.in.cu_q}, std::pair{&s.cu_k, &p.in.cu_k}}) {
      absl::StatusOr<gpu::DeviceBuffer> b = UploadNew(*driver, *host, stream);
      if (!b.ok()) return b.status();
      *dev = *std::move(b);
    }

    // Forward reference (backward needs its O and LSE as inputs).
    KF_RETURN_IF_ERROR(AllocInto(p.ref_o, s.q_elems() * sizeof(float)));
    // (a backward's LSE input: the reference's, moved)
    KF_RETURN_IF_ERROR(AllocTensorInto(p.ref_lse, s.lse_elems() * sizeof(float), p.spec));
    KfAttnParams params = BaseParams(s);
    SetInputs(params, p.in, false);
    params.o = p.ref_o.get();
    params.lse = p.ref_lse.as<float>();
    if (ref_time != nullptr && !backward) KF_RETURN_IF_ERROR(start.Record(stream));
    KF_RETURN_IF_ERROR(ref->Forward(params, stream));
    if (ref_time != nullptr && !backward) KF_RETURN_IF_ERROR(end.Record(stream));
    if (backward) {
      KF_RETURN_IF_ERROR(AllocTensorInto(p.in.o, s.q_elems() * 2, p.spec));
      KF_RETURN_IF_ERROR(tools->ToBf16(p.in.o, p.ref_o, s.q_elems(), stream));
      p.in.lse = std::move(p.ref_lse);
      p.ref_o = gpu::DeviceBuffer{};
      gpu::DeviceBuffer delta;
      KF_RETURN_IF_ERROR(AllocInto(delta, s.lse_elems() * sizeof(float)));
      KF_RETURN_IF_ERROR(AllocInto(p.ref_dq, s.q_elems() * sizeof(float)));
      KF_RETURN_IF_ERROR(AllocInto(p.ref_dk, s.k_elems() * sizeof(float)));
      KF_RETURN_IF_ERROR(AllocInto(p.ref_dv, s.k_elems() * sizeof(float)));
      KfAttnParams bp = BaseParams(s);
      SetInputs(bp, p.in, true);
      bp.delta = delta.as<float>();
      bp.dq = p.ref_dq.get();
      bp.dk = p.ref_dk.get();
      bp.dv = p.ref_dv.get();
      if (ref_time != nullptr) KF_RETURN_IF_ERROR(start.Record(stream));
      KF_RETURN_IF_ERROR(ref->Backward(bp, stream));
      if (ref_time != nullptr) KF_RETURN_IF_ERROR(end.Record(stream));
      KF_RETURN_IF_ERROR(stream.Synchronize());  // before `delta` is freed
    }
    absl::StatusOr<uint64_t> digest = ReferenceFingerprint(p);  // synchronises
    if (!digest.ok()) return digest.status();
    p.ref_fingerprint = *digest;
    const auto inputs = p.in.Buffers();
    absl::StatusOr<std::vector<uint64_t>> fp = tools->Fingerprints(inputs, stream);
    if (!fp.ok()) return fp.status();
    p.input_fingerprints = *std::move(fp);
    if (ref_time != nullptr) {
      absl::StatusOr<float> ms = gpu::Event::ElapsedMs(start, end);
      if (!ms.ok()) return ms.status();
      *ref_time = Summarize({*ms * 1000.0});
    }
    return p;
  }

  // All of `specs` on the device; the one at `timed_index` (if any) has its
  // reference launch timed into `ref_time`.
  absl::StatusOr<std::vector<Problem>> MakeProblems(std::vector<ProblemSpec> specs, bool backward,
                                                    uint64_t seed, int timed_index,
                                                    std::optional<Timing>* ref_time) {
    std::mt19937_64 rng(seed ^ 0x6b666f7267650001ull);
    std::vector<Problem> problems;
    for (size_t i = 0; i < specs.size(); ++i) {
      absl::StatusOr<Problem> p = MakeProblem(std::move(specs[i]), backward, rng,
                                              int(i) == timed_index ? ref_time : nullptr);
      if (!p.ok()) return p.status();
      problems.push_back(*std::move(p));
    }
    return problems;
  }

  // Q elements the corner problem may have: what is left of most of the
  // device's memory next to the other problems.
  int64_t CornerBudget(const std::vector<ProblemSpec>& others, bool backward) const {
    int64_t used = 0;
    for (const ProblemSpec& s : others) used += int64_t(s.shape.q_elems());
    const int64_t budget = int64_t(double(info.memory_bytes) * 0.7) / BytesPerQElement(backward);
    return std::max<int64_t>(budget - used, 1);
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
    const std::vector<gpu::GlobalSection> globals = gpu::MutableGlobalSections(image);
    if (const int64_t bytes = gpu::MutableGlobalBytes(image); bytes > gpu::kMaxModuleGlobalBytes) {
      return MakeResult(Outcome::kCompileError,
                        fmt::format("the image has {} bytes of writable __device__ variables (at "
                                    "most {}): a variant may keep no state between launches; put "
                                    "read-only tables in __constant__",
                                    bytes, gpu::kMaxModuleGlobalBytes));
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
    // Each variable the driver can find, exactly as large as it says: the
    // sections' layout on the device need not be the file's.
    for (const gpu::GlobalSection& section : globals) {
      for (const auto& [symbol, offset] : section.symbols) {
        absl::StatusOr<gpu::DeviceRegion> g = out.module.GetGlobal(symbol);
        if (g.ok() && g->bytes > 0) out.state.push_back(*g);
      }
    }

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
    const JaggedShape& s = p.shape();
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
    // A persistent kernel must be right on any grid: some problems launch
    // one to three CTAs, so that each runs many tiles of every length. The
    // plan is made for that grid (a host-balanced list is laid out for it).
    const bool small_grid = c.manifest.grid == GridPolicy::kPersistent && p.spec.grid_ctas > 0;
    absl::StatusOr<LaunchPlan> plan =
        PlanLaunch(c.manifest, s.cu_q, s.cu_k, s.heads, s.causal, info.arch,
                   small_grid ? p.spec.grid_ctas : info.sm_count, small_grid ? 1 : ctas_per_sm,
                   s.kv_heads);
    if (!plan.ok()) {
      why = fmt::format("launch plan: {}", std::string(plan.status().message()));
      return out;
    }
    out.plan = *std::move(plan);
    if (p.backward) {
      KF_RETURN_IF_ERROR(AllocTensorInto(out.dq, s.q_elems() * 2, p.spec));
      KF_RETURN_IF_ERROR(AllocTensorInto(out.dk, s.k_elems() * 2, p.spec));
      KF_RETURN_IF_ERROR(AllocTensorInto(out.dv, s.k_elems() * 2, p.spec));
      KF_RETURN_IF_ERROR(AllocInto(out.delta, s.lse_elems() * 4));
      KF_RETURN_IF_ERROR(AllocInto(out.dq_accum, s.q_elems() * 4));
    } else {
      KF_RETURN_IF_ERROR(AllocTensorInto(out.o, s.q_elems() * 2, p.spec));
      KF_RETURN_IF_ERROR(AllocTensorInto(out.lse, s.lse_elems() * 4, p.spec));
    }
    KF_RETURN_IF_ERROR(AllocInto(out.tiles, out.plan.tiles.size() * sizeof(int32_t)));
    KF_RETURN_IF_ERROR(out.tiles.CopyFromHost(out.plan.tiles.data(),
                                              out.plan.tiles.size() * sizeof(int32_t), stream));
    KF_RETURN_IF_ERROR(AllocInto(out.tile_counter, 16));
    KF_RETURN_IF_ERROR(AllocInto(out.workspace, size_t(out.plan.workspace_bytes)));
    KF_RETURN_IF_ERROR(stream.Synchronize());
    return out;
  }

  // What a buffer holds before a launch (Prefill).
  enum class Fill { kNaN = 0, kRandom = 1, kAsLeft = 2 };

  // kNaN: `nan_word` in every 32-bit word. kRandom: random bf16 values (two
  // a word for fp32 buffers) times `scale`, finite and different in every
  // element. kAsLeft: what the last launch left there.
  absl::Status Prefill(gpu::DeviceBuffer& b, Fill fill, uint32_t nan_word, float scale = 256.f) {
    if (b.size() == 0 || fill == Fill::kAsLeft) return absl::OkStatus();
    if (fill == Fill::kNaN) return b.Fill32(nan_word, stream);
    const size_t n = b.size() / 2;
    KF_RETURN_IF_ERROR(tools->FillRandomBf16(b, n, fill_rng(), stream));
    return tools->StyleBf16(b, n, scale, fill_rng(), 0, 0.f, stream);
  }

  // Poison, scratch zeroing, the launch (between the events when `timed`)
  // and a synchronisation, so that a fault is this launch's. `ms` gets the
  // launch's time when timed: a backward's includes the scratch zeroing,
  // which every backward call pays (the runtime zeroes it per launch, the
  // bench times it too), so that a variant needing less of it zeroed
  // (zero_dq_accum false) is credited with what its users save.
  absl::Status Launch(const LoadedCandidate& c, const Problem& p, OutputSet& out, bool flush,
                      bool timed, float& ms) {
    if (flush) KF_RETURN_IF_ERROR(FlushL2());
    // The outputs (every element of which the variant writes) hold NaN on a
    // slot's first launch, random values of an output's size (about N(0, 1))
    // on its second, and after that NaN, random values of that size or 256
    // times it, or the previous launch's outputs, drawn at random. So what a
    // variant finds there does not tell evaluation from use, where a caller's
    // buffers hold anything (often the last call's outputs, for other
    // inputs): a variant that computes only where it finds NaN or values no
    // output has is wrong on the second launch, one that leaves an element
    // unwritten on the NaN ones.
    const int n_fill = out.output_fills++;
    const Fill fill = Fill(n_fill < 2 ? n_fill : int(fill_rng() % 3));
    const float scale = n_fill < 2 || fill_rng() % 2 ? 1.f : 256.f;
    for (gpu::DeviceBuffer* b : {&out.o, &out.lse, &out.dq, &out.dk, &out.dv}) {
      KF_RETURN_IF_ERROR(Prefill(*b, fill, b == &out.lse ? kPoisonF32 : kPoisonBf16Pair, scale));
    }
    // A variant that zeroes nothing of dq_accum writes each element before
    // reading it (CONTRACT.md "Backward"): the buffer holds NaN, then random
    // finite values, then what the previous launch left there (as the
    // runtime's does, so the evaluator's garbage is not the only thing a
    // variant sees here), in turn, so reading an element it did not write
    // shows in its dQ, whichever way it looks.
    const bool accum_garbage = p.backward && !c.manifest.zero_dq_accum;
    if (accum_garbage) {
      // the slot's first launch: NaN
      KF_RETURN_IF_ERROR(Prefill(out.dq_accum, Fill(out.accum_fills++ % 3), kPoisonF32));
    }
    // A variant that restores dq_accum's zeros (CONTRACT.md "Backward") gets
    // them once, as the runtime gives them once per scratch: zeroed here,
    // untimed, only when its last launch was not checked to leave them.
    const bool accum_kept = p.backward && c.manifest.restores_dq_accum;
    if (accum_kept && !out.accum_zero) KF_RETURN_IF_ERROR(out.dq_accum.Fill8(0, stream));
    out.accum_zero = false;
    KfAttnParams params = BaseParams(p.shape());
    SetInputs(params, p.in, p.backward);
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
    // (host work, before the events: encoding is a host call, as the runtime makes it)
    absl::StatusOr<std::vector<gpu::TensorMap>> maps =
        gpu::EncodeAttnTensorMaps(*driver, params, c.manifest.tensor_maps);
    if (!maps.ok()) return maps.status();
    if (timed && p.backward) KF_RETURN_IF_ERROR(start.Record(stream));
    for (gpu::DeviceBuffer* b : {&out.delta, &out.dq_accum, &out.tile_counter, &out.workspace}) {
      if (b == &out.dq_accum && (accum_garbage || accum_kept)) continue;
      if (b->size() > 0) KF_RETURN_IF_ERROR(b->Fill8(0, stream));
    }
    if (timed && !p.backward) KF_RETURN_IF_ERROR(start.Record(stream));
    if (!out.plan.empty) {
      KF_RETURN_IF_ERROR(c.kernel.Launch(
          params, *maps, {out.plan.grid[0], out.plan.grid[1], out.plan.grid[2]},
          {out.plan.threads}, out.plan.dynamic_smem_bytes, stream));
    }
    if (timed) KF_RETURN_IF_ERROR(end.Record(stream));
    KF_RETURN_IF_ERROR(stream.Synchronize());
    if (timed) {
      absl::StatusOr<float> t = gpu::Event::ElapsedMs(start, end);
      if (!t.ok()) return t.status();
      ms = *t;
    }
    return absl::OkStatus();
  }

  // What one launch's check found.
  struct LaunchCheck {
    std::vector<OutputCheck> outputs;  // each output against the tolerance policy
    std::string failure;               // the first thing wrong ("" when none)
    std::string note;                  // worth recording even when it passed
    // The problem's inputs or reference answers were changed: no other
    // kernel can be checked on it any more.
    bool problem_spoiled = false;
  };

  // Every output of the launch against the reference's, tallied on the
  // device and judged on the host; then the inputs, the tile list and the
  // reference's answers against their fingerprints, and the outputs against
  // the previous launch's. Synchronises.
  absl::StatusOr<LaunchCheck> CheckLaunch(LoadedCandidate& c, const Problem& p, Slot& slot) {
    const JaggedShape& s = p.shape();
    const OutputSet& out = slot.out;
    Layout q_rows{s.cu_q, s.heads, s.head_dim, false};
    Layout k_rows{s.cu_k, s.kv_heads, s.head_dim, false};
    Layout lse_rows{s.cu_q, s.heads, 1, true};
    LaunchCheck check;
    auto bf16 = [&](const char* name, const gpu::DeviceBuffer& got, const gpu::DeviceBuffer& want,
                    size_t n, const Layout& layout) -> absl::Status {
      absl::StatusOr<Tally> t = tools->TallyBf16(got, want, n, stream);
      if (!t.ok()) return t.status();
      check.outputs.push_back(JudgeBf16(name, *t, n, layout));
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
      check.outputs.push_back(JudgeLse(*t, s.lse_elems(), lse_rows));
    }

    // Everything that must not change, and the outputs, in one pass and one
    // synchronisation: inputs, tile list, outputs, module globals, reference.
    const auto inputs = p.in.Buffers();
    const std::vector<const gpu::DeviceBuffer*> written = out.Written(p.backward);
    std::vector<gpu::DeviceRegion> regions;
    for (const gpu::DeviceBuffer* b : inputs) regions.push_back({b->address(), b->size()});
    regions.push_back({out.tiles.address(), out.tiles.size()});
    for (const gpu::DeviceBuffer* b : written) regions.push_back({b->address(), b->size()});
    regions.insert(regions.end(), c.state.begin(), c.state.end());
    for (const gpu::DeviceBuffer* b : ReferenceBuffers(p)) regions.push_back({b->address(), b->size()});
    absl::StatusOr<std::vector<uint64_t>> digests = tools->Fingerprints(regions, stream);
    if (!digests.ok()) return digests.status();
    const std::span<const uint64_t> all(*digests);
    const std::span<const uint64_t> input_digests = all.subspan(0, inputs.size());
    const uint64_t tiles_digest = all[inputs.size()];
    const std::vector<uint64_t> output_digests(all.begin() + inputs.size() + 1,
                                               all.begin() + inputs.size() + 1 + written.size());
    const std::vector<uint64_t> state_digests(
        all.begin() + inputs.size() + 1 + written.size(),
        all.begin() + inputs.size() + 1 + written.size() + c.state.size());
    const uint64_t ref_digest = CombineReference(all.last(ReferenceBuffers(p).size()));

    if (ref_digest != p.ref_fingerprint) {
      check.failure = "the reference's answers changed while the kernel ran: it writes outside its "
                      "outputs";
    }
    for (size_t i = 0; check.failure.empty() && i < inputs.size(); ++i) {
      if (input_digests[i] != p.input_fingerprints[i]) {
        check.failure = fmt::format("the kernel changed its input {} (inputs are read-only)",
                                    kInputNames[i]);
      }
    }
    check.problem_spoiled = !check.failure.empty();
    if (check.failure.empty() && tiles_digest != slot.tiles_fingerprint) {
      check.failure = "the kernel changed its tile list (inputs are read-only)";
    }
    if (!c.state_fingerprints) {
      c.state_fingerprints = state_digests;
    } else if (check.failure.empty() && state_digests != *c.state_fingerprints) {
      check.failure = "the kernel changed its module's __device__ variables: a variant may keep no "
                      "state between launches";
    }
    for (const OutputCheck& c : check.outputs) {
      if (check.failure.empty() && !c.pass) check.failure = c.detail;
    }
    if (p.backward && c.manifest.restores_dq_accum && out.dq_accum.size() > 0) {
      absl::StatusOr<uint64_t> nonzero =
          tools->CountNonZero32({out.dq_accum.address(), out.dq_accum.size()}, stream);
      if (!nonzero.ok()) return nonzero.status();
      const std::string why = JudgeDqAccumRestored(*nonzero, out.dq_accum.size() / 4);
      slot.out.accum_zero = why.empty();
      if (check.failure.empty()) check.failure = why;
    }
    if (check.failure.empty() && slot.last_outputs && *slot.last_outputs != output_digests) {
      // Same inputs, other bits: the output depends on something besides the
      // inputs (leftovers, a race, the launch count).
      const char* names_fwd[] = {"O", "LSE"};
      const char* names_bwd[] = {"dQ", "dK", "dV"};
      std::string which;
      for (size_t i = 0; i < output_digests.size(); ++i) {
        if ((*slot.last_outputs)[i] != output_digests[i] && which.empty())
          which = p.backward ? names_bwd[i] : names_fwd[i];
      }
      if (p.backward && !c.manifest.deterministic) {
        // fp32 atomics in the dQ accumulation are legitimate (CONTRACT.md),
        // unless the manifest says the variant is deterministic.
        check.note = fmt::format("backward not bitwise deterministic ({} differs between launches)",
                                 which);
      } else {
        check.failure = fmt::format("not deterministic: two launches on the same inputs wrote "
                                    "different {}{}",
                                    which, p.backward ? " (its manifest says deterministic)" : "");
      }
    }
    slot.last_outputs = output_digests;
    return check;
  }

  // Runs `steps` for every contender: each step launches each contender that
  // has not failed on the step's problem (timed steps alternate their order,
  // A B B A ...) and checks the launch. A CUDA fault ends the run: the
  // context is gone. `timing_done`, when given, is asked after each timed
  // step; once it says so the remaining timed steps are skipped, and every
  // other launch (the checks among them) still runs.
  using TimingDone = std::function<bool(const std::vector<Contender>&)>;
  void RunSteps(std::vector<Contender>& contenders, std::vector<Problem>& problems,
                const std::vector<LaunchStep>& steps, const EvalOptions& o,
                const TimingDone& timing_done = {}) {
    int timed_index = 0;
    bool timing_over = false;
    for (size_t si = 0; si < steps.size(); ++si) {
      const LaunchStep& step = steps[si];
      if (step.timed && timing_over) continue;
      Problem& p = problems[size_t(step.problem)];
      std::vector<size_t> order(contenders.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      if (timed_index % 2 == 1) std::reverse(order.begin(), order.end());
      for (size_t ci : order) {
        Contender& c = contenders[ci];
        if (c.verdict) continue;
        // For the operator's log when something fails; built only then.
        auto where = [&] {
          return fmt::format("launch {} of {}, {}", si + 1, steps.size(), p.spec.Describe());
        };
        Slot& slot = c.slots[size_t(step.problem)];
        if (!slot.planned) {
          std::string why;
          absl::StatusOr<OutputSet> out = MakeOutputs(*c.candidate, p, why);
          if (!out.ok()) {
            c.verdict = Crashed(out.status(), "allocating outputs");
            c.verdict->context_lost = false;
            continue;
          }
          if (!why.empty()) {
            c.verdict = MakeResult(Outcome::kCompileError, why);
            c.verdict->operator_note = where();
            continue;
          }
          slot.out = *std::move(out);
          const gpu::DeviceBuffer* tiles[] = {&slot.out.tiles};
          absl::StatusOr<std::vector<uint64_t>> digest = tools->Fingerprints(tiles, stream);
          if (!digest.ok()) {
            c.verdict = Crashed(digest.status(), "preparing a launch");
            Abandon(contenders, ci, "not finished: the other kernel broke the CUDA context", true);
            return;
          }
          slot.tiles_fingerprint = (*digest)[0];
          slot.planned = true;
        }
        float ms = 0;
        const bool flush = o.flush_l2 && p.spec.role == ProblemRole::kTiming;
        if (absl::Status s = Launch(*c.candidate, p, slot.out, flush, step.timed, ms); !s.ok()) {
          c.verdict = Crashed(s, "a launch");
          c.verdict->operator_note = where();
          Abandon(contenders, ci, "not finished: the other kernel broke the CUDA context", true);
          return;
        }
        ++c.launches;
        absl::StatusOr<LaunchCheck> check = CheckLaunch(*c.candidate, p, slot);
        if (!check.ok()) {
          c.verdict = Crashed(check.status(), "checking a launch");
          c.verdict->operator_note = where();
          Abandon(contenders, ci, "not finished: the other kernel broke the CUDA context", true);
          return;
        }
        FoldWorst(check->outputs, c.errors);
        if (!check->note.empty() && c.notes.find(check->note) == std::string::npos)
          c.notes += "; " + check->note;
        if (!check->failure.empty()) {
          EvalResult r = MakeResult(Outcome::kWrong, fmt::format("wrong: {}", check->failure));
          c.errors.detail = check->failure;
          r.errors = c.errors;
          r.operator_note = where();
          c.verdict = std::move(r);
          if (check->problem_spoiled) {
            Abandon(contenders, ci, "not finished: the other kernel changed the shared inputs",
                    false);
          }
          continue;
        }
        if (step.timed) c.samples.push_back(double(ms) * 1000.0);
      }
      if (step.timed) {
        ++timed_index;
        if (timing_done && timing_done(contenders)) timing_over = true;
      }
    }
  }

  // After `failed` broke the context or the shared inputs, the others
  // cannot be finished: they end as compiled, not charged with anything.
  static void Abandon(std::vector<Contender>& contenders, size_t failed, std::string_view why,
                      bool context_lost) {
    for (size_t i = 0; i < contenders.size(); ++i) {
      if (i == failed || contenders[i].verdict) continue;
      contenders[i].verdict = MakeResult(Outcome::kCompiled, std::string(why));
      contenders[i].verdict->context_lost = context_lost;
    }
  }

  // The result of a contender that passed everything.
  static EvalResult Passed(Contender& c, const SizeExtent& extent) {
    EvalResult r = MakeResult(Outcome::kVerified, "");
    r.errors = c.errors;
    r.errors.detail.clear();
    if (!c.samples.empty()) r.timing = Summarize(c.samples);
    r.verified = extent;
    return r;
  }

  // The problems an evaluation of `req` runs: its checks (twice as many for
  // a promotion), the corner (promotion), and the timing problem last.
  absl::StatusOr<std::vector<ProblemSpec>> PlanProblems(const EvalRequest& req, bool promotion,
                                                        const std::vector<const Manifest*>& ms) {
    int largest_tile = 0;
    for (const Manifest* m : ms) largest_tile = std::max({largest_tile, m->tile_m, m->tile_n});
    const int checks = std::max(3, req.options.checks) * (promotion ? 2 : 1);
    std::vector<ProblemSpec> specs = CheckProblems(req.shape, req.seed, checks, largest_tile);
    absl::StatusOr<ProblemSpec> timing =
        TimingProblem(req.shape, req.cu_seqlens_q, req.cu_seqlens_k, req.seed);
    if (!timing.ok()) return timing.status();
    if (promotion) {
      std::vector<ProblemSpec> so_far = specs;
      so_far.push_back(*timing);
      specs.push_back(CornerProblem(req.shape, req.seed,
                                    CornerBudget(so_far, req.shape.op == Op::kBackward)));
    }
    specs.push_back(*std::move(timing));
    return specs;
  }

  static SizeExtent ExtentOfAll(const std::vector<Problem>& problems) {
    SizeExtent e;
    for (const Problem& p : problems) e = MaxExtent(e, ExtentOf(p.shape()));
    return e;
  }

  static std::vector<int> CornerIndices(const std::vector<Problem>& problems) {
    std::vector<int> out;
    for (size_t i = 0; i < problems.size(); ++i) {
      if (problems[i].spec.role == ProblemRole::kCorner) out.push_back(int(i));
    }
    return out;
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
  for (gpu::Event* e : {&impl->start, &impl->end}) {
    absl::StatusOr<gpu::Event> event = gpu::Event::Create(driver);
    if (!event.ok()) return event.status();
    *e = *std::move(event);
  }
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
  absl::StatusOr<std::vector<ProblemSpec>> specs =
      m.PlanProblems(req, o.promotion, {&cand.manifest});
  if (!specs.ok()) return specs.status();
  const int timing_index = int(specs->size()) - 1;
  std::optional<Timing> ref_time;
  absl::StatusOr<std::vector<Problem>> problems =
      m.MakeProblems(*std::move(specs), backward, req.seed, timing_index, &ref_time);
  if (!problems.ok()) return problems.status();
  const auto prepared = Clock::now();
  const std::vector<LaunchStep> steps = PlanLaunches(
      req.seed, LaunchPlanOptions{.problems = int(problems->size()),
                                  .timing_problem = timing_index,
                                  .warmup = o.warmup,
                                  .iterations = o.iterations,
                                  .twice = Impl::CornerIndices(*problems)});
  if (on_reference) on_reference(ref_time->median_us / 1000.0, int(steps.size()));

  std::vector<Contender> contenders(1);
  contenders[0].candidate = &cand;
  contenders[0].slots.resize(problems->size());
  m.RunSteps(contenders, *problems, steps, o);

  Contender& c = contenders[0];
  EvalResult r = c.verdict ? *std::move(c.verdict) : Impl::Passed(c, Impl::ExtentOfAll(*problems));
  r.compile = compiled;
  r.attributes = *attrs;
  r.reference_timing = ref_time;
  if (r.outcome == Outcome::kVerified) {
    r.message = fmt::format("verified; median {:.2f} us (min {:.2f}, max {:.2f}, n {}); reference "
                            "{:.2f} us; {}{}",
                            r.timing->median_us, r.timing->min_us, r.timing->max_us,
                            r.timing->samples, ref_time->median_us,
                            Phases(began, prepared, Clock::now()), c.notes);
  }
  return r;
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

  const int largest_tile = std::max(cand.manifest.tile_m, cand.manifest.tile_n);
  // Three check problems hold every length up to CoverageLength once; more
  // (a promotion's count) and longer sequences would only make the
  // sanitizers slower: the unsanitized evaluation that follows a gate runs
  // them at full strength.
  std::vector<ProblemSpec> specs;
  if (o.sampled_checks) {
    // The awkward lengths twice: on the problem's small grid, where each
    // CTA runs many tiles in turn (racecheck and synccheck look for hazards
    // between one tile and the next in the same CTA), and on the whole
    // GPU's, where each tile is its CTA's first.
    ProblemSpec sampled = SampledCheckProblem(req.shape, req.seed, largest_tile);
    specs.push_back(sampled);
    sampled.grid_ctas = 0;
    specs.push_back(std::move(sampled));
    specs.push_back(GateProblem(req.shape, req.seed, kGateMaxTokens / 4, GateLongest(largest_tile)));
  } else {
    specs = CheckProblems(req.shape, req.seed, 3, largest_tile, GateLongest(largest_tile));
    // One CTA running every tile is a correctness check the evaluation
    // itself makes; under a sanitizer it would only be slow.
    for (ProblemSpec& s : specs) s.grid_ctas = 0;
    specs.push_back(GateProblem(req.shape, req.seed));
  }
  const int gate_index = int(specs.size()) - 1;
  std::optional<Timing> ref_time;
  absl::StatusOr<std::vector<Problem>> problems = m.MakeProblems(
      std::move(specs), req.shape.op == Op::kBackward, req.seed, gate_index, &ref_time);
  if (!problems.ok()) return problems.status();
  const std::vector<LaunchStep> steps =
      PlanLaunches(req.seed, LaunchPlanOptions{.problems = int(problems->size())});
  if (on_reference) on_reference(ref_time->median_us / 1000.0, int(steps.size()));

  std::vector<Contender> contenders(1);
  contenders[0].candidate = &cand;
  contenders[0].slots.resize(problems->size());
  m.RunSteps(contenders, *problems, steps, o);
  Contender& c = contenders[0];
  EvalResult r = c.verdict ? *std::move(c.verdict) : Impl::Passed(c, Impl::ExtentOfAll(*problems));
  if (r.outcome == Outcome::kVerified) {
    r.message = fmt::format("passed {} checked launches (not timed){}", c.launches, c.notes);
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
  const EvalOptions& o = req.options;
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

  absl::StatusOr<std::vector<ProblemSpec>> specs =
      m.PlanProblems(req, true, {&loaded[0].manifest, &loaded[1].manifest});
  if (!specs.ok()) return specs.status();
  const int timing_index = int(specs->size()) - 1;
  std::optional<Timing> ref_time;
  absl::StatusOr<std::vector<Problem>> problems =
      m.MakeProblems(*std::move(specs), backward, req.seed ^ 0x5bd1e995ull, timing_index, &ref_time);
  if (!problems.ok()) return problems.status();
  // Pairs: as many as the win rule's schedule may take (its cap); the
  // timing stops at the look that decides (core/timing.h EnoughPairs).
  const int pairs = o.rule.look_pairs > 0 ? o.rule.max_pairs : o.iterations;
  const std::vector<LaunchStep> steps = PlanLaunches(
      req.seed ^ 0x5bd1e995ull, LaunchPlanOptions{.problems = int(problems->size()),
                                                  .timing_problem = timing_index,
                                                  .warmup = o.warmup,
                                                  .iterations = pairs,
                                                  .twice = Impl::CornerIndices(*problems)});
  if (on_reference) on_reference(ref_time->median_us / 1000.0, 2 * int(steps.size()));

  std::vector<Contender> contenders(2);
  for (int i = 0; i < 2; ++i) {
    contenders[size_t(i)].candidate = &loaded[i];
    contenders[size_t(i)].slots.resize(problems->size());
  }
  auto enough = [&o](const std::vector<Contender>& cs) {
    const Contender& cand = cs[0];
    const Contender& inc = cs[1];
    if (cand.verdict || inc.verdict) {
      // No pairs to decide on: the one left is timed as an evaluation is.
      const Contender& left = cand.verdict ? inc : cand;
      return left.verdict.has_value() || left.samples.size() >= size_t(std::max(1, o.iterations));
    }
    return EnoughPairs(cand.samples, inc.samples, o.rule);
  };
  m.RunSteps(contenders, *problems, steps, o, enough);
  const SizeExtent extent = Impl::ExtentOfAll(*problems);
  for (int i = 0; i < 2; ++i) {
    Contender& c = contenders[size_t(i)];
    *results[i] = c.verdict ? *std::move(c.verdict) : Impl::Passed(c, extent);
    results[i]->compile = compiled[i];
    results[i]->reference_timing = ref_time;
  }
  if (result.candidate.timing && result.incumbent.timing) {
    // RunSteps launched both once per timed step, so sample i of each is
    // a pair.
    result.comparison = CompareTimings(*result.candidate.timing, *result.incumbent.timing, o.rule);
    for (int i = 0; i < 2; ++i) {
      const Timing& t = *results[i]->timing;
      results[i]->message = fmt::format("retimed interleaved: median {:.2f} us (min {:.2f}, max "
                                        "{:.2f}, n {}){}",
                                        t.median_us, t.min_us, t.max_us, t.samples,
                                        contenders[size_t(i)].notes);
    }
  }
  return result;
}

}  // namespace kforge::eval

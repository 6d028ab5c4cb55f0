#include "server/convert.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <google/protobuf/io/coded_stream.h>
#include <nlohmann/json.hpp>

#include "core/status.h"

namespace kforge::server {
namespace {

// Core's messages start with the field name ("head_dim: ..."); prefixing the
// request path turns them into "shape.head_dim: ...".
absl::Status Prefixed(std::string_view path, const absl::Status& s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), fmt::format("{}.{}", path, std::string(s.message())));
}

constexpr int kMaxNameLength = 200;
constexpr int kMaxShapesPerJob = 256;
constexpr int kMaxJobSeconds = 7 * 24 * 3600;
constexpr int32_t kMaxPageSize = 1000;

}  // namespace

absl::StatusOr<ShapeKey> ShapeFromProto(const v1::Shape& s, std::string_view field,
                                        const ServedLimits& limits) {
  ShapeKey k;
  switch (s.op()) {
    case v1::OP_FORWARD: k.op = Op::kForward; break;
    case v1::OP_BACKWARD:
      if (!limits.backward)
        return Invalid(fmt::format("{}.op", field), "OP_BACKWARD: no backward kernels are served by this server");
      k.op = Op::kBackward;
      break;
    default:
      return Invalid(fmt::format("{}.op", field),
                     fmt::format("{} is not OP_FORWARD or OP_BACKWARD", static_cast<int>(s.op())));
  }
  if (s.dtype() != v1::DTYPE_BF16)
    return Invalid(fmt::format("{}.dtype", field),
                   fmt::format("{} is not a supported dtype (DTYPE_BF16)", static_cast<int>(s.dtype())));
  k.dtype = DType::kBF16;
  k.head_dim = s.head_dim();
  k.heads = s.heads();
  k.kv_heads = s.kv_heads() == 0 ? s.heads() : s.kv_heads();
  k.causal = s.causal();
  k.cross = s.cross();
  k.arch = s.arch();
  k.deterministic = s.deterministic();
  k.batch = s.batch();
  k.max_len_q = s.max_len_q();
  k.total_q = s.total_q();
  k.max_len_k = s.max_len_k();
  k.total_k = s.total_k();

  if (!s.cu_seqlens_k().empty() && s.cu_seqlens_q().empty())
    return Invalid(fmt::format("{}.cu_seqlens_k", field), "given without cu_seqlens_q");
  if (!s.cu_seqlens_q().empty()) {
    if (!s.cu_seqlens_k().empty() && !s.cross())
      return Invalid(fmt::format("{}.cu_seqlens_k", field),
                     "given, but cross is false (self-attention keys use cu_seqlens_q)");
    if (s.cross() && s.cu_seqlens_k().empty())
      return Invalid(fmt::format("{}.cu_seqlens_k", field),
                     "cross-attention with cu_seqlens_q also needs cu_seqlens_k");
    ShapeKey from = k;
    std::span<const int32_t> q(s.cu_seqlens_q().data(), s.cu_seqlens_q().size());
    std::span<const int32_t> kk(s.cu_seqlens_k().data(), s.cu_seqlens_k().size());
    if (absl::Status st = FillLengthStats(q, kk, from); !st.ok()) return Prefixed(field, st);
    // Offsets win, but summary fields that were also given must agree.
    auto agree = [&](std::string_view name, int64_t given, int64_t derived,
                     std::string_view source) -> absl::Status {
      if (given != 0 && given != derived)
        return Invalid(fmt::format("{}.{}", field, name),
                       fmt::format("{} disagrees with {} (which gives {})", given, source, derived));
      return absl::OkStatus();
    };
    for (const auto& st : {agree("batch", k.batch, from.batch, "cu_seqlens_q"),
                           agree("max_len_q", k.max_len_q, from.max_len_q, "cu_seqlens_q"),
                           agree("total_q", k.total_q, from.total_q, "cu_seqlens_q")}) {
      if (!st.ok()) return st;
    }
    if (s.cross()) {
      for (const auto& st : {agree("max_len_k", k.max_len_k, from.max_len_k, "cu_seqlens_k"),
                             agree("total_k", k.total_k, from.total_k, "cu_seqlens_k")}) {
        if (!st.ok()) return st;
      }
    }
    k = from;
  }
  if (absl::Status st = ValidateShapeKey(k); !st.ok()) return Prefixed(field, st);
  if (!k.cross) {
    k.max_len_k = k.max_len_q;
    k.total_k = k.total_q;
  }
  if (!limits.head_dims.empty() && !limits.head_dims.count(k.head_dim)) {
    std::vector<int> dims(limits.head_dims.begin(), limits.head_dims.end());
    return Invalid(fmt::format("{}.head_dim", field),
                   fmt::format("{} is not supported by the served kernels (supported: {})",
                               k.head_dim, fmt::join(dims, ", ")));
  }
  return k;
}

void ShapeToProto(const ShapeKey& k, v1::Shape* out) {
  out->set_op(k.op == Op::kForward ? v1::OP_FORWARD : v1::OP_BACKWARD);
  out->set_dtype(v1::DTYPE_BF16);
  out->set_head_dim(k.head_dim);
  out->set_heads(k.heads);
  out->set_kv_heads(k.kv_heads);
  out->set_causal(k.causal);
  out->set_cross(k.cross);
  out->set_arch(k.arch);
  out->set_deterministic(k.deterministic);
  out->set_batch(k.batch);
  out->set_max_len_q(k.max_len_q);
  out->set_total_q(k.total_q);
  if (k.cross) {
    out->set_max_len_k(k.max_len_k);
    out->set_total_k(k.total_k);
  }
}

namespace {

// The path of the first string field in `bytes` (a `d` on the wire) that
// is not UTF-8, searching nested messages; nullopt when there is none or
// the bytes are not well-formed wire format.
std::optional<std::string> FirstNonUtf8Field(std::string_view bytes,
                                             const google::protobuf::Descriptor* d,
                                             const std::string& prefix, int depth) {
  using google::protobuf::FieldDescriptor;
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  in.SetRecursionLimit(64);
  std::map<int, int> seen;  // occurrences per field number, for repeated indices
  while (const uint32_t tag = in.ReadTag()) {
    const int number = static_cast<int>(tag >> 3);
    const int wire = static_cast<int>(tag & 7);
    const FieldDescriptor* f = d->FindFieldByNumber(number);
    const int index = seen[number]++;
    if (wire == 0) {
      uint64_t v;
      if (!in.ReadVarint64(&v)) return std::nullopt;
    } else if (wire == 1 || wire == 5) {
      if (!in.Skip(wire == 1 ? 8 : 4)) return std::nullopt;
    } else if (wire == 2) {
      uint32_t len = 0;
      std::string payload;
      if (!in.ReadVarint32(&len) || !in.ReadString(&payload, static_cast<int>(len)))
        return std::nullopt;
      if (f == nullptr) continue;
      const std::string path = prefix + f->name() +
                               (f->is_repeated() ? fmt::format("[{}]", index) : std::string());
      if (f->type() == FieldDescriptor::TYPE_STRING && !IsValidUtf8(payload)) return path;
      if (f->type() == FieldDescriptor::TYPE_MESSAGE && depth < 32)
        if (auto inner = FirstNonUtf8Field(payload, f->message_type(), path + ".", depth + 1))
          return inner;
    } else {
      return std::nullopt;  // groups: kforge.proto has none
    }
  }
  return std::nullopt;
}

// Printable ASCII, for versions and capabilities a worker reports.
bool IsPrintableAscii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
}

}  // namespace

absl::Status ParseRequest(std::string_view bytes, size_t max_bytes,
                          google::protobuf::Message* request) {
  const std::string& type = request->GetDescriptor()->name();
  if (bytes.size() > max_bytes)
    return absl::InvalidArgumentError(fmt::format(
        "request: a {} of {} bytes is more than the {} this call accepts", type, bytes.size(),
        max_bytes));
  if (request->ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return absl::OkStatus();
  if (std::optional<std::string> field =
          FirstNonUtf8Field(bytes, request->GetDescriptor(), "", 0))
    return Invalid(*field, "is not valid UTF-8 (string fields carry text)");
  return absl::InvalidArgumentError(fmt::format("request: not a well-formed {}", type));
}

absl::Status ValidateRegistration(const v1::RegisterRequest& req) {
  // UTF-8 is the parser's (ParseRequest); lengths, ranges and forms are here.
  auto text = [](std::string_view field, const std::string& v, size_t max,
                 bool required) -> absl::Status {
    if (required && v.empty()) return Invalid(field, "is required");
    if (v.size() > max) return Invalid(field, fmt::format("is {} bytes, more than {}", v.size(), max));
    if (std::any_of(v.begin(), v.end(), [](char c) { return c >= 0 && c < 0x20; }))
      return Invalid(field, fmt::format("'{}' has control characters", Excerpt(v)));
    return absl::OkStatus();
  };
  auto version = [](std::string_view field, const std::string& v) -> absl::Status {
    if (v.size() > 64 || !IsPrintableAscii(v))
      return Invalid(field, fmt::format("'{}' is not a version (at most 64 printable ASCII "
                                        "characters)",
                                        Excerpt(v)));
    return absl::OkStatus();
  };
  if (absl::Status s = text("worker_name", req.worker_name(), kMaxWorkerNameBytes, true); !s.ok())
    return s;
  const v1::GpuInfo& g = req.gpu();
  if (absl::Status s = ValidateArch(g.arch()); !s.ok())
    return absl::InvalidArgumentError(fmt::format("gpu.{}", std::string(s.message())));
  if (absl::Status s = text("gpu.name", g.name(), kMaxWorkerNameBytes, false); !s.ok()) return s;
  if (!g.compute_capability().empty()) {
    const std::string& cc = g.compute_capability();
    const size_t dot = cc.find('.');
    const bool digits = dot != std::string::npos && dot > 0 && dot + 1 < cc.size() &&
                        cc.size() <= 8 &&
                        cc.find_first_not_of("0123456789.") == std::string::npos &&
                        cc.find('.', dot + 1) == std::string::npos;
    if (!digits)
      return Invalid("gpu.compute_capability",
                     fmt::format("'{}' is not MAJOR.MINOR, e.g. 9.0", Excerpt(cc)));
  }
  if (g.sm_count() < 0 || g.sm_count() > 4096)
    return Invalid("gpu.sm_count", fmt::format("{} is out of range [0, 4096]", g.sm_count()));
  constexpr int64_t kMaxMemory = int64_t{1} << 50;  // 1 PiB
  if (g.memory_bytes() < 0 || g.memory_bytes() > kMaxMemory)
    return Invalid("gpu.memory_bytes",
                   fmt::format("{} is out of range [0, {}]", g.memory_bytes(), kMaxMemory));
  if (absl::Status s = version("gpu.driver_version", g.driver_version()); !s.ok()) return s;
  if (absl::Status s = version("gpu.nvrtc_version", g.nvrtc_version()); !s.ok()) return s;
  constexpr int kMaxCompileArchs = 64;
  if (req.compile_archs_size() > kMaxCompileArchs)
    return Invalid("compile_archs", fmt::format("{} archs; at most {}", req.compile_archs_size(),
                                                kMaxCompileArchs));
  for (int i = 0; i < req.compile_archs_size(); ++i)
    if (absl::Status s = ValidateArch(req.compile_archs(i)); !s.ok())
      return Invalid(fmt::format("compile_archs[{}]", i), std::string(s.message()));
  static const std::set<std::string> kTools = {"memcheck", "racecheck", "synccheck", "initcheck"};
  if (req.sanitizer_tools_size() > 16)
    return Invalid("sanitizer_tools",
                   fmt::format("{} entries; there are {} tools", req.sanitizer_tools_size(),
                               kTools.size()));
  for (int i = 0; i < req.sanitizer_tools_size(); ++i)
    if (!kTools.count(req.sanitizer_tools(i)))
      return Invalid(fmt::format("sanitizer_tools[{}]", i),
                     fmt::format("'{}' is not a compute-sanitizer tool (memcheck, racecheck, "
                                 "synccheck, initcheck)",
                                 Excerpt(req.sanitizer_tools(i), 32)));
  return absl::OkStatus();
}

absl::Status PageTokenError(const absl::Status& store_error) {
  if (!absl::IsInvalidArgument(store_error)) return store_error;
  return Invalid("page_token", "is not a token returned by a previous call");
}

absl::StatusOr<Page> PageFromProto(int32_t page_size, const std::string& page_token) {
  if (page_size < 0 || page_size > kMaxPageSize)
    return Invalid("page_size", fmt::format("{} is out of range [0, {}]", page_size, kMaxPageSize));
  // Each list's store has its own token form (row numbers, bucket|arch for
  // shapes) and checks it; here only what no token ever is: long, or not
  // printable ASCII.
  if (page_token.size() > kMaxPageTokenBytes ||
      std::any_of(page_token.begin(), page_token.end(),
                  [](char c) { return c < 0x20 || c > 0x7e; }))
    return Invalid("page_token", "is not a token returned by a previous call");
  Page p;
  if (page_size > 0) p.limit = page_size;
  p.token = page_token;
  return p;
}

absl::StatusOr<JobSpec> JobSpecFromProto(const v1::SubmitJobRequest& req,
                                         const ServedLimits& limits) {
  JobSpec spec;
  if (req.name().size() > kMaxNameLength)
    return Invalid("name", fmt::format("is {} bytes long; at most {}", req.name().size(),
                                       kMaxNameLength));
  spec.name = req.name();
  if (req.shapes().empty()) return Invalid("shapes", "at least one shape is needed");
  if (req.shapes().size() > kMaxShapesPerJob)
    return Invalid("shapes", fmt::format("{} shapes; at most {} per job", req.shapes().size(),
                                         kMaxShapesPerJob));
  for (int i = 0; i < req.shapes().size(); ++i) {
    auto k = ShapeFromProto(req.shapes(i), fmt::format("shapes[{}]", i), limits);
    if (!k.ok()) return k.status();
    spec.shapes.push_back(*std::move(k));
    // Offsets, already checked against the statistics by ShapeFromProto.
    const v1::Shape& s = req.shapes(i);
    spec.lengths.push_back(ShapeLengths{{s.cu_seqlens_q().begin(), s.cu_seqlens_q().end()},
                                        {s.cu_seqlens_k().begin(), s.cu_seqlens_k().end()}});
  }
  if (std::all_of(spec.lengths.begin(), spec.lengths.end(),
                  [](const ShapeLengths& l) { return l.empty(); })) {
    spec.lengths.clear();
  }
  spec.proposer = req.proposer().empty() ? "builtin" : req.proposer();
  // A name, with the models a job chooses after ':' ("model:mini,big").
  if (spec.proposer.size() > 128 ||
      spec.proposer.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:,") !=
          std::string::npos)
    return Invalid("proposer", fmt::format("'{}' is not a proposer name (builtin, model, model:<names>, hybrid)",
                                           spec.proposer.substr(0, 128)));
  const auto& b = req.budget();
  if (b.max_variants() < 0 || b.max_variants() > kMaxVariantsLimit)
    return Invalid("budget.max_variants",
                   fmt::format("{} is out of range [0, {}]", b.max_variants(), kMaxVariantsLimit));
  if (b.max_seconds() < 0 || b.max_seconds() > kMaxJobSeconds)
    return Invalid("budget.max_seconds",
                   fmt::format("{} is out of range [0, {}]", b.max_seconds(), kMaxJobSeconds));
  if (b.max_tokens() < 0)
    return Invalid("budget.max_tokens", fmt::format("{} is negative", b.max_tokens()));
  spec.max_variants = b.max_variants() == 0 ? kDefaultMaxVariants : b.max_variants();
  spec.max_seconds = b.max_seconds();
  spec.max_tokens = b.max_tokens();
  if (!(b.max_cost_usd() >= 0) || std::isinf(b.max_cost_usd()))
    return Invalid("budget.max_cost_usd", fmt::format("{} is not a non-negative number", b.max_cost_usd()));
  spec.max_cost_usd = b.max_cost_usd();
  spec.seed = req.seed();
  spec.compile_only = req.compile_only();
  return spec;
}

v1::JobState JobStateToProto(JobState s) {
  switch (s) {
    case JobState::kQueued: return v1::JOB_STATE_QUEUED;
    case JobState::kRunning: return v1::JOB_STATE_RUNNING;
    case JobState::kSucceeded: return v1::JOB_STATE_SUCCEEDED;
    case JobState::kFailed: return v1::JOB_STATE_FAILED;
    case JobState::kCancelled: return v1::JOB_STATE_CANCELLED;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

void TimingToProto(const Timing& t, v1::Timing* out, const std::string& measured_by) {
  out->set_median_us(t.median_us);
  out->set_min_us(t.min_us);
  out->set_max_us(t.max_us);
  out->set_samples(t.samples);
  out->set_p25_us(t.p25_us);
  out->set_p75_us(t.p75_us);
  out->set_measured_by(measured_by);
}

absl::StatusOr<Timing> TimingFromProto(const v1::Timing& t, std::string_view field) {
  if (t.samples_us_size() == 0) {
    return Timing{.median_us = t.median_us(),
                  .min_us = t.min_us(),
                  .max_us = t.max_us(),
                  .samples = t.samples(),
                  .p25_us = t.p25_us(),
                  .p75_us = t.p75_us()};
  }
  if (t.samples_us_size() > kMaxTimingSamples)
    return Invalid(fmt::format("{}.samples_us", field),
                   fmt::format("holds {} samples, more than {}", t.samples_us_size(),
                               kMaxTimingSamples));
  if (t.samples() != 0 && t.samples() != t.samples_us_size())
    return Invalid(fmt::format("{}.samples", field),
                   fmt::format("is {} but samples_us holds {}", t.samples(), t.samples_us_size()));
  std::vector<double> samples(t.samples_us().begin(), t.samples_us().end());
  for (double v : samples) {
    if (!std::isfinite(v) || v <= 0)
      return Invalid(fmt::format("{}.samples_us", field), "times must be finite and positive");
  }
  return Summarize(std::move(samples));
}

void JobToProto(const JobView& job, v1::Job* out) {
  out->set_id(job.record.id);
  out->set_name(job.record.name);
  out->set_state(JobStateToProto(job.record.state));
  out->set_proposer(job.record.proposer);
  out->mutable_budget()->set_max_variants(job.spec.max_variants);
  out->mutable_budget()->set_max_seconds(job.spec.max_seconds);
  out->mutable_budget()->set_max_tokens(job.spec.max_tokens);
  out->mutable_budget()->set_max_cost_usd(job.spec.max_cost_usd);
  for (const auto& s : job.spec.shapes) ShapeToProto(s, out->add_shapes());
  for (const auto& p : job.progress) {
    auto* jp = out->add_progress();
    jp->set_bucket(p.bucket);
    jp->set_proposed(p.proposed);
    jp->set_evaluated(p.evaluated);
    jp->set_verified(p.verified);
    jp->set_failed(p.failed);
    jp->set_compiled(p.compiled);
    jp->set_best_variant_id(p.best_variant_id);
    if (!p.best_variant_id.empty()) TimingToProto(p.best_timing, jp->mutable_best_timing());
  }
  out->set_tokens_used(job.record.tokens_used);
  out->set_created_at(FormatUnixMs(job.record.created_unix_ms));
  out->set_updated_at(FormatUnixMs(job.record.updated_unix_ms));
  out->set_message(job.record.message);
  out->set_seed(job.record.seed);
  out->set_compile_only(job.spec.compile_only);
  out->set_waiting_for(job.waiting_for);
}

void ProvenanceToProto(const VariantRecord& v, v1::Provenance* out) {
  out->set_origin(v.origin);
  out->set_template_name(v.template_name);
  out->set_knobs_json(v.knobs_json);
  out->set_model(v.model);
  out->set_prompt_hash(v.prompt_hash);
  out->set_parent_variant_id(v.parent_id);
  out->set_job_id(v.job_id);
}

void ManifestToProto(const std::string& manifest_json, v1::LaunchManifest* out) {
  using nlohmann::json;
  out->set_json(manifest_json);
  json j = json::parse(manifest_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return;
  auto int_of = [&](const json& o, const char* key) -> int64_t {
    auto it = o.find(key);
    return it != o.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
  };
  auto str_of = [&](const char* key) -> std::string {
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  out->set_entry_point(str_of("entry_point"));
  out->set_threads_per_block(static_cast<int32_t>(int_of(j, "threads")));
  out->set_dynamic_smem_bytes(static_cast<int32_t>(int_of(j, "dynamic_smem_bytes")));
  const std::string grid = str_of("grid");
  out->set_grid_policy(grid == "persistent" ? v1::GRID_POLICY_PERSISTENT
                       : grid == "per_tile" || grid.empty() ? v1::GRID_POLICY_PER_TILE
                                                            : v1::GRID_POLICY_UNSPECIFIED);
  out->set_tile_m(static_cast<int32_t>(int_of(j, "tile_m")));
  out->set_tile_n(static_cast<int32_t>(int_of(j, "tile_n")));
  if (auto w = j.find("workspace"); w != j.end() && w->is_object()) {
    out->set_workspace_bytes_fixed(int_of(*w, "fixed_bytes"));
    out->set_workspace_bytes_per_tile(int_of(*w, "per_tile_bytes"));
  }
  auto strings = [&](const char* key, auto* field) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_array()) return;
    for (const auto& e : *it)
      if (e.is_string()) field->Add(e.get<std::string>());
  };
  strings("archs", out->mutable_archs());
  strings("features", out->mutable_features());
  if (auto it = j.find("head_dims"); it != j.end() && it->is_array()) {
    for (const auto& e : *it)
      if (e.is_number_integer()) out->add_head_dims(e.get<int32_t>());
  }
}

absl::StatusOr<Outcome> OutcomeFromProto(v1::EvalOutcome o) {
  switch (o) {
    case v1::EVAL_OUTCOME_COMPILED: return Outcome::kCompiled;
    case v1::EVAL_OUTCOME_COMPILE_ERROR: return Outcome::kCompileError;
    case v1::EVAL_OUTCOME_WRONG: return Outcome::kWrong;
    case v1::EVAL_OUTCOME_CRASHED: return Outcome::kCrashed;
    case v1::EVAL_OUTCOME_TIMEOUT: return Outcome::kTimeout;
    case v1::EVAL_OUTCOME_VERIFIED: return Outcome::kVerified;
    default:
      return Invalid("result.outcome",
                     fmt::format("{} is not a known outcome", static_cast<int>(o)));
  }
}

v1::TaskKind TaskKindToProto(TaskKind k) {
  switch (k) {
    case TaskKind::kEvaluate: return v1::TASK_KIND_EVALUATE;
    case TaskKind::kRetime: return v1::TASK_KIND_RETIME;
    case TaskKind::kCompile: return v1::TASK_KIND_COMPILE;
    case TaskKind::kConfirm: return v1::TASK_KIND_CONFIRM;
  }
  return v1::TASK_KIND_UNSPECIFIED;
}

absl::StatusOr<SizeExtent> ExtentFromProto(const v1::SizeExtent& e, std::string_view field) {
  const std::pair<const char*, int64_t> values[] = {
      {"batch", e.batch()},         {"max_len_q", e.max_len_q()}, {"max_len_k", e.max_len_k()},
      {"total_q", e.total_q()},     {"total_k", e.total_k()}};
  for (const auto& [name, v] : values) {
    if (v < 0) return Invalid(fmt::format("{}.{}", field, name), fmt::format("{} is negative", v));
  }
  SizeExtent out{.batch = e.batch(),
                 .max_len_q = e.max_len_q(),
                 .max_len_k = e.max_len_k(),
                 .total_q = e.total_q(),
                 .total_k = e.total_k()};
  // Past core's limits no request can be: the extent is capped there.
  out.batch = std::min(out.batch, kMaxBatch);
  out.max_len_q = std::min(out.max_len_q, kMaxSeqLen);
  out.max_len_k = std::min(out.max_len_k, kMaxSeqLen);
  out.total_q = std::min(out.total_q, kMaxTotalTokens);
  out.total_k = std::min(out.total_k, kMaxTotalTokens);
  return out;
}

SizeExtent ExtentOf(const ShapeKey& key) {
  return SizeExtent{.batch = key.batch,
                    .max_len_q = key.max_len_q,
                    .max_len_k = key.cross ? key.max_len_k : key.max_len_q,
                    .total_q = key.total_q,
                    .total_k = key.cross ? key.total_k : key.total_q};
}

std::string FormatUnixMs(int64_t unix_ms) {
  if (unix_ms <= 0) return "";
  std::time_t secs = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     unix_ms % 1000);
}

void WorkerToProto(const WorkerRecord& w, int64_t last_seen_unix_ms, bool connected,
                   v1::Worker* out) {
  out->set_id(w.id);
  out->set_name(w.name);
  out->set_arch(w.arch);
  out->set_compile_only(w.compile_only);
  out->set_principal(w.principal);
  out->set_state(connected ? v1::WORKER_STATE_CONNECTED : v1::WORKER_STATE_DISCONNECTED);
  out->set_last_seen_unix_ms(last_seen_unix_ms);
  if (last_seen_unix_ms > 0) out->set_last_seen(FormatUnixMs(last_seen_unix_ms));
  v1::GpuInfo* gpu = out->mutable_gpu();
  gpu->set_arch(w.arch);
  const nlohmann::json j = nlohmann::json::parse(w.gpu_json, nullptr, false);
  if (j.is_object()) {
    auto str = [&](const char* k) {
      auto it = j.find(k);
      return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    auto num = [&](const char* k) {
      auto it = j.find(k);
      return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : int64_t{0};
    };
    gpu->set_name(str("name"));
    gpu->set_compute_capability(str("compute_capability"));
    gpu->set_sm_count(static_cast<int32_t>(num("sm_count")));
    gpu->set_memory_bytes(num("memory_bytes"));
    gpu->set_driver_version(str("driver_version"));
    gpu->set_nvrtc_version(str("nvrtc_version"));
  }
  for (const auto& t : w.sanitizer_tools) out->add_sanitizer_tools(t);
  for (const auto& a : w.compile_archs) out->add_compile_archs(a);
}

}  // namespace kforge::server

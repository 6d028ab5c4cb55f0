// kforge: the command-line client of kforge-server.
//
//   kforge get --head-dim 128 --heads 4 --batch 128 --max-len-q 4096 --total-q 500000
//   kforge get --head-dim 128 --heads 4 --cu-seqlens-file lens.json --out ./k
//   kforge tune --shapes bench/shapes.json --max-variants 32
//   kforge jobs | kforge jobs show j3 | kforge jobs cancel j3
//   kforge variants [--bucket B] | kforge shapes [--arch sm_90a]
//   kforge export --arch sm_90a --out kernels.kfpack   (every best, for the runtime offline)
//   kforge workers                                      (registered workers, connected or not)
//   kforge health [--service kforge.v1.KernelService]   (exit 0 when serving: probes)
//
// Tables by default, --json for scripts. --server (env KFORGE_SERVER); the
// token from env KFORGE_TOKEN or --token-file, never a flag; TLS with
// --tls-ca (env KFORGE_TLS_CA), needed for a server that is not on
// loopback unless --allow-plaintext. Exit status: 0 ok, 1 server/RPC error,
// 2 usage.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "core/lengths.h"
#include "core/secrets.h"
#include "core/transport.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gpu/gpu.h"
#include "kforge/v1/kforge.grpc.pb.h"
#include "kforge/version.h"
#include "pack/proto.h"

namespace v1 = kforge::v1;
using nlohmann::json;

namespace {

struct Globals {
  std::string server = "127.0.0.1:50051";
  std::string token;       // KFORGE_TOKEN or --token-file (ResolveConnection)
  std::string token_file;
  std::string flag_token;  // the old --token, refused
  kforge::ClientTlsFiles tls;
  kforge::ClientTlsPem tls_pem;  // read by ResolveConnection
  bool allow_plaintext = false;
  bool json = false;
  int timeout_s = 30;
};

struct ShapeFlags {
  std::string op = "fwd";
  int head_dim = 0, heads = 0, kv_heads = 0;
  bool causal = false, cross = false;
  bool deterministic = false;  // backward only
  std::string arch;  // "": the local GPU's (LocalArch)
  int64_t batch = 0, max_len_q = 0, total_q = 0, max_len_k = 0, total_k = 0;
  std::string cu_q_file, cu_k_file;
};

// An error already explained to the user; main() turns it into exit status.
struct Failure {
  int code;
  std::string message;
};

// The arch of GPU 0 as the driver sees it (CUDA_VISIBLE_DEVICES applies);
// sm_90a, the arch kforge is tuned on, when this machine has no GPU.
std::string LocalArch() {
  absl::StatusOr<std::unique_ptr<kforge::gpu::Driver>> driver = kforge::gpu::Driver::Load();
  if (driver.ok()) {
    absl::StatusOr<int> n = (*driver)->DeviceCount();
    if (n.ok() && *n > 0) {
      absl::StatusOr<kforge::gpu::DeviceInfo> info = (*driver)->GetDeviceInfo(0);
      if (info.ok() && !info->arch.empty()) return info->arch;
    }
  }
  return "sm_90a";
}

// Enum values as the tables print them: JOB_STATE_RUNNING -> "running",
// WORKER_STATE_CONNECTED -> "connected" (the enum's prefix dropped, lower
// case), so a script reads the words a person sees.
bool TableEnum(const google::protobuf::EnumDescriptor* e) {
  return e->full_name() == "kforge.v1.JobState" || e->full_name() == "kforge.v1.WorkerState";
}

std::string TableEnumName(const google::protobuf::EnumDescriptor* e, const std::string& value) {
  std::string prefix = e->name();  // JobState -> JOB_STATE_
  std::string upper;
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (i > 0 && std::isupper(static_cast<unsigned char>(prefix[i]))) upper += '_';
    upper += static_cast<char>(std::toupper(static_cast<unsigned char>(prefix[i])));
  }
  upper += '_';
  std::string n = value.rfind(upper, 0) == 0 ? value.substr(upper.size()) : value;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  return n;
}

// proto3 JSON writes 64-bit integers as strings (the spec's guard for
// JavaScript, whose numbers are doubles). Scripts reading kforge's --json
// (jq, Python) compare them as numbers, so every 64-bit integer field is
// turned back into a JSON number, walking the message's descriptor: only
// fields declared int64/uint64 (and their fixed/sint forms) change. The
// same walk gives state enums their table names (TableEnum).
void Int64sAsNumbers(json& j, const google::protobuf::Descriptor* d) {
  using FD = google::protobuf::FieldDescriptor;
  if (!j.is_object()) return;
  for (int i = 0; i < d->field_count(); ++i) {
    const FD* f = d->field(i);
    auto it = j.find(f->name());
    if (it == j.end()) continue;
    auto convert = [&](json& v) {
      if (f->cpp_type() == FD::CPPTYPE_MESSAGE) {
        Int64sAsNumbers(v, f->message_type());
      } else if (v.is_string() && f->cpp_type() == FD::CPPTYPE_INT64) {
        v = std::stoll(v.get<std::string>());
      } else if (v.is_string() && f->cpp_type() == FD::CPPTYPE_UINT64) {
        v = std::stoull(v.get<std::string>());
      } else if (v.is_string() && f->cpp_type() == FD::CPPTYPE_ENUM && TableEnum(f->enum_type())) {
        v = TableEnumName(f->enum_type(), v.get<std::string>());
      }
    };
    if (f->is_map()) continue;  // none in kforge.proto
    if (f->is_repeated() && it->is_array()) {
      for (json& v : *it) convert(v);
    } else {
      convert(*it);
    }
  }
}

// --json: proto field names, every field (defaults included: tuned false,
// counts 0, empty lists) and 64-bit integers as numbers. `indent` < 0: one line.
std::string ToJson(const google::protobuf::Message& m, int indent = 2) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;  // protobuf 3.21 (Debian 12); later: always_print_fields_with_no_presence
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  json j = json::parse(out, nullptr, false);
  if (j.is_discarded()) return out;
  Int64sAsNumbers(j, m.GetDescriptor());
  return j.dump(indent);
}

class Client {
 public:
  explicit Client(const Globals& g) : g_(g) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(256 << 20);
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    if (!g.tls_pem.ca.empty()) {
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = g.tls_pem.ca;
      ssl.pem_cert_chain = g.tls_pem.cert;
      ssl.pem_private_key = g.tls_pem.key;
      creds = grpc::SslCredentials(ssl);
      if (!g.tls_pem.server_name.empty()) args.SetSslTargetNameOverride(g.tls_pem.server_name);
    }
    channel_ = grpc::CreateCustomChannel(g.server, creds, args);
    stub_ = v1::KernelService::NewStub(channel_);
  }

  std::unique_ptr<grpc::ClientContext> Ctx(int timeout_s = -1) const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (!g_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + g_.token);
    const int t = timeout_s < 0 ? g_.timeout_s : timeout_s;
    if (t > 0) ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(t));
    return ctx;
  }

  // Turns a failed RPC into a message a person can act on.
  void Check(const grpc::Status& s, const char* what) const {
    if (s.ok()) return;
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
        (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
         channel_->GetState(false) != GRPC_CHANNEL_READY))
      throw Failure{1, fmt::format("cannot reach kforge-server at {}: {}", g_.server,
                                   s.error_message())};
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED)
      throw Failure{1, fmt::format("{}: {} (set KFORGE_TOKEN or pass --token-file)", what,
                                   s.error_message())};
    throw Failure{1, fmt::format("{}: {}", what, s.error_message())};
  }

  v1::KernelService::Stub& stub() { return *stub_; }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }

 private:
  const Globals& g_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KernelService::Stub> stub_;
};

std::vector<int32_t> ReadOffsets(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Failure{2, fmt::format("{}: cannot open", path)};
  std::stringstream buf;
  buf << in.rdbuf();
  std::string text = buf.str();
  // Accept a JSON array or whitespace/comma separated integers.
  std::replace_if(text.begin(), text.end(), [](char c) { return c == ',' || c == '[' || c == ']'; }, ' ');
  std::istringstream is(text);
  std::vector<int32_t> out;
  std::string tok;
  while (is >> tok) {
    char* end = nullptr;
    long long v = std::strtoll(tok.c_str(), &end, 10);
    if (*end != '\0' || v < INT32_MIN || v > INT32_MAX)
      throw Failure{2, fmt::format("{}: '{}' is not a 32-bit integer", path, tok)};
    out.push_back(static_cast<int32_t>(v));
  }
  return out;
}

v1::Shape ShapeFrom(const ShapeFlags& f) {
  v1::Shape s;
  if (f.op == "fwd" || f.op == "forward") s.set_op(v1::OP_FORWARD);
  else if (f.op == "bwd" || f.op == "backward") s.set_op(v1::OP_BACKWARD);
  else throw Failure{2, fmt::format("--op: '{}' is not fwd or bwd", f.op)};
  s.set_dtype(v1::DTYPE_BF16);
  s.set_head_dim(f.head_dim);
  s.set_heads(f.heads);
  s.set_kv_heads(f.kv_heads);
  s.set_causal(f.causal);
  s.set_cross(f.cross || !f.cu_k_file.empty());
  s.set_deterministic(f.deterministic);
  s.set_arch(f.arch);
  s.set_batch(f.batch);
  s.set_max_len_q(f.max_len_q);
  s.set_total_q(f.total_q);
  s.set_max_len_k(f.max_len_k);
  s.set_total_k(f.total_k);
  if (!f.cu_q_file.empty())
    for (int32_t v : ReadOffsets(f.cu_q_file)) s.add_cu_seqlens_q(v);
  if (!f.cu_k_file.empty())
    for (int32_t v : ReadOffsets(f.cu_k_file)) s.add_cu_seqlens_k(v);
  return s;
}

void AddShapeFlags(CLI::App* cmd, ShapeFlags& f) {
  cmd->add_option("--op", f.op, "fwd | bwd")->capture_default_str();
  cmd->add_option("--head-dim", f.head_dim, "head dimension");
  cmd->add_option("--heads", f.heads, "query heads");
  cmd->add_option("--kv-heads", f.kv_heads, "key/value heads (default: heads)");
  cmd->add_flag("--causal", f.causal, "causal mask (bottom-right aligned)");
  cmd->add_flag("--cross", f.cross, "separate key lengths");
  cmd->add_flag("--deterministic", f.deterministic,
                "backward only: a bitwise reproducible kernel (a bucket of its own)");
  cmd->add_option("--arch", f.arch, "GPU architecture (default: the local GPU's, else sm_90a)");
  cmd->add_option("--batch", f.batch, "sequences in the batch");
  cmd->add_option("--max-len-q", f.max_len_q, "longest query sequence");
  cmd->add_option("--total-q", f.total_q, "query tokens in the batch");
  cmd->add_option("--max-len-k", f.max_len_k, "longest key sequence (cross)");
  cmd->add_option("--total-k", f.total_k, "key tokens in the batch (cross)");
  cmd->add_option("--cu-seqlens-file", f.cu_q_file, "query offsets (B+1 ints, JSON or text)");
  cmd->add_option("--cu-seqlens-k-file", f.cu_k_file, "key offsets (cross)");
}

// bench/shapes.json: entries {"name","B","H","D","q":{dist...},"kv":"same"|{dist},
// "causal"}, optionally "KVH" (key/value heads), "op" ("bwd") and
// "deterministic" (backward). Lengths are drawn from the
// distribution by the one rule (core/lengths.h, seed 1 per shape: the
// batches bench/ and the anchors time) and summarised; entries may also give
// the Shape fields directly (head_dim, batch, ...).
// Entries with "lq" (and "lk" when "kv" is not "same") lists of lengths, as
// bench/attention/lengths.py writes them, are sent as exact offsets: the
// workers then time every candidate on exactly that batch.
std::vector<v1::Shape> ShapesFromFile(const std::string& path, const std::string& arch) {
  std::ifstream in(path);
  if (!in) throw Failure{2, fmt::format("{}: cannot open", path)};
  json j = json::parse(in, nullptr, false);
  if (j.is_object() && j.contains("shapes")) j = j["shapes"];
  if (!j.is_array()) throw Failure{2, fmt::format("{}: expected a JSON array of shapes", path)};
  std::vector<v1::Shape> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const json& e = j[i];
    if (!e.is_object()) throw Failure{2, fmt::format("{}: shape {} is not an object", path, i)};
    try {
      v1::Shape s;
      s.set_op(e.value("op", "fwd") == "bwd" ? v1::OP_BACKWARD : v1::OP_FORWARD);
      s.set_dtype(v1::DTYPE_BF16);
      s.set_head_dim(e.contains("D") ? e["D"].get<int>() : e.value("head_dim", 0));
      s.set_heads(e.contains("H") ? e["H"].get<int>() : e.value("heads", 0));
      s.set_kv_heads(e.contains("KVH") ? e["KVH"].get<int>() : e.value("kv_heads", 0));
      s.set_causal(e.value("causal", false));
      s.set_deterministic(e.value("deterministic", false));
      s.set_arch(e.value("arch", arch));
      const int64_t batch = e.contains("B") ? e["B"].get<int64_t>() : e.value("batch", int64_t{0});
      s.set_batch(batch);
      const bool cross = e.contains("kv") && e["kv"].is_object();
      if (e.contains("lq")) {
        auto offsets = [&](const char* name) {
          std::vector<int32_t> cu = {0};
          for (const auto& l : e.at(name)) {
            const int64_t len = l.get<int64_t>();
            if (len < 0) throw Failure{2, fmt::format("{}: shape {}: {} has a negative length", path, i, name)};
            const int64_t end = cu.back() + len;
            if (end > INT32_MAX) throw Failure{2, fmt::format("{}: shape {}: {} sums past 2^31 tokens", path, i, name)};
            cu.push_back(static_cast<int32_t>(end));
          }
          return cu;
        };
        const std::vector<int32_t> cu_q = offsets("lq");
        s.mutable_cu_seqlens_q()->Add(cu_q.begin(), cu_q.end());
        s.set_batch(static_cast<int64_t>(cu_q.size()) - 1);
        s.set_cross(cross);
        if (cross) {
          const std::vector<int32_t> cu_k = offsets("lk");
          s.mutable_cu_seqlens_k()->Add(cu_k.begin(), cu_k.end());
        }
      } else if (e.contains("q")) {
        absl::StatusOr<kforge::DrawnLengths> drawn = kforge::DrawShapeLengths(e);
        if (!drawn.ok())
          throw Failure{2, fmt::format("{}: shape {}: {}", path, i, std::string(drawn.status().message()))};
        auto summarise = [](const std::vector<int64_t>& lengths, int64_t* max_len, int64_t* total) {
          *max_len = 0;
          *total = 0;
          for (int64_t len : lengths) {
            *max_len = std::max(*max_len, len);
            *total += len;
          }
        };
        int64_t mx = 0, tot = 0;
        summarise(drawn->q, &mx, &tot);
        s.set_max_len_q(mx);
        s.set_total_q(tot);
        if (drawn->cross) {
          summarise(drawn->k, &mx, &tot);
          s.set_cross(true);
          s.set_max_len_k(mx);
          s.set_total_k(tot);
        }
      } else {
        s.set_max_len_q(e.value("max_len_q", int64_t{0}));
        s.set_total_q(e.value("total_q", int64_t{0}));
        s.set_cross(e.value("cross", false));
        s.set_max_len_k(e.value("max_len_k", int64_t{0}));
        s.set_total_k(e.value("total_k", int64_t{0}));
      }
      out.push_back(std::move(s));
    } catch (const json::exception& ex) {
      throw Failure{2, fmt::format("{}: shape {}: {}", path, i, ex.what())};
    }
  }
  return out;
}

std::string StateName(v1::JobState s) {
  std::string n = v1::JobState_Name(s);
  if (n.rfind("JOB_STATE_", 0) == 0) n = n.substr(10);
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  return n;
}

std::string WorkerStateName(v1::WorkerState s) {
  std::string n = v1::WorkerState_Name(s);
  if (n.rfind("WORKER_STATE_", 0) == 0) n = n.substr(13);
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  return n;
}

void PrintWorkers(const v1::ListWorkersResponse& resp) {
  constexpr const char* kRow = "{:<6} {:<16} {:<8} {:<7} {:<12} {:<24} {:<20} {:<12} {:<10} {}\n";
  fmt::print(kRow, "ID", "NAME", "ARCH", "KIND", "STATE", "LAST SEEN", "GPU", "PRINCIPAL",
             "SANITIZERS", "GPU USE");
  for (const auto& w : resp.workers()) {
    std::string tools;
    for (const auto& t : w.sanitizer_tools()) tools += (tools.empty() ? "" : ",") + t;
    fmt::print(kRow, w.id(), w.name(), w.arch(), w.compile_only() ? "compile" : "gpu",
               WorkerStateName(w.state()), w.last_seen().empty() ? "-" : w.last_seen(),
               w.gpu().name().empty() ? "-" : w.gpu().name(),
               w.principal().empty() ? "-" : w.principal(), tools.empty() ? "-" : tools,
               w.has_gpu_usage() ? fmt::format("{:.0f}%", w.gpu_usage().utilization() * 100)
                                 : "-");
  }
}

std::string Us(const v1::Timing& t) {
  return t.median_us() > 0 ? fmt::format("{:.1f} us", t.median_us()) : "-";
}

void PrintJob(const v1::Job& job) {
  fmt::print("job {}  {}  state={}  proposer={}  seed={}{}\n", job.id(), job.name(),
             StateName(job.state()), job.proposer(), job.seed(),
             job.compile_only() ? "  compile-only" : "");
  fmt::print("created {}  updated {}  tokens {}\n", job.created_at(), job.updated_at(),
             job.tokens_used());
  if (!job.waiting_for().empty()) fmt::print("waiting: {}\n", job.waiting_for());
  if (!job.message().empty()) fmt::print("message: {}\n", job.message());
  // A compile-only job runs nothing, so nothing is verified: its table
  // counts what compiled instead.
  const bool compiled = job.compile_only();
  fmt::print("{:<76} {:>5} {:>5} {:>8} {:>5}  {:<8} {}\n", "BUCKET", "PROP", "EVAL",
             compiled ? "COMPILED" : "OK", "FAIL", "BEST", "TIME");
  for (const auto& p : job.progress())
    fmt::print("{:<76} {:>5} {:>5} {:>8} {:>5}  {:<8} {}\n", p.bucket(), p.proposed(),
               p.evaluated(), compiled ? p.compiled() : p.verified(), p.failed(),
               p.best_variant_id().empty() ? "-" : p.best_variant_id(), Us(p.best_timing()));
}

void ProgressLine(const v1::Job& job, const std::string& event, bool tty) {
  int proposed = 0, evaluated = 0, compiled = 0, budget = 0;
  for (const auto& p : job.progress()) {
    proposed += p.proposed();
    evaluated += p.evaluated();
    compiled += p.compiled();
  }
  // While it waits for a worker, that is the news, whatever the last event.
  const std::string msg = job.waiting_for().empty() ? event : job.waiting_for();
  budget = job.budget().max_variants() * std::max(1, job.progress_size());
  const int width = 30;
  const int filled = budget > 0 ? std::min(width, width * evaluated / budget) : 0;
  std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
  const std::string counts =
      job.compile_only() ? fmt::format("{} proposed, {} compiled", proposed, compiled)
                         : fmt::format("{} proposed", proposed);
  std::string line = fmt::format("[{}] {}/{} evaluated ({})  {}  {}", bar, evaluated, budget,
                                 counts, StateName(job.state()), msg.substr(0, 80));
  if (tty) {
    fmt::print("\r\033[K{}", line);
    std::fflush(stdout);
  } else {
    // One line per event, flushed: a file or pipe (a log, `| tee`) sees each
    // line as it happens, not a block of them when stdio's buffer fills.
    fmt::print("{}\n", line);
    std::fflush(stdout);
  }
}

int Watch(Client& c, const Globals& g, const std::string& id) {
  v1::WatchJobRequest req;
  req.set_job_id(id);
  v1::JobEvent ev;
  v1::Job last;
  const bool tty = isatty(STDOUT_FILENO) && !g.json;
  // The server ends a watch with UNAVAILABLE ("watch again") after its
  // max_watch_ms and when it shuts down, as a lost connection does: watch
  // again (each watch starts with the job's current state), giving up after
  // about 50 s without an event.
  constexpr int kMaxQuietRetries = 15;
  for (int quiet = 0;;) {
    auto ctx = c.Ctx(0);  // a watch lasts as long as the job, or the server's max_watch_ms
    auto reader = c.stub().WatchJob(ctx.get(), req);
    while (reader->Read(&ev)) {
      quiet = 0;
      last = ev.job();
      if (g.json) {
        fmt::print("{}\n", ToJson(ev, -1));
        std::fflush(stdout);
      } else {
        ProgressLine(ev.job(), ev.message(), tty);
      }
    }
    const grpc::Status s = reader->Finish();
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE && quiet < kMaxQuietRetries) {
      const int pause_ms = std::min(4000, 250 << std::min(quiet, 4));
      ++quiet;
      std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
      continue;
    }
    c.Check(s, "watching the job");
    break;
  }
  if (tty) fmt::print("\n");
  if (!g.json) PrintJob(last);
  return last.state() == v1::JOB_STATE_SUCCEEDED ? 0 : 1;
}

// Streams ExportKernels into one pack file (pack/pack.h), written atomically.
int Export(Client& c, const Globals& g, const std::string& arch, const std::string& op,
           const std::string& out) {
  v1::ExportKernelsRequest req;
  req.set_arch(arch);
  if (op == "fwd" || op == "forward") req.set_op(v1::OP_FORWARD);
  else if (op == "bwd" || op == "backward") req.set_op(v1::OP_BACKWARD);
  else if (op != "all") throw Failure{2, fmt::format("--op: '{}' is not fwd, bwd or all", op)};
  kforge::pack::Pack pack;
  pack.created_at = kforge::pack::NowRfc3339();
  pack.origin = fmt::format("kforge-server {}", g.server);
  pack.arch = arch;
  auto ctx = c.Ctx(std::max(g.timeout_s, 300));  // every cubin: allow time
  auto reader = c.stub().ExportKernels(ctx.get(), req);
  v1::ExportedKernel k;
  while (reader->Read(&k))
    pack.entries.push_back(kforge::pack::EntryFromKernel(k.kernel(), k.bucket(),
                                                         kforge::pack::ExtentFromProto(k.extent())));
  c.Check(reader->Finish(), "ExportKernels");
  if (absl::Status s = kforge::pack::WritePackFile(out, pack); !s.ok())
    throw Failure{1, std::string(s.message())};
  size_t bytes = 0;
  for (const auto& e : pack.entries) bytes += e.source.size() + e.cubin.size();
  if (g.json) {
    json j = {{"out", out}, {"kernels", pack.entries.size()}, {"bytes", bytes}, {"buckets", json::array()}};
    for (const auto& e : pack.entries)
      j["buckets"].push_back({{"bucket", e.bucket}, {"variant_id", e.variant_id},
                              {"median_us", e.timing.median_us}});
    fmt::print("{}\n", j.dump());
    return 0;
  }
  fmt::print("{:<76} {:<8} {}\n", "BUCKET", "VARIANT", "TIME");
  for (const auto& e : pack.entries)
    fmt::print("{:<76} {:<8} {}\n", e.bucket, e.variant_id,
               e.timing.median_us > 0 ? fmt::format("{:.1f} us", e.timing.median_us) : "-");
  fmt::print("exported {} kernel(s), {:.1f} KiB of source and cubins, to {}\n",
             pack.entries.size(), double(bytes) / 1024.0, out);
  return 0;
}

// Each subcommand's own flags, as CLI11 fills them. `shape` is shared by
// get and tune, `limit` by the listing commands.
struct GetFlags {
  std::string out_dir;
  bool tune_if_untuned = false;
};

struct TuneFlags {
  std::string shapes_file, name, proposer = "builtin";
  int max_variants = 0, max_seconds = 0;
  int64_t max_tokens = 0;
  double max_cost_usd = 0;
  uint64_t seed = 0;
  bool no_watch = false, compile_only = false;
};

struct ListFlags {
  std::vector<std::string> jobs_args;  // [show|cancel|watch ID]
  int limit = 50;
  std::string bucket;       // variants
  std::string arch_filter;  // shapes
};

struct ExportFlags {
  std::string arch, op = "all", out;
};

struct CommandLine {
  Globals g;
  ShapeFlags shape;
  GetFlags get;
  TuneFlags tune;
  ListFlags list;
  ExportFlags export_flags;
  // The subcommands, to tell which one was given.
  CLI::App *get_cmd = nullptr, *tune_cmd = nullptr, *jobs_cmd = nullptr, *variants_cmd = nullptr,
           *shapes_cmd = nullptr, *export_cmd = nullptr, *workers_cmd = nullptr,
           *health_cmd = nullptr;
  std::string health_service;
};

// --server and --tls-ca default to the environment; the flags override it.
// The token comes from the environment or a file only.
void AddGlobalFlags(CLI::App& app, Globals& g) {
  if (const char* s = std::getenv("KFORGE_SERVER")) g.server = s;
  if (const char* t = std::getenv("KFORGE_TOKEN")) g.token = t;
  if (const char* ca = std::getenv("KFORGE_TLS_CA")) g.tls.ca_file = ca;
  app.set_version_flag("--version", "kforge " KFORGE_VERSION, "print the version and exit");
  app.require_subcommand(1);
  app.fallthrough();  // global flags (--json, --server...) also after the subcommand
  app.add_option("--server", g.server, "kforge-server address (env KFORGE_SERVER)")->capture_default_str();
  app.add_option("--token-file", g.token_file,
                 "file whose first line is the client token (default: env KFORGE_TOKEN)");
  // A token on the command line shows in /proc/<pid>/cmdline and ps.
  app.add_option("--token", g.flag_token)->group("");
  app.add_option("--tls-ca", g.tls.ca_file,
                 "PEM CA bundle the server's certificate must chain to: connect with TLS (env "
                 "KFORGE_TLS_CA)");
  app.add_option("--tls-cert", g.tls.cert_file,
                 "PEM client certificate, for a server that requires one (mTLS)");
  app.add_option("--tls-key", g.tls.key_file, "PEM private key of --tls-cert");
  app.add_option("--tls-server-name", g.tls.server_name,
                 "name the server's certificate must carry (default: the --server host)");
  app.add_flag("--allow-plaintext", g.allow_plaintext,
               "connect without TLS to a server that is not on loopback (another layer encrypts)");
  app.footer("Environment: KFORGE_SERVER, KFORGE_TOKEN (the client token, 32+ characters), "
             "KFORGE_TLS_CA. Tokens are never taken from flags.");
  app.add_flag("--json", g.json, "machine-readable output");
  app.add_option("--timeout", g.timeout_s, "seconds per call")->capture_default_str();
}

CLI::App* AddGetCommand(CLI::App& app, ShapeFlags& shape, GetFlags& f) {
  auto* get = app.add_subcommand("get", "get the kernel for a shape");
  AddShapeFlags(get, shape);
  get->add_option("--out", f.out_dir, "write source, cubin and manifest to this directory");
  get->add_flag("--tune", f.tune_if_untuned, "enqueue tuning when the bucket is untuned");
  return get;
}

CLI::App* AddTuneCommand(CLI::App& app, ShapeFlags& shape, TuneFlags& f) {
  auto* tune = app.add_subcommand("tune", "submit a tuning job and watch it");
  AddShapeFlags(tune, shape);
  tune->add_option("--shapes", f.shapes_file, "shapes JSON file (like bench/shapes.json)");
  tune->add_option("--name", f.name, "job name");
  tune->add_option("--proposer", f.proposer, "builtin | model | model:<names> | hybrid[:<names>]")->capture_default_str();
  tune->add_option("--max-variants", f.max_variants, "variants per shape bucket (0: server default)");
  tune->add_option("--max-seconds", f.max_seconds, "wall-clock budget (0: none)");
  tune->add_option("--max-tokens", f.max_tokens, "model token budget (0: none)");
  tune->add_option("--max-cost-usd", f.max_cost_usd, "model cost budget, estimated from the server's prices (0: none)");
  tune->add_option("--seed", f.seed, "proposer seed");
  tune->add_flag("--no-watch", f.no_watch, "submit and return");
  tune->add_flag("--compile-only", f.compile_only,
                 "only compile the proposals for --arch (no GPU run, no best chosen)");
  return tune;
}

void AddListCommands(CLI::App& app, CommandLine& cl) {
  ListFlags& f = cl.list;
  cl.jobs_cmd = app.add_subcommand("jobs", "list jobs; 'jobs show ID', 'jobs cancel ID', 'jobs watch ID'");
  cl.jobs_cmd->add_option("args", f.jobs_args, "[show|cancel|watch ID]");
  cl.jobs_cmd->add_option("--limit", f.limit, "rows")->capture_default_str();

  cl.variants_cmd = app.add_subcommand("variants", "list kernel variants");
  cl.variants_cmd->add_option("--bucket", f.bucket, "only variants evaluated on this bucket");
  cl.variants_cmd->add_option("--limit", f.limit, "rows")->capture_default_str();

  cl.shapes_cmd = app.add_subcommand("shapes", "list tuned shape buckets and their best");
  cl.shapes_cmd->add_option("--arch", f.arch_filter, "only this architecture");
  cl.shapes_cmd->add_option("--limit", f.limit, "rows")->capture_default_str();
}

CLI::App* AddExportCommand(CLI::App& app, ExportFlags& f) {
  auto* export_cmd = app.add_subcommand("export", "write the server's verified kernels into a kernel pack");
  export_cmd->add_option("--arch", f.arch, "only this architecture (e.g. sm_90a); default: all");
  export_cmd->add_option("--op", f.op, "fwd | bwd | all")->capture_default_str();
  export_cmd->add_option("--out", f.out, "pack file to write")->required();
  return export_cmd;
}

CLI::App* AddWorkersCommand(CLI::App& app) {
  return app.add_subcommand("workers", "list the registered workers and whether they are connected");
}

CLI::App* AddHealthCommand(CLI::App& app, std::string& service) {
  auto* health = app.add_subcommand(
      "health", "ask the server's grpc.health.v1 service; exit 0 when serving (for probes)");
  health->add_option("--service", service,
                     "service to ask about (kforge.v1.KernelService, kforge.v1.WorkerService; "
                     "default: the server as a whole)");
  return health;
}

// The token, the TLS files and the transport rule, before any call: a
// mistake here is a usage error (exit 2), not a failed RPC.
void ResolveConnection(Globals& g, int argc, char** argv) {
  if (!g.flag_token.empty()) {
    kforge::ScrubFromProcessMemory(argc, argv, g.flag_token);
    throw Failure{2, "--token is gone: a token on the command line shows in /proc/<pid>/cmdline "
                     "and ps; set KFORGE_TOKEN or pass --token-file"};
  }
  std::string source = "KFORGE_TOKEN";
  if (!g.token_file.empty()) {
    absl::StatusOr<std::string> t = kforge::ReadTokenFile(g.token_file);
    if (!t.ok()) throw Failure{2, fmt::format("--token-file: {}", std::string(t.status().message()))};
    g.token = *t;
    source = "--token-file " + g.token_file;
  }
  if (!g.token.empty()) {
    if (absl::Status s = kforge::CheckToken(g.token, source); !s.ok())
      throw Failure{2, std::string(s.message())};
  }
  absl::StatusOr<kforge::ClientTlsPem> pem = kforge::ReadClientTls(g.tls);
  if (!pem.ok()) throw Failure{2, std::string(pem.status().message())};
  g.tls_pem = *std::move(pem);
  if (absl::Status s = kforge::CheckPlaintext(g.server, g.tls.enabled(), g.allow_plaintext,
                                              "--tls-ca (or KFORGE_TLS_CA)");
      !s.ok())
    throw Failure{2, fmt::format("--server {}", std::string(s.message()))};
}

// get --out: the kernel's source, manifest and (when served) cubin.
void WriteKernelFiles(const std::string& out_dir, const v1::Kernel& k) {
  std::filesystem::create_directories(out_dir);
  auto write = [&](const std::string& file, const std::string& data) {
    std::ofstream o(std::filesystem::path(out_dir) / file, std::ios::binary);
    o << data;
    if (!o) throw Failure{1, fmt::format("cannot write {}/{}", out_dir, file)};
  };
  write("kernel.cu", k.source());
  write("manifest.json", k.manifest().json());
  if (!k.cubin().empty()) write(fmt::format("kernel.{}.cubin", k.arch()), k.cubin());
}

void PrintKernel(const v1::GetKernelResponse& resp, const std::string& out_dir) {
  const v1::Kernel& k = resp.kernel();
  fmt::print("variant      {}\n", k.variant_id().empty() ? "(seed default)" : k.variant_id());
  fmt::print("tuned        {}\n", k.tuned() ? "yes" : "no");
  fmt::print("requested    {}\n", k.requested_bucket());
  fmt::print("served from  {}\n", k.served_bucket().empty() ? "(seed default)" : k.served_bucket());
  fmt::print("arch         {}\n", k.arch());
  fmt::print("entry        {}  threads {}  smem {} B  tile {}x{}\n",
             k.manifest().entry_point(), k.manifest().threads_per_block(),
             k.manifest().dynamic_smem_bytes(), k.manifest().tile_m(), k.manifest().tile_n());
  fmt::print("timing       {}{}\n", Us(k.timing()),
             k.gpu_name().empty() ? "" : fmt::format(" on {}", k.gpu_name()));
  fmt::print("origin       {} {}\n", k.provenance().origin(),
             k.provenance().template_name().empty() ? k.provenance().model()
                                                   : k.provenance().template_name());
  fmt::print("source       {} bytes, cubin {} bytes\n", k.source().size(), k.cubin().size());
  if (!resp.tuning_job_id().empty()) fmt::print("tuning job   {}\n", resp.tuning_job_id());
  if (!out_dir.empty()) fmt::print("written to   {}\n", out_dir);
}

int RunGet(Client& c, const Globals& g, const ShapeFlags& shape, const GetFlags& f) {
  v1::GetKernelRequest req;
  *req.mutable_shape() = ShapeFrom(shape);
  req.set_tune_if_untuned(f.tune_if_untuned);
  v1::GetKernelResponse resp;
  c.Check(c.stub().GetKernel(c.Ctx().get(), req, &resp), "GetKernel");
  if (!f.out_dir.empty()) WriteKernelFiles(f.out_dir, resp.kernel());
  if (g.json) {
    v1::GetKernelResponse brief = resp;
    brief.mutable_kernel()->clear_cubin();
    brief.mutable_kernel()->clear_source();
    fmt::print("{}\n", ToJson(brief));
  } else {
    PrintKernel(resp, f.out_dir);
  }
  return 0;
}

v1::SubmitJobRequest TuneRequest(const ShapeFlags& shape, const TuneFlags& f) {
  v1::SubmitJobRequest req;
  req.set_name(f.name);
  req.set_proposer(f.proposer);
  req.mutable_budget()->set_max_variants(f.max_variants);
  req.mutable_budget()->set_max_seconds(f.max_seconds);
  req.mutable_budget()->set_max_tokens(f.max_tokens);
  req.mutable_budget()->set_max_cost_usd(f.max_cost_usd);
  req.set_seed(f.seed);
  req.set_compile_only(f.compile_only);
  if (!f.shapes_file.empty()) {
    for (auto& s : ShapesFromFile(f.shapes_file, shape.arch)) *req.add_shapes() = std::move(s);
  } else {
    *req.add_shapes() = ShapeFrom(shape);
  }
  return req;
}

int RunTune(Client& c, const Globals& g, const ShapeFlags& shape, const TuneFlags& f) {
  const v1::SubmitJobRequest req = TuneRequest(shape, f);
  v1::Job job;
  c.Check(c.stub().SubmitJob(c.Ctx().get(), req, &job), "SubmitJob");
  if (f.no_watch) {
    if (g.json) fmt::print("{}\n", ToJson(job));
    else fmt::print("submitted job {} ({} bucket(s))\n", job.id(), job.progress_size());
    return 0;
  }
  if (!g.json) {
    fmt::print("submitted job {} ({} bucket(s)); watching (Ctrl-C stops watching, not the job)\n",
               job.id(), job.progress_size());
    std::fflush(stdout);
  }
  return Watch(c, g, job.id());
}

int ListJobs(Client& c, const Globals& g, int limit) {
  v1::ListJobsRequest req;
  req.set_page_size(limit);
  v1::ListJobsResponse resp;
  c.Check(c.stub().ListJobs(c.Ctx().get(), req, &resp), "ListJobs");
  if (g.json) {
    fmt::print("{}\n", ToJson(resp));
  } else {
    fmt::print("{:<8} {:<10} {:<9} {:>7} {:<24} {:<20} {}\n", "ID", "STATE", "PROPOSER",
               "BUCKETS", "CREATED", "NAME", "NOTE");
    for (const auto& j : resp.jobs())
      fmt::print("{:<8} {:<10} {:<9} {:>7} {:<24} {:<20} {}\n", j.id(), StateName(j.state()),
                 j.proposer(), j.progress_size(), j.created_at(), j.name(), j.waiting_for());
  }
  return 0;
}

// jobs show|cancel|watch ID.
int RunJobAction(Client& c, const Globals& g, const std::string& verb, const std::string& id) {
  if (verb == "watch") return Watch(c, g, id);
  v1::Job job;
  if (verb == "show") {
    v1::GetJobRequest req;
    req.set_job_id(id);
    c.Check(c.stub().GetJob(c.Ctx().get(), req, &job), "GetJob");
  } else if (verb == "cancel") {
    v1::CancelJobRequest req;
    req.set_job_id(id);
    c.Check(c.stub().CancelJob(c.Ctx().get(), req, &job), "CancelJob");
  } else {
    throw Failure{2, fmt::format("jobs: unknown action '{}' (show, cancel, watch)", verb)};
  }
  if (g.json) fmt::print("{}\n", ToJson(job));
  else PrintJob(job);
  return 0;
}

int RunJobs(Client& c, const Globals& g, const ListFlags& f) {
  if (f.jobs_args.empty() || f.jobs_args[0] == "list") return ListJobs(c, g, f.limit);
  if (f.jobs_args.size() != 2) throw Failure{2, "usage: kforge jobs [show|cancel|watch ID]"};
  return RunJobAction(c, g, f.jobs_args[0], f.jobs_args[1]);
}

int RunVariants(Client& c, const Globals& g, const ListFlags& f) {
  v1::ListVariantsRequest req;
  req.set_bucket(f.bucket);
  req.set_page_size(f.limit);
  v1::ListVariantsResponse resp;
  c.Check(c.stub().ListVariants(c.Ctx().get(), req, &resp), "ListVariants");
  if (g.json) {
    fmt::print("{}\n", ToJson(resp));
  } else {
    fmt::print("{:<8} {:<10} {:<12} {:<40} {:>5} {:<14} {}\n", "ID", "ORIGIN", "TEMPLATE",
               "KNOBS", "EVALS", "BEST", "TIME");
    for (const auto& v : resp.variants())
      fmt::print("{:<8} {:<10} {:<12} {:<40} {:>5} {:<14} {}\n", v.variant_id(),
                 v.provenance().origin(), v.provenance().template_name(),
                 v.provenance().knobs_json().substr(0, 40), v.evaluations(),
                 v.best_outcome().empty() ? "-" : v.best_outcome(), Us(v.best_timing()));
  }
  return 0;
}

int RunWorkers(Client& c, const Globals& g) {
  v1::ListWorkersResponse resp;
  c.Check(c.stub().ListWorkers(c.Ctx().get(), v1::ListWorkersRequest(), &resp), "ListWorkers");
  if (g.json) fmt::print("{}\n", ToJson(resp));
  else PrintWorkers(resp);
  return 0;
}

int RunShapes(Client& c, const Globals& g, const ListFlags& f) {
  v1::ListShapesRequest req;
  req.set_arch(f.arch_filter);
  req.set_page_size(f.limit);
  v1::ListShapesResponse resp;
  c.Check(c.stub().ListShapes(c.Ctx().get(), req, &resp), "ListShapes");
  if (g.json) {
    fmt::print("{}\n", ToJson(resp));
  } else {
    fmt::print("{:<76} {:<8} {:<8} {:<12} {}\n", "BUCKET", "ARCH", "BEST", "TIME", "UPDATED");
    for (const auto& s : resp.shapes())
      fmt::print("{:<76} {:<8} {:<8} {:<12} {}\n", s.bucket(), s.arch(), s.best_variant_id(),
                 Us(s.best_timing()), s.updated_at());
  }
  return 0;
}

// Runs the subcommand that was given; a Failure says why it could not.
// Exit 0 when SERVING, 1 otherwise (NOT_SERVING, unreachable, unknown
// service), so that an exec probe or a compose healthcheck can run it.
int RunHealth(Client& c, const Globals& g, const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(c.channel());
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status s = stub->Check(c.Ctx().get(), req, &resp);
  if (!s.ok()) c.Check(s, "Health.Check");
  const bool serving = resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  const std::string state = serving ? "serving"
                            : resp.status() == grpc::health::v1::HealthCheckResponse::NOT_SERVING
                                ? "not_serving"
                                : "unknown";
  if (g.json)
    fmt::print("{}\n", json{{"service", service}, {"status", state}}.dump());
  else
    fmt::print("{} {}\n", service.empty() ? "kforge-server" : service, state);
  return serving ? 0 : 1;
}

int RunCommand(CommandLine& cl) {
  Client c(cl.g);
  if (*cl.health_cmd) return RunHealth(c, cl.g, cl.health_service);
  if (*cl.get_cmd) return RunGet(c, cl.g, cl.shape, cl.get);
  if (*cl.tune_cmd) return RunTune(c, cl.g, cl.shape, cl.tune);
  if (*cl.jobs_cmd) return RunJobs(c, cl.g, cl.list);
  if (*cl.variants_cmd) return RunVariants(c, cl.g, cl.list);
  if (*cl.export_cmd)
    return Export(c, cl.g, cl.export_flags.arch, cl.export_flags.op, cl.export_flags.out);
  if (*cl.workers_cmd) return RunWorkers(c, cl.g);
  if (*cl.shapes_cmd) return RunShapes(c, cl.g, cl.list);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CommandLine cl;
  CLI::App app{"kforge: get tuned jagged attention kernels, run and watch tuning jobs"};
  AddGlobalFlags(app, cl.g);
  cl.get_cmd = AddGetCommand(app, cl.shape, cl.get);
  cl.tune_cmd = AddTuneCommand(app, cl.shape, cl.tune);
  AddListCommands(app, cl);
  cl.export_cmd = AddExportCommand(app, cl.export_flags);
  cl.workers_cmd = AddWorkersCommand(app);
  cl.health_cmd = AddHealthCommand(app, cl.health_service);
  CLI11_PARSE(app, argc, argv);
  // Only commands that send a shape ask the driver (cuInit takes a moment).
  if (cl.shape.arch.empty() && (*cl.get_cmd || *cl.tune_cmd)) cl.shape.arch = LocalArch();

  try {
    ResolveConnection(cl.g, argc, argv);
    return RunCommand(cl);
  } catch (const Failure& f) {
    std::fprintf(stderr, "kforge: %s\n", f.message.c_str());
    return f.code;
  }
}

// server_load_bench: how many tasks a second one kforge-server hands out and
// records, with the workers' own cost taken out.
//
// A load generator, not a worker: N clients speak the worker protocol to a
// running server over real gRPC with a real worker token (each its own
// channel and session, through the worker's own client, worker/rpc_client.h):
// Register as compile-only workers, then LeaseTask and ReportResult as fast
// as the server answers. It submits a compile-only job of --shapes buckets x
// --variants variants (builtin proposer) and counts the reports the server
// accepted in a window after a warm-up.
//
// What the reports say is real but not each task's own: the first task is
// run by the worker's task runner (worker/task_runner.h: the source checks,
// NVRTC for the task's arch, the result a kforge-worker would report), and
// that result, its cubin and ptxas figures, is reported for every task, with
// a message saying so. So the server does all it does for a real report
// (session, lease check, scrubbing, the CompileTask transaction, the job
// engine's Observe and next round, long-poll wake-ups), except that the
// store keeps the one cubin once (content-addressed) where a real fleet's
// distinct cubins would each be written. No heartbeats: a task is reported
// within milliseconds, far inside the lease.
//
// --clients 0 runs no load: it submits the job and counts what real workers
// (started by the caller, e.g. run.sh's compile-only kforge-workers)
// complete in the window, from the job's progress (GetJob).
//
// Tokens: KFORGE_TOKEN (a client token, to submit and cancel the job) and
// KFORGE_WORKER_TOKEN. Prints one line, or one JSON object with --json.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "gpu/compile.h"
#include "gpu/compile_cache.h"
#include "kforge/v1/kforge.grpc.pb.h"
#include "worker/rpc_client.h"
#include "worker/task_runner.h"

namespace v1 = kforge::v1;
namespace kw = kforge::worker;
using Clock = std::chrono::steady_clock;

namespace {

struct Flags {
  std::string server = "127.0.0.1:50051";
  int clients = 1;
  int shapes = 64;
  int variants = 64;
  double warmup_s = 3;
  double seconds = 10;
  int lease_wait_ms = 1000;
  std::string arch = "sm_90a";
  bool fresh_compiles = false;
  bool json = false;
};

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// `n` shapes of distinct buckets: batch and maximum length are rounded to
// powers of two in a bucket id (core/shape.h), so each (batch, length) pair
// of powers of two is a bucket of its own.
//
// With `fresh`, the buckets differ in arch and head dim instead (arch i % 4
// of sm_80, sm_86, sm_89, sm_90a; head dim 64 or 128), at most 8: the
// builtin proposer's candidates are the same in buckets that differ only in
// sizes, and a worker's compile cache answers a program it compiled before,
// but no two of these buckets compile the same program. So every task of
// such a job is an NVRTC compile, for measuring real workers.
std::vector<v1::Shape> Shapes(int n, const std::string& arch, bool fresh) {
  static const char* kArchs[] = {"sm_80", "sm_86", "sm_89", "sm_90a"};
  std::vector<v1::Shape> out;
  for (int i = 0; i < n; ++i) {
    v1::Shape s;
    s.set_op(v1::OP_FORWARD);
    s.set_dtype(v1::DTYPE_BF16);
    s.set_head_dim(fresh && i / 4 % 2 == 1 ? 64 : 128);
    s.set_heads(4);
    s.set_causal(!fresh && i % 2 == 1);
    s.set_arch(fresh ? kArchs[i % 4] : arch);
    if (fresh) {
      s.set_batch(8);
      s.set_max_len_q(512);
      s.set_total_q(2000);
      out.push_back(std::move(s));
      continue;
    }
    const int64_t batch = int64_t{1} << (i / 2 % 8);
    const int64_t len = int64_t{256} << (i / 16 % 8);
    s.set_batch(batch);
    s.set_max_len_q(len);
    s.set_total_q(std::max(len, batch * len / 2));  // at least one sequence of the longest
    out.push_back(std::move(s));
  }
  return out;
}

std::unique_ptr<grpc::ClientContext> ClientCtx(const std::string& token) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->AddMetadata("authorization", "Bearer " + token);
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return ctx;
}

kw::Registration Registration(const std::string& name, const std::string& arch) {
  kw::Registration r;
  r.worker_name = name;
  r.compile_only = true;
  r.gpu.arch = arch;
  r.gpu.nvrtc_version = kforge::gpu::NvrtcVersion();
  return r;
}

// One client's figures inside the window.
struct Counts {
  int64_t reported = 0;      // accepted reports
  int64_t empty_leases = 0;  // long polls that ended without a task
  int64_t errors = 0;
  std::vector<double> lease_ms, report_ms;  // of tasks reported
};

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"server_load_bench: kforge-server tasks/s under a worker-protocol load generator"};
  app.add_option("--server", f.server, "kforge-server address");
  app.add_option("--clients", f.clients,
                 "concurrent worker-protocol clients; 0: none, count real workers' results")
      ->check(CLI::Range(0, 1024));
  app.add_option("--shapes", f.shapes, "buckets in the job")->check(CLI::Range(1, 256));
  app.add_option("--variants", f.variants, "variants per bucket")->check(CLI::Range(1, 10000));
  app.add_option("--warmup-s", f.warmup_s, "seconds before the window");
  app.add_option("--seconds", f.seconds, "the measured window");
  app.add_option("--lease-wait-ms", f.lease_wait_ms, "each LeaseTask's long-poll wait");
  app.add_option("--arch", f.arch, "the job's arch");
  app.add_flag("--fresh-compiles", f.fresh_compiles,
               "buckets of distinct arch and head dim (at most 8), so that no task hits a "
               "worker's compile cache: for real workers (--clients 0)");
  app.add_flag("--json", f.json, "one JSON object");
  CLI11_PARSE(app, argc, argv);
  if (f.fresh_compiles && f.shapes > 8) {
    std::fprintf(stderr, "server_load_bench: --fresh-compiles makes at most 8 buckets\n");
    return 2;
  }
  const std::string client_token = Env("KFORGE_TOKEN");
  const std::string worker_token = Env("KFORGE_WORKER_TOKEN");
  if (client_token.empty() || worker_token.empty()) {
    std::fprintf(stderr, "server_load_bench: set KFORGE_TOKEN and KFORGE_WORKER_TOKEN\n");
    return 2;
  }

  auto channel = grpc::CreateChannel(f.server, grpc::InsecureChannelCredentials());
  auto kernels = v1::KernelService::NewStub(channel);
  v1::SubmitJobRequest submit;
  submit.set_name(fmt::format("server-load x{}", f.clients));
  for (auto& s : Shapes(f.shapes, f.arch, f.fresh_compiles)) *submit.add_shapes() = std::move(s);
  submit.mutable_budget()->set_max_variants(f.variants);
  submit.set_seed(11);
  submit.set_compile_only(true);
  v1::Job job;
  if (grpc::Status s = kernels->SubmitJob(ClientCtx(client_token).get(), submit, &job); !s.ok()) {
    std::fprintf(stderr, "server_load_bench: SubmitJob: %s\n", s.error_message().c_str());
    return 1;
  }

  kw::GrpcClientOptions co;
  co.target = f.server;
  co.token = worker_token;

  v1::GetJobRequest get;
  get.set_job_id(job.id());
  // Results the server recorded for the job so far.
  auto evaluated = [&]() -> int64_t {
    v1::Job j;
    if (!kernels->GetJob(ClientCtx(client_token).get(), get, &j).ok()) return -1;
    int64_t n = 0;
    for (const auto& p : j.progress()) n += p.evaluated();
    return n;
  };
  // Ends the measured job: whether it had already run out of work (then the
  // rate is not the server's limit), after which it is cancelled.
  auto stop_job = [&]() -> bool {
    v1::Job after;
    (void)kernels->GetJob(ClientCtx(client_token).get(), get, &after);
    v1::CancelJobRequest cancel;
    cancel.set_job_id(job.id());
    v1::Job cancelled;
    (void)kernels->CancelJob(ClientCtx(client_token).get(), cancel, &cancelled);
    return after.state() != v1::JOB_STATE_RUNNING;
  };
  if (f.clients == 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(f.warmup_s));
    const int64_t e0 = evaluated();
    const auto w0 = Clock::now();
    std::this_thread::sleep_for(std::chrono::duration<double>(f.seconds));
    const int64_t e1 = evaluated();
    const double window_s = std::chrono::duration<double>(Clock::now() - w0).count();
    const bool ran_out = stop_job();
    const double rate = static_cast<double>(e1 - e0) / window_s;
    nlohmann::json out = {{"clients", 0},          {"tasks_per_s", rate},
                          {"reported", e1 - e0},   {"window_s", window_s},
                          {"job_ran_out", ran_out}};
    if (f.json)
      std::printf("%s\n", out.dump().c_str());
    else
      std::printf("real workers: %.2f tasks/s (%lld results in %.1f s)%s\n", rate,
                  static_cast<long long>(e1 - e0), window_s,
                  ran_out ? "  [the job ran out of work: raise --variants]" : "");
    return ran_out ? 3 : 0;
  }

  // The one real result: the first task through the worker's task runner.
  kw::TaskResult real;
  std::string real_variant;
  {
    auto prime = kw::MakeGrpcServerClient(co);
    auto session = prime->Register(Registration("load-prime", f.arch), std::nullopt);
    if (!session.ok()) {
      std::fprintf(stderr, "server_load_bench: Register: %s\n",
                   std::string(session.status().message()).c_str());
      return 1;
    }
    auto task = prime->LeaseTask(*session, std::chrono::milliseconds(30000));
    if (!task.ok() || !task->has_value()) {
      std::fprintf(stderr, "server_load_bench: no first task to compile\n");
      return 1;
    }
    kforge::gpu::CompilePool pool(1, nullptr);  // in process: our own server's proposals
    kw::RunnerOptions ro;
    ro.gpu = Registration("", f.arch).gpu;
    ro.compile_only = true;
    ro.secrets = {client_token, worker_token};
    kw::LocalTaskRunner runner(&pool, nullptr, ro);
    std::atomic<bool> cancel{false};
    std::optional<kw::TaskResult> r = runner.Run(**task, cancel);
    if (!r || r->worker_fault) {
      std::fprintf(stderr, "server_load_bench: the first compile failed: %s\n",
                   r ? r->message.c_str() : "cancelled");
      return 1;
    }
    if (absl::Status s = prime->ReportResult(*session, (*task)->task_id, *r); !s.ok()) {
      std::fprintf(stderr, "server_load_bench: ReportResult: %s\n",
                   std::string(s.message()).c_str());
      return 1;
    }
    real_variant = (*task)->variant.variant_id;
    real = *std::move(r);
    real.message = fmt::format("load generator (bench/server_load): the result of variant {}'s "
                               "compile, reported for this task: {}",
                               real_variant, real.message);
  }

  std::atomic<bool> stop{false};
  std::atomic<bool> in_window{false};
  std::vector<Counts> counts(f.clients);
  std::vector<std::thread> threads;
  std::atomic<int> registered{0};
  for (int i = 0; i < f.clients; ++i) {
    threads.emplace_back([&, i] {
      auto client = kw::MakeGrpcServerClient(co);
      auto session = client->Register(Registration(fmt::format("load-{}", i), f.arch), std::nullopt);
      if (!session.ok()) {
        ++counts[i].errors;
        return;
      }
      ++registered;
      Counts& c = counts[i];
      while (!stop.load()) {
        const auto t0 = Clock::now();
        auto task = client->LeaseTask(*session, std::chrono::milliseconds(f.lease_wait_ms));
        const auto t1 = Clock::now();
        const bool counting = in_window.load();
        if (!task.ok()) {
          if (counting) ++c.errors;
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          continue;
        }
        if (!task->has_value()) {
          if (counting) ++c.empty_leases;
          continue;
        }
        absl::Status s = client->ReportResult(*session, (*task)->task_id, real);
        const auto t2 = Clock::now();
        if (!in_window.load()) continue;
        if (!s.ok()) {
          ++c.errors;
          continue;
        }
        ++c.reported;
        c.lease_ms.push_back(Ms(t1 - t0));
        c.report_ms.push_back(Ms(t2 - t1));
      }
    });
  }

  std::this_thread::sleep_for(std::chrono::duration<double>(f.warmup_s));
  in_window = true;
  const auto w0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(f.seconds));
  in_window = false;
  const double window_s = std::chrono::duration<double>(Clock::now() - w0).count();
  stop = true;
  for (auto& t : threads) t.join();

  Counts all;
  for (auto& c : counts) {
    all.reported += c.reported;
    all.empty_leases += c.empty_leases;
    all.errors += c.errors;
    all.lease_ms.insert(all.lease_ms.end(), c.lease_ms.begin(), c.lease_ms.end());
    all.report_ms.insert(all.report_ms.end(), c.report_ms.begin(), c.report_ms.end());
  }
  const bool ran_out = stop_job();

  const double rate = static_cast<double>(all.reported) / window_s;
  nlohmann::json out = {
      {"clients", f.clients},
      {"registered", registered.load()},
      {"tasks_per_s", rate},
      {"reported", all.reported},
      {"window_s", window_s},
      {"empty_leases", all.empty_leases},
      {"errors", all.errors},
      {"lease_p50_ms", Percentile(all.lease_ms, 0.5)},
      {"lease_p99_ms", Percentile(all.lease_ms, 0.99)},
      {"report_p50_ms", Percentile(all.report_ms, 0.5)},
      {"report_p99_ms", Percentile(all.report_ms, 0.99)},
      {"job_ran_out", ran_out},
      {"reported_result_of", real_variant},
      {"cubin_bytes", real.compile.cubin.size()},
  };
  if (f.json) {
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("%3d clients: %7.1f tasks/s (%lld in %.1f s; lease p50 %.2f ms p99 %.2f ms, "
                "report p50 %.2f ms p99 %.2f ms; %lld empty long polls, %lld errors)%s\n",
                f.clients, rate, static_cast<long long>(all.reported), window_s,
                out["lease_p50_ms"].get<double>(), out["lease_p99_ms"].get<double>(),
                out["report_p50_ms"].get<double>(), out["report_p99_ms"].get<double>(),
                static_cast<long long>(all.empty_leases), static_cast<long long>(all.errors),
                ran_out ? "  [the job ran out of work: raise --variants]" : "");
  }
  return ran_out ? 3 : 0;
}

// getkernel_bench: load generator for GetKernel.
//
// N client threads (one channel each) call GetKernel for one stored bucket
// over loopback for T seconds and report requests/s and p50/p99/p999
// latency. By default it hosts the server itself: a fresh SQLite file with
// one tuned bucket (a variant with a realistic source and cubin size, an
// evaluation and a best), served by kforge_server on a free port, so the
// figure measures the served-from-memory path. --server ADDR measures an
// external server instead (the shape flags must name a tuned bucket there).
#include <algorithm>
#include <atomic>
#include <mutex>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include "kforge/v1/kforge.grpc.pb.h"
#include "server/jobs.h"
#include "server/server.h"
#include "storage/store.h"

namespace v1 = kforge::v1;

namespace {

constexpr char kToken[] = "bench-client-token-0123456789abcdef0123";

kforge::ShapeKey BenchShape() {
  kforge::ShapeKey k;
  k.head_dim = 128;
  k.heads = 4;
  k.kv_heads = 4;
  k.causal = true;
  k.arch = "sm_90a";
  k.batch = 128;
  k.max_len_q = 4096;
  k.total_q = 128 * 3900;
  k.max_len_k = k.max_len_q;
  k.total_k = k.total_q;
  return k;
}

// Stores one tuned bucket through the Store API, as a worker's report would.
absl::Status Seed(kforge::Store& store, size_t source_bytes, size_t cubin_bytes) {
  const kforge::ShapeKey key = BenchShape();
  const std::string bucket = kforge::BucketOf(key).Id();
  kforge::VariantRecord v;
  v.source = std::string(source_bytes, ' ') + "// bench variant\n";
  v.manifest_json =
      R"({"entry_point":"kf_attn_fwd","threads":256,"dynamic_smem_bytes":98304,"tile_m":128,"tile_n":64,"archs":["sm_90a"],"head_dims":[128]})";
  v.origin = "template";
  v.template_name = "fwd_mma";
  v.knobs_json = R"({"BLOCK_M":128})";
  auto vid = store.PutVariant(v);
  if (!vid.ok()) return vid.status();
  kforge::TaskRecord t;
  kforge::JobRecord job;
  job.name = "bench";
  job.proposer = "builtin";
  kforge::server::JobSpec spec;
  spec.shapes = {key};
  job.spec_json = kforge::server::EncodeJobSpec(spec);
  job.state = kforge::JobState::kSucceeded;
  auto jid = store.CreateJob(job);
  if (!jid.ok()) return jid.status();
  t.job_id = *jid;
  t.variant_id = *vid;
  t.bucket = bucket;
  t.arch = key.arch;
  t.shape_json = kforge::server::EncodeShapeKey(key);
  if (auto ids = store.EnqueueTasks({t}); !ids.ok()) return ids.status();
  kforge::WorkerRecord w;
  w.name = "bench-worker";
  w.arch = key.arch;
  auto wid = store.UpsertWorker(w);
  if (!wid.ok()) return wid.status();
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  auto leased = store.LeaseTask(*wid, key.arch, false, now, 60000, kforge::PromotionLease::kAny);
  if (!leased.ok() || !leased->has_value()) return absl::InternalError("bench: lease failed");
  kforge::TaskCompletion c;
  c.cubin = std::string(cubin_bytes, '\x7f');
  c.eval.outcome = kforge::Outcome::kVerified;
  c.eval.timing = {812.4, 810.0, 815.0, 20};
  c.eval.gpu_name = "NVIDIA H200";
  c.eval.verified = kforge::BucketExtent(kforge::BucketOf(key));  // serves the whole bucket
  c.new_best = kforge::BestRecord{};
  auto ok = store.CompleteTask((*leased)->id, *wid, now, std::move(c));
  if (!ok.ok()) return ok.status();
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GetKernel load generator"};
  std::string server_addr, token = kToken;
  int threads = 4, seconds = 10, inflight = 0, lookahead_kb = 0;
  bool if_none_match = false;
  size_t source_bytes = 16 * 1024, cubin_bytes = 64 * 1024;
  app.add_option("--server", server_addr, "external server (default: host one in-process)");
  // A token is never a flag (it would show in /proc/<pid>/cmdline).
  if (const char* t = std::getenv("KFORGE_TOKEN"); t && *t) token = t;
  app.add_option("--threads", threads, "client threads")->capture_default_str();
  app.add_option("--seconds", seconds, "duration")->capture_default_str();
  app.add_option("--inflight", inflight,
                 "0: blocking calls, one per thread; N: N outstanding async calls per thread's channel")
      ->capture_default_str();
  app.add_option("--lookahead-kb", lookahead_kb,
                 "client HTTP/2 receive window per stream (0: gRPC default)")->capture_default_str();
  app.add_option("--source-bytes", source_bytes, "self-hosted variant source size")->capture_default_str();
  app.add_option("--cubin-bytes", cubin_bytes, "self-hosted cubin size")->capture_default_str();
  app.add_flag("--if-none-match", if_none_match,
               "ask as a client that already holds the kernel (not-modified replies)");
  CLI11_PARSE(app, argc, argv);

  std::unique_ptr<kforge::Store> store;
  std::unique_ptr<kforge::server::Server> server;
  std::filesystem::path db;
  if (server_addr.empty()) {
    db = std::filesystem::temp_directory_path() / fmt::format("kforge_bench_{}.db", getpid());
    auto opened = kforge::OpenSqliteStore(db.string());
    if (!opened.ok()) {
      fmt::print(stderr, "bench: {}\n", std::string(opened.status().message()));
      return 1;
    }
    store = *std::move(opened);
    if (absl::Status s = Seed(*store, source_bytes, cubin_bytes); !s.ok()) {
      fmt::print(stderr, "bench: seeding: {}\n", std::string(s.message()));
      return 1;
    }
    kforge::server::ServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.client_tokens = {token};
    o.worker_tokens = {"bench-worker-token-0123456789abcdef0123"};
    auto started = kforge::server::Server::Start(o, store.get(), nullptr, nullptr);
    if (!started.ok()) {
      fmt::print(stderr, "bench: {}\n", std::string(started.status().message()));
      return 1;
    }
    server = *std::move(started);
    server_addr = server->address();
  }

  v1::GetKernelRequest req;
  {
    const kforge::ShapeKey k = BenchShape();
    auto* s = req.mutable_shape();
    s->set_op(v1::OP_FORWARD);
    s->set_dtype(v1::DTYPE_BF16);
    s->set_head_dim(k.head_dim);
    s->set_heads(k.heads);
    s->set_causal(k.causal);
    s->set_arch(k.arch);
    s->set_batch(k.batch);
    s->set_max_len_q(k.max_len_q);
    s->set_total_q(k.total_q);
  }
  // Check once that the bucket is tuned, so the figure is the tuned path.
  {
    auto ch = grpc::CreateChannel(server_addr, grpc::InsecureChannelCredentials());
    auto stub = v1::KernelService::NewStub(ch);
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + token);
    v1::GetKernelResponse resp;
    grpc::Status s = stub->GetKernel(&ctx, req, &resp);
    if (!s.ok()) {
      fmt::print(stderr, "bench: GetKernel: {}\n", s.error_message());
      return 1;
    }
    fmt::print("serving {} (tuned={}, source {} B, cubin {} B) from {}\n",
               resp.kernel().variant_id(), resp.kernel().tuned(), resp.kernel().source().size(),
               resp.kernel().cubin().size(), server_addr);
    if (if_none_match) req.set_if_none_match(resp.kernel().variant_id());
  }

  std::atomic<bool> stop{false};
  std::atomic<int64_t> errors{0};
  std::vector<std::vector<float>> latencies(threads);
  std::vector<std::thread> pool;
  const auto start = std::chrono::steady_clock::now();
  // Async mode: `inflight` closed-loop callers per channel, each issuing its
  // next call from the completion of the previous one (the client's own CPU
  // cost per call is then far below that of a blocking thread per call).
  struct Caller {
    v1::KernelService::Stub* stub;
    const v1::GetKernelRequest* req;
    std::atomic<bool>* stop;
    std::vector<float>* lat;
    std::mutex* mu;
    std::atomic<int64_t>* errors;
    std::atomic<int>* running;
    std::unique_ptr<grpc::ClientContext> ctx;
    v1::GetKernelResponse resp;
    std::chrono::steady_clock::time_point t0;
    std::string token;
    void Next() {
      if (stop->load()) {
        running->fetch_sub(1);
        return;
      }
      ctx = std::make_unique<grpc::ClientContext>();
      ctx->AddMetadata("authorization", "Bearer " + token);
      t0 = std::chrono::steady_clock::now();
      stub->async()->GetKernel(ctx.get(), req, &resp, [this](grpc::Status s) {
        const auto t1 = std::chrono::steady_clock::now();
        if (s.ok()) {
          std::lock_guard lock(*mu);
          lat->push_back(std::chrono::duration<float, std::micro>(t1 - t0).count());
        } else {
          errors->fetch_add(1);
        }
        Next();
      });
    }
  };
  std::vector<std::unique_ptr<v1::KernelService::Stub>> stubs;
  std::vector<std::unique_ptr<Caller>> callers;
  std::vector<std::mutex> mus(threads);
  std::atomic<int> running{0};
  for (int i = 0; i < threads && inflight > 0; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.channel_id", i);
    args.SetMaxReceiveMessageSize(64 << 20);
    if (lookahead_kb > 0) args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, lookahead_kb * 1024);
    stubs.push_back(v1::KernelService::NewStub(
        grpc::CreateCustomChannel(server_addr, grpc::InsecureChannelCredentials(), args)));
    for (int k = 0; k < inflight; ++k) {
      auto c = std::make_unique<Caller>();
      c->stub = stubs.back().get();
      c->req = &req;
      c->stop = &stop;
      c->lat = &latencies[i];
      c->mu = &mus[i];
      c->errors = &errors;
      c->running = &running;
      c->token = token;
      callers.push_back(std::move(c));
    }
  }
  for (auto& c : callers) {
    running++;
    c->Next();
  }
  for (int i = 0; i < threads && inflight == 0; ++i) {
    pool.emplace_back([&, i] {
      grpc::ChannelArguments args;
      args.SetInt("grpc.channel_id", i);  // distinct connections per thread
      args.SetMaxReceiveMessageSize(64 << 20);
      if (lookahead_kb > 0) args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, lookahead_kb * 1024);
      auto ch = grpc::CreateCustomChannel(server_addr, grpc::InsecureChannelCredentials(), args);
      auto stub = v1::KernelService::NewStub(ch);
      auto& lat = latencies[i];
      lat.reserve(1 << 20);
      v1::GetKernelResponse resp;
      while (!stop.load(std::memory_order_relaxed)) {
        grpc::ClientContext ctx;
        ctx.AddMetadata("authorization", std::string("Bearer ") + token);
        const auto t0 = std::chrono::steady_clock::now();
        grpc::Status s = stub->GetKernel(&ctx, req, &resp);
        const auto t1 = std::chrono::steady_clock::now();
        if (!s.ok()) {
          errors++;
          continue;
        }
        lat.push_back(std::chrono::duration<float, std::micro>(t1 - t0).count());
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  stop = true;
  for (auto& t : pool) t.join();
  while (running.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<float> all;
  for (auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) {
    return all.empty() ? 0.0 : all[std::min(all.size() - 1, static_cast<size_t>(p * all.size()))];
  };
  fmt::print("mode {}  ", inflight > 0 ? fmt::format("async, {} in flight per channel", inflight)
                                       : std::string("blocking"));
  fmt::print("threads {}  duration {:.1f} s  requests {}  errors {}\n", threads, elapsed,
             all.size(), errors.load());
  fmt::print("throughput {:.0f} GetKernel/s\n", all.size() / elapsed);
  fmt::print("latency p50 {:.0f} us  p99 {:.0f} us  p99.9 {:.0f} us  max {:.0f} us\n", pct(0.50),
             pct(0.99), pct(0.999), all.empty() ? 0.0 : all.back());
  server.reset();
  store.reset();
  if (!db.empty())
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db.string() + suffix);
  return 0;
}

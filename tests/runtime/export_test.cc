// The server side of kernel packs and seed ids, in-process with a real
// SQLite store: ExportKernels streams every best with its extent, filtered
// by arch and op; seeds have stable content ids, so if_none_match works for
// them too.
#include <unistd.h>

#include <filesystem>

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "core/hash.h"
#include "kforge/v1/kforge.grpc.pb.h"
#include "server/server.h"
#include "tests/runtime/store_fixture.h"

namespace kforge {
namespace {

constexpr char kClient[] = "export-test-client-token-0123456789abc";
constexpr char kWorker[] = "export-test-worker-token-0123456789abc";
constexpr char kManifest[] =
    R"({"contract_version":1,"entry_point":"kf_attn_fwd","threads":128,"grid":"per_tile",)"
    R"("tile_m":64,"tile_n":64,"archs":["sm_90a"],"head_dims":[128],"ops":["fwd"]})";

ShapeKey Key(std::string arch = "sm_90a", Op op = Op::kForward, int64_t batch = 4) {
  ShapeKey k;
  k.op = op;
  k.head_dim = 128;
  k.heads = 4;
  k.kv_heads = 4;
  k.causal = true;
  k.arch = std::move(arch);
  k.batch = batch;
  k.max_len_q = k.max_len_k = 1000;
  k.total_q = k.total_k = 3000;
  return k;
}

server::SeedProvider Seeds() {
  return [](const ShapeKey& key) -> absl::StatusOr<server::SeedKernel> {
    server::SeedKernel s;
    s.source = "// seed for " + key.arch;
    s.manifest_json = kManifest;
    s.template_name = "fwd_mma";
    s.knobs_json = "{}";
    s.cubin = "CUBIN-" + key.arch;
    s.compile_options = "-arch=" + key.arch;
    return s;
  };
}

class ExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = std::filesystem::temp_directory_path() / fmt::format("kforge_export_test_{}.db", getpid());
    std::filesystem::remove(db_);
    auto store = OpenSqliteStore(db_.string());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }
  void TearDown() override {
    server_.reset();
    store_.reset();
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db_.string() + suffix);
  }
  void Start() {
    server::ServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.client_tokens = {kClient};
    o.worker_tokens = {kWorker};
    auto s = server::Server::Start(o, store_.get(), nullptr, Seeds());
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    stub_ = v1::KernelService::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }
  std::unique_ptr<grpc::ClientContext> Ctx() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata("authorization", std::string("Bearer ") + kClient);
    return ctx;
  }
  std::vector<v1::ExportedKernel> Export(const std::string& arch = "",
                                         v1::Op op = v1::OP_UNSPECIFIED,
                                         grpc::Status* status = nullptr) {
    v1::ExportKernelsRequest req;
    req.set_arch(arch);
    req.set_op(op);
    auto ctx = Ctx();
    auto reader = stub_->ExportKernels(ctx.get(), req);
    std::vector<v1::ExportedKernel> out;
    v1::ExportedKernel k;
    while (reader->Read(&k)) out.push_back(k);
    grpc::Status s = reader->Finish();
    if (status) *status = s;
    else EXPECT_TRUE(s.ok()) << s.error_message();
    return out;
  }
  v1::GetKernelResponse Get(const ShapeKey& key, const std::string& if_none_match = "") {
    v1::GetKernelRequest req;
    auto* s = req.mutable_shape();
    s->set_op(key.op == Op::kForward ? v1::OP_FORWARD : v1::OP_BACKWARD);
    s->set_dtype(v1::DTYPE_BF16);
    s->set_head_dim(key.head_dim);
    s->set_heads(key.heads);
    s->set_causal(key.causal);
    s->set_arch(key.arch);
    s->set_batch(key.batch);
    s->set_max_len_q(key.max_len_q);
    s->set_total_q(key.total_q);
    req.set_if_none_match(if_none_match);
    v1::GetKernelResponse resp;
    auto ctx = Ctx();
    grpc::Status st = stub_->GetKernel(ctx.get(), req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return resp;
  }

  std::filesystem::path db_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<server::Server> server_;
  std::unique_ptr<v1::KernelService::Stub> stub_;
};

TEST_F(ExportTest, StreamsEveryBestWithItsKernelAndExtent) {
  const auto a = testing::PutBest(*store_, Key("sm_90a"), "// a", kManifest, "CUBIN-a", 800);
  const auto b = testing::PutBest(*store_, Key("sm_90a", Op::kForward, 64), "// b", kManifest,
                                  "CUBIN-b", 900);
  testing::PutBest(*store_, Key("sm_100a"), "// c", kManifest, "CUBIN-c");
  Start();
  auto all = Export();
  ASSERT_EQ(all.size(), 3u);
  auto hopper = Export("sm_90a");
  ASSERT_EQ(hopper.size(), 2u);
  const v1::ExportedKernel& k = hopper[0].bucket() == a.bucket ? hopper[0] : hopper[1];
  EXPECT_EQ(k.bucket(), a.bucket);
  EXPECT_EQ(k.kernel().variant_id(), a.variant_id);
  EXPECT_EQ(k.kernel().source(), "// a");
  EXPECT_EQ(k.kernel().cubin(), "CUBIN-a");
  EXPECT_EQ(k.kernel().manifest().json(), kManifest);
  EXPECT_TRUE(k.kernel().tuned());
  EXPECT_EQ(k.kernel().served_bucket(), a.bucket);
  EXPECT_DOUBLE_EQ(k.kernel().timing().median_us(), 800);
  EXPECT_EQ(k.kernel().provenance().template_name(), "fwd_mma");
  EXPECT_EQ(k.kernel().gpu_name(), "NVIDIA H200");
  // Exact bucket hits are served for every key of the bucket.
  const SizeExtent e = BucketExtent(BucketOf(Key("sm_90a")));
  EXPECT_EQ(k.extent().batch(), e.batch);
  EXPECT_EQ(k.extent().max_len_q(), e.max_len_q);
  EXPECT_EQ(k.extent().total_k(), e.total_k);
  EXPECT_TRUE(Export("sm_80").empty());
  EXPECT_EQ(Export("", v1::OP_FORWARD).size(), 3u);
  EXPECT_TRUE(Export("", v1::OP_BACKWARD).empty());
  (void)b;
}

TEST_F(ExportTest, RefusesAMalformedArch) {
  Start();
  grpc::Status s;
  Export("hopper", v1::OP_UNSPECIFIED, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("arch: 'hopper'"), std::string::npos) << s.error_message();
}

TEST_F(ExportTest, NeedsTheClientToken) {
  Start();
  v1::ExportKernelsRequest req;
  grpc::ClientContext ctx;
  auto reader = stub_->ExportKernels(&ctx, req);
  v1::ExportedKernel k;
  while (reader->Read(&k)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(ExportTest, SeedsHaveStableContentIdsAndAnswerIfNoneMatch) {
  Start();
  const v1::GetKernelResponse first = Get(Key());
  EXPECT_FALSE(first.kernel().tuned());
  EXPECT_EQ(first.kernel().variant_id(),
            ContentVariantId("// seed for sm_90a", kManifest, "-arch=sm_90a"));
  EXPECT_EQ(first.kernel().source_hash(), Sha256Hex("// seed for sm_90a"));
  const v1::GetKernelResponse again = Get(Key(), first.kernel().variant_id());
  EXPECT_TRUE(again.not_modified());
  EXPECT_TRUE(again.kernel().source().empty());
  EXPECT_TRUE(again.kernel().cubin().empty());
  // A restarted server names the same seed the same way.
  server_.reset();
  Start();
  EXPECT_TRUE(Get(Key(), first.kernel().variant_id()).not_modified());
}

}  // namespace
}  // namespace kforge

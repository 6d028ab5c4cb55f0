#include "runtime/resolver.h"

#include <unistd.h>

#include <filesystem>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/hash.h"
#include "runtime/request.h"

namespace kforge::runtime {
namespace {

constexpr char kManifest[] =
    R"({"contract_version":1,"entry_point":"kf_attn_fwd","threads":128,"grid":"per_tile",)"
    R"("tile_m":64,"tile_n":64,"archs":["sm_90a"],"head_dims":[128],"ops":["fwd"]})";

ShapeKey Key(int64_t batch = 4, int64_t max_len = 1000, int64_t total = 3000) {
  ShapeKey k;
  k.op = Op::kForward;
  k.head_dim = 128;
  k.heads = 4;
  k.kv_heads = 4;
  k.causal = true;
  k.arch = "sm_90a";
  k.batch = batch;
  k.max_len_q = k.max_len_k = max_len;
  k.total_q = k.total_k = total;
  return k;
}

pack::Entry Tuned(const std::string& id, const ShapeKey& key, SizeExtent extent = {}) {
  pack::Entry e;
  e.bucket = e.kernel_bucket = BucketOf(key).Id();
  e.arch = key.arch;
  e.variant_id = id;
  e.tuned = true;
  e.source = "// tuned " + id;
  e.cubin = "CUBIN-" + id;
  e.manifest_json = kManifest;
  e.extent = extent;
  return e;
}

// The server's rules as the runtime relies on them: the bucket's best (or
// "no kernel") and not-modified when the caller names it.
class FakeServer : public KernelServer {
 public:
  struct State {
    std::map<std::string, pack::Entry> best;  // by bucket id
    bool down = false;
    std::vector<std::string> if_none_match;  // per call
  };
  explicit FakeServer(std::shared_ptr<State> s) : s_(std::move(s)) {}
  absl::StatusOr<Answer> Get(const ShapeKey& key, const std::string& inm) override {
    s_->if_none_match.push_back(inm);
    if (s_->down) return ToStatus(KF_ERR_SERVER, "GetKernel: connection refused (14)");
    auto it = s_->best.find(BucketOf(key).Id());
    if (it == s_->best.end()) return ToStatus(KF_ERR_UNSUPPORTED, "GetKernel: no kernel (3)");
    Answer a;
    if (!inm.empty() && inm == it->second.variant_id) {
      a.not_modified = true;
    } else {
      a.entry = it->second;
    }
    return a;
  }
  std::string Describe() const override { return "fake server"; }

 private:
  std::shared_ptr<State> s_;
};

class ResolverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           fmt::format("kforge_resolver_test_{}_{}", getpid(), counter_++);
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  Compiler FakeCompiler() {
    Compiler c;
    c.options = [](const std::string& arch) { return "-arch=" + arch; };
    c.compile = [this](const std::string& source,
                       const std::string& arch) -> absl::StatusOr<Compiler::Image> {
      ++compiles_;
      if (source.find("does not compile") != std::string::npos)
        return ToStatus(KF_ERR_COMPILE, "error: does not compile");
      return Compiler::Image{"CUBIN(" + arch + "," + Sha256Hex(source).substr(0, 8) + ")",
                             "-arch=" + arch, "13.0"};
    };
    return c;
  }

  std::unique_ptr<Resolver> Make(bool with_server, std::vector<pack::Pack> packs = {},
                                 bool disk = false, kf_policy policy = KF_POLICY_FALLBACK) {
    ResolverOptions o;
    o.policy = policy;
    if (disk) o.cache_dir = dir_.string();
    o.server_retry = std::chrono::milliseconds(30000);
    o.revalidate = std::chrono::milliseconds(600000);
    o.now_ms = [this] { return now_ms_; };
    std::unique_ptr<KernelServer> server;
    if (with_server) server = std::make_unique<FakeServer>(server_);
    return std::make_unique<Resolver>(std::move(o), std::move(packs), std::move(server),
                                      FakeCompiler(), &counters_);
  }

  std::string Resolved(Resolver& r, const ShapeKey& key) {
    auto k = r.Resolve(key);
    if (!k.ok()) return fmt::format("{}: {}", kf_status_name(CodeOf(k.status())), std::string(k.status().message()));
    return fmt::format("{} {}", SourceName((*k)->source), (*k)->entry.variant_id);
  }

  static inline int counter_ = 0;
  std::filesystem::path dir_;
  std::shared_ptr<FakeServer::State> server_ = std::make_shared<FakeServer::State>();
  Counters counters_;
  int compiles_ = 0;
  int64_t now_ms_ = 1'000'000;
};

TEST_F(ResolverTest, APackHitNeedsNoServer) {
  pack::Pack p;
  p.entries.push_back(Tuned("v7", Key(), BucketExtent(BucketOf(Key()))));
  auto r = Make(/*with_server=*/true, {p});
  EXPECT_EQ(Resolved(*r, Key()), "pack v7");
  EXPECT_TRUE(server_->if_none_match.empty());
  EXPECT_EQ(Resolved(*r, Key()), "pack v7");
  EXPECT_EQ(counters_.pack_hits, 1u);
  EXPECT_EQ(counters_.memory_hits, 1u);
  EXPECT_EQ(compiles_, 0) << "a pack's cubin is used as is";
}

TEST_F(ResolverTest, APackEntryIsUsedOnlyInsideItsExtent) {
  pack::Pack p;
  p.entries.push_back(Tuned("v7", Key(), SizeExtent{4, 1000, 1000, 3000, 3000}));
  auto r = Make(/*with_server=*/false, {p});
  EXPECT_EQ(Resolved(*r, Key(4, 1000, 3000)), "pack v7");
  // Same bucket (b4.mq1024.aq1024), past the verified total: the seed.
  EXPECT_EQ(Resolved(*r, Key(4, 1000, 3500)).substr(0, 7), "seed s-");
}

TEST_F(ResolverTest, TheNearestPackBucketServesAnUntunedBucketWithinItsExtent) {
  pack::Pack p;
  const ShapeKey tuned = Key(4, 1000, 3000);
  p.entries.push_back(Tuned("v7", tuned, SizeExtent{64, 4096, 4096, 100000, 100000}));
  auto r = Make(/*with_server=*/false, {p});
  auto k = r->Resolve(Key(16, 1000, 12000));  // another bucket of the same class
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ((*k)->entry.variant_id, "v7");
  EXPECT_FALSE((*k)->entry.tuned);
  ShapeKey other = Key(16, 1000, 12000);
  other.heads = other.kv_heads = 8;  // a different head layout is no neighbour
  EXPECT_EQ(Resolved(*r, other).substr(0, 4), "seed");
}

TEST_F(ResolverTest, ServerKernelsAreAskedForOnceAndThenHeld) {
  server_->best[BucketOf(Key()).Id()] = Tuned("v12", Key());
  auto r = Make(/*with_server=*/true);
  EXPECT_EQ(Resolved(*r, Key()), "server v12");
  EXPECT_EQ(Resolved(*r, Key()), "server v12");
  ASSERT_EQ(server_->if_none_match.size(), 1u);
  EXPECT_EQ(server_->if_none_match[0], "");
  EXPECT_EQ(counters_.server_kernels, 1u);
  EXPECT_EQ(counters_.memory_hits, 1u);
}

// The server chose the kernel for the keys asked about; a larger key of the
// same bucket is asked about again, naming the kernel held, and a
// not-modified answer grows what it is held for.
TEST_F(ResolverTest, ALargerKeyOfTheBucketIsConfirmedWithIfNoneMatch) {
  server_->best[BucketOf(Key()).Id()] = Tuned("v12", Key());
  auto r = Make(/*with_server=*/true);
  EXPECT_EQ(Resolved(*r, Key(4, 1000, 3000)), "server v12");
  EXPECT_EQ(Resolved(*r, Key(3, 1020, 3060)), "server v12");
  ASSERT_EQ(server_->if_none_match.size(), 2u);
  EXPECT_EQ(server_->if_none_match[1], "v12");
  EXPECT_EQ(counters_.server_not_modified, 1u);
  EXPECT_EQ(counters_.server_kernels, 1u);
  // Inside the per-statistic maximum of the two: no call.
  EXPECT_EQ(Resolved(*r, Key(4, 1020, 3060)), "server v12");
  EXPECT_EQ(server_->if_none_match.size(), 2u);
}

TEST_F(ResolverTest, ANewBestReplacesTheHeldKernelOnTheNextConfirmation) {
  server_->best[BucketOf(Key()).Id()] = Tuned("v12", Key());
  auto r = Make(/*with_server=*/true);
  EXPECT_EQ(Resolved(*r, Key(4, 1000, 3000)), "server v12");
  server_->best[BucketOf(Key()).Id()] = Tuned("v13", Key());
  EXPECT_EQ(Resolved(*r, Key(4, 1010, 3030)), "server v13");
  EXPECT_EQ(server_->if_none_match.back(), "v12");
}

TEST_F(ResolverTest, AServerDownIsSkippedForTheSeedAndAskedAgainLater) {
  server_->down = true;
  auto r = Make(/*with_server=*/true);
  EXPECT_EQ(Resolved(*r, Key()).substr(0, 7), "seed s-");
  EXPECT_EQ(counters_.server_errors, 1u);
  // Another bucket meanwhile: the server is not asked (it is down).
  EXPECT_EQ(Resolved(*r, Key(64, 4000, 200000)).substr(0, 4), "seed");
  EXPECT_EQ(server_->if_none_match.size(), 1u);
  server_->down = false;
  server_->best[BucketOf(Key()).Id()] = Tuned("v12", Key());
  now_ms_ += 10000;
  EXPECT_EQ(Resolved(*r, Key()).substr(0, 4), "seed") << "inside the retry interval";
  now_ms_ += 30000;
  EXPECT_EQ(Resolved(*r, Key()), "server v12");
  EXPECT_EQ(Resolved(*r, Key()), "server v12") << "the server's kernel replaced the fallback";
}

TEST_F(ResolverTest, TheStrictPolicyReturnsTheServersError) {
  server_->down = true;
  auto r = Make(/*with_server=*/true, {}, false, KF_POLICY_STRICT);
  EXPECT_EQ(Resolved(*r, Key()),
            "KF_ERR_SERVER: fake server: GetKernel: connection refused (14)");
}

TEST_F(ResolverTest, AShapeTheServerHasNoKernelForGetsTheSeed) {
  auto r = Make(/*with_server=*/true, {}, false, KF_POLICY_STRICT);
  EXPECT_EQ(Resolved(*r, Key()).substr(0, 7), "seed s-");
  EXPECT_EQ(counters_.server_errors, 0u);
}

TEST_F(ResolverTest, AHeadDimNoTemplateServesIsUnsupported) {
  auto r = Make(/*with_server=*/false);
  ShapeKey k = Key();
  k.head_dim = 96;
  const std::string got = Resolved(*r, k);
  EXPECT_EQ(got.rfind("KF_ERR_UNSUPPORTED: no kforge kernel for fwd head_dim 96 on sm_90a", 0), 0u)
      << got;
}

TEST_F(ResolverTest, TheSeedIdIsItsContentHash) {
  auto r = Make(/*with_server=*/false);
  auto k = r->Resolve(Key());
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ((*k)->entry.variant_id,
            ContentVariantId((*k)->entry.source, (*k)->entry.manifest_json, "-arch=sm_90a"));
  EXPECT_EQ((*k)->entry.provenance.origin, "template");
}

TEST_F(ResolverTest, TheDiskCacheServesTheNextProcessWithoutTheServer) {
  server_->best[BucketOf(Key()).Id()] = Tuned("v12", Key());
  {
    auto r = Make(/*with_server=*/true, {}, /*disk=*/true);
    EXPECT_EQ(Resolved(*r, Key(4, 1000, 3000)), "server v12");
    EXPECT_EQ(Resolved(*r, Key(3, 1020, 3060)), "server v12");  // grows the extent, saved
  }
  auto r = Make(/*with_server=*/false, {}, /*disk=*/true);
  EXPECT_EQ(Resolved(*r, Key(4, 1020, 3060)), "disk v12");
  EXPECT_EQ(counters_.disk_hits, 1u);
  // Outside what the server confirmed: not from the disk.
  EXPECT_EQ(Resolved(*r, Key(4, 1023, 4000)).substr(0, 4), "seed");
}

TEST_F(ResolverTest, ADamagedDiskCacheFileIsAMiss) {
  server_->best[BucketOf(Key()).Id()] = Tuned("v12", Key());
  { auto r = Make(/*with_server=*/true, {}, /*disk=*/true); Resolved(*r, Key()); }
  for (auto& f : std::filesystem::recursive_directory_iterator(dir_)) {
    if (f.is_regular_file()) std::filesystem::resize_file(f.path(), 100);
  }
  auto r = Make(/*with_server=*/false, {}, /*disk=*/true);
  EXPECT_EQ(Resolved(*r, Key()).substr(0, 4), "seed");
}

TEST_F(ResolverTest, SeedsAreCompiledOncePerMachine) {
  { auto r = Make(/*with_server=*/false, {}, /*disk=*/true); Resolved(*r, Key()); }
  EXPECT_EQ(counters_.seed_compiles, 1u);
  auto r = Make(/*with_server=*/false, {}, /*disk=*/true);
  EXPECT_EQ(Resolved(*r, Key()).substr(0, 4), "seed");
  EXPECT_EQ(counters_.seed_compiles, 1u);
  EXPECT_EQ(counters_.seed_disk_hits, 1u);
}

TEST_F(ResolverTest, ServerKernelsAreRevalidatedAfterTheInterval) {
  server_->best[BucketOf(Key()).Id()] = Tuned("v12", Key());
  auto r = Make(/*with_server=*/true);
  EXPECT_EQ(Resolved(*r, Key()), "server v12");
  now_ms_ += 599000;
  EXPECT_EQ(Resolved(*r, Key()), "server v12");
  EXPECT_EQ(server_->if_none_match.size(), 1u);
  now_ms_ += 2000;
  EXPECT_EQ(Resolved(*r, Key()), "server v12");
  ASSERT_EQ(server_->if_none_match.size(), 2u);
  EXPECT_EQ(server_->if_none_match[1], "v12");
  EXPECT_EQ(counters_.server_not_modified, 1u);
  // The server down at the next check: the kernel held stays in use.
  server_->down = true;
  now_ms_ += 700000;
  EXPECT_EQ(Resolved(*r, Key()), "server v12");
}

TEST_F(ResolverTest, AServerKernelWithoutACubinIsCompiledHere) {
  pack::Entry e = Tuned("v12", Key());
  e.cubin.clear();
  server_->best[BucketOf(Key()).Id()] = e;
  auto r = Make(/*with_server=*/true);
  auto k = r->Resolve(Key());
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ((*k)->entry.cubin.rfind("CUBIN(sm_90a,", 0), 0u);
  EXPECT_EQ(compiles_, 1);
}

TEST_F(ResolverTest, AKernelThatDoesNotCompileFallsBackOrFailsByPolicy) {
  pack::Entry e = Tuned("v12", Key());
  e.cubin.clear();
  e.source = "// does not compile";
  server_->best[BucketOf(Key()).Id()] = e;
  auto r = Make(/*with_server=*/true);
  EXPECT_EQ(Resolved(*r, Key()).substr(0, 4), "seed");
  auto strict = Make(/*with_server=*/true, {}, false, KF_POLICY_STRICT);
  EXPECT_EQ(Resolved(*strict, Key()), "KF_ERR_COMPILE: fake server: error: does not compile");
}

}  // namespace
}  // namespace kforge::runtime

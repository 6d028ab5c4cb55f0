// libkforge_runtime.so through its C header alone, as a C caller uses it:
// options and argument checks with their codes and messages, packs refused
// when damaged, kernels resolved without a GPU (a pack's, the seed compiled
// by the real NVRTC), and launches that say why they cannot run here.
#include "kforge/runtime.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "pack/pack.h"

namespace {

std::string Status(kf_status s) { return fmt::format("{}: {}", kf_status_name(s), kf_last_error()); }

class CAbiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           fmt::format("kforge_c_abi_test_{}_{}", getpid(), counter_++);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    for (kf_runtime* rt : runtimes_) kf_runtime_destroy(rt);
    std::filesystem::remove_all(dir_);
  }

  kf_runtime* Create(const kf_runtime_options& o) {
    kf_runtime* rt = nullptr;
    const kf_status s = kf_runtime_create(&o, &rt);
    EXPECT_EQ(s, KF_OK) << Status(s);
    if (rt) runtimes_.push_back(rt);
    return rt;
  }
  kf_runtime* CreateForHopper() {
    kf_runtime_options o;
    kf_runtime_options_init(&o);
    o.arch = "sm_90a";  // resolve kernels without a GPU
    return Create(o);
  }

  // Self-attention, 3 sequences (host offsets), heads 4, head dim 128.
  kf_attention_args Args() {
    kf_attention_args a;
    kf_attention_args_init(&a);
    a.batch = 3;
    a.heads = 4;
    a.head_dim = 128;
    a.total_q = 1000;
    a.max_seqlen_q = 600;
    a.causal = 1;
    a.cu_seqlens_q_host = offsets_.data();
    a.q = a.k = a.v = a.dout = dummy_;
    a.o = a.dq = a.dk = a.dv = dummy_;
    a.lse = dummy_lse_;
    return a;
  }

  std::string WritePack(const std::string& name, const kforge::pack::Pack& p) {
    const std::string path = (dir_ / name).string();
    EXPECT_TRUE(kforge::pack::WritePackFile(path, p).ok());
    return path;
  }

  static inline int counter_ = 0;
  std::filesystem::path dir_;
  std::vector<kf_runtime*> runtimes_;
  std::vector<int32_t> offsets_ = {0, 300, 900, 1000};
  alignas(16) char dummy_[16] = {};  // tensors start on 16-byte boundaries
  alignas(16) float dummy_lse_[4] = {};
};

TEST_F(CAbiTest, OptionsStartAtTheDocumentedDefaults) {
  kf_runtime_options o;
  std::memset(&o, 0xff, sizeof o);
  kf_runtime_options_init(&o);
  EXPECT_EQ(o.struct_size, sizeof o);
  EXPECT_EQ(o.server, nullptr);
  EXPECT_EQ(o.num_packs, 0u);
  EXPECT_EQ(o.policy, KF_POLICY_FALLBACK);
  EXPECT_EQ(o.server_timeout_ms, 10000);
  EXPECT_EQ(o.revalidate_s, 600);
  EXPECT_EQ(kf_runtime_abi_version(), KF_RUNTIME_ABI_VERSION);
  kf_runtime* rt = nullptr;
  ASSERT_EQ(kf_runtime_create(nullptr, &rt), KF_OK) << kf_last_error();  // NULL: defaults
  kf_runtime_destroy(rt);
  kf_runtime_destroy(nullptr);
}

TEST_F(CAbiTest, CreateRefusesBadOptionsNamingTheField) {
  kf_runtime_options o;
  kf_runtime_options_init(&o);
  kf_runtime* rt = nullptr;
  EXPECT_EQ(kf_runtime_create(&o, nullptr), KF_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(kf_last_error(), "out: null");
  o.arch = "hopper";
  EXPECT_EQ(kf_runtime_create(&o, &rt), KF_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()).find("options.arch: 'hopper'"), std::string::npos)
      << kf_last_error();
  EXPECT_EQ(rt, nullptr);
  kf_runtime_options_init(&o);
  o.struct_size = 16;
  EXPECT_EQ(kf_runtime_create(&o, &rt), KF_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()).find("options.struct_size: 16"), std::string::npos);
  kf_runtime_options_init(&o);
  o.num_packs = 2;
  EXPECT_EQ(kf_runtime_create(&o, &rt), KF_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(kf_last_error(), "options.packs: null with num_packs 2");
}

TEST_F(CAbiTest, AMissingOrDamagedPackIsRefusedSayingWhatIsWrong) {
  kforge::pack::Pack p;
  const std::string good = WritePack("good.kfpack", p);
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string truncated = (dir_ / "truncated.kfpack").string();
  std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() - 10);
  std::string flipped = bytes;
  flipped[30] ^= 1;
  const std::string damaged = (dir_ / "damaged.kfpack").string();
  std::ofstream(damaged, std::ios::binary) << flipped;

  struct Case {
    std::string path, expect;
  } cases[] = {{(dir_ / "missing.kfpack").string(), "cannot open"},
               {truncated, "truncated"},
               {damaged, "checksum mismatch"}};
  for (const Case& c : cases) {
    const char* packs[] = {good.c_str(), c.path.c_str()};
    kf_runtime_options o;
    kf_runtime_options_init(&o);
    o.packs = packs;
    o.num_packs = 2;
    kf_runtime* rt = nullptr;
    EXPECT_EQ(kf_runtime_create(&o, &rt), KF_ERR_PACK) << c.path;
    const std::string err = kf_last_error();
    EXPECT_NE(err.find("pack " + c.path), std::string::npos) << err;
    EXPECT_NE(err.find(c.expect), std::string::npos) << err;
    EXPECT_EQ(rt, nullptr);
  }
}

TEST_F(CAbiTest, ArgumentErrorsHaveCodesAndNameTheField) {
  kf_runtime* rt = CreateForHopper();
  EXPECT_EQ(kf_attention_forward(rt, nullptr), KF_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(kf_last_error(), "args: null");
  EXPECT_EQ(kf_attention_forward(nullptr, nullptr), KF_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(kf_last_error(), "runtime: null");

  struct Case {
    std::function<void(kf_attention_args&)> edit;
    kf_status code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](auto& a) { a.batch = 0; }, KF_ERR_INVALID_ARGUMENT, "args.batch: 0 must be positive"},
      {[](auto& a) { a.heads = -4; }, KF_ERR_INVALID_ARGUMENT, "args.heads: -4 must be positive"},
      {[](auto& a) { a.kv_heads = 3; }, KF_ERR_INVALID_ARGUMENT,
       "args.kv_heads: 3 does not divide heads 4"},
      {[](auto& a) { a.q = nullptr; }, KF_ERR_INVALID_ARGUMENT, "args.q: null"},
      {[](auto& a) { a.o = nullptr; }, KF_ERR_INVALID_ARGUMENT, "args.o: null"},
      {[](auto& a) { a.total_q = 999; }, KF_ERR_INVALID_ARGUMENT,
       "args.cu_seqlens_q_host: ends at 1000 but total_q is 999"},
      {[](auto& a) { a.softmax_scale = NAN; }, KF_ERR_INVALID_ARGUMENT,
       "args.softmax_scale: is not finite"},
      {[](auto& a) { a.dtype = KF_DTYPE_FP16; }, KF_ERR_UNSUPPORTED,
       "args.dtype: fp16 has no kforge kernels (bf16 only)"},
      {[](auto& a) { a.head_dim = 100; }, KF_ERR_UNSUPPORTED,
       "args.head_dim: 100 is not a multiple of 8"},
  };
  for (const Case& c : cases) {
    kf_attention_args a = Args();
    c.edit(a);
    EXPECT_EQ(kf_attention_forward(rt, &a), c.code) << c.message;
    EXPECT_EQ(kf_last_error(), c.message);
  }
  kf_attention_args a = Args();
  a.lse = nullptr;
  EXPECT_EQ(kf_attention_backward(rt, &a), KF_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(kf_last_error(), "args.lse: null");
  // A view that starts off a 16-byte boundary would fault on the device.
  a = Args();
  a.dv = dummy_ + 2;
  EXPECT_EQ(kf_attention_backward(rt, &a), KF_ERR_INVALID_ARGUMENT);
  const std::string e = kf_last_error();
  EXPECT_EQ(e.rfind("args.dv: ", 0), 0u) << e;
  EXPECT_NE(e.find("is not 16-byte aligned"), std::string::npos) << e;
}

TEST_F(CAbiTest, AHeadDimNoKernelServesIsUnsupported) {
  kf_runtime* rt = CreateForHopper();
  kf_attention_args a = Args();
  a.head_dim = 96;
  EXPECT_EQ(kf_attention_prepare(rt, &a, KF_OP_FORWARD, nullptr), KF_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(kf_last_error()).find("no kforge kernel for fwd head_dim 96 on sm_90a"),
            std::string::npos)
      << kf_last_error();
}

// No server, no pack: the catalog's seed, compiled here by the real NVRTC.
TEST_F(CAbiTest, ResolvesTheSeedWithNvrtcWithoutAGpu) {
  kf_runtime* rt = CreateForHopper();
  kf_attention_args a = Args();
  kf_kernel_info info;
  info.struct_size = sizeof info;
  ASSERT_EQ(kf_attention_prepare(rt, &a, KF_OP_FORWARD, &info), KF_OK) << kf_last_error();
  EXPECT_STREQ(info.source, "seed");
  EXPECT_EQ(std::string(info.variant_id).rfind("s-", 0), 0u) << info.variant_id;
  EXPECT_STREQ(info.bucket, "fwd.bf16.d128.h4.kv4.causal.self.sm_90a.b4.mq1024.aq512.mk1024.ak512");
  EXPECT_STREQ(info.entry_point, "kf_attn_fwd");
  EXPECT_STREQ(info.arch, "sm_90a");
  EXPECT_EQ(info.tuned, 0);
  EXPECT_GT(info.cubin_bytes, 1000);
  ASSERT_EQ(kf_attention_prepare(rt, &a, KF_OP_BACKWARD, &info), KF_OK) << kf_last_error();
  EXPECT_STREQ(info.entry_point, "kf_attn_bwd");
  EXPECT_EQ(info.persistent, 1) << "the backward seed is key-major";
  kf_runtime_stats stats;
  stats.struct_size = sizeof stats;
  ASSERT_EQ(kf_runtime_get_stats(rt, &stats), KF_OK);
  EXPECT_EQ(stats.seed_compiles, 2u);
  EXPECT_EQ(stats.server_requests, 0u);
  ASSERT_EQ(kf_attention_prepare(rt, &a, KF_OP_FORWARD, &info), KF_OK);
  ASSERT_EQ(kf_runtime_get_stats(rt, &stats), KF_OK);
  EXPECT_EQ(stats.memory_hits, 1u);
  EXPECT_EQ(stats.seed_compiles, 2u);
}

// args.deterministic asks for a deterministic backward: a bucket of its own
// (".det") and, with no server or pack, the catalog's deterministic seed
// (bwd_sm90 DET=1), compiled here by the real NVRTC. The forward ignores
// it. On sm_80 bwd_mma DET=1 serves it; a head dim no backward kernel has is
// unsupported, saying so.
TEST_F(CAbiTest, ADeterministicBackwardGetsItsOwnBucketAndADeterministicKernel) {
  kf_runtime* rt = CreateForHopper();
  kf_attention_args a = Args();
  kf_kernel_info plain, det;
  plain.struct_size = det.struct_size = sizeof det;
  ASSERT_EQ(kf_attention_prepare(rt, &a, KF_OP_BACKWARD, &plain), KF_OK) << kf_last_error();
  a.deterministic = 1;
  ASSERT_EQ(kf_attention_prepare(rt, &a, KF_OP_BACKWARD, &det), KF_OK) << kf_last_error();
  EXPECT_STREQ(det.bucket, "bwd.bf16.d128.h4.kv4.causal.self.sm_90a.b4.mq1024.aq512.mk1024.ak512.det");
  EXPECT_EQ(std::string(plain.bucket) + ".det", det.bucket);
  EXPECT_STREQ(det.source, "seed");
  EXPECT_STREQ(det.entry_point, "kf_attn_bwd");
  EXPECT_STRNE(det.variant_id, plain.variant_id);
  EXPECT_EQ(kf_attention_supported(rt, &a, KF_OP_BACKWARD), KF_OK) << kf_last_error();
  ASSERT_EQ(kf_attention_prepare(rt, &a, KF_OP_FORWARD, &det), KF_OK) << kf_last_error();
  EXPECT_STREQ(det.bucket, "fwd.bf16.d128.h4.kv4.causal.self.sm_90a.b4.mq1024.aq512.mk1024.ak512");
  a.deterministic = 2;
  EXPECT_EQ(kf_attention_prepare(rt, &a, KF_OP_BACKWARD, nullptr), KF_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(kf_last_error(), "args.deterministic: 2 is not 0 or 1");

  kf_runtime_options o;
  kf_runtime_options_init(&o);
  o.arch = "sm_80";
  kf_runtime* ampere = Create(o);
  a.deterministic = 1;
  EXPECT_EQ(kf_attention_supported(ampere, &a, KF_OP_BACKWARD), KF_OK) << kf_last_error();
  kf_kernel_info amp;
  amp.struct_size = sizeof amp;
  ASSERT_EQ(kf_attention_prepare(ampere, &a, KF_OP_BACKWARD, &amp), KF_OK) << kf_last_error();
  EXPECT_STREQ(amp.bucket, "bwd.bf16.d128.h4.kv4.causal.self.sm_80.b4.mq1024.aq512.mk1024.ak512.det");
  EXPECT_STREQ(amp.source, "seed");
  a.head_dim = 96;
  EXPECT_EQ(kf_attention_supported(ampere, &a, KF_OP_BACKWARD), KF_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(kf_last_error()).find("no deterministic backward kernel for sm_80"),
            std::string::npos)
      << kf_last_error();
  EXPECT_EQ(kf_attention_prepare(ampere, &a, KF_OP_BACKWARD, nullptr), KF_ERR_UNSUPPORTED);
  a.head_dim = 128;
  a.deterministic = 0;
  EXPECT_EQ(kf_attention_supported(ampere, &a, KF_OP_BACKWARD), KF_OK) << kf_last_error();
}

TEST_F(CAbiTest, APackServesItsBucketsWithNoServer) {
  kforge::pack::Pack p;
  kforge::pack::Entry e;
  e.bucket = e.kernel_bucket = "fwd.bf16.d128.h4.kv4.causal.self.sm_90a.b4.mq1024.aq512.mk1024.ak512";
  e.arch = "sm_90a";
  e.variant_id = "v42";
  e.tuned = true;
  e.source = "// from the pack";
  e.cubin = "not loaded without a GPU";
  e.manifest_json = R"({"entry_point":"kf_attn_fwd","threads":128,"grid":"per_tile","archs":["sm_90a"],)"
                    R"("tile_m":64,"tile_n":64,"head_dims":[128],"ops":["fwd"]})";
  e.extent = {4, 1024, 1024, 2048, 2048};
  p.entries.push_back(e);
  const std::string path = WritePack("k.kfpack", p);
  const char* packs[] = {path.c_str()};
  kf_runtime_options o;
  kf_runtime_options_init(&o);
  o.arch = "sm_90a";
  o.packs = packs;
  o.num_packs = 1;
  o.server = "127.0.0.1:1";  // never asked: the pack answers first
  o.policy = KF_POLICY_STRICT;
  kf_runtime* rt = Create(o);
  kf_attention_args a = Args();
  kf_kernel_info info;
  info.struct_size = sizeof info;
  ASSERT_EQ(kf_attention_prepare(rt, &a, KF_OP_FORWARD, &info), KF_OK) << kf_last_error();
  EXPECT_STREQ(info.source, "pack");
  EXPECT_STREQ(info.variant_id, "v42");
  EXPECT_EQ(info.tuned, 1);
  kf_runtime_stats stats;
  stats.struct_size = sizeof stats;
  ASSERT_EQ(kf_runtime_get_stats(rt, &stats), KF_OK);
  EXPECT_EQ(stats.pack_hits, 1u);
  EXPECT_EQ(stats.server_requests, 0u);
  // Past the pack entry's extent (total 3000 > 2048): the unreachable
  // server is asked, and the strict policy says so.
  std::vector<int32_t> big = {0, 1000, 2000, 3000};
  a.cu_seqlens_q_host = big.data();
  a.total_q = 3000;
  a.max_seqlen_q = 1000;
  EXPECT_EQ(kf_attention_prepare(rt, &a, KF_OP_FORWARD, &info), KF_ERR_SERVER);
  EXPECT_NE(std::string(kf_last_error()).find("kforge-server at 127.0.0.1:1"), std::string::npos)
      << kf_last_error();
}

TEST_F(CAbiTest, SupportedSaysWhetherAKernelOfTheKindExists) {
  kf_runtime* rt = CreateForHopper();
  kf_attention_args a;
  kf_attention_args_init(&a);  // no sizes, no pointers: only the kind matters
  a.heads = 8;
  a.kv_heads = 2;
  a.head_dim = 128;
  a.causal = 1;
  EXPECT_EQ(kf_attention_supported(rt, &a, KF_OP_FORWARD), KF_OK) << kf_last_error();
  EXPECT_EQ(kf_attention_supported(rt, &a, KF_OP_BACKWARD), KF_OK) << kf_last_error();
  a.head_dim = 96;
  EXPECT_EQ(kf_attention_supported(rt, &a, KF_OP_FORWARD), KF_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(kf_last_error()).find("head_dim 96"), std::string::npos);
  a.head_dim = 128;
  a.dtype = KF_DTYPE_FP32;
  EXPECT_EQ(kf_attention_supported(rt, &a, KF_OP_FORWARD), KF_ERR_UNSUPPORTED);
  a.dtype = KF_DTYPE_BF16;
  a.kv_heads = 3;
  EXPECT_EQ(kf_attention_supported(rt, &a, KF_OP_FORWARD), KF_ERR_INVALID_ARGUMENT);
  kf_runtime_stats stats;
  stats.struct_size = sizeof stats;
  ASSERT_EQ(kf_runtime_get_stats(rt, &stats), KF_OK);
  EXPECT_EQ(stats.seed_compiles, 0u) << "nothing is compiled to answer";
}

TEST_F(CAbiTest, LaunchesWithoutADriverSayWhy) {
  kf_runtime* rt = CreateForHopper();
  kf_attention_args a = Args();
  const kf_status s = kf_attention_forward(rt, &a);
  if (s != KF_ERR_NO_DEVICE) GTEST_SKIP() << "a CUDA driver is present (" << Status(s) << ")";
  EXPECT_NE(std::string(kf_last_error()).find("no CUDA driver"), std::string::npos)
      << kf_last_error();
  // Without an arch in the options, nothing can be resolved either.
  kf_runtime* plain = Create([] {
    kf_runtime_options o;
    kf_runtime_options_init(&o);
    return o;
  }());
  EXPECT_EQ(kf_attention_prepare(plain, &a, KF_OP_FORWARD, nullptr), KF_ERR_NO_DEVICE);
  EXPECT_NE(std::string(kf_last_error()).find("set options.arch"), std::string::npos)
      << kf_last_error();
}

TEST_F(CAbiTest, TheLastErrorIsPerThread) {
  kf_runtime* rt = CreateForHopper();
  kf_attention_args a = Args();
  a.batch = 0;
  ASSERT_EQ(kf_attention_forward(rt, &a), KF_ERR_INVALID_ARGUMENT);
  std::string other = "unset";
  std::thread([&] { other = kf_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_STREQ(kf_last_error(), "args.batch: 0 must be positive");
  kf_runtime_stats stats;
  stats.struct_size = sizeof stats;
  EXPECT_EQ(kf_runtime_get_stats(rt, &stats), KF_OK);
  EXPECT_STREQ(kf_last_error(), "") << "a successful call clears it";
}

TEST_F(CAbiTest, StatusNamesAreTheEnumNames) {
  EXPECT_STREQ(kf_status_name(KF_OK), "KF_OK");
  EXPECT_STREQ(kf_status_name(KF_ERR_NEEDS_HOST_OFFSETS), "KF_ERR_NEEDS_HOST_OFFSETS");
  EXPECT_STREQ(kf_status_name(static_cast<kf_status>(77)), "KF_ERR_UNKNOWN");
}

}  // namespace

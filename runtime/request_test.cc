#include "runtime/request.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace kforge::runtime {
namespace {

kf_attention_args Args() {
  kf_attention_args a;
  kf_attention_args_init(&a);
  a.batch = 3;
  a.heads = 8;
  a.kv_heads = 2;
  a.head_dim = 128;
  a.total_q = 1000;
  a.max_seqlen_q = 600;
  a.causal = 1;
  alignas(16) static int32_t dummy_offsets[4];
  alignas(16) static char dummy[16];
  a.cu_seqlens_q = dummy_offsets;
  a.q = a.k = a.v = dummy;
  a.o = dummy;
  return a;
}

std::string Error(const kf_attention_args& a, Op op = Op::kForward) {
  auto r = MakeRequest(&a, op, "sm_90a");
  if (r.ok()) return "ok";
  return std::string(kf_status_name(CodeOf(r.status()))) + " " + std::string(r.status().message());
}

TEST(MakeRequest, SelfAttentionFromSizes) {
  kf_attention_args a = Args();
  auto r = MakeRequest(&a, Op::kForward, "sm_90a");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->key.kv_heads, 2);
  EXPECT_FALSE(r->key.cross);
  EXPECT_EQ(r->key.total_k, 1000);
  EXPECT_EQ(r->key.max_len_k, 600);
  EXPECT_EQ(r->key.arch, "sm_90a");
  EXPECT_FALSE(r->has_host_offsets);
  EXPECT_FLOAT_EQ(r->scale, 1.0f / std::sqrt(128.0f));
  EXPECT_EQ(r->degenerate, Degenerate::kNone);
}

TEST(MakeRequest, HostOffsetsGiveTheExactLengths) {
  kf_attention_args a = Args();
  const std::vector<int32_t> cu = {0, 300, 800, 1000};
  a.cu_seqlens_q_host = cu.data();
  a.max_seqlen_q = 4096;  // an upper bound is fine with host offsets
  auto r = MakeRequest(&a, Op::kForward, "sm_90a");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->key.max_len_q, 500);
  EXPECT_EQ(r->key.max_len_k, 500);
  EXPECT_TRUE(r->has_host_offsets);
  EXPECT_EQ(r->cu_q_host.size(), 4u);
}

TEST(MakeRequest, HostOffsetsMustAgreeWithTheSizes) {
  kf_attention_args a = Args();
  std::vector<int32_t> cu = {0, 300, 800, 998};
  a.cu_seqlens_q_host = cu.data();
  EXPECT_EQ(Error(a), "KF_ERR_INVALID_ARGUMENT args.cu_seqlens_q_host: ends at 998 but total_q is 1000");
  cu = {0, 300, 100, 1000};
  EXPECT_EQ(Error(a),
            "KF_ERR_INVALID_ARGUMENT args.cu_seqlens_q_host: decreases at index 2 (300 -> 100)");
  cu = {0, 300, 400, 1000};
  a.max_seqlen_q = 500;
  EXPECT_EQ(Error(a), "KF_ERR_INVALID_ARGUMENT args.cu_seqlens_q_host: has a sequence of 600 "
                      "rows, longer than max_seqlen 500");
}

TEST(MakeRequest, NamesTheBadSize) {
  kf_attention_args a = Args();
  a.kv_heads = 3;
  EXPECT_EQ(Error(a), "KF_ERR_INVALID_ARGUMENT args.kv_heads: 3 does not divide heads 8");
  a = Args();
  a.batch = 0;
  EXPECT_EQ(Error(a), "KF_ERR_INVALID_ARGUMENT args.batch: 0 must be positive");
  a = Args();
  a.total_q = -1;
  EXPECT_EQ(Error(a), "KF_ERR_INVALID_ARGUMENT args.total_q: -1 is negative");
  a = Args();
  a.max_seqlen_q = 2000;
  EXPECT_EQ(Error(a), "KF_ERR_INVALID_ARGUMENT args.max_len_q: 2000 is larger than total_q 1000");
  a = Args();
  a.causal = 2;
  EXPECT_EQ(Error(a), "KF_ERR_INVALID_ARGUMENT args.causal: 2 is not 0 or 1");
  a = Args();
  a.struct_size = 8;
  EXPECT_NE(Error(a).find("args.struct_size: 8 is smaller"), std::string::npos);
}

// deterministic selects backward kernels (the forward is always
// deterministic); a caller built against the first kf_attention_args, which
// ends before the field, asks for nothing.
TEST(MakeRequest, DeterministicIsABackwardRequestAndOlderStructsAskForNothing) {
  kf_attention_args a = Args();
  a.deterministic = 1;
  a.dout = a.dq = a.dk = a.dv = a.o;
  alignas(16) static float lse[16];
  a.lse = lse;
  auto r = MakeRequest(&a, Op::kBackward, "sm_90a");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->key.deterministic);
  EXPECT_EQ(BucketOf(r->key).Id().substr(BucketOf(r->key).Id().size() - 4), ".det");
  r = MakeRequest(&a, Op::kForward, "sm_90a");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->key.deterministic);
  a.struct_size = kArgsMinSize;
  r = MakeRequest(&a, Op::kBackward, "sm_90a");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->key.deterministic);
  a = Args();
  a.deterministic = -1;
  EXPECT_EQ(Error(a), "KF_ERR_INVALID_ARGUMENT args.deterministic: -1 is not 0 or 1");
}

TEST(MakeRequest, NamesTheNullPointer) {
  kf_attention_args a = Args();
  a.v = nullptr;
  EXPECT_EQ(Error(a), "KF_ERR_INVALID_ARGUMENT args.v: null");
  a = Args();
  a.cu_seqlens_q = nullptr;
  EXPECT_EQ(Error(a), "KF_ERR_INVALID_ARGUMENT args.cu_seqlens_q: null (give the device offsets, "
                      "the host offsets or both)");
  a = Args();  // backward needs lse, dout and the gradients
  EXPECT_EQ(Error(a, Op::kBackward), "KF_ERR_INVALID_ARGUMENT args.lse: null");
  EXPECT_EQ(MakeRequest(&a, Op::kBackward, "sm_90a", /*sizes_only=*/true).status().ok(), true);
  auto null_args = MakeRequest(nullptr, Op::kForward, "sm_90a");
  EXPECT_EQ(std::string(null_args.status().message()), "args: null");
}

TEST(MakeRequest, NamesATensorThatIsNotSixteenByteAligned) {
  alignas(16) static char buffer[64];
  alignas(16) static int32_t offsets[8];
  kf_attention_args a = Args();
  a.k = buffer + 8;
  const std::string e = Error(a);
  EXPECT_EQ(e.rfind("KF_ERR_INVALID_ARGUMENT args.k: ", 0), 0u) << e;
  EXPECT_NE(e.find("is not 16-byte aligned"), std::string::npos) << e;
  a = Args();  // a backward's gradient, and lse
  a.lse = reinterpret_cast<float*>(buffer);
  a.dout = a.dq = a.dk = buffer;
  a.dv = buffer + 32;
  EXPECT_EQ(Error(a, Op::kBackward), "ok");
  a.lse = reinterpret_cast<float*>(buffer + 4);
  EXPECT_NE(Error(a, Op::kBackward).find("args.lse: "), std::string::npos);
  a = Args();  // int32 offsets need only their own alignment
  a.cu_seqlens_q = offsets + 1;
  EXPECT_EQ(Error(a), "ok");
  a.cu_seqlens_q = reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(offsets) + 2);
  EXPECT_NE(Error(a).find("args.cu_seqlens_q: "), std::string::npos);
  EXPECT_NE(Error(a).find("is not 4-byte aligned (int32 offsets)"), std::string::npos);
  // Sizes alone (kf_prepare) look at no pointer.
  EXPECT_TRUE(MakeRequest(&a, Op::kForward, "sm_90a", /*sizes_only=*/true).ok());
}

TEST(MakeRequest, ShapesWithoutKernelsAreUnsupportedNotInvalid) {
  kf_attention_args a = Args();
  a.dtype = KF_DTYPE_FP16;
  EXPECT_EQ(Error(a), "KF_ERR_UNSUPPORTED args.dtype: fp16 has no kforge kernels (bf16 only)");
  a = Args();
  a.head_dim = 100;
  EXPECT_EQ(Error(a), "KF_ERR_UNSUPPORTED args.head_dim: 100 is not a multiple of 8");
  a.head_dim = 512;
  EXPECT_EQ(Error(a), "KF_ERR_UNSUPPORTED args.head_dim: 512 exceeds 256");
}

TEST(MakeRequest, CrossAttentionNeedsBothHostOffsetsOrNeither) {
  kf_attention_args a = Args();
  static int32_t k_dev[4];
  const std::vector<int32_t> cu_q = {0, 300, 800, 1000};
  a.cu_seqlens_k = k_dev;
  a.total_k = 90;
  a.max_seqlen_k = 40;
  a.cu_seqlens_q_host = cu_q.data();
  EXPECT_EQ(Error(a), "KF_ERR_INVALID_ARGUMENT args.cu_seqlens_k_host: null while "
                      "cu_seqlens_q_host is given for cross attention (give both or neither)");
  const std::vector<int32_t> cu_k = {0, 40, 80, 90};
  a.cu_seqlens_k_host = cu_k.data();
  auto r = MakeRequest(&a, Op::kForward, "sm_90a");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->key.cross);
  EXPECT_EQ(r->key.max_len_k, 40);
  EXPECT_EQ(r->key.total_k, 90);
}

TEST(MakeRequest, SelfAttentionKeysMustBeTheQueries) {
  kf_attention_args a = Args();
  a.total_k = 999;
  EXPECT_NE(Error(a).find("args.total_k: 999 differs from total_q 1000 in self-attention"),
            std::string::npos);
}

TEST(MakeRequest, EmptyBatchesAreDegenerateNotErrors) {
  kf_attention_args a = Args();
  a.total_q = 0;
  a.max_seqlen_q = 0;
  auto r = MakeRequest(&a, Op::kForward, "sm_90a");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->degenerate, Degenerate::kNoQueries);
  a = Args();
  static int32_t k_dev[4];
  a.cu_seqlens_k = k_dev;
  a.total_k = 0;
  r = MakeRequest(&a, Op::kForward, "sm_90a");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->degenerate, Degenerate::kNoKeys);
}

}  // namespace
}  // namespace kforge::runtime

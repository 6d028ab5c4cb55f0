// The runtime computes a call's bucket on the host, with core's BucketOf
// like the server: for the same batch both must name the same bucket,
// whether the batch is described by its offsets or by its statistics.
#include <random>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/request.h"
#include "server/convert.h"

namespace kforge {
namespace {

struct Batch {
  int heads, kv_heads, head_dim;
  bool causal, cross;
  Op op;
  std::vector<int32_t> cu_q, cu_k;
};

std::vector<int32_t> Offsets(const std::vector<int>& lengths) {
  std::vector<int32_t> cu = {0};
  for (int l : lengths) cu.push_back(cu.back() + l);
  return cu;
}

int MaxLen(const std::vector<int32_t>& cu) {
  int m = 0;
  for (size_t i = 1; i < cu.size(); ++i) m = std::max(m, cu[i] - cu[i - 1]);
  return m;
}

std::string ServerBucket(const Batch& b, bool from_offsets) {
  v1::Shape s;
  s.set_op(b.op == Op::kForward ? v1::OP_FORWARD : v1::OP_BACKWARD);
  s.set_dtype(v1::DTYPE_BF16);
  s.set_head_dim(b.head_dim);
  s.set_heads(b.heads);
  s.set_kv_heads(b.kv_heads);
  s.set_causal(b.causal);
  s.set_cross(b.cross);
  s.set_arch("sm_90a");
  if (from_offsets) {
    s.mutable_cu_seqlens_q()->Add(b.cu_q.begin(), b.cu_q.end());
    if (b.cross) s.mutable_cu_seqlens_k()->Add(b.cu_k.begin(), b.cu_k.end());
  } else {
    s.set_batch(int64_t(b.cu_q.size()) - 1);
    s.set_max_len_q(MaxLen(b.cu_q));
    s.set_total_q(b.cu_q.back());
    if (b.cross) {
      s.set_max_len_k(MaxLen(b.cu_k));
      s.set_total_k(b.cu_k.back());
    }
  }
  server::ServedLimits limits;
  limits.backward = true;
  auto key = server::ShapeFromProto(s, "shape", limits);
  if (!key.ok()) return "error: " + std::string(key.status().message());
  return BucketOf(*key).Id();
}

std::string ClientBucket(const Batch& b, bool host_offsets) {
  kf_attention_args a;
  kf_attention_args_init(&a);
  a.batch = int(b.cu_q.size()) - 1;
  a.heads = b.heads;
  a.kv_heads = b.kv_heads;
  a.head_dim = b.head_dim;
  a.causal = b.causal;
  a.total_q = b.cu_q.back();
  a.max_seqlen_q = MaxLen(b.cu_q);
  static int32_t device_q[1], device_k[1];  // never read: sizes only
  a.cu_seqlens_q = device_q;
  if (b.cross) {
    a.cu_seqlens_k = device_k;
    a.total_k = b.cu_k.back();
    a.max_seqlen_k = MaxLen(b.cu_k);
  }
  if (host_offsets) {
    a.cu_seqlens_q_host = b.cu_q.data();
    if (b.cross) a.cu_seqlens_k_host = b.cu_k.data();
    a.max_seqlen_q = 0;  // derived from the offsets
    a.max_seqlen_k = 0;
  }
  auto r = runtime::MakeRequest(&a, b.op, "sm_90a", /*sizes_only=*/true);
  if (!r.ok()) return "error: " + std::string(r.status().message());
  return BucketOf(r->key).Id();
}

void ExpectSameBucket(const Batch& b, const std::string& what) {
  const std::string server = ServerBucket(b, true);
  ASSERT_EQ(server.rfind("error", 0), std::string::npos) << what << ": " << server;
  EXPECT_EQ(ServerBucket(b, false), server) << what;
  EXPECT_EQ(ClientBucket(b, true), server) << what;
  EXPECT_EQ(ClientBucket(b, false), server) << what;
}

TEST(ClientBucket, MatchesTheServersOnHandPickedBatches) {
  ExpectSameBucket({4, 4, 128, true, false, Op::kForward, Offsets({100, 512, 388}), {}}, "self");
  ExpectSameBucket({8, 2, 64, false, false, Op::kForward, Offsets({0, 1, 4096, 33}), {}}, "gqa");
  ExpectSameBucket({4, 4, 64, false, true, Op::kForward, Offsets({180, 500, 0}), Offsets({256, 0, 256})},
                   "cross with empty sequences");
  ExpectSameBucket({4, 4, 128, true, false, Op::kBackward, Offsets({4096, 3687, 4000}), {}}, "bwd");
  ExpectSameBucket({4, 1, 128, true, true, Op::kBackward, Offsets({7}), Offsets({9})}, "one seq");
}

TEST(ClientBucket, MatchesTheServersOnRandomJaggedBatches) {
  std::mt19937 rng(11);
  for (int i = 0; i < 500; ++i) {
    Batch b;
    b.heads = std::vector<int>{1, 4, 8, 16}[rng() % 4];
    const int groups = std::vector<int>{1, 2, 4}[rng() % 3];
    b.kv_heads = b.heads % groups == 0 ? b.heads / groups : b.heads;
    b.head_dim = (rng() % 2) ? 64 : 128;
    b.causal = rng() % 2;
    b.cross = rng() % 3 == 0;
    b.op = rng() % 2 ? Op::kForward : Op::kBackward;
    const int batch = 1 + int(rng() % 300);
    const int cap = std::vector<int>{1, 17, 512, 8192}[rng() % 4];
    auto lengths = [&] {
      std::vector<int> l(batch);
      for (int& x : l) x = rng() % 5 == 0 ? 0 : int(rng() % (cap + 1));
      l[rng() % batch] = cap;  // at least one token
      return l;
    };
    b.cu_q = Offsets(lengths());
    if (b.cross) b.cu_k = Offsets(lengths());
    ExpectSameBucket(b, fmt::format("random batch {}", i));
    if (HasFailure()) break;
  }
}

}  // namespace
}  // namespace kforge

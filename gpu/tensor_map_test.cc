// The contract's tensor maps as specs (CONTRACT.md "Tensor maps"), on any
// machine: dims, strides and boxes of each tensor, and the reasons a request
// or a tensor is refused. The encoded maps themselves are exercised on the
// GPU by every bwd_sm90 TMA evaluation (worker/eval/eval_gpu_test.cc).
#include <cstring>

#include <gtest/gtest.h>

#include "gpu/gpu.h"

namespace kforge::gpu {
namespace {

KfAttnParams Params() {
  KfAttnParams p;
  std::memset(&p, 0, sizeof(p));
  // (addresses are never read here: only their value and alignment matter)
  p.q = reinterpret_cast<const void*>(uintptr_t{0x10000});
  p.k = reinterpret_cast<const void*>(uintptr_t{0x20000});
  p.v = reinterpret_cast<const void*>(uintptr_t{0x30000});
  p.o = reinterpret_cast<void*>(uintptr_t{0x40000});
  p.dout = reinterpret_cast<const void*>(uintptr_t{0x50000});
  p.heads = 8;
  p.kv_heads = 2;
  p.head_dim = 128;
  p.total_q = 1000;
  p.total_k = 700;
  return p;
}

TEST(AttnTensorMapSpec, QueryAndKeySideTensorsGetTheirOwnRowsAndColumns) {
  const KfAttnParams p = Params();
  for (const char* t : {"q", "o", "dout"}) {
    auto s = AttnTensorMapSpec(p, {t, 64});
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE(s->has_value()) << t;
    EXPECT_EQ((*s)->rank, 2);
    EXPECT_EQ((*s)->dims[0], 8u * 128) << t;
    EXPECT_EQ((*s)->dims[1], 1000u) << t;
    EXPECT_EQ((*s)->strides_bytes[0], 8u * 128 * 2) << t;
    EXPECT_EQ((*s)->box[0], 64u);
    EXPECT_EQ((*s)->box[1], 64u);
    EXPECT_EQ((*s)->swizzle_bytes, 128);
  }
  EXPECT_EQ((*AttnTensorMapSpec(p, {"q", 64}))->global_address, p.q);
  EXPECT_EQ((*AttnTensorMapSpec(p, {"dout", 64}))->global_address, p.dout);
  for (const char* t : {"k", "v"}) {
    auto s = AttnTensorMapSpec(p, {t, 128});
    ASSERT_TRUE(s.ok() && s->has_value()) << t;
    EXPECT_EQ((*s)->dims[0], 2u * 128) << t;
    EXPECT_EQ((*s)->dims[1], 700u) << t;
    EXPECT_EQ((*s)->strides_bytes[0], 2u * 128 * 2) << t;
    EXPECT_EQ((*s)->box[1], 128u) << t;
  }
}

TEST(AttnTensorMapSpec, ATensorOfNoRowsHasNothingToMap) {
  KfAttnParams p = Params();
  p.total_q = 0;
  p.q = nullptr;  // an empty batch may come without a buffer
  auto s = AttnTensorMapSpec(p, {"q", 64});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->has_value());
}

TEST(AttnTensorMapSpec, RefusesWhatTmaCannotAddressNamingTheTensor) {
  KfAttnParams p = Params();
  p.dout = reinterpret_cast<const void*>(uintptr_t{0x50008});
  auto s = AttnTensorMapSpec(p, {"dout", 64});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("tensor map of dout"), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find("not 16-byte aligned"), std::string::npos) << s.status();
  p = Params();
  p.k = nullptr;
  s = AttnTensorMapSpec(p, {"k", 128});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("is null"), std::string::npos) << s.status();
  p = Params();
  p.head_dim = 40;
  p.heads = 1;
  s = AttnTensorMapSpec(p, {"q", 64});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("40 columns"), std::string::npos) << s.status();
  s = AttnTensorMapSpec(Params(), {"lse", 64});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("\"lse\""), std::string::npos) << s.status();
  s = AttnTensorMapSpec(Params(), {"q", 0});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("box_rows 0"), std::string::npos) << s.status();
}

}  // namespace
}  // namespace kforge::gpu

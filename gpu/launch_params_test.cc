// Which kernels a contract launch may be made with (CheckKernelParams): a
// kernel that declares more parameters, or a larger one, than the launch
// passes would have the driver copy bytes from past what it was given.
// Sizes as NVRTC 13.0 declares them for bwd_sm90 (the cubin's parameter
// records): KfAttnParams 224 bytes, its two tensor maps 256.
#include <gtest/gtest.h>

#include "gpu/gpu.h"

namespace kforge::gpu {
namespace {

TEST(CheckKernelParams, TheContractsParametersPass) {
  const size_t params = sizeof(KfAttnParams);
  EXPECT_TRUE(CheckKernelParams("k", std::vector<size_t>{params}, std::vector<size_t>{params}).ok());
  EXPECT_TRUE(CheckKernelParams("k", std::vector<size_t>{params, 256},
                                std::vector<size_t>{params, 256})
                  .ok());
  // declaring less than is passed reads less: harmless
  EXPECT_TRUE(CheckKernelParams("k", std::vector<size_t>{}, std::vector<size_t>{params}).ok());
  EXPECT_TRUE(
      CheckKernelParams("k", std::vector<size_t>{params}, std::vector<size_t>{params, 256}).ok());
}

TEST(CheckKernelParams, MoreOrLargerParametersThanPassedAreRefusedWithBothLists) {
  const size_t params = sizeof(KfAttnParams);
  auto s = CheckKernelParams("kf_attn_fwd", std::vector<size_t>{params, 4096},
                             std::vector<size_t>{params});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("kernel kf_attn_fwd declares 2 parameter(s)"), std::string::npos)
      << s;
  EXPECT_NE(s.message().find(std::to_string(params) + ", 4096"), std::string::npos) << s;
  s = CheckKernelParams("kf_attn_bwd", std::vector<size_t>{params + 64},
                        std::vector<size_t>{params});
  ASSERT_FALSE(s.ok());
  s = CheckKernelParams("kf_attn_bwd", std::vector<size_t>{params, 384},
                        std::vector<size_t>{params, 256});
  ASSERT_FALSE(s.ok());
}

}  // namespace
}  // namespace kforge::gpu

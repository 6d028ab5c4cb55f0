// The GPU reference against the float64 CPU reference on random jagged
// batches: empty and length-1 sequences, odd lengths, cross with Lq != Lk,
// causal and not, GQA, head dims 8..256. Needs a GPU; skips without one.
#include "worker/reference/gpu_reference.h"

#include <gtest/gtest.h>

#include <cmath>

#include "fmt/format.h"
#include "worker/reference/cpu_reference.h"
#include "worker/reference/test_util.h"

namespace kforge::reference {
namespace {

using testing::Compare;
using testing::Errors;
using testing::Offsets;

struct Case {
  std::string name;
  JaggedShape shape;
  // Keeps test names free of the raw bytes gtest prints otherwise.
  friend void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }
};

std::vector<Case> Cases() {
  auto self = [](std::vector<int> cu) { return std::pair{cu, cu}; };
  std::vector<Case> cases;
  auto add = [&](std::string name, int h, int kvh, int d, bool causal,
                 std::pair<std::vector<int>, std::vector<int>> cu) {
    cases.push_back({std::move(name), JaggedShape{.heads = h, .kv_heads = kvh, .head_dim = d,
                                                  .causal = causal, .cu_q = cu.first,
                                                  .cu_k = cu.second}});
  };
  add("self_full_d64", 2, 2, 64, false, self(Offsets({0, 1, 17, 64, 130})));
  add("self_causal_d128_gqa", 4, 1, 128, true, self(Offsets({1, 0, 33, 200})));
  add("cross_full_d96_gqa", 4, 2, 96, false,
      {Offsets({3, 0, 50, 7, 1}), Offsets({10, 5, 0, 129, 1})});
  add("cross_causal_d128", 2, 2, 128, true,
      {Offsets({5, 40, 1, 64, 3}), Offsets({17, 20, 0, 64, 9})});
  add("self_causal_d256", 1, 1, 256, true, self(Offsets({77, 2})));
  add("cross_causal_d40_gqa", 6, 3, 40, true, {Offsets({9, 31}), Offsets({4, 63})});
  return cases;
}

class GpuReferenceVsCpu : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<gpu::Driver>> d = gpu::Driver::Load();
    if (!d.ok()) GTEST_SKIP() << d.status().message();
    driver_ = *std::move(d);
    auto ctx = driver_->OpenContext(0);
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    context_ = *std::move(ctx);
    auto info = driver_->GetDeviceInfo(0);
    ASSERT_TRUE(info.ok()) << info.status();
    auto ref = GpuReference::Create(*driver_, info->arch);
    ASSERT_TRUE(ref.ok()) << ref.status();
    ref_ = *std::move(ref);
    auto stream = gpu::Stream::Create(*driver_);
    ASSERT_TRUE(stream.ok()) << stream.status();
    stream_ = *std::move(stream);
  }

  template <typename T>
  gpu::DeviceBuffer Upload(const std::vector<T>& host) {
    auto buf = gpu::DeviceBuffer::Allocate(*driver_, host.size() * sizeof(T));
    EXPECT_TRUE(buf.ok()) << buf.status();
    EXPECT_TRUE(buf->Upload(std::span<const T>(host), stream_).ok());
    return *std::move(buf);
  }
  gpu::DeviceBuffer Poisoned(size_t floats) {
    auto buf = gpu::DeviceBuffer::Allocate(*driver_, floats * sizeof(float));
    EXPECT_TRUE(buf.ok()) << buf.status();
    EXPECT_TRUE(buf->Fill32(0x7fc00000u, stream_).ok());  // NaN: unwritten shows
    return *std::move(buf);
  }
  template <typename T>
  std::vector<T> Download(const gpu::DeviceBuffer& buf, size_t n) {
    std::vector<T> host(n);
    EXPECT_TRUE(buf.Download(std::span<T>(host), stream_).ok());
    return host;
  }

  std::unique_ptr<gpu::Driver> driver_;
  std::unique_ptr<gpu::Context> context_;
  std::unique_ptr<GpuReference> ref_;
  gpu::Stream stream_;
};

void ExpectClose(const std::string& what, const Errors& e) {
  EXPECT_LE(e.rel_l2, 1e-5) << what;
  EXPECT_LE(e.max_abs, 1e-4 * (1 + e.ref_max)) << what << " ref_max " << e.ref_max;
}

TEST_P(GpuReferenceVsCpu, ForwardAndBackwardAgree) {
  const JaggedShape& s = GetParam().shape;
  ASSERT_TRUE(ValidateJaggedShape(s).ok());
  std::mt19937_64 rng(1234);
  auto q = testing::RandomBf16(s.q_elems(), rng);
  auto k = testing::RandomBf16(s.k_elems(), rng);
  auto v = testing::RandomBf16(s.k_elems(), rng);
  auto dout = testing::RandomBf16(s.q_elems(), rng);

  gpu::DeviceBuffer dq_in = Upload(q), dk_in = Upload(k), dv_in = Upload(v), ddo = Upload(dout);
  gpu::DeviceBuffer cu_q = Upload(s.cu_q), cu_k = Upload(s.cu_k);
  gpu::DeviceBuffer o32 = Poisoned(s.q_elems()), lse = Poisoned(s.lse_elems());

  KfAttnParams p{};
  p.q = dq_in.get();
  p.k = dk_in.get();
  p.v = dv_in.get();
  p.o = o32.get();
  p.lse = lse.as<float>();
  p.cu_seqlens_q = cu_q.as<int>();
  p.cu_seqlens_k = cu_k.as<int>();
  p.batch = s.batch();
  p.heads = s.heads;
  p.kv_heads = s.kv_heads;
  p.head_dim = s.head_dim;
  p.max_seqlen_q = s.max_q();
  p.max_seqlen_k = s.max_k();
  p.total_q = s.total_q();
  p.total_k = s.total_k();
  p.softmax_scale = s.scale();
  p.softmax_scale_log2 = s.scale() * 1.4426950408889634f;
  p.causal = s.causal;
  ASSERT_TRUE(ref_->Forward(p, stream_).ok());
  auto o_gpu = Download<float>(o32, s.q_elems());
  auto lse_gpu = Download<float>(lse, s.lse_elems());

  CpuForwardResult cpu = CpuForward(s, q, k, v);
  ExpectClose(GetParam().name + " O", Compare<float>(o_gpu, cpu.o));
  ExpectClose(GetParam().name + " LSE", Compare<float>(lse_gpu, cpu.lse));

  // Backward from the GPU forward's own outputs (bf16 O, fp32 LSE).
  std::vector<uint16_t> o_bf16(o_gpu.size());
  for (size_t i = 0; i < o_gpu.size(); ++i) o_bf16[i] = FloatToBf16(o_gpu[i]);
  gpu::DeviceBuffer o_in = Upload(o_bf16);
  gpu::DeviceBuffer delta = Poisoned(s.lse_elems());
  gpu::DeviceBuffer dq = Poisoned(s.q_elems()), dk = Poisoned(s.k_elems()),
                    dv = Poisoned(s.k_elems());
  p.o = o_in.get();
  p.dout = ddo.get();
  p.delta = delta.as<float>();
  p.dq = dq.get();
  p.dk = dk.get();
  p.dv = dv.get();
  ASSERT_TRUE(ref_->Backward(p, stream_).ok());
  CpuBackwardResult cpu_b = CpuBackward(s, q, k, v, o_bf16, lse_gpu, dout);
  ExpectClose(GetParam().name + " dQ", Compare<float>(Download<float>(dq, s.q_elems()), cpu_b.dq));
  ExpectClose(GetParam().name + " dK", Compare<float>(Download<float>(dk, s.k_elems()), cpu_b.dk));
  ExpectClose(GetParam().name + " dV", Compare<float>(Download<float>(dv, s.k_elems()), cpu_b.dv));
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuReferenceVsCpu, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace kforge::reference

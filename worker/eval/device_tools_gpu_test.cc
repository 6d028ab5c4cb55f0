// The evaluator's device kernels against the host functions they mirror:
// RandomBf16, FloatToBf16, TallyBf16 and TallyLse. Needs a GPU; skips
// without one.
#include "worker/eval/device_tools.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>

#include "worker/eval/batches.h"
#include "worker/reference/jagged.h"

namespace kforge::eval {
namespace {

using reference::FloatToBf16;

class DeviceToolsGpu : public ::testing::Test {
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
    auto tools = DeviceTools::Create(*driver_, info->arch);
    ASSERT_TRUE(tools.ok()) << tools.status();
    tools_ = *std::move(tools);
    auto stream = gpu::Stream::Create(*driver_);
    ASSERT_TRUE(stream.ok()) << stream.status();
    stream_ = *std::move(stream);
  }

  template <typename T>
  gpu::DeviceBuffer Upload(const std::vector<T>& host) {
    auto b = gpu::DeviceBuffer::Allocate(*driver_, std::max<size_t>(1, host.size()) * sizeof(T));
    EXPECT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(b->Upload(std::span<const T>(host), stream_).ok());
    return *std::move(b);
  }

  template <typename T>
  std::vector<T> Download(const gpu::DeviceBuffer& b, size_t n) {
    std::vector<T> host(n);
    EXPECT_TRUE(b.Download(std::span<T>(host), stream_).ok());
    return host;
  }

  static void ExpectSameTally(const Tally& gpu, const Tally& cpu) {
    EXPECT_EQ(gpu.unwritten, cpu.unwritten);
    EXPECT_EQ(gpu.nonfinite, cpu.nonfinite);
    EXPECT_EQ(gpu.first_bad, cpu.first_bad);
    EXPECT_EQ(gpu.first_bad_bits, cpu.first_bad_bits);
    EXPECT_EQ(gpu.worst_at, cpu.worst_at);
    EXPECT_EQ(gpu.worst_bits, cpu.worst_bits);
    EXPECT_EQ(gpu.max_abs, cpu.max_abs);
    EXPECT_EQ(gpu.ref_max, cpu.ref_max);
    EXPECT_NEAR(gpu.num, cpu.num, 1e-9 * cpu.num);
    EXPECT_NEAR(gpu.den, cpu.den, 1e-9 * cpu.den);
  }

  std::unique_ptr<gpu::Driver> driver_;
  std::unique_ptr<gpu::Context> context_;
  std::unique_ptr<DeviceTools> tools_;
  gpu::Stream stream_;
};

TEST_F(DeviceToolsGpu, FillIsBitIdenticalToRandomBf16) {
  for (size_t n : {size_t{1}, size_t{1000}, size_t{3'000'001}}) {
    std::mt19937_64 host_rng(42 + n), device_rng(42 + n);
    std::vector<uint16_t> want = RandomBf16(n, host_rng);
    auto buf = gpu::DeviceBuffer::Allocate(*driver_, n * 2);
    ASSERT_TRUE(buf.ok());
    ASSERT_TRUE(tools_->FillRandomBf16(*buf, n, device_rng(), stream_).ok());
    std::vector<uint16_t> got = Download<uint16_t>(*buf, n);
    ASSERT_EQ(std::memcmp(got.data(), want.data(), n * 2), 0) << "n = " << n;
    EXPECT_EQ(host_rng(), device_rng()) << "both drew the same number of values";
  }
}

TEST_F(DeviceToolsGpu, StyleIsBitIdenticalToTheHost) {
  for (auto [scale, period, magnitude] : {std::tuple{4.0f, 0u, 0.0f}, std::tuple{1.0f, 257u, 32.0f},
                                          std::tuple{0.25f, 509u, 64.0f}}) {
    std::mt19937_64 rng(9);
    std::vector<uint16_t> want = RandomBf16(2'000'003, rng);
    gpu::DeviceBuffer buf = Upload(want);
    StyleBf16(want, scale, 1234, period, magnitude);
    ASSERT_TRUE(tools_->StyleBf16(buf, want.size(), scale, 1234, period, magnitude, stream_).ok());
    std::vector<uint16_t> got = Download<uint16_t>(buf, want.size());
    ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 2), 0)
        << "scale " << scale << " period " << period;
  }
}

TEST_F(DeviceToolsGpu, ToBf16RoundsLikeTheHost) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> in = {0.0f, -0.0f, 1.0f, 1.00390625f, 1.01171875f, -3.14159f, 1e-40f,
                           3.4e38f, inf, -inf, std::nanf(""), 65504.5f};
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 10.0f);
  for (int i = 0; i < 100000; ++i) in.push_back(normal(rng));
  gpu::DeviceBuffer src = Upload(in);
  auto dst = gpu::DeviceBuffer::Allocate(*driver_, in.size() * 2);
  ASSERT_TRUE(dst.ok());
  ASSERT_TRUE(tools_->ToBf16(*dst, src, in.size(), stream_).ok());
  std::vector<uint16_t> got = Download<uint16_t>(*dst, in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(got[i], FloatToBf16(in[i])) << "value " << in[i];
  }
}

TEST_F(DeviceToolsGpu, TallyBf16MatchesTheHost) {
  const size_t n = 2'000'003;  // more elements than one pass of the grid
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> ref(n);
  std::vector<uint16_t> got(n);
  for (size_t i = 0; i < n; ++i) {
    ref[i] = normal(rng);
    got[i] = FloatToBf16(ref[i] + 0.01f * normal(rng));
  }
  {  // all written and finite
    Tally cpu = TallyBf16(got, ref);
    auto g = tools_->TallyBf16(Upload(got), Upload(ref), n, stream_);
    ASSERT_TRUE(g.ok()) << g.status();
    ExpectSameTally(*g, cpu);
  }
  // Unwritten, infinite and NaN outputs, and the worst error twice (the
  // lower index must win, as in the host's single pass).
  for (size_t i : {size_t{5}, size_t{777'777}, n - 1}) got[i] = kPoisonBf16;
  got[1'234'567] = 0xff80;  // -inf
  got[99] = 0x7fff;         // a NaN that is not the poison
  ref[1'500'000] = ref[300'000] = 2.0f;
  got[1'500'000] = got[300'000] = FloatToBf16(9.0f);
  Tally cpu = TallyBf16(got, ref);
  auto g = tools_->TallyBf16(Upload(got), Upload(ref), n, stream_);
  ASSERT_TRUE(g.ok()) << g.status();
  ExpectSameTally(*g, cpu);
  EXPECT_EQ(g->first_bad, 5);
  EXPECT_EQ(g->unwritten, 3);
  EXPECT_EQ(g->nonfinite, 2);
  EXPECT_EQ(g->worst_at, 300'000);
}

TEST_F(DeviceToolsGpu, TallyLseMatchesTheHost) {
  const size_t n = 300'001;
  const float inf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(12);
  std::normal_distribution<float> normal(3.0f, 1.0f);
  std::vector<float> ref(n), got(n);
  for (size_t i = 0; i < n; ++i) {
    ref[i] = normal(rng);
    got[i] = ref[i] + 1e-5f * normal(rng);
  }
  for (size_t i = 1000; i < 1010; ++i) ref[i] = got[i] = -inf;  // rows that see no key
  got[200'000] = 0.0f;                                          // where -inf is due...
  ref[200'000] = -inf;
  uint32_t poison = kPoisonF32;
  std::memcpy(&got[250'000], &poison, 4);
  got[260'000] = inf;
  got[123] = ref[123] + 0.5f;
  Tally cpu = TallyLse(got, ref);
  auto g = tools_->TallyLse(Upload(got), Upload(ref), n, stream_);
  ASSERT_TRUE(g.ok()) << g.status();
  ExpectSameTally(*g, cpu);
  EXPECT_EQ(g->first_bad, 200'000);
  EXPECT_EQ(g->worst_at, 123);
}

TEST_F(DeviceToolsGpu, FingerprintSeesOneChangedWord) {
  std::mt19937_64 rng(3);
  std::vector<uint16_t> words = RandomBf16(1'000'001, rng);
  gpu::DeviceBuffer a = Upload(words);
  auto fa = tools_->Fingerprint(a, stream_);
  ASSERT_TRUE(fa.ok()) << fa.status();
  auto again = tools_->Fingerprint(a, stream_);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*fa, *again);
  words[654'321] ^= 1;
  auto fb = tools_->Fingerprint(Upload(words), stream_);
  ASSERT_TRUE(fb.ok());
  EXPECT_NE(*fa, *fb);
  std::swap(words[10], words[11]);  // a move, not just a change of values
  words[654'321] ^= 1;
  if (words[10] != words[11]) {
    auto fc = tools_->Fingerprint(Upload(words), stream_);
    ASSERT_TRUE(fc.ok());
    EXPECT_NE(*fa, *fc);
  }
}

// Several buffers in one call give each its own digest, the single-buffer
// one; an odd last byte counts too (module globals can be one byte long).
TEST_F(DeviceToolsGpu, FingerprintsOfManyBuffersAndOddRegions) {
  std::mt19937_64 rng(5);
  gpu::DeviceBuffer a = Upload(RandomBf16(1000, rng));
  gpu::DeviceBuffer b = Upload(RandomBf16(77777, rng));
  const gpu::DeviceBuffer* both[] = {&a, &b};
  auto many = tools_->Fingerprints(both, stream_);
  ASSERT_TRUE(many.ok()) << many.status();
  EXPECT_EQ((*many)[0], *tools_->Fingerprint(a, stream_));
  EXPECT_EQ((*many)[1], *tools_->Fingerprint(b, stream_));
  std::vector<uint8_t> bytes = {1, 2, 3};
  auto c = gpu::DeviceBuffer::Allocate(*driver_, bytes.size());
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->Upload(std::span<const uint8_t>(bytes), stream_).ok());
  const gpu::DeviceRegion odd[] = {{c->address(), 3}};
  auto before = tools_->Fingerprints(odd, stream_);
  bytes[2] = 4;
  ASSERT_TRUE(c->Upload(std::span<const uint8_t>(bytes), stream_).ok());
  auto after = tools_->Fingerprints(odd, stream_);
  ASSERT_TRUE(before.ok() && after.ok());
  EXPECT_NE((*before)[0], (*after)[0]);
}

}  // namespace
}  // namespace kforge::eval

// The Hopper parts (templates/sm90/, notes/parts.md) and fwd_sm90's source
// assembled from them, checked on the text alone (no NVRTC): the cubin pin is
// in templates_compile_test.cc.
#include "kernels/templates/sm90/parts.h"

#include <gtest/gtest.h>

#include "kernels/catalog.h"
#include "kernels/source_check.h"
#include "kernels/templates/sm90/layout.h"

namespace kforge {
namespace {


using templates::sm90::BwdSm90Parts;
using templates::sm90::FwdSm90Parts;
using templates::sm90::Part;

// Every valid (knobs, head dim) of fwd_sm90.
std::vector<Variant> AllFwdSm90Variants() {
  std::vector<Variant> out;
  for (int d : {64, 128}) {
    for (int bn : {64, 96, 128, 176, 192}) {
      for (int st : {2, 3, 4}) {
        for (int pers : {0, 1}) {
          auto v = Instantiate("fwd_sm90",
                               {{"BLOCK_M", 128}, {"BLOCK_N", bn}, {"STAGES", st},
                                {"PERSISTENT", pers}},
                               d);
          if (v.ok()) out.push_back(*std::move(v));
        }
      }
    }
  }
  return out;
}

TEST(Sm90Parts, FwdSm90SourceIsThePreludeThenThePartsThenTheKernel) {
  std::vector<std::string_view> names;
  for (const Part& p : FwdSm90Parts()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string_view>{
                       "sm90/ptx.cuh", "sm90/wgmma_ops.cuh", "sm90/layout.h",
                       "sm90/tile_scheduler.cuh", "sm90/packed_rows.cuh", "sm90/softmax.cuh",
                       "sm90/fwd_ring.cuh",
                       "sm90/fwd_producer.cuh", "sm90/fwd_consumer.cuh",
                       "sm90/fwd_epilogue.cuh", "fwd_sm90.cuh"}));
  const auto variants = AllFwdSm90Variants();
  ASSERT_EQ(variants.size(), 48u);
  for (const Variant& v : variants) {
    EXPECT_EQ(v.source, KnobPrelude(v.knobs, v.head_dim) + templates::sm90::Assemble(FwdSm90Parts()));
  }
}

// Parts take sizes as template arguments, so another template (bwd_sm90)
// can use them with its own knobs: no KF_ macro but the dev harness's
// KF_WAIT_LIMIT, and no #define of anything.
TEST(Sm90Parts, PartsReadNoKnobs) {
  std::vector<Part> parts = FwdSm90Parts();
  for (const Part& p : BwdSm90Parts()) parts.push_back(p);
  for (const Part& p : parts) {
    if (p.name == "fwd_sm90.cuh" || p.name == "bwd_sm90.cuh") continue;
    auto tokens = LexSource(p.text);
    ASSERT_TRUE(tokens.ok()) << p.name << ": " << tokens.status();
    for (size_t i = 0; i < tokens->size(); ++i) {
      const SourceToken& t = (*tokens)[i];
      if (t.kind != SourceToken::Kind::kIdentifier) continue;
      EXPECT_FALSE(t.text.starts_with("KF_") && t.text != "KF_WAIT_LIMIT")
          << p.name << " line " << t.line << " reads knob " << t.text;
      EXPECT_FALSE(t.text == "define" && i > 0 && (*tokens)[i - 1].text == "#")
          << p.name << " line " << t.line << " defines a macro";
    }
  }
}

// Each part alone obeys the sandbox's source rules, only the kernel file
// defines the entry point, and the assembled source passes the check.
TEST(Sm90Parts, PartsPassTheSourceCheckAndOnlyTheKernelDefinesTheEntryPoint) {
  for (const Part& p : FwdSm90Parts()) {
    EXPECT_TRUE(CheckSource(p.text).ok()) << p.name << ": " << CheckSource(p.text);
    auto tokens = LexSource(p.text);
    ASSERT_TRUE(tokens.ok()) << p.name;
    EXPECT_EQ(DefinesEntryPoint(*tokens, "kf_attn_fwd"), p.name == "fwd_sm90.cuh") << p.name;
  }
  for (const Variant& v : AllFwdSm90Variants()) {
    EXPECT_TRUE(CheckSource(v.source).ok()) << CheckSource(v.source);
  }
  for (const Part& p : BwdSm90Parts()) {
    EXPECT_TRUE(CheckSource(p.text).ok()) << p.name << ": " << CheckSource(p.text);
    auto tokens = LexSource(p.text);
    ASSERT_TRUE(tokens.ok()) << p.name;
    EXPECT_EQ(DefinesEntryPoint(*tokens, "kf_attn_bwd"), p.name == "bwd_sm90.cuh") << p.name;
  }
}

// The manifest's shared memory is the kernel's layout; the layout keeps the
// swizzled tiles 1024-byte aligned and the regions in order without
// overlap, and it still gives the bytes of the formula fwd_sm90.cc had
// before the layout existed (Q 128 x d, STAGES K and V tiles, 4 STAGES
// mbarriers, 1024 for alignment).
TEST(Sm90Parts, ManifestSharedMemoryIsTheFwdLayout) {
  for (const Variant& v : AllFwdSm90Variants()) {
    const int d = v.head_dim, bn = v.knobs.at("BLOCK_N"), st = v.knobs.at("STAGES");
    const KfFwdSm90Layout l = kf_fwd_sm90_layout(d, v.knobs.at("BLOCK_M"), bn, st);
    EXPECT_EQ(v.manifest.dynamic_smem_bytes, l.dynamic_bytes);
    EXPECT_EQ(l.dynamic_bytes, 128 * d * 2 + st * 2 * bn * d * 2 + 4 * st * 8 + 1024);
    EXPECT_EQ(l.q, 0);
    EXPECT_EQ(l.q_wg_bytes, 64 * d * 2);
    EXPECT_EQ(l.kv_bytes, bn * d * 2);
    EXPECT_EQ(l.k % 1024, 0);
    EXPECT_EQ(l.v % 1024, 0);
    EXPECT_GE(l.k, l.q + 2 * l.q_wg_bytes);
    EXPECT_GE(l.v, l.k + st * l.kv_bytes);
    EXPECT_GE(l.full_k, l.v + st * l.kv_bytes);
    EXPECT_EQ(l.full_k % 8, 0);
    EXPECT_EQ(l.full_v, l.full_k + 8 * st);
    EXPECT_EQ(l.empty_k, l.full_v + 8 * st);
    EXPECT_EQ(l.empty_v, l.empty_k + 8 * st);
    EXPECT_EQ(l.total, l.empty_v + 8 * st);
    EXPECT_LE(l.dynamic_bytes, 232448);
  }
}

// The layout is a constant expression, as the kernel needs it.
static_assert(kf_fwd_sm90_layout(128, 128, 128, 2).dynamic_bytes == 164928);
static_assert(kf_fwd_sm90_layout(64, 128, 128, 2).dynamic_bytes == 83008);


}  // namespace
}  // namespace kforge

// Compile-only checks of the seed templates with NVRTC (no GPU needed): every
// knob combination of every template builds for sm_80, sm_90a and sm_100a
// where the template lists the arch, and the default knobs do not spill.
#include <cctype>
#include <cstdlib>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "gpu/cubin.h"
#include "kernels/catalog.h"
#include "kernels/check.h"
#include "kernels/testing/nvrtc_util.h"

namespace kforge {
namespace {

// Knobs that do not change the code's structure (launch-bounds residency,
// the packed-tile path) are varied one at a time around the defaults instead
// of multiplied into the product, which keeps the suite near 200 compiles.
bool Secondary(const std::string& knob) {
  return knob == "MIN_BLOCKS" || knob == "PACK" || knob == "ORDER";
}

// Every combination of a template's primary knob values (valid or not), with
// secondary knobs at their defaults, plus each secondary value on the defaults.
std::vector<std::map<std::string, int>> AllCombinations(const TemplateInfo& t) {
  std::vector<std::map<std::string, int>> out = {{}};
  std::map<std::string, int> defaults;
  for (const auto& k : t.knobs) defaults[k.name] = k.default_value;
  std::vector<std::map<std::string, int>> extra;
  for (const auto& k : t.knobs) {
    if (!Secondary(k.name)) continue;
    for (int v : k.values) {
      auto m = defaults;
      m[k.name] = v;
      extra.push_back(m);
    }
  }
  for (const auto& k : t.knobs) {
    if (Secondary(k.name)) continue;
    std::vector<std::map<std::string, int>> next;
    for (const auto& partial : out) {
      for (int v : k.values) {
        auto m = partial;
        m[k.name] = v;
        next.push_back(m);
      }
    }
    out = std::move(next);
  }
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

std::string Describe(const std::map<std::string, int>& knobs, int d) {
  std::string s = "d" + std::to_string(d);
  for (const auto& [k, v] : knobs) s += " " + k + "=" + std::to_string(v);
  return s;
}

// ptxas reports "N bytes gmem" of module-scope device variables: NVRTC's
// -default-device puts namespace-scope constants there, and the evaluator
// refuses images with more than gpu::kMaxModuleGlobalBytes of them.
int GmemBytes(const std::string& log) {
  const size_t at = log.find(" bytes gmem");
  if (at == std::string::npos) return 0;
  size_t begin = at;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(log[begin - 1]))) --begin;
  return std::atoi(log.substr(begin, at - begin).c_str());
}

class TemplatesCompile : public ::testing::TestWithParam<std::string> {};

TEST_P(TemplatesCompile, EveryValidKnobCombinationCompiles) {
  const std::string arch = GetParam();
  struct Job {
    std::string what;
    std::string source;
  };
  std::vector<Job> jobs;
  for (const auto& t : ListTemplates()) {
    if (std::find(t.archs.begin(), t.archs.end(), arch) == t.archs.end()) continue;
    for (int d : t.head_dims) {
      for (const auto& knobs : AllCombinations(t)) {
        auto v = Instantiate(t.name, knobs, d);
        if (!v.ok()) continue;  // impossible combinations are rejected with a reason
        // The source rules hold for every setting; only the manifest's
        // limits (below) may exclude one.
        absl::Status source_ok = CheckSource(v->source);
        ASSERT_TRUE(source_ok.ok()) << t.name << " " << Describe(v->knobs, d) << ": "
                                    << source_ok.message();
        // (checked for the template's own op: a backward template checked as
        // forward would be skipped here)
        const Op op = t.ops.front() == "bwd" ? Op::kBackward : Op::kForward;
        if (!CheckVariant(v->source, v->manifest, arch,
                          ShapeKey{.op = op, .head_dim = d, .heads = 4, .kv_heads = 4,
                                   .arch = arch, .batch = 1})
                 .ok()) {
          continue;  // e.g. over sm_80's shared memory
        }
        jobs.push_back({t.name + " " + Describe(v->knobs, d), v->source});
      }
    }
  }
  ASSERT_FALSE(jobs.empty());
  const unsigned workers = std::max(2u, std::thread::hardware_concurrency());
  for (size_t start = 0; start < jobs.size(); start += workers) {
    std::vector<std::future<testing::CompileReport>> fut;
    for (size_t i = start; i < std::min(jobs.size(), start + workers); ++i) {
      fut.push_back(std::async(std::launch::async,
                               [&, i] { return testing::CompileVariant(jobs[i].source, arch); }));
    }
    for (size_t i = 0; i < fut.size(); ++i) {
      auto r = fut[i].get();
      const auto& job = jobs[start + i];
      EXPECT_TRUE(r.ok) << arch << " " << job.what << "\n" << r.log;
      EXPECT_LE(GmemBytes(r.log), gpu::kMaxModuleGlobalBytes) << arch << " " << job.what;
      std::printf("%-8s %-70s regs=%3d spill_st=%4d spill_ld=%4d %.2fs\n", arch.c_str(),
                  job.what.c_str(), r.registers, r.spill_stores, r.spill_loads, r.seconds);
    }
  }
}

TEST_P(TemplatesCompile, DefaultKnobsDoNotSpill) {
  const std::string arch = GetParam();
  for (int d : {64, 128}) {
    ShapeKey s{.head_dim = d, .heads = 4, .kv_heads = 4, .arch = arch, .batch = 128,
               .max_len_q = 1024, .total_q = 65536, .max_len_k = 1024, .total_k = 65536};
    auto v = Instantiate("fwd_mma", DefaultKnobs("fwd_mma", s), d);
    ASSERT_TRUE(v.ok()) << v.status();
    auto r = testing::CompileVariant(v->source, arch);
    ASSERT_TRUE(r.ok) << r.log;
    EXPECT_EQ(r.spill_stores, 0) << arch << " d" << d << "\n" << r.log;
    EXPECT_EQ(r.spill_loads, 0) << arch << " d" << d << "\n" << r.log;
  }
}

// The Hopper backward's default settings (kernels/notes/bwd.md, bwd_sm90 v1)
// compile without spills at both head dims.
TEST(TemplatesCompileSm90, BwdSm90DefaultKnobsDoNotSpill) {
  bool listed = false;
  for (const auto& t : ListTemplates()) listed = listed || t.name == "bwd_sm90";
  if (!listed) GTEST_SKIP() << "bwd_sm90 is not in this build";
  for (int d : {64, 128}) {
    ShapeKey s{.op = Op::kBackward, .head_dim = d, .heads = 4, .kv_heads = 4, .arch = "sm_90a",
               .batch = 128, .max_len_q = 1024, .total_q = 65536, .max_len_k = 1024,
               .total_k = 65536};
    auto v = Instantiate("bwd_sm90", DefaultKnobs("bwd_sm90", s), d);
    ASSERT_TRUE(v.ok()) << v.status();
    auto r = testing::CompileVariant(v->source, "sm_90a");
    ASSERT_TRUE(r.ok) << r.log;
    EXPECT_EQ(r.spill_stores, 0) << "d" << d << "\n" << r.log;
    EXPECT_EQ(r.spill_loads, 0) << "d" << d << "\n" << r.log;
    EXPECT_EQ(r.log.find("C7517"), std::string::npos) << "wgmma wait injected\n" << r.log;
    EXPECT_EQ(r.log.find("C7511"), std::string::npos) << "wgmma serialized\n" << r.log;
  }
}

// bwd_sm90 v2 (OVERLAP=1): every setting validate() accepts compiles without
// spills or wgmma serialization (kernels/notes/bwd.md, bwd_sm90 v2).
TEST(TemplatesCompileSm90, BwdSm90OverlapDoesNotSpill) {
  bool listed = false;
  for (const auto& t : ListTemplates()) listed = listed || t.name == "bwd_sm90";
  if (!listed) GTEST_SKIP() << "bwd_sm90 is not in this build";
  for (int d : {64, 128}) {
    for (int bm : {64, 128}) {
      for (int st : {1, 2}) {
        auto v = Instantiate("bwd_sm90",
                             {{"BLOCK_M", bm}, {"BLOCK_N", 128}, {"STAGES", st}, {"OVERLAP", 1}}, d);
        if (!v.ok()) continue;  // refused by validate()
        auto r = testing::CompileVariant(v->source, "sm_90a");
        ASSERT_TRUE(r.ok) << r.log;
        const std::string what = "d" + std::to_string(d) + " BM" + std::to_string(bm) + " ST" +
                                 std::to_string(st);
        EXPECT_EQ(r.spill_stores, 0) << what << "\n" << r.log;
        EXPECT_EQ(r.spill_loads, 0) << what << "\n" << r.log;
        EXPECT_EQ(r.log.find("C7517"), std::string::npos) << what << "\n" << r.log;
        EXPECT_EQ(r.log.find("C7511"), std::string::npos) << what << "\n" << r.log;
        EXPECT_EQ(r.log.find("C7512"), std::string::npos) << what << "\n" << r.log;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, TemplatesCompile,
                         ::testing::Values("sm_80", "sm_90a", "sm_100a"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kforge

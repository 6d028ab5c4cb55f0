// Compile-only checks of the seed templates with NVRTC (no GPU needed): every
// knob combination of every template builds for sm_80, sm_90a and sm_100a
// where the template lists the arch, and the default knobs do not spill.
#include <cctype>
#include <cstdlib>
#include <functional>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include <fmt/format.h>

#include "core/hash.h"
#include "gpu/cubin.h"
#include "kernels/catalog.h"
#include "kernels/templates/bwd_sm90_layout.h"
#include "kernels/check.h"
#include "kernels/testing/nvrtc_util.h"

namespace kforge {
namespace {

// Knobs that do not change the code's structure (launch-bounds residency,
// the packed-tile path) are varied one at a time around the defaults instead
// of multiplied into the product, which keeps the suite near 200 compiles.
// (bwd_sm90's DQZ changes only the dQ conversion's stores: its DQZ=1 forms of
// every primary setting are compiled and pinned by
// BwdSm90SettingsKeepTheWgmmaPipelineAndArePinned, and as a primary knob it
// doubled this test's sm_90a time, to 336 s on 2 cores. Its HELP changes only
// the head end's hand-off and the helpers' loop: HELP=1 and 2 with each
// class's settings are compiled by BwdSm90HelpSettingsCompile, and as a primary
// knob, with three values, it took this test past its 600 s on 2 cores)
bool Secondary(const std::string& knob) {
  return knob == "MIN_BLOCKS" || knob == "PACK" || knob == "ORDER" || knob == "DQZ" ||
         knob == "HELP" || knob == "KVSTORE";
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

// Compiles every source for `arch`, hardware_concurrency (at least 2) at a
// time, and hands each report to `check` with the source's index, in order.
void CompileEach(const std::vector<std::string>& sources, const std::string& arch,
                 const std::function<void(size_t, const testing::CompileReport&)>& check) {
  const unsigned workers = std::max(2u, std::thread::hardware_concurrency());
  for (size_t start = 0; start < sources.size(); start += workers) {
    std::vector<std::future<testing::CompileReport>> fut;
    for (size_t i = start; i < std::min(sources.size(), start + workers); ++i) {
      fut.push_back(std::async(std::launch::async,
                               [&, i] { return testing::CompileVariant(sources[i], arch); }));
    }
    for (size_t i = 0; i < fut.size(); ++i) check(start + i, fut[i].get());
  }
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
  std::vector<std::string> sources;
  for (const auto& job : jobs) sources.push_back(job.source);
  CompileEach(sources, arch, [&](size_t i, const testing::CompileReport& r) {
    const auto& job = jobs[i];
    EXPECT_TRUE(r.ok) << arch << " " << job.what << "\n" << r.log;
    EXPECT_LE(GmemBytes(r.log), gpu::kMaxModuleGlobalBytes) << arch << " " << job.what;
    std::printf("%-8s %-70s regs=%3d spill_st=%4d spill_ld=%4d %.2fs\n", arch.c_str(),
                job.what.c_str(), r.registers, r.spill_stores, r.spill_loads, r.seconds);
  });
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

// fwd_stream's served settings for long queries over short keys (one key
// block of 16, 32 or 64 holds the keys) compile without spills at both head
// dims.
TEST_P(TemplatesCompile, FwdStreamServedSettingsDoNotSpill) {
  const std::string arch = GetParam();
  std::vector<std::pair<std::string, std::string>> jobs;  // (setting, source)
  for (int d : {64, 128}) {
    for (int64_t keys : {16, 32, 64}) {
      ShapeKey s{.head_dim = d, .heads = 4, .kv_heads = 4, .cross = true, .arch = arch,
                 .batch = 512, .max_len_q = 2048, .total_q = 512 * 1536, .max_len_k = keys,
                 .total_k = 512 * keys / 2};
      auto v = Instantiate("fwd_stream", DefaultKnobs("fwd_stream", s), d);
      ASSERT_TRUE(v.ok()) << v.status();
      ASSERT_TRUE(CheckVariant(v->source, v->manifest, arch, s).ok()) << Describe(v->knobs, d);
      jobs.emplace_back(Describe(v->knobs, d), v->source);
    }
  }
  ASSERT_FALSE(jobs.empty());
  std::vector<std::string> sources;
  for (const auto& job : jobs) sources.push_back(job.second);
  CompileEach(sources, arch, [&](size_t i, const testing::CompileReport& r) {
    const std::string& what = jobs[i].first;
    ASSERT_TRUE(r.ok) << arch << " " << what << "\n" << r.log;
    EXPECT_EQ(r.spill_stores, 0) << arch << " " << what << "\n" << r.log;
    EXPECT_EQ(r.spill_loads, 0) << arch << " " << what << "\n" << r.log;
    std::printf("%-8s fwd_stream %-60s regs=%3d\n", arch.c_str(), what.c_str(), r.registers);
  });
}

// The Hopper backward's default settings (kernels/notes/bwd.md) compile at
// both head dims with at most kBwdSm90SpillBytes of spills and no serialised
// wgmma. Where those spills are (ncu's source view on the H200, v5): the
// consumers' once per tile or on cold paths, the 40-register producer's six
// 4-byte reloads a step from L1; the wgmmas stay pipelined (no C7512), which
// is what costs when registers run out. (TMA=1, v10: 72 B, the producer's
// choice between a TMA and a cp.async step; emptying the producer leaves
// the consumers with no spills at all.)
constexpr int kBwdSm90SpillBytes = 80;

// ptxas kept every wgmma asynchronous: none of the infos it prints when it
// injects a wait (C7517) or serialises the wgmmas (C7511, C7512; C7520 for a
// divergent path, notes/bwd.md v11).
void ExpectWgmmaPipelined(const std::string& log, const std::string& what) {
  for (const char* code : {"C7511", "C7512", "C7517", "C7520"}) {
    EXPECT_EQ(log.find(code), std::string::npos) << what << ": " << code << "\n" << log;
  }
}
// Compiles bwd_sm90 settings (setting, source) for sm_90a: each compiles, keeps
// the wgmma pipeline and spills at most spill_limit(setting) bytes each way.
void ExpectBwdSm90SettingsCompile(const std::vector<std::pair<std::string, std::string>>& jobs,
                                  const std::function<int(const std::string&)>& spill_limit) {
  std::vector<std::string> sources;
  for (const auto& job : jobs) sources.push_back(job.second);
  CompileEach(sources, "sm_90a", [&](size_t i, const testing::CompileReport& r) {
    const std::string& what = jobs[i].first;
    ASSERT_TRUE(r.ok) << what << "\n" << r.log;
    EXPECT_LE(r.spill_stores, spill_limit(what)) << what << "\n" << r.log;
    EXPECT_LE(r.spill_loads, spill_limit(what)) << what << "\n" << r.log;
    ExpectWgmmaPipelined(r.log, what);
  });
}
TEST(TemplatesCompileSm90, BwdSm90DefaultKnobsSpillLittleAndKeepTheWgmmaPipeline) {
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
    EXPECT_LE(r.spill_stores, kBwdSm90SpillBytes) << "d" << d << "\n" << r.log;
    EXPECT_LE(r.spill_loads, kBwdSm90SpillBytes) << "d" << d << "\n" << r.log;
    ExpectWgmmaPipelined(r.log, "d" + std::to_string(d));
  }
}

// fwd_sm90 on the shared Hopper parts (templates/sm90/) compiles to the same
// cubin bytes as the single-file kernel it was split from (main at fd693fe),
// at every valid setting. The hashes hold only for the NVRTC that made them
// (13.0) and the options of testing::CompileVariant; with another NVRTC the
// test is skipped. A deliberate change to fwd_sm90's code changes them:
// regenerate with `kforge-kernels-compile --cubin-sha256 fwd_sm90` and say so
// in the commit (kernels/notes/parts.md).
TEST(TemplatesCompileSm90, FwdSm90CubinsArePinned) {
  bool listed = false;
  for (const auto& t : ListTemplates()) listed = listed || t.name == "fwd_sm90";
  if (!listed) GTEST_SKIP() << "fwd_sm90 is not in this build";
  const auto version = testing::GetNvrtcVersion();
  if (version.major != 13 || version.minor != 0) {
    GTEST_SKIP() << "cubin hashes were taken with NVRTC 13.0, this is " << version.major << "."
                 << version.minor;
  }
  const std::map<std::string, std::string> pinned = {
      {"d64 BLOCK_M=128 BLOCK_N=64 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=2", "6db23252ee7f0477114bc6d7b0087d7bcd55d53bc342ff99c869aab6b6f6b3cc"},
      {"d64 BLOCK_M=128 BLOCK_N=64 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=2", "80efd1931d39f6aa0b3f480f480fa67b14d53b0af2b1390c84a01bba7962c269"},
      {"d64 BLOCK_M=128 BLOCK_N=64 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=3", "64777377eeb19ab3de5a2592e0fe397d7caefab5d9056f6669163e17b4642242"},
      {"d64 BLOCK_M=128 BLOCK_N=64 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=3", "6205d047224f4e9b7b9c0f79341c283f37b6dd82cfd3924ad3f57ed49d776612"},
      {"d64 BLOCK_M=128 BLOCK_N=64 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=4", "80aa29cfbd068504bdb452a697f5301bb6d2ef245c22b5b2fb0f4495296a6f9a"},
      {"d64 BLOCK_M=128 BLOCK_N=64 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=4", "ea28c47ec7f3988bf3b01f18bc7cc22befa9ada0d40c9fb4a6629dbbec0bc7d2"},
      {"d64 BLOCK_M=128 BLOCK_N=96 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=2", "0d2e26650fc718b3bd1e4fd155b5ab3a40d180904f96c3a8a3c71913a08f67f8"},
      {"d64 BLOCK_M=128 BLOCK_N=96 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=2", "0be1c5e6dee430ac5e72da16f05f3d5a6ed8edaabb9ceaf0e6197b2c4ac3de6d"},
      {"d64 BLOCK_M=128 BLOCK_N=96 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=3", "750d796475637fbf97d4e1be10c2132a8c83b65fef7f406fb9c41186b9b980ef"},
      {"d64 BLOCK_M=128 BLOCK_N=96 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=3", "35b4392b34d39399b412d3d2cf34cf3257bd2d58147c2692d0b05f748d29b5e0"},
      {"d64 BLOCK_M=128 BLOCK_N=96 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=4", "fd0e81197ee6b2d9aa2cfecd84e90fe40efc896798fe0f73708b7d66897ce383"},
      {"d64 BLOCK_M=128 BLOCK_N=96 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=4", "86c79b0ed4b166077e770287fecaf9e3feeb283ac51388eafd33c97e679e64c9"},
      {"d64 BLOCK_M=128 BLOCK_N=128 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=2", "040344bda729aa320550ee4b438e47a6884272ba2f4ed5e99753d1480be3ac7e"},
      {"d64 BLOCK_M=128 BLOCK_N=128 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=2", "e887b4f1cbc5893031e41d76b4ae0a7a5c5cbdbe9a2d97b15a383c701f556946"},
      {"d64 BLOCK_M=128 BLOCK_N=128 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=3", "f4e347657d5c8902fffdbf1cf03feea712ef9da961b2aba0ed1f19b4b116010f"},
      {"d64 BLOCK_M=128 BLOCK_N=128 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=3", "9df8e1a77c2b9b9ca23ba2398819890be9735ab972749d1b58877f2ffdb5cca1"},
      {"d64 BLOCK_M=128 BLOCK_N=128 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=4", "fecec22671873d45ac3333628ff8a606a2f5fd70bba1ce5ef55efbc0ec436a00"},
      {"d64 BLOCK_M=128 BLOCK_N=128 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=4", "ee122633496d9d9e683ae3fa82488dc55159fb556e33f09144996df16f1877f8"},
      {"d64 BLOCK_M=128 BLOCK_N=176 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=2", "63037f616f317d0527a9229529c55625f5a0ac042f2eb375ad221e743246b08c"},
      {"d64 BLOCK_M=128 BLOCK_N=176 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=2", "03eaa463ed12fa9bf201fc6bd22824c113631e3afc3d6854ec5f2045759ddc5d"},
      {"d64 BLOCK_M=128 BLOCK_N=176 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=3", "dc6c915c823912974050049c4be62db026488adbf331f147f729708c49620aea"},
      {"d64 BLOCK_M=128 BLOCK_N=176 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=3", "4d118f7ba7c8ede613d836b872ab3c6c85432f2cb0adbb4cdb51226507d9bf7a"},
      {"d64 BLOCK_M=128 BLOCK_N=176 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=4", "42a7840526d72d2d365eb727847682bb594feb4de7537aeb86c897db9ec52627"},
      {"d64 BLOCK_M=128 BLOCK_N=176 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=4", "2dc5eda1594352b7f1bc1f20df60d9d91eace0b8b78cfaca9b5bf7061f2b337d"},
      {"d64 BLOCK_M=128 BLOCK_N=192 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=2", "1417d4d134905ece9398bb0b4e4978b817a84b9bb89137d55ed93bf16ae42fac"},
      {"d64 BLOCK_M=128 BLOCK_N=192 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=2", "aeb9de6ba4b5a389fb62c00d56e50b9c20a26bb40032d2ae484dad42141fbb4d"},
      {"d64 BLOCK_M=128 BLOCK_N=192 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=3", "eaca453e42eb68850bbd5132278ffa6475f276f5b5ce39e51d574a4aa3ece2dc"},
      {"d64 BLOCK_M=128 BLOCK_N=192 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=3", "7c08cb2336e11f8d1c3a7707135450ff622688f7ad83cb4d5fdd4b516082af67"},
      {"d64 BLOCK_M=128 BLOCK_N=192 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=4", "89cb80fae169c356c659919516886c118f947eeb5a84c766879f16d4f95dba03"},
      {"d64 BLOCK_M=128 BLOCK_N=192 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=4", "03096a66c3967d5600347feb1129ec0acc6160280978ac230e2b61a3b2f29487"},
      {"d128 BLOCK_M=128 BLOCK_N=64 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=2", "98b42260f7275e63ad58f9ac5e6807a32231c93bbf4e0d0a49c6abd789aafc91"},
      {"d128 BLOCK_M=128 BLOCK_N=64 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=2", "211b97e69d151c39873ab34b50f9eae59ee7343f41edd865c6b8181835227d0c"},
      {"d128 BLOCK_M=128 BLOCK_N=64 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=3", "8a9b8848b15274973f5e2dfaceee892c63713f3b6ef246a702176fada43fd747"},
      {"d128 BLOCK_M=128 BLOCK_N=64 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=3", "157a2897d04f7135d6f796fa74f5113e9414ce7e7e1a960c6ea362c5c7954875"},
      {"d128 BLOCK_M=128 BLOCK_N=64 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=4", "ee81722d28306f59d11b597ffed709d33c7e3254922193edb8b14f9702e4a72a"},
      {"d128 BLOCK_M=128 BLOCK_N=64 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=4", "492acedfdb16b302015d2d39c55161fec5216091e73bad0b28b4ebcdbeaec9cf"},
      {"d128 BLOCK_M=128 BLOCK_N=96 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=2", "d56eb4fcfa0ee2d3a2396c299a2beb34a85c7577ca14cc1459c923ff49b28dbc"},
      {"d128 BLOCK_M=128 BLOCK_N=96 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=2", "79dbb7f9f6bfb60daa3be3513339cbf98ce33234f50ac504c6605c04f63cdcfc"},
      {"d128 BLOCK_M=128 BLOCK_N=96 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=3", "dc5f33ebca17aef9f8f6e817b5ff03f4ef7cf6f0b1a39878f196c570c09cea46"},
      {"d128 BLOCK_M=128 BLOCK_N=96 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=3", "0a4413073cbdc8da4e0c0b0d9c867c5fbb78109c5c79cef31e2e65d7c1e55f3b"},
      {"d128 BLOCK_M=128 BLOCK_N=96 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=4", "510dbbbfb915d6fbd18f76a75f03c7ec01dee85fa5f7c2139880fb708264ad77"},
      {"d128 BLOCK_M=128 BLOCK_N=96 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=4", "99bc6a1a382ed892e32edc2c8d165844e3c5b89906b81a28556ab06942ec5efa"},
      {"d128 BLOCK_M=128 BLOCK_N=128 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=2", "701349232524163753fc7aab9e822ddc494e93a55232019c1b5254ce52dba89a"},
      {"d128 BLOCK_M=128 BLOCK_N=128 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=2", "8df0f889f6efb4bd0dd9bfbd1c3dfcfa90a6432e12c2591ebca3644c5262b816"},
      {"d128 BLOCK_M=128 BLOCK_N=128 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=3", "3143065f06e5ec20cc703eebce7fefd76fa0a91cd5f925582f19720a5d5fe010"},
      {"d128 BLOCK_M=128 BLOCK_N=128 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=3", "99e92a8635cb94dc2a52fb99e22c39944abeec004dd8acdf328185879c313f73"},
      {"d128 BLOCK_M=128 BLOCK_N=176 ORDER=0 PACK=0 PERSISTENT=0 QAHEAD=0 STAGES=2", "53616ee0291792e63adff2c073d3a056567bed2c47dc731195f5239c09216fd3"},
      {"d128 BLOCK_M=128 BLOCK_N=176 ORDER=0 PACK=0 PERSISTENT=1 QAHEAD=0 STAGES=2", "99ada8d93c57a0f85701d65825da4582622af96b51662359d362e1874795bca0"},
  };
  std::vector<std::pair<std::string, std::string>> jobs;  // (setting, source)
  for (int d : {64, 128}) {
    for (int bn : {64, 96, 128, 176, 192}) {
      for (int st : {2, 3, 4}) {
        for (int pers : {0, 1}) {
          auto v = Instantiate("fwd_sm90",
                               {{"BLOCK_M", 128}, {"BLOCK_N", bn}, {"STAGES", st},
                                {"PERSISTENT", pers}},
                               d);
          if (!v.ok()) continue;
          jobs.emplace_back(Describe(v->knobs, d), v->source);
        }
      }
    }
  }
  ASSERT_EQ(jobs.size(), pinned.size());
  std::vector<std::string> sources;
  for (const auto& job : jobs) sources.push_back(job.second);
  CompileEach(sources, "sm_90a", [&](size_t i, const testing::CompileReport& r) {
    const std::string& what = jobs[i].first;
    ASSERT_TRUE(r.ok) << what << "\n" << r.log;
    ASSERT_TRUE(pinned.count(what)) << what;
    EXPECT_EQ(Sha256Hex(r.cubin), pinned.at(what)) << what;
  });
}

// bwd_sm90: every setting validate() accepts compiles with little spilling
// and no wgmma serialization (kernels/notes/bwd.md, v5), and, with the NVRTC
// that made them (13.0), to the cubins that passed every GPU test and gate
// (v11, notes/bwd.md: P^T while dP^T runs; the CSKIP=1 TMA=1 defaults,
// KVFIRST=1 with SPLIT=1's class; v13: each setting with DQZ=0 and with the
// default DQZ=1, whose DQZ=0 cubins v12's are; v17: HELP=2 with SPLIT=1's
// class at head dim 128, run on an H100; v18: with CSKIP=0 too, that class's
// default at head dim 128; v20: the served defaults with KVSTORE=1). A
// deliberate kernel change changes them: regenerate with
// `kforge-kernels-compile --cubin-sha256 bwd_sm90` and say so in the commit.
TEST(TemplatesCompileSm90, BwdSm90SettingsKeepTheWgmmaPipelineAndArePinned) {
  bool listed = false;
  for (const auto& t : ListTemplates()) listed = listed || t.name == "bwd_sm90";
  if (!listed) GTEST_SKIP() << "bwd_sm90 is not in this build";
  const auto version = testing::GetNvrtcVersion();
  const bool pin = version.major == 13 && version.minor == 0;
  const std::map<std::string, std::string> pinned = {
      {"d64 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=0 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=0 SPLIT=0 STAGES=2 TMA=1", "64ce5955b118986d04e35b1724c717542d9cfeb5798ef830e60cf028d0e1e029"},
      {"d64 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=0 SPLIT=0 STAGES=2 TMA=1", "2b9caa593a99f639f6e29abc012983648713524d9cdb7b99ed25e6fa71e3c012"},
      {"d64 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=0 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=1 SPLIT=0 STAGES=2 TMA=1", "b8cbe53a32339318d7da5578027177c6b1065b351bce0e23358c1d29cc95b2ca"},
      {"d64 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=1 SPLIT=0 STAGES=2 TMA=1", "1d453cfcf10eb9d7ed4060055b5b8eeb3bff6196a190b95d1903e59b8425d7b6"},
      {"d64 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=0 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=1 SPLIT=1 STAGES=2 TMA=1", "1b3d0d65689b9b2fb096db11e74e2b1521ed297a01e7cc2c2bab5f3d71bd0e3c"},
      {"d64 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=1 SPLIT=1 STAGES=2 TMA=1", "f8af1fa89d1a551254664f9c82b0da12141665eaaf255f1beee13f98a635a42f"},
      {"d64 BLOCK_M=128 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=0 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=0 SPLIT=0 STAGES=2 TMA=1", "e675dba489a944e30f4509d930daf6394ca50866e9529e43d752205cabdb513e"},
      {"d64 BLOCK_M=128 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=0 SPLIT=0 STAGES=2 TMA=1", "f247ab2f57569e30376d20316de0d222584c7110602986a53066559713d41bbe"},
      {"d64 BLOCK_M=128 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=0 DQ_DIRECT=1 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=0 SPLIT=0 STAGES=2 TMA=1", "7bd51d138a485ae0924113b3592fd33d78a0cd4102160d8502498f86c634765a"},
      {"d64 BLOCK_M=128 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=1 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=0 SPLIT=0 STAGES=2 TMA=1", "b620b6163b69deac5fea0d020f30ba3ebcc4e5dfb1032d8ca8f27f0b3c065321"},
      {"d64 BLOCK_M=128 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=0 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=1 SPLIT=0 STAGES=2 TMA=1", "f15cc7b60165371970fc94f8004eef45e193aee3c298082c3f07e67eb8ae464f"},
      {"d64 BLOCK_M=128 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=1 SPLIT=0 STAGES=2 TMA=1", "36f720e002db2913a9acf37685b1293b5748714a04a27585b5ded416c98e11df"},
      {"d64 BLOCK_M=128 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=0 DQ_DIRECT=1 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=1 SPLIT=0 STAGES=2 TMA=1", "b1227bdba5d81ff256a521a1fbee1a424e10f725f472d8c89985e5960791df4f"},
      {"d64 BLOCK_M=128 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=1 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=1 SPLIT=0 STAGES=2 TMA=1", "d2669b6d1ab96bdff695b6c2b96c8723b0f9277f8e261f7be10c5f805f7b48d8"},
      {"d64 BLOCK_M=128 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=0 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=1 SPLIT=1 STAGES=2 TMA=1", "cfa97d9d513c5d03bbfa06634c3b75b553bde8541fa80b4a6d3940b2d05b7c85"},
      {"d64 BLOCK_M=128 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=1 SPLIT=1 STAGES=2 TMA=1", "6f86c8792c8daa5559e492207a97f81020ff3a5b3f5fda671880ac3cc8e550b2"},
      {"d64 BLOCK_M=128 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=0 DQ_DIRECT=1 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=1 SPLIT=1 STAGES=2 TMA=1", "b6bb59d216c20e930baa6c89b929c77cb2e49342ac630b5c4f9dd09a87ebb911"},
      {"d64 BLOCK_M=128 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=1 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=1 SPLIT=1 STAGES=2 TMA=1", "0f8a27ef3c5bd36a518996b679099603602a7ed575ac79ab99ba8c2d0374074c"},
      {"d128 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=0 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=0 SPLIT=0 STAGES=2 TMA=1", "bdab5b5efe07b9d06b4a194523933c066665227afda29a4160396801ee1e88ca"},
      {"d128 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=0 SPLIT=0 STAGES=2 TMA=1", "2d2ce57e565c1045e7529b97f1ccdaf89fef8d42a495f848bb69eb86cd10807b"},
      {"d128 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=0 DQ_DIRECT=1 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=0 SPLIT=0 STAGES=2 TMA=1", "602848ca06c7ff651e9c450e32a41e26f3462e29f39d9efe7355817860dbef81"},
      {"d128 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=1 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=0 SPLIT=0 STAGES=2 TMA=1", "40dc17e55e02aa033dd56b6b9bea4cf3d3d304b7083f9144bd9f6db14f1028f6"},
      {"d128 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=0 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=1 SPLIT=0 STAGES=2 TMA=1", "48ee3dd1b321e12ef2ba63d1b537644c929701ee417a209d99592c8422ae2613"},
      {"d128 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=1 SPLIT=0 STAGES=2 TMA=1", "091c971652c15573c3c46829b02bedf2dd6ba9a8b51dc0b3ab7bdae0d1ac616e"},
      {"d128 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=0 DQ_DIRECT=1 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=1 SPLIT=0 STAGES=2 TMA=1", "ee08ad0c18c936e3367523cdff94c0c72bf07a6b0b058e774c439b15d00537f8"},
      {"d128 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=1 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=1 SPLIT=0 STAGES=2 TMA=1", "cd08d73700e90460307091079bd4120f7aa893f7a1022773cc1a0af27e01fc9e"},
      {"d128 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=0 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=1 SPLIT=1 STAGES=2 TMA=1", "47db9295039ec30bc51a7b1357677aca56d716c6a3604ea9c7f2fd9a984f0bd0"},
      {"d128 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=1 SPLIT=1 STAGES=2 TMA=1", "db9a69fcc27678f42f2389f397e499e7da5694de35306d5735a0e41eb4a35516"},
      {"d128 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=0 DQ_DIRECT=1 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=1 SPLIT=1 STAGES=2 TMA=1", "6b9010a147b9f11bf7245bca75ba19c003a831d27f7e615646d4f540df37f97c"},
      {"d128 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=1 HELP=0 KVFIRST=0 KVSTORE=0 ORDER=1 SPLIT=1 STAGES=2 TMA=1", "0a5dcd0e84a84796a17d1dfd85b21ac6831af8dae679d2acfb9f781f66b60d94"},
      {"d64 BLOCK_M=128 BLOCK_N=128 CSKIP=1 DET=0 DQW=1 DQZ=0 DQ_DIRECT=0 HELP=0 KVFIRST=1 KVSTORE=0 ORDER=1 SPLIT=1 STAGES=2 TMA=1", "4b136c1e6e1580bacde8b825bf0457205f12817dea966b7dad426aa942658ddc"},
      {"d64 BLOCK_M=128 BLOCK_N=128 CSKIP=1 DET=0 DQW=1 DQZ=0 DQ_DIRECT=0 HELP=2 KVFIRST=1 KVSTORE=0 ORDER=1 SPLIT=1 STAGES=2 TMA=1", "b2d0d36647e27d38d3c329da8ae2f16882e7babdf5eb1afa7f32e5db4e5f450d"},
      {"d128 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=1 DQZ=0 DQ_DIRECT=0 HELP=0 KVFIRST=1 KVSTORE=0 ORDER=1 SPLIT=1 STAGES=2 TMA=1", "9b6259f11349ab69cc53d1cb91da7ce962a9ea77e7e2373ad7dd9f83f09eae94"},
      {"d128 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=1 DQZ=0 DQ_DIRECT=0 HELP=2 KVFIRST=1 KVSTORE=0 ORDER=1 SPLIT=1 STAGES=2 TMA=1", "f0ae8c9e527ae4c43eedcd3707a3b3f49e387c0b927de742f81840a7c79853e4"},
      {"d128 BLOCK_M=64 BLOCK_N=128 CSKIP=0 DET=0 DQW=1 DQZ=0 DQ_DIRECT=0 HELP=2 KVFIRST=1 KVSTORE=0 ORDER=1 SPLIT=1 STAGES=2 TMA=1", "63265095efb6d4a8e26f3562bd7d4569aeeb1dee9f062fae95baa8a9c0041588"},
      {"d64 BLOCK_M=128 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=1 ORDER=0 SPLIT=0 STAGES=2 TMA=1", "e07038a193bfe903da03b7619e512cdc8e24db2efcbe67f19b2c507cad978d7f"},
      {"d64 BLOCK_M=128 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=1 HELP=0 KVFIRST=0 KVSTORE=1 ORDER=0 SPLIT=0 STAGES=2 TMA=1", "0cffdbb50127968145cfcc3f46d33f7956a0ea5943d6af87ed0747290ff9c8d4"},
      {"d64 BLOCK_M=128 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=1 ORDER=1 SPLIT=0 STAGES=2 TMA=1", "f5d5ba216251bca345f0fea2cd42a8428b743a13303f8f0e5441533febf99019"},
      {"d64 BLOCK_M=128 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=1 HELP=0 KVFIRST=0 KVSTORE=1 ORDER=1 SPLIT=0 STAGES=2 TMA=1", "85a3b070bcb654a910f8001d7d333f356923e9dce4cea1e97ea7b5644f4e31b2"},
      {"d64 BLOCK_M=128 BLOCK_N=128 CSKIP=1 DET=0 DQW=1 DQZ=0 DQ_DIRECT=0 HELP=2 KVFIRST=1 KVSTORE=1 ORDER=1 SPLIT=1 STAGES=2 TMA=1", "cadcf2ec29969a424141d659e85ac25d98565a5639c36343bff157819b81f5d3"},
      {"d128 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=1 ORDER=0 SPLIT=0 STAGES=2 TMA=1", "a30189429616b0da7784ea439010eaa5cb08a29d9b033716dc2a332ab7a84916"},
      {"d128 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=1 HELP=0 KVFIRST=0 KVSTORE=1 ORDER=0 SPLIT=0 STAGES=2 TMA=1", "1976b118deea792e5d6ca743630c44eda2a78142350157bd9185d472be12f6e0"},
      {"d128 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=1 ORDER=1 SPLIT=0 STAGES=2 TMA=1", "4983504e695dbc36fb9b92b604c6500f3a93ab8ff53cec3b0f18f8c89c6f7235"},
      {"d128 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=1 HELP=0 KVFIRST=0 KVSTORE=1 ORDER=1 SPLIT=0 STAGES=2 TMA=1", "926edfb69f9cb4d8b7be149143af0a067420e84e3f6a4c476a2010843c4b6176"},
      {"d128 BLOCK_M=64 BLOCK_N=128 CSKIP=0 DET=0 DQW=1 DQZ=0 DQ_DIRECT=0 HELP=2 KVFIRST=1 KVSTORE=1 ORDER=1 SPLIT=1 STAGES=2 TMA=1", "7a8848eab5a3408971d09c938b047d1d15c97491ce391180c5acac5969f2437d"},
  };
  std::vector<std::pair<std::string, std::string>> jobs;  // (setting, source)
  for (int d : {64, 128}) {
    for (int bm : {64, 128}) {
      for (int order : {0, 1}) {
        for (int split : {0, 1}) {
          for (int direct : {0, 1}) {
            for (int dqz : {0, 1}) {  // DQZ=1: the defaults outside the heavy-tailed class
              auto v = Instantiate("bwd_sm90",
                                   {{"BLOCK_M", bm}, {"BLOCK_N", 128}, {"STAGES", 2},
                                    {"ORDER", order}, {"SPLIT", split}, {"DQ_DIRECT", direct},
                                    {"DQZ", dqz}},
                                   d);
              if (!v.ok()) continue;  // refused by validate()
              EXPECT_EQ(v->manifest.restores_dq_accum, dqz == 1);
              jobs.emplace_back(Describe(v->knobs, d), v->source);
            }
          }
        }
      }
    }
    // the heavy-tailed short class's defaults: SPLIT=1 with KVFIRST=1 and DQW=1
    auto v = Instantiate("bwd_sm90",
                         {{"BLOCK_M", d == 64 ? 128 : 64}, {"BLOCK_N", 128}, {"STAGES", 2},
                          {"ORDER", 1}, {"SPLIT", 1}, {"KVFIRST", 1}, {"DQW", 1}},
                         d);
    ASSERT_TRUE(v.ok()) << v.status();
    jobs.emplace_back(Describe(v->knobs, d), v->source);
    // and its HELP=2 (the class's default since v18) with CSKIP 1 (v17; at
    // head dim 64 the default) and at head dim 128 0 (the default): the
    // cubins run on powerlaw_short
    for (int cskip : {1, 0}) {
      if (d == 64 && cskip == 0) break;
      auto h = Instantiate("bwd_sm90",
                           {{"BLOCK_M", d == 64 ? 128 : 64}, {"BLOCK_N", 128}, {"STAGES", 2},
                            {"ORDER", 1}, {"SPLIT", 1}, {"KVFIRST", 1}, {"DQW", 1},
                            {"CSKIP", cskip}, {"HELP", 2}},
                           d);
      ASSERT_TRUE(h.ok()) << h.status();
      jobs.emplace_back(Describe(h->knobs, d), h->source);
    }
  }
  // KVSTORE=1, the served default (TMA stores of dK and dV): outside the
  // heavy-tailed class (DQZ=1), both orders, with and without DQ_DIRECT, and
  // that class's HELP=2 settings; the cubins of v20's results run, where
  // KVSTORE=1 was the best variant of every public shape
  for (int d : {64, 128}) {
    const int bm = d == 64 ? 128 : 64;
    for (int order : {0, 1}) {
      for (int direct : {0, 1}) {
        auto v = Instantiate("bwd_sm90",
                             {{"BLOCK_M", bm}, {"BLOCK_N", 128}, {"STAGES", 2}, {"ORDER", order},
                              {"DQ_DIRECT", direct}, {"DQZ", 1}, {"KVSTORE", 1}},
                             d);
        ASSERT_TRUE(v.ok()) << v.status();
        EXPECT_EQ(v->manifest.tensor_maps.size(), 4u);
        jobs.emplace_back(Describe(v->knobs, d), v->source);
      }
    }
    auto h = Instantiate("bwd_sm90",
                         {{"BLOCK_M", bm}, {"BLOCK_N", 128}, {"STAGES", 2}, {"ORDER", 1},
                          {"SPLIT", 1}, {"KVFIRST", 1}, {"DQW", 1}, {"CSKIP", d == 64 ? 1 : 0},
                          {"HELP", 2}, {"KVSTORE", 1}},
                         d);
    ASSERT_TRUE(h.ok()) << h.status();
    jobs.emplace_back(Describe(h->knobs, d), h->source);
  }
  // BLOCK_M=128 needs head dim 64, SPLIT=1 ORDER=1, DQ_DIRECT=1 not BLOCK_M=64 at d64
  ASSERT_EQ(jobs.size(), 45u);
  ASSERT_EQ(jobs.size(), pinned.size());
  std::vector<std::string> sources;
  for (const auto& job : jobs) sources.push_back(job.second);
  CompileEach(sources, "sm_90a", [&](size_t i, const testing::CompileReport& r) {
    const std::string& what = jobs[i].first;
    ASSERT_TRUE(r.ok) << what << "\n" << r.log;
    // SPLIT=1 keeps a half's step range over the tile: at head dim 128 it
    // spills up to 124 B (measured on powerlaw_short, still 1.04x: v8)
    // DQ_DIRECT=1's dQ stores spill up to 176 B at head dim 128, 220 B with
    // SPLIT=1 (served only where every tile takes that path, memory-bound: v9)
    const int spill = kBwdSm90SpillBytes * (what.find("SPLIT=1") != std::string::npos ? 2 : 1) *
                      (what.find("DQ_DIRECT=1") != std::string::npos ? 3 : 1);
    EXPECT_LE(r.spill_stores, spill) << what << "\n" << r.log;
    EXPECT_LE(r.spill_loads, spill) << what << "\n" << r.log;
    ExpectWgmmaPipelined(r.log, what);
    ASSERT_TRUE(pinned.count(what)) << what;
    if (pin) EXPECT_EQ(Sha256Hex(r.cubin), pinned.at(what)) << what;
  });
}


// bwd_sm90's CSKIP and TMA knobs (notes/bwd.md v10) off, at both head dims
// and with SPLIT: compiled, the wgmma pipeline kept (ExpectWgmmaPipelined),
// the tensor maps asked for exactly with TMA=1, and the spills bounded (all
// of them the 40-register producer's: with the producer emptied the
// consumers spill nothing at 232 registers).
TEST(TemplatesCompileSm90, BwdSm90SkipAndTmaSettingsCompile) {
  bool listed = false;
  for (const auto& t : ListTemplates()) listed = listed || t.name == "bwd_sm90";
  if (!listed) GTEST_SKIP() << "bwd_sm90 is not in this build";
  std::vector<std::pair<std::string, std::string>> jobs;  // (setting, source)
  for (int d : {64, 128}) {
    for (int cskip : {0, 1}) {
      for (int tma : {0, 1}) {
        if (cskip == 1 && tma == 1) continue;  // the defaults: pinned above
        for (int split : {0, 1}) {
          auto v = Instantiate("bwd_sm90",
                               {{"BLOCK_M", d == 64 ? 128 : 64}, {"BLOCK_N", 128}, {"STAGES", 2},
                                {"ORDER", 1}, {"SPLIT", split}, {"DQ_DIRECT", 0},
                                {"CSKIP", cskip}, {"TMA", tma}},
                               d);
          ASSERT_TRUE(v.ok()) << v.status();
          EXPECT_EQ(v->manifest.tensor_maps.size(), tma == 1 ? 2u : 0u);
          jobs.emplace_back(Describe(v->knobs, d), v->source);
        }
      }
    }
  }
  ExpectBwdSm90SettingsCompile(jobs, [](const std::string& what) {
    return kBwdSm90SpillBytes * (what.find("SPLIT=1") != std::string::npos ? 2 : 1) + 16;
  });
}

// bwd_sm90 DQW=1 (a query block's first visitor copies its dQ slices, the
// host zeroes no dq_accum; notes/bwd.md v12) at both head dims, with SPLIT,
// DQ_DIRECT and KVFIRST: compiled, the wgmma pipeline kept, spills bounded
// as the DQW=0 settings' are.
TEST(TemplatesCompileSm90, BwdSm90DqwSettingsCompile) {
  bool listed = false;
  for (const auto& t : ListTemplates()) listed = listed || t.name == "bwd_sm90";
  if (!listed) GTEST_SKIP() << "bwd_sm90 is not in this build";
  std::vector<std::pair<std::string, std::string>> jobs;  // (setting, source)
  for (int d : {64, 128}) {
    for (int order : {0, 1}) {
      for (int split : {0, 1}) {
        for (int direct : {0, 1}) {
          if (split == 1 && order == 0) continue;  // refused: SPLIT needs ORDER 1
          auto v = Instantiate("bwd_sm90",
                               {{"BLOCK_M", d == 64 ? 128 : 64}, {"BLOCK_N", 128},
                                {"STAGES", 2}, {"ORDER", order}, {"SPLIT", split},
                                {"DQ_DIRECT", direct}, {"KVFIRST", split}, {"DQW", 1}},
                               d);
          ASSERT_TRUE(v.ok()) << v.status();
          EXPECT_FALSE(v->manifest.zero_dq_accum);
          jobs.emplace_back(Describe(v->knobs, d), v->source);
        }
      }
    }
  }
  ExpectBwdSm90SettingsCompile(jobs, [](const std::string& what) {
    return kBwdSm90SpillBytes * (what.find("SPLIT=1") != std::string::npos ? 2 : 1) *
           (what.find("DQ_DIRECT=1") != std::string::npos ? 3 : 1);
  });
}

// bwd_sm90 HELP=1 (a head's end queues its completed query blocks once every
// tile is handed out, CTAs without tiles convert them; notes/bwd.md v16) at
// both head dims, with SPLIT, DQ_DIRECT, DQW and DQZ: compiled, the wgmma
// pipeline kept, the workspace's fixed bytes asked for (the queue), spills
// bounded as the HELP=0 settings' are.
TEST(TemplatesCompileSm90, BwdSm90HelpSettingsCompile) {
  bool listed = false;
  for (const auto& t : ListTemplates()) listed = listed || t.name == "bwd_sm90";
  if (!listed) GTEST_SKIP() << "bwd_sm90 is not in this build";
  std::vector<std::pair<std::string, std::string>> jobs;  // (setting, source)
  for (int d : {64, 128}) {
    for (int split : {0, 1}) {
      for (int direct : {0, 1}) {
        for (int help : {1, 2}) {
          const int dqw = split;  // the heavy-tailed class's defaults, else DQZ
          auto v = Instantiate("bwd_sm90",
                               {{"BLOCK_M", d == 64 ? 128 : 64}, {"BLOCK_N", 128}, {"STAGES", 2},
                                {"ORDER", 1}, {"SPLIT", split}, {"DQ_DIRECT", direct},
                                {"KVFIRST", split}, {"DQW", dqw}, {"DQZ", 1 - dqw},
                                {"HELP", help}},
                               d);
          ASSERT_TRUE(v.ok()) << v.status();
          EXPECT_EQ(v->manifest.workspace_fixed_bytes, kf_bwd_sm90_help_bytes());
          jobs.emplace_back(Describe(v->knobs, d), v->source);
        }
      }
    }
  }
  ExpectBwdSm90SettingsCompile(jobs, [](const std::string& what) {
    return kBwdSm90SpillBytes * (what.find("SPLIT=1") != std::string::npos ? 2 : 1) *
           (what.find("DQ_DIRECT=1") != std::string::npos ? 3 : 1);
  });
}

// bwd_sm90 DET=1 (ordered dQ adds; notes/bwd.md v21, v23) at both head dims,
// CSKIP off and on, with HELP=2 and DQ_DIRECT: compiled, the wgmma pipeline
// kept, spills bounded as the plain settings' are.
TEST(TemplatesCompileSm90, BwdSm90DetSettingsCompile) {
  bool listed = false;
  for (const auto& t : ListTemplates()) listed = listed || t.name == "bwd_sm90";
  if (!listed) GTEST_SKIP() << "bwd_sm90 is not in this build";
  std::vector<std::pair<std::string, std::string>> jobs;  // (setting, source)
  for (int d : {64, 128}) {
    for (int cskip : {0, 1}) {
      for (auto [help, direct] : {std::pair{0, 0}, std::pair{2, 1}}) {
        auto v = Instantiate("bwd_sm90",
                             {{"BLOCK_M", d == 64 ? 128 : 64}, {"BLOCK_N", 128}, {"STAGES", 2},
                              {"ORDER", 0}, {"DET", 1}, {"CSKIP", cskip}, {"DQZ", 1},
                              {"HELP", help}, {"DQ_DIRECT", direct}, {"KVSTORE", 1}},
                             d);
        ASSERT_TRUE(v.ok()) << v.status();
        EXPECT_TRUE(v->manifest.deterministic);
        jobs.emplace_back(Describe(v->knobs, d), v->source);
      }
    }
  }
  ExpectBwdSm90SettingsCompile(jobs, [](const std::string& what) {
    return kBwdSm90SpillBytes * (what.find("DQ_DIRECT=1") != std::string::npos ? 3 : 1);
  });
}

INSTANTIATE_TEST_SUITE_P(Archs, TemplatesCompile,
                         ::testing::Values("sm_80", "sm_90a", "sm_100a"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kforge

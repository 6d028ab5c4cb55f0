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
// both head dims with no more than DELTA=2's 32 B of producer spills (v4b:
// measured faster than the spill-free DELTA=1 anyway) and no serialised wgmma.
TEST(TemplatesCompileSm90, BwdSm90DefaultKnobsSpillAtMostTheProducersBytes) {
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
    EXPECT_LE(r.spill_stores, 32) << "d" << d << "\n" << r.log;
    EXPECT_LE(r.spill_loads, 32) << "d" << d << "\n" << r.log;
    EXPECT_EQ(r.log.find("C7517"), std::string::npos) << "wgmma wait injected\n" << r.log;
    EXPECT_EQ(r.log.find("C7511"), std::string::npos) << "wgmma serialized\n" << r.log;
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
      {"d64 BLOCK_M=128 BLOCK_N=64 PERSISTENT=0 STAGES=2", "6db23252ee7f0477114bc6d7b0087d7bcd55d53bc342ff99c869aab6b6f6b3cc"},
      {"d64 BLOCK_M=128 BLOCK_N=64 PERSISTENT=1 STAGES=2", "80efd1931d39f6aa0b3f480f480fa67b14d53b0af2b1390c84a01bba7962c269"},
      {"d64 BLOCK_M=128 BLOCK_N=64 PERSISTENT=0 STAGES=3", "64777377eeb19ab3de5a2592e0fe397d7caefab5d9056f6669163e17b4642242"},
      {"d64 BLOCK_M=128 BLOCK_N=64 PERSISTENT=1 STAGES=3", "6205d047224f4e9b7b9c0f79341c283f37b6dd82cfd3924ad3f57ed49d776612"},
      {"d64 BLOCK_M=128 BLOCK_N=64 PERSISTENT=0 STAGES=4", "80aa29cfbd068504bdb452a697f5301bb6d2ef245c22b5b2fb0f4495296a6f9a"},
      {"d64 BLOCK_M=128 BLOCK_N=64 PERSISTENT=1 STAGES=4", "ea28c47ec7f3988bf3b01f18bc7cc22befa9ada0d40c9fb4a6629dbbec0bc7d2"},
      {"d64 BLOCK_M=128 BLOCK_N=96 PERSISTENT=0 STAGES=2", "0d2e26650fc718b3bd1e4fd155b5ab3a40d180904f96c3a8a3c71913a08f67f8"},
      {"d64 BLOCK_M=128 BLOCK_N=96 PERSISTENT=1 STAGES=2", "0be1c5e6dee430ac5e72da16f05f3d5a6ed8edaabb9ceaf0e6197b2c4ac3de6d"},
      {"d64 BLOCK_M=128 BLOCK_N=96 PERSISTENT=0 STAGES=3", "750d796475637fbf97d4e1be10c2132a8c83b65fef7f406fb9c41186b9b980ef"},
      {"d64 BLOCK_M=128 BLOCK_N=96 PERSISTENT=1 STAGES=3", "35b4392b34d39399b412d3d2cf34cf3257bd2d58147c2692d0b05f748d29b5e0"},
      {"d64 BLOCK_M=128 BLOCK_N=96 PERSISTENT=0 STAGES=4", "fd0e81197ee6b2d9aa2cfecd84e90fe40efc896798fe0f73708b7d66897ce383"},
      {"d64 BLOCK_M=128 BLOCK_N=96 PERSISTENT=1 STAGES=4", "86c79b0ed4b166077e770287fecaf9e3feeb283ac51388eafd33c97e679e64c9"},
      {"d64 BLOCK_M=128 BLOCK_N=128 PERSISTENT=0 STAGES=2", "040344bda729aa320550ee4b438e47a6884272ba2f4ed5e99753d1480be3ac7e"},
      {"d64 BLOCK_M=128 BLOCK_N=128 PERSISTENT=1 STAGES=2", "e887b4f1cbc5893031e41d76b4ae0a7a5c5cbdbe9a2d97b15a383c701f556946"},
      {"d64 BLOCK_M=128 BLOCK_N=128 PERSISTENT=0 STAGES=3", "f4e347657d5c8902fffdbf1cf03feea712ef9da961b2aba0ed1f19b4b116010f"},
      {"d64 BLOCK_M=128 BLOCK_N=128 PERSISTENT=1 STAGES=3", "9df8e1a77c2b9b9ca23ba2398819890be9735ab972749d1b58877f2ffdb5cca1"},
      {"d64 BLOCK_M=128 BLOCK_N=128 PERSISTENT=0 STAGES=4", "fecec22671873d45ac3333628ff8a606a2f5fd70bba1ce5ef55efbc0ec436a00"},
      {"d64 BLOCK_M=128 BLOCK_N=128 PERSISTENT=1 STAGES=4", "ee122633496d9d9e683ae3fa82488dc55159fb556e33f09144996df16f1877f8"},
      {"d64 BLOCK_M=128 BLOCK_N=176 PERSISTENT=0 STAGES=2", "63037f616f317d0527a9229529c55625f5a0ac042f2eb375ad221e743246b08c"},
      {"d64 BLOCK_M=128 BLOCK_N=176 PERSISTENT=1 STAGES=2", "03eaa463ed12fa9bf201fc6bd22824c113631e3afc3d6854ec5f2045759ddc5d"},
      {"d64 BLOCK_M=128 BLOCK_N=176 PERSISTENT=0 STAGES=3", "dc6c915c823912974050049c4be62db026488adbf331f147f729708c49620aea"},
      {"d64 BLOCK_M=128 BLOCK_N=176 PERSISTENT=1 STAGES=3", "4d118f7ba7c8ede613d836b872ab3c6c85432f2cb0adbb4cdb51226507d9bf7a"},
      {"d64 BLOCK_M=128 BLOCK_N=176 PERSISTENT=0 STAGES=4", "42a7840526d72d2d365eb727847682bb594feb4de7537aeb86c897db9ec52627"},
      {"d64 BLOCK_M=128 BLOCK_N=176 PERSISTENT=1 STAGES=4", "2dc5eda1594352b7f1bc1f20df60d9d91eace0b8b78cfaca9b5bf7061f2b337d"},
      {"d64 BLOCK_M=128 BLOCK_N=192 PERSISTENT=0 STAGES=2", "1417d4d134905ece9398bb0b4e4978b817a84b9bb89137d55ed93bf16ae42fac"},
      {"d64 BLOCK_M=128 BLOCK_N=192 PERSISTENT=1 STAGES=2", "aeb9de6ba4b5a389fb62c00d56e50b9c20a26bb40032d2ae484dad42141fbb4d"},
      {"d64 BLOCK_M=128 BLOCK_N=192 PERSISTENT=0 STAGES=3", "eaca453e42eb68850bbd5132278ffa6475f276f5b5ce39e51d574a4aa3ece2dc"},
      {"d64 BLOCK_M=128 BLOCK_N=192 PERSISTENT=1 STAGES=3", "7c08cb2336e11f8d1c3a7707135450ff622688f7ad83cb4d5fdd4b516082af67"},
      {"d64 BLOCK_M=128 BLOCK_N=192 PERSISTENT=0 STAGES=4", "89cb80fae169c356c659919516886c118f947eeb5a84c766879f16d4f95dba03"},
      {"d64 BLOCK_M=128 BLOCK_N=192 PERSISTENT=1 STAGES=4", "03096a66c3967d5600347feb1129ec0acc6160280978ac230e2b61a3b2f29487"},
      {"d128 BLOCK_M=128 BLOCK_N=64 PERSISTENT=0 STAGES=2", "98b42260f7275e63ad58f9ac5e6807a32231c93bbf4e0d0a49c6abd789aafc91"},
      {"d128 BLOCK_M=128 BLOCK_N=64 PERSISTENT=1 STAGES=2", "211b97e69d151c39873ab34b50f9eae59ee7343f41edd865c6b8181835227d0c"},
      {"d128 BLOCK_M=128 BLOCK_N=64 PERSISTENT=0 STAGES=3", "8a9b8848b15274973f5e2dfaceee892c63713f3b6ef246a702176fada43fd747"},
      {"d128 BLOCK_M=128 BLOCK_N=64 PERSISTENT=1 STAGES=3", "157a2897d04f7135d6f796fa74f5113e9414ce7e7e1a960c6ea362c5c7954875"},
      {"d128 BLOCK_M=128 BLOCK_N=64 PERSISTENT=0 STAGES=4", "ee81722d28306f59d11b597ffed709d33c7e3254922193edb8b14f9702e4a72a"},
      {"d128 BLOCK_M=128 BLOCK_N=64 PERSISTENT=1 STAGES=4", "492acedfdb16b302015d2d39c55161fec5216091e73bad0b28b4ebcdbeaec9cf"},
      {"d128 BLOCK_M=128 BLOCK_N=96 PERSISTENT=0 STAGES=2", "d56eb4fcfa0ee2d3a2396c299a2beb34a85c7577ca14cc1459c923ff49b28dbc"},
      {"d128 BLOCK_M=128 BLOCK_N=96 PERSISTENT=1 STAGES=2", "79dbb7f9f6bfb60daa3be3513339cbf98ce33234f50ac504c6605c04f63cdcfc"},
      {"d128 BLOCK_M=128 BLOCK_N=96 PERSISTENT=0 STAGES=3", "dc5f33ebca17aef9f8f6e817b5ff03f4ef7cf6f0b1a39878f196c570c09cea46"},
      {"d128 BLOCK_M=128 BLOCK_N=96 PERSISTENT=1 STAGES=3", "0a4413073cbdc8da4e0c0b0d9c867c5fbb78109c5c79cef31e2e65d7c1e55f3b"},
      {"d128 BLOCK_M=128 BLOCK_N=96 PERSISTENT=0 STAGES=4", "510dbbbfb915d6fbd18f76a75f03c7ec01dee85fa5f7c2139880fb708264ad77"},
      {"d128 BLOCK_M=128 BLOCK_N=96 PERSISTENT=1 STAGES=4", "99bc6a1a382ed892e32edc2c8d165844e3c5b89906b81a28556ab06942ec5efa"},
      {"d128 BLOCK_M=128 BLOCK_N=128 PERSISTENT=0 STAGES=2", "701349232524163753fc7aab9e822ddc494e93a55232019c1b5254ce52dba89a"},
      {"d128 BLOCK_M=128 BLOCK_N=128 PERSISTENT=1 STAGES=2", "8df0f889f6efb4bd0dd9bfbd1c3dfcfa90a6432e12c2591ebca3644c5262b816"},
      {"d128 BLOCK_M=128 BLOCK_N=128 PERSISTENT=0 STAGES=3", "3143065f06e5ec20cc703eebce7fefd76fa0a91cd5f925582f19720a5d5fe010"},
      {"d128 BLOCK_M=128 BLOCK_N=128 PERSISTENT=1 STAGES=3", "99e92a8635cb94dc2a52fb99e22c39944abeec004dd8acdf328185879c313f73"},
      {"d128 BLOCK_M=128 BLOCK_N=176 PERSISTENT=0 STAGES=2", "53616ee0291792e63adff2c073d3a056567bed2c47dc731195f5239c09216fd3"},
      {"d128 BLOCK_M=128 BLOCK_N=176 PERSISTENT=1 STAGES=2", "99ada8d93c57a0f85701d65825da4582622af96b51662359d362e1874795bca0"},
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

// bwd_sm90: every setting validate() accepts (OVERLAP, DQ and DELTA both
// ways) compiles without spills or wgmma serialization (kernels/notes/bwd.md),
// and, with the NVRTC that made them (13.0), to the cubins that passed every
// GPU test and gate at c044062 (kernels/notes/parts.md: bwd_sm90 on the
// shared parts). A deliberate kernel change changes them: regenerate with
// `kforge-kernels-compile --cubin-sha256 bwd_sm90` and say so in the commit.
TEST(TemplatesCompileSm90, BwdSm90SettingsDoNotSpillAndArePinned) {
  bool listed = false;
  for (const auto& t : ListTemplates()) listed = listed || t.name == "bwd_sm90";
  if (!listed) GTEST_SKIP() << "bwd_sm90 is not in this build";
  const auto version = testing::GetNvrtcVersion();
  const bool pin = version.major == 13 && version.minor == 0;
  const std::map<std::string, std::string> pinned = {
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=0 ORDER=0 OVERLAP=0 STAGES=1", "d02ef11548b9199a400176ad5cc803bc31e06e4f9f8b74dff7235d7be92b9c30"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=0 OVERLAP=0 STAGES=1", "1e6865074f807d17344e2b01d6900ba211648bcaae7e8d426318e58324f1225c"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=1 OVERLAP=0 STAGES=1", "cb3013a4348875bb53702296d259bc5ed888eb611486b01e13e6e80d6120fb74"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=0 ORDER=0 OVERLAP=0 STAGES=1", "5a2527f05c5477bb05dd1cb39c28c4a8c75c1664f79b072811efaa34ba590b42"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=0 ORDER=1 OVERLAP=0 STAGES=1", "8ebe0975203ac39116c02a3ea11b8233097eeb68835d1e0fc45fc2a99971282b"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=1 ORDER=0 OVERLAP=0 STAGES=1", "86c685da4d62a011da866064f831b4ca7c145f4a8588cbb20deaa59dfef250de"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=0 OVERLAP=0 STAGES=1", "9b7173ee56f6e1499cabb7bde890acdb2db7b1da2a53e5b15cfd5d9ecd82fa7a"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=1 OVERLAP=0 STAGES=1", "aef16bca157bc0e9fdc2672641fda545246d8a9cb55855f9fa290eab474dd11c"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=1 ORDER=0 OVERLAP=0 STAGES=1", "f80e3f6f14e5216ef0264d0734d46ff47903df47a6238d911b4a0df0f62c0b0b"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=1 ORDER=1 OVERLAP=0 STAGES=1", "040e9c272fde73cc72841eae1dfef9a07b2ed05f71f9ddaa2d224fd053855b13"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=0 ORDER=0 OVERLAP=1 STAGES=1", "01e4cacf593917b701daa44bf8a5dd1c97444699cdcc6f982be82f991ed8df3a"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=0 OVERLAP=1 STAGES=1", "346d6cb94498701722f70e37a0c2df00ac47bf58bd3387d8061aa51ee6d4aad1"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=1 OVERLAP=1 STAGES=1", "20a5162ae461dc09a7b967a13e3b603fb3984c1719cdd5b4ca9ffa31d5cca7aa"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=0 ORDER=0 OVERLAP=1 STAGES=1", "77a032fab213d09dc9c7c0506ef0605507cf839b651a8225a1901364e3f09095"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=0 ORDER=1 OVERLAP=1 STAGES=1", "cfe8b45c24115267fe76b9af7b0dca40ad77efe32805080238eac7361db41d08"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=1 ORDER=0 OVERLAP=1 STAGES=1", "c8b19904110a49dc714053ef268f09b1912f9fceae168565a96b3effa6080710"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=0 OVERLAP=1 STAGES=1", "aedf5a91f5e6c17b8ed53bec2693f61bb085065fe1f4be5b98baccde285c4585"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=1 OVERLAP=1 STAGES=1", "548f6562db54a15dc80f9eb7dfbfb3a37f68932531d6cdbbac2fe789bcb39be3"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=1 ORDER=0 OVERLAP=1 STAGES=1", "ad672ab8935606e8d719f2e84d6e156953efa23e09b0119b32dd52a5821c4968"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=1 ORDER=1 OVERLAP=1 STAGES=1", "60fa212f48770a0beab30a9d96c434851542f9275e87c254709a4f3daf32b380"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=0 ORDER=0 OVERLAP=0 STAGES=2", "eeccfcc4022954dd7eabcbac688aa64481765e69e4c0b5b97438677acb667076"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=0 OVERLAP=0 STAGES=2", "afe8857b8d058d9348eca3524d671a5db65383744aac067dae1c7bcc04ef3eb8"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=1 OVERLAP=0 STAGES=2", "35cb9704a00a57123cb7708afcb0e6fa36d9fa60fac154207d0e0e40698ceb31"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=0 ORDER=0 OVERLAP=0 STAGES=2", "acdf80a8946f19567b1529ecb91f96eb208232c5002762b8d9b093f4a29a5bf2"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=0 ORDER=1 OVERLAP=0 STAGES=2", "8669b48ab9b39dd53ccce06dc50557581d0d25f490c93959436e4408b120a601"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=1 ORDER=0 OVERLAP=0 STAGES=2", "fe4c9030c8cba2536adfc0d2b94bf2b8c8d1df987444ab1e320c4325d00e79ef"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=0 OVERLAP=0 STAGES=2", "4c29c02292cb5b409d2d1649290f3665c6caf78374ab7306a4ed3a8e36b166ea"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=1 OVERLAP=0 STAGES=2", "df6ab5de8311e18ef6006a4ed52499462fe34d570b3bb337a0ce7f0527f44d64"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=1 ORDER=0 OVERLAP=0 STAGES=2", "a71c3033efe60fb4371eb648fbfd93552af2e54217d763238dec7d9c67eb8313"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=1 ORDER=1 OVERLAP=0 STAGES=2", "a035a0e71e730c594aa0838419e4e1854a83da25097815f8a2c191c2dba07a58"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=0 ORDER=0 OVERLAP=1 STAGES=2", "f98bd4820a3d79a662ad2ab46cd8e481d54b9164681c5180ac03a11a983afa2c"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=0 OVERLAP=1 STAGES=2", "ff5671bf4321544447590a544ba48e61d25ccce39f3c9531369ec5055efe1611"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=1 OVERLAP=1 STAGES=2", "1cf14d66828c3b1d34fec5456389b9293a9cf47da506d27846461414b5a74303"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=0 ORDER=0 OVERLAP=1 STAGES=2", "d7575e4b17b98f449f9f49c644e98fc10fb9eac936511e8c042099b2f3a769e6"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=0 ORDER=1 OVERLAP=1 STAGES=2", "e5b6247999a7f9569c8c673503045d4d120842a36231f6df9d5cddfaebdc8657"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=1 ORDER=0 OVERLAP=1 STAGES=2", "754541daa28f1a61d5822af9b4be1cdc5bcbfa543b9e5975d348ea17ba5ca358"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=0 OVERLAP=1 STAGES=2", "e476caf17f40ed66853de1a133639a7de925f0dfb59053659e4c0f1672cc1acc"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=1 OVERLAP=1 STAGES=2", "e41bbe3bfa10ea3092aafa5f513844c61924f58a22fb1943226d287ca1b71bc9"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=1 ORDER=0 OVERLAP=1 STAGES=2", "67f60db4c111041a7104e9c09ee91b47db097f8cf810afb9b64ab1e214d1079f"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=1 ORDER=1 OVERLAP=1 STAGES=2", "9353faf1a8853dd061bb1936bd5208baedc671eb77dd6bc7a1f090ab9b754805"},
      {"d64 BLOCK_M=128 BLOCK_N=128 DELTA=0 DQ=0 ORDER=0 OVERLAP=1 STAGES=2", "49655e34a1147d170b71e99dba0ac53c71bdb76261913817b89e7f1425d6b9bc"},
      {"d64 BLOCK_M=128 BLOCK_N=128 DELTA=1 DQ=0 ORDER=0 OVERLAP=1 STAGES=2", "32e2ca52de4037442ef6ad19a3ad5474206d10c901da2f965fc88dbf8a8390d4"},
      {"d64 BLOCK_M=128 BLOCK_N=128 DELTA=1 DQ=0 ORDER=1 OVERLAP=1 STAGES=2", "5473e39eb9dd36b67291bd635a97248416f698ebfe51e56ea28c66f219ee7b0d"},
      {"d64 BLOCK_M=128 BLOCK_N=128 DELTA=2 DQ=0 ORDER=0 OVERLAP=1 STAGES=2", "64bba7e83a36c8d13789d5ae83767da210b1505f21cf30120e60fb4618260257"},
      {"d64 BLOCK_M=128 BLOCK_N=128 DELTA=2 DQ=0 ORDER=1 OVERLAP=1 STAGES=2", "69f82b045b921cc200c7c03a9ebdef6dc88d2b3f8a61665a3490a02f204fe647"},
      {"d64 BLOCK_M=128 BLOCK_N=128 DELTA=0 DQ=1 ORDER=0 OVERLAP=1 STAGES=2", "23113b7ff1feb749991fae4ec2cb3010f9314dde656c2f3396f2c3125fafbed1"},
      {"d64 BLOCK_M=128 BLOCK_N=128 DELTA=1 DQ=1 ORDER=0 OVERLAP=1 STAGES=2", "2b45bc3fee6faedc6088443a5753f3a216f7157e688e17dc5392a89d58b5905e"},
      {"d64 BLOCK_M=128 BLOCK_N=128 DELTA=1 DQ=1 ORDER=1 OVERLAP=1 STAGES=2", "6dab4f5fa6bebf83453b2aaebd884f05ce7468a588ceb4b8307a1f17f37d58ed"},
      {"d64 BLOCK_M=128 BLOCK_N=128 DELTA=2 DQ=1 ORDER=0 OVERLAP=1 STAGES=2", "b28e5e965481aac926b5948d0254e4127cd7c1725a4b98962db1343947d492e5"},
      {"d64 BLOCK_M=128 BLOCK_N=128 DELTA=2 DQ=1 ORDER=1 OVERLAP=1 STAGES=2", "9d36a34befabdaf4ccda6e0c9bc43eb2a80ca0ede30812f7be68c944e051c328"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=0 ORDER=0 OVERLAP=0 STAGES=1", "2450f51e98d7d07a06f31734d8acd8d02eae442205cd3485029149b460cab88b"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=0 OVERLAP=0 STAGES=1", "ca907c04980f439e40b3cc9e52ec1325e86a9b0a5544d53518f59bc42f2ee072"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=1 OVERLAP=0 STAGES=1", "9056c588f4ac38b38411189ddedb322d4d0d519d47c0a0ae5791b243cc900df6"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=0 ORDER=0 OVERLAP=0 STAGES=1", "81703bbf3564047815888bf19019e7dbae71340064943482c7f046e749db83ed"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=0 ORDER=1 OVERLAP=0 STAGES=1", "302f0113ddecbe2523440f304a2bc5f6bac279665587513e6a170cb6e453a31e"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=1 ORDER=0 OVERLAP=0 STAGES=1", "d21a4914dd6030a158159738a88bdb7e4b7952b90c08fc4b3d794525534d742a"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=0 OVERLAP=0 STAGES=1", "741fe4db9ae1c7ed014530f1a63d590b60f0f5676d0ceb6155b310081c2fca0d"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=1 OVERLAP=0 STAGES=1", "3925439dd9e86ca184cd46c99d39a5e9a35ed1a0878d46de02e6557f7b6bc88d"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=1 ORDER=0 OVERLAP=0 STAGES=1", "00b74ef25cab7b074864450a8eaa856fcb148c9e04ea18a390d5b165d81d56f7"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=1 ORDER=1 OVERLAP=0 STAGES=1", "b2219f04ea72256ff13df792f2a07a54e8ea0bdb3e277f7c1b717de3d3098ac4"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=0 ORDER=0 OVERLAP=1 STAGES=1", "12b7bfd6b04258008679b06085c0235c590db4f4441db94b4a1c5c76e8482a0f"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=0 OVERLAP=1 STAGES=1", "23a6a29075a787e08fd6ea190ed9075e4b590b58ada784af6b92c0abb0913e8a"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=1 OVERLAP=1 STAGES=1", "9a330aec84af369fd21fa457de985b27ee0854d6279be03dd4cae094f83d8ced"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=0 ORDER=0 OVERLAP=1 STAGES=1", "7ce0bf8284a2e7f5b5a312a92ad69d977b598c6b6a18e1849d847b2cd63f8b52"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=0 ORDER=1 OVERLAP=1 STAGES=1", "dd2cfc7ac4c73d933fd634d48e596df0b58d11bb1c0e901e5654455554d536b3"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=1 ORDER=0 OVERLAP=1 STAGES=1", "e1dfcd82295294ced30f65a82fe8e29b352aaff3382f9fa8caa2f8665b168de0"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=0 OVERLAP=1 STAGES=1", "c735c0a24925019b867f4956ddb82eba8be0e70ddbbac9436ba847166ee9883b"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=1 OVERLAP=1 STAGES=1", "059176a2ef58a2576d9f0a0b11a84bf4da5297a8c69ba369710806ace5ac23a8"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=1 ORDER=0 OVERLAP=1 STAGES=1", "96ad9cff504c5306ee603fd156bffc5545abb8a334b1df58ed29a3c0e54aafad"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=1 ORDER=1 OVERLAP=1 STAGES=1", "318410b9edf3d0272fbc69d858d0e21531348abaedc9886ba7dcec4ec60c28b0"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=0 ORDER=0 OVERLAP=0 STAGES=2", "a5634aec77a8928a78cfac9610d8d4f50407b3d542b0af485660e009438a4e20"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=0 OVERLAP=0 STAGES=2", "c8765fe7f0abe6dec1c7749e62b1418d6110f06c8fb301f57461bffdc5d5b294"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=1 OVERLAP=0 STAGES=2", "a6c3264b134ddeeff87d3aa0f1a34e1665ba81f8e6e8e2dd2e25fcd463b2fb9d"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=0 ORDER=0 OVERLAP=0 STAGES=2", "76644a59175edeb2367b7faa6695de58fc4984ce7f7e5ae47962bcf7914eddc9"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=0 ORDER=1 OVERLAP=0 STAGES=2", "65b2e089c057d43c309bec177a03d5e9c5a3e3670a0a2d52d6c82178298b6c78"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=1 ORDER=0 OVERLAP=0 STAGES=2", "69cc0eab4471279631313b697641f295bc9d8450e02bb043217923839caf4a86"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=0 OVERLAP=0 STAGES=2", "589d6dae1022d4be259d42549c8f2653c6ff4224691802fa290e9bdb105b0388"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=1 OVERLAP=0 STAGES=2", "346b21a0c7b46b4d80e29db68583d1b360e0f06e8d5727d1e04c6bfcf19404a3"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=1 ORDER=0 OVERLAP=0 STAGES=2", "6ec9abb6abe345e58e5137dffbed9721b22e482acb8d80042eb7b8e937b82820"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=1 ORDER=1 OVERLAP=0 STAGES=2", "aad8631a674394015302765b4ae783195202b398167990576b632916f9c2458c"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=0 ORDER=0 OVERLAP=1 STAGES=2", "fea57e065e8fe68cda1fb3461e95bee0f2f9366f7a0528ab2ddd0201c5748ae7"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=0 OVERLAP=1 STAGES=2", "2ad9dda11054c9c0253531a5c98f47f8c6d2c0a58ed6dfa0e0bc21a630adf625"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=1 OVERLAP=1 STAGES=2", "41d8e4a46dc7724ea4c61874677fdb23ec53234f2e59e9481c54a1816887ffe1"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=0 ORDER=0 OVERLAP=1 STAGES=2", "ff47de6139289f56b3fdc7dfcd19641033bd19c6a38783dd49321957f7a4339f"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=0 ORDER=1 OVERLAP=1 STAGES=2", "01cc1b95feda2ee0f0789e57f8e48532e43cbf8a459e125470c09ed0cea27854"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=1 ORDER=0 OVERLAP=1 STAGES=2", "0831287a8ededb83dbcf7db4ac10bf24a274ff04a288fb59384fba76a8a6c0cf"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=0 OVERLAP=1 STAGES=2", "69d7e95949119427736937ca12f24219040e64f636b08ab542c85a15ca39d048"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=1 OVERLAP=1 STAGES=2", "d186597f5ee5bef7e978a7251f23650123023ba389c621fbdcf1e5e25fd2425f"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=1 ORDER=0 OVERLAP=1 STAGES=2", "3b6b0eb04aa23623e24ef6ffa0b48dbf99712a34b0d1d2d9a408797ff41de3b3"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=2 DQ=1 ORDER=1 OVERLAP=1 STAGES=2", "fdb9a896a2a69aca562354b25fa3649d04fe2733750c6d6a02079a8969fabc82"},
  };
  std::vector<std::pair<std::string, std::string>> jobs;  // (setting, source)
  for (int d : {64, 128}) {
    for (int bm : {64, 128}) {
      for (int st : {1, 2}) {
        for (int ov : {0, 1}) {
          for (int dq : {0, 1}) {
            for (int delta : {0, 1, 2}) {
              for (int order : {0, 1}) {
                auto v = Instantiate("bwd_sm90",
                                     {{"BLOCK_M", bm}, {"BLOCK_N", 128}, {"STAGES", st},
                                      {"OVERLAP", ov}, {"DQ", dq}, {"DELTA", delta},
                                      {"ORDER", order}},
                                     d);
                if (!v.ok()) continue;  // refused by validate()
                jobs.emplace_back(Describe(v->knobs, d), v->source);
              }
            }
          }
        }
      }
    }
  }
  // 9 of the 16 block/stage/overlap settings, x 2 DQ x 5 (DELTA, ORDER): ORDER=1 needs DELTA 1 or 2
  ASSERT_EQ(jobs.size(), 90u);
  ASSERT_EQ(jobs.size(), pinned.size());
  std::vector<std::string> sources;
  for (const auto& job : jobs) sources.push_back(job.second);
  CompileEach(sources, "sm_90a", [&](size_t i, const testing::CompileReport& r) {
    const std::string& what = jobs[i].first;
    ASSERT_TRUE(r.ok) << what << "\n" << r.log;
    // DELTA=2 spills 28-32 B in the 40-register producer (ptxas 13.0) and is
    // still 1.01-1.07x DELTA=1 on every public shape (notes/bwd.md, v4b); no
    // other setting spills.
    const bool delta2 = what.find("DELTA=2") != std::string::npos;
    EXPECT_LE(r.spill_stores, delta2 ? 32 : 0) << what << "\n" << r.log;
    EXPECT_LE(r.spill_loads, delta2 ? 32 : 0) << what << "\n" << r.log;
    EXPECT_EQ(r.log.find("C7517"), std::string::npos) << what << "\n" << r.log;
    EXPECT_EQ(r.log.find("C7511"), std::string::npos) << what << "\n" << r.log;
    EXPECT_EQ(r.log.find("C7512"), std::string::npos) << what << "\n" << r.log;
    ASSERT_TRUE(pinned.count(what)) << what;
    if (pin) EXPECT_EQ(Sha256Hex(r.cubin), pinned.at(what)) << what;
  });
}


INSTANTIATE_TEST_SUITE_P(Archs, TemplatesCompile,
                         ::testing::Values("sm_80", "sm_90a", "sm_100a"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kforge

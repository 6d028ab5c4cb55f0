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
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=0 ORDER=0 OVERLAP=0 STAGES=1", "174c877d8ec64e0f81ab6d845eb86297692529e4acca8b46a5791a0dc025ee65"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=0 OVERLAP=0 STAGES=1", "ade803c165628c8f8f42ce28bef8c008055d3a5bb3b34e71da0f8b08d35c9ece"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=1 OVERLAP=0 STAGES=1", "4a59d0928e5e2c215499a2eee874b858d542e692d8f691215ab4801add197d8b"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=1 ORDER=0 OVERLAP=0 STAGES=1", "a541b7bad5fec2151588da0de83c48416f2d8561f1f3f24e3f620423838ad956"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=0 OVERLAP=0 STAGES=1", "f348d1ec03708deb4e6916b0d5f0e15de9d039c4862fbd4ed7329e6ead3438d2"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=1 OVERLAP=0 STAGES=1", "cd160b75ae1a28795551cb56637d04618af5efdcae0fa5f2513962146717e761"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=0 ORDER=0 OVERLAP=1 STAGES=1", "44b72a58491c363514e79a8afea25d18b7e05680f7dbefb53b6d2c9a406b9c0b"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=0 OVERLAP=1 STAGES=1", "7c968c552ee08f45c45d54951debd4672d874438039a72771898d6e48b6aba31"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=1 OVERLAP=1 STAGES=1", "fcc2d38c7273e3490ba78b5f3c49baa34d5222244a57d849ee72730d3dba07f1"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=1 ORDER=0 OVERLAP=1 STAGES=1", "8dc1371baf0c06e877e839752400ad85a273a775fbccc0111b246e7ea2237529"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=0 OVERLAP=1 STAGES=1", "f4eb2f0d3b7d09f9e35c67ccf8917bfa7f8f49ce37e3a2c7e0920a49410aaa49"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=1 OVERLAP=1 STAGES=1", "7d5aceeca8336f724ea18adb30ee640b8be3fece996912b4b65553e199c60e14"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=0 ORDER=0 OVERLAP=0 STAGES=2", "06f58c212248483398e43763bf38b25233ff93cc2fc398ae0e8d17c817598ef6"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=0 OVERLAP=0 STAGES=2", "7068257e1adccf091417eb6b3cc5747bddfc34994691da4629792d8dcfdc9dd3"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=1 OVERLAP=0 STAGES=2", "2749fb3ffc06aa6e9ccfa535ce0cb3c2f63a23600df22e1214634265a3ff920a"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=1 ORDER=0 OVERLAP=0 STAGES=2", "ca3bcf1540702d64842092dd1fef22ec4284aef2008dc5b9c389e627995b7cdc"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=0 OVERLAP=0 STAGES=2", "c2b268f5d4846bdfe902759728ad2dbf634d90a2fbd795e73fbcc13674e47fa0"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=1 OVERLAP=0 STAGES=2", "875b5586c40ea21c6d261c07d43060beef998b5984d448006aaccb41c2850626"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=0 ORDER=0 OVERLAP=1 STAGES=2", "9bc84b54dc56fdc4643177b0addcaa3429e2940710bb89777b0593a0a6dd6d1c"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=0 OVERLAP=1 STAGES=2", "85dc02122439350f8c92e9a186bc8327ef4aaf5335a39385c913ed2624989028"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=1 OVERLAP=1 STAGES=2", "feb3b65d9989c96a45d622b03b2d68b64e4f0d1a8c59e344076ea92bc3bd23d1"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=1 ORDER=0 OVERLAP=1 STAGES=2", "ea208f38871061ed4072a64e920bb89f775f06af5aad2d1e75dd0a43c5ec96af"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=0 OVERLAP=1 STAGES=2", "931f90d7c7463aa9452f52dfffea52697522373211fa6c12ae2ba2644793ad6b"},
      {"d64 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=1 OVERLAP=1 STAGES=2", "7e7400442a534dd59abbc2bc2814cd1339cf6f7b2ca514dae9f840e6aad22c94"},
      {"d64 BLOCK_M=128 BLOCK_N=128 DELTA=0 DQ=0 ORDER=0 OVERLAP=1 STAGES=2", "27f6250a14120ab9686dc5ad5773303eabd381867871d865cfcefac717ec6fe4"},
      {"d64 BLOCK_M=128 BLOCK_N=128 DELTA=1 DQ=0 ORDER=0 OVERLAP=1 STAGES=2", "e3d88b6f128e1776244e0c785bb0fc8296e02ef4bbc9300ec80e25e5907c07c7"},
      {"d64 BLOCK_M=128 BLOCK_N=128 DELTA=1 DQ=0 ORDER=1 OVERLAP=1 STAGES=2", "f1d0c0341c01180c8b8e7b1f82e5d03be1d860aa8eb9946e0e1effa0237c9c0a"},
      {"d64 BLOCK_M=128 BLOCK_N=128 DELTA=0 DQ=1 ORDER=0 OVERLAP=1 STAGES=2", "d730b361046db42f9ca08ddb7f40c299bf6fe69c081037e2dc4b4ca6a8b93915"},
      {"d64 BLOCK_M=128 BLOCK_N=128 DELTA=1 DQ=1 ORDER=0 OVERLAP=1 STAGES=2", "8f4313d6251b5fdec000b40ccb8fac1f89a5081e91dc5e4389c46442abfc9b34"},
      {"d64 BLOCK_M=128 BLOCK_N=128 DELTA=1 DQ=1 ORDER=1 OVERLAP=1 STAGES=2", "f11a7ba578160254ac45978ffcac7a21cf5c1bb30db564fa4ca2e4ce751b5bef"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=0 ORDER=0 OVERLAP=0 STAGES=1", "44a648f9e543e4349f700ad61e727ca8538e06ccfbdcd3c9c0a09384c5f896ec"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=0 OVERLAP=0 STAGES=1", "91dc1675f3c4c22b85f5c405a12dbc70712bfa2409105cdb659dc66b4ac775ac"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=1 OVERLAP=0 STAGES=1", "21e04ba5b1cdd96f56aeb95ebf948c7d3989e6e16aec351c5e5f8b655d410d87"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=1 ORDER=0 OVERLAP=0 STAGES=1", "6292157c75ef41dd4cdd1794cb0ff181a645d6f7510b89652d26a1d83d63ce63"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=0 OVERLAP=0 STAGES=1", "be549d69985b1f2f8a156a7140c314d7b12c86d1f6c92d3485205474aa9aeda3"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=1 OVERLAP=0 STAGES=1", "27fd1e19e464b65d30fae07de3e24e4e02b7cc3e9bbd4efc8aa3a11506a4e454"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=0 ORDER=0 OVERLAP=1 STAGES=1", "d5999bdfd155c57c1f84add548f1434519d8a1885252b4719d810a3c100db063"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=0 OVERLAP=1 STAGES=1", "4c53ac234afec50debdc270e9b7ca720be7a113ad0cad56aa7970f825c9c8eb1"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=1 OVERLAP=1 STAGES=1", "0deba600782bff368a259218693e69bbce7548e4b8b08c71870fb7623ebd56cf"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=1 ORDER=0 OVERLAP=1 STAGES=1", "ec082f7a99757294b1ccd6678cbf4342beb72ea7fe44545113f6724aa1f011e9"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=0 OVERLAP=1 STAGES=1", "dde1fc6ef23b0c2f4cfaeb28548efd79bb416f8d4605b910951d6053cd638af8"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=1 OVERLAP=1 STAGES=1", "2706afeeaf1b640dc6e7174d095f210522dc0f91f95f7cf476cf10ed2b72cecc"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=0 ORDER=0 OVERLAP=0 STAGES=2", "241c31dd55c0eb246060046189702db27c6dc186cb712e1c67cffa46de010183"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=0 OVERLAP=0 STAGES=2", "f8b75f7ff17406c0ee6786b4b3896e9a2123dd37b6bdb0e8a5f2a2b19ad28e0e"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=1 OVERLAP=0 STAGES=2", "0398d6175045a9e1e72f3a4f20c7522799b76a7cfa240bf1e8b7865c06de1173"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=1 ORDER=0 OVERLAP=0 STAGES=2", "ca04bdb9fce67d1351944ba991f8885078100b0f67f1c5b5fbeaa15914edf90b"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=0 OVERLAP=0 STAGES=2", "3e0e725eafe954a5113730395b7467486b034e5ff8b9348961a6988e02c2efb0"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=1 OVERLAP=0 STAGES=2", "fece8d2d3b7e11a7bfa2a3627fe4efd318a6def987ca5ff5bd6554c98d8da914"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=0 ORDER=0 OVERLAP=1 STAGES=2", "899943ba8ee58dd101c2b6f1fb394c013d175df41bd0073b02632845770e528e"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=0 OVERLAP=1 STAGES=2", "135f4b85930f1bb0e9959487f81a26663feb031524732902235fc7bb169fe691"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=0 ORDER=1 OVERLAP=1 STAGES=2", "afee2d1b6b5c5358f15a8a8306fcd59d8702e2d00116ff89baa382e9ccc6082e"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=0 DQ=1 ORDER=0 OVERLAP=1 STAGES=2", "639a2bd8600037075aae73a8e1016e17dcf048a5c04c8791503e320e8118df05"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=0 OVERLAP=1 STAGES=2", "763500b7bd464e3f1f344412aadc05e1797ffd0eec8e2822b481441c427ddeef"},
      {"d128 BLOCK_M=64 BLOCK_N=128 DELTA=1 DQ=1 ORDER=1 OVERLAP=1 STAGES=2", "3f0736804fb865754fcfaccb364005c858bfe92e81c1b6f043b6befc27cc0e4f"},
  };
  std::vector<std::pair<std::string, std::string>> jobs;  // (setting, source)
  for (int d : {64, 128}) {
    for (int bm : {64, 128}) {
      for (int st : {1, 2}) {
        for (int ov : {0, 1}) {
          for (int dq : {0, 1}) {
            for (int delta : {0, 1}) {
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
  // 9 of the 16 block/stage/overlap settings, x 2 DQ x 3 (DELTA, ORDER): ORDER=1 needs DELTA=1
  ASSERT_EQ(jobs.size(), 54u);
  ASSERT_EQ(jobs.size(), pinned.size());
  std::vector<std::string> sources;
  for (const auto& job : jobs) sources.push_back(job.second);
  CompileEach(sources, "sm_90a", [&](size_t i, const testing::CompileReport& r) {
    const std::string& what = jobs[i].first;
    ASSERT_TRUE(r.ok) << what << "\n" << r.log;
    EXPECT_EQ(r.spill_stores, 0) << what << "\n" << r.log;
    EXPECT_EQ(r.spill_loads, 0) << what << "\n" << r.log;
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

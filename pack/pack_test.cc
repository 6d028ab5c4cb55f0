#include "pack/pack.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/hash.h"

namespace kforge::pack {
namespace {

Entry MakeEntry(int i) {
  Entry e;
  e.bucket = fmt::format("fwd.bf16.d128.h4.kv4.causal.self.sm_90a.b{}.mq4096.aq4096.mk4096.ak4096",
                         1 << i);
  e.kernel_bucket = e.bucket;
  e.arch = "sm_90a";
  e.variant_id = fmt::format("v{}", 10 + i);
  e.tuned = true;
  e.source = fmt::format("// source {}\nextern \"C\" __global__ void kf_attn_fwd() {{}}\n", i);
  e.cubin = std::string("\x7f" "ELF\0\0binary", 12) + std::to_string(i);
  e.manifest_json = R"({"contract_version":1,"entry_point":"kf_attn_fwd"})";
  e.compile_options = "-arch=sm_90a -default-device";
  e.extent = {1 << i, 4096, 4096, (1 << i) * 4096, (1 << i) * 4096};
  e.timing = {812.5, 800.0, 830.0, 805.0, 820.0, 20};
  e.provenance = {"template", "fwd_mma", R"({"BLOCK_M":128})", "", "", "v3", "j7"};
  e.gpu_name = "NVIDIA H200";
  e.nvrtc_version = "13.0";
  e.driver_version = "13.0";
  return e;
}

Pack MakePack() {
  Pack p;
  p.created_at = "2026-12-01T10:00:00Z";
  p.origin = "kforge-server 127.0.0.1:50051";
  p.arch = "sm_90a";
  for (int i = 0; i < 3; ++i) p.entries.push_back(MakeEntry(i));
  p.entries[2].cubin.clear();  // a kernel with no cubin (compile on load)
  return p;
}

std::string Bytes() { return *SerializePack(MakePack()); }

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(Pack, RoundTripsEveryField) {
  const std::string bytes = Bytes();
  auto back = ParsePack(bytes, "k.kfpack");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, MakePack());
}

TEST(Pack, RoundTripsThroughAFile) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            fmt::format("kforge_pack_test_{}.kfpack", getpid()))
                               .string();
  ASSERT_TRUE(WritePackFile(path, MakePack()).ok());
  auto back = ReadPackFile(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, MakePack());
}

TEST(Pack, EmptyPackRoundTrips) {
  Pack p;
  auto bytes = SerializePack(p);
  ASSERT_TRUE(bytes.ok());
  auto back = ParsePack(*bytes, "e");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->entries.empty());
}

TEST(Pack, RefusesEntriesWithoutWhatALaunchNeeds) {
  Pack p = MakePack();
  p.entries[1].manifest_json.clear();
  auto bytes = SerializePack(p);
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(Message(bytes.status()), "entries[1].manifest_json: empty");
}

TEST(Pack, RefusesAFileThatIsNoPack) {
  auto r = ParsePack("{\"entries\": []}", "x.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(r.status()),
            "pack x.json: not a kforge kernel pack (it does not start with the KFPACK magic)");
}

TEST(Pack, RefusesANewerVersionSayingSo) {
  std::string bytes = Bytes();
  bytes[8] = 2;
  auto r = ParsePack(bytes, "k");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(Message(r.status()).find("format version 2; this kforge reads version 1"),
            std::string::npos)
      << r.status();
}

TEST(Pack, RefusesEveryTruncationNamingIt) {
  const std::string bytes = Bytes();
  // Every cut: inside the magic, the header, the index, the blobs and the trailer.
  for (size_t cut : {size_t{3}, size_t{12}, size_t{40}, bytes.size() / 2, bytes.size() - 40,
                     bytes.size() - 1}) {
    auto r = ParsePack(std::string_view(bytes).substr(0, cut), "k.kfpack");
    ASSERT_FALSE(r.ok()) << "cut at " << cut;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << cut;
    EXPECT_NE(Message(r.status()).find("pack k.kfpack: truncated"), std::string::npos)
        << cut << ": " << r.status();
  }
}

TEST(Pack, RefusesAnyFlippedByteWithAChecksumError) {
  const std::string bytes = Bytes();
  // A byte in the index and one in a cubin.
  for (size_t at : {size_t{40}, bytes.size() - 80}) {
    std::string bad = bytes;
    bad[at] ^= 0x20;
    auto r = ParsePack(bad, "k.kfpack");
    ASSERT_FALSE(r.ok()) << at;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(Message(r.status()).find("checksum mismatch"), std::string::npos) << r.status();
  }
}

// A pack whose checksum was recomputed over a changed blob (a hand edit, or
// a writer bug): the entry's own hash names it.
TEST(Pack, NamesTheEntryWhoseKernelDoesNotMatchItsHash) {
  std::string bytes = Bytes();
  const size_t body = bytes.size() - 73;
  const std::string source = MakeEntry(1).source;
  const size_t at = bytes.find(source);
  ASSERT_NE(at, std::string::npos);
  bytes[at + 3] = 'X';
  bytes.replace(body + 9, 64, Sha256Hex(std::string_view(bytes).substr(0, body)));
  auto r = ParsePack(bytes, "k.kfpack");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(Message(r.status()),
            "pack k.kfpack: entries[1] (bucket "
            "fwd.bf16.d128.h4.kv4.causal.self.sm_90a.b2.mq4096.aq4096.mk4096.ak4096, variant v11): "
            "source does not match its SHA-256 " +
                Sha256Hex(source));
}

TEST(Pack, NamesAMissingIndexField) {
  std::string bytes = Bytes();
  const size_t body = bytes.size() - 73;
  const size_t at = bytes.find("\"variant_id\"");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 12, "\"variant_xx\"");
  bytes.replace(body + 9, 64, Sha256Hex(std::string_view(bytes).substr(0, body)));
  auto r = ParsePack(bytes, "k.kfpack");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(Message(r.status()), "pack k.kfpack: index: entries[0].variant_id: missing");
}

TEST(Pack, ReadingAMissingFileSaysSo) {
  auto r = ReadPackFile("/nonexistent/k.kfpack");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(Message(r.status()).find("pack /nonexistent/k.kfpack: cannot open"),
            std::string::npos);
}

}  // namespace
}  // namespace kforge::pack

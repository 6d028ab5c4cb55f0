#include "core/transport.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

namespace kforge {
namespace {

TEST(TransportTest, LoopbackAddresses) {
  for (const char* a : {"127.0.0.1:50051", "127.1.2.3:1", "localhost:50051", "LOCALHOST:1",
                        "[::1]:50051", "::1", "[::ffff:127.0.0.1]:5", "dns:///localhost:50051",
                        "dns:localhost:1", "ipv4:127.0.0.1:1,127.0.0.2:2", "ipv6:[::1]:1",
                        "unix:/run/kforge.sock", "unix-abstract:kforge"})
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
}

TEST(TransportTest, EverythingElseIsNotLoopback) {
  for (const char* a : {"0.0.0.0:50051", "[::]:50051", ":50051", "10.0.0.1:50051",
                        "kforge-server:50051", "dns:///kforge.example.com:443",
                        "localhost.example.com:1", "128.0.0.1:1", "ipv4:127.0.0.1:1,10.0.0.1:2",
                        "[::ffff:10.0.0.1]:5", "", "dns://8.8.8.8/kforge:1"})
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
}

TEST(TransportTest, PlaintextOnlyOnLoopbackUnlessForcedOrTls) {
  EXPECT_TRUE(CheckPlaintext("127.0.0.1:1", false, false, "--tls-ca").ok());
  EXPECT_TRUE(CheckPlaintext("10.0.0.1:1", true, false, "--tls-ca").ok());
  EXPECT_TRUE(CheckPlaintext("10.0.0.1:1", false, true, "--tls-ca").ok());
  absl::Status s = CheckPlaintext("0.0.0.0:50051", false, false, "--tls-cert and --tls-key");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("0.0.0.0:50051"), std::string::npos) << s;
  EXPECT_NE(s.message().find("--tls-cert and --tls-key"), std::string::npos) << s;
  EXPECT_NE(s.message().find("--allow-plaintext"), std::string::npos) << s;
}

TEST(TransportTest, TokensAreLongPrintableAndNeverEchoed) {
  EXPECT_TRUE(CheckToken(std::string(32, 'a'), "t").ok());
  absl::Status shrt = CheckToken("secret-but-short", "KFORGE_TOKEN");
  EXPECT_EQ(shrt.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shrt.message().find("KFORGE_TOKEN"), std::string::npos) << shrt;
  EXPECT_NE(shrt.message().find("16 characters, fewer than 32"), std::string::npos) << shrt;
  EXPECT_EQ(shrt.message().find("secret-but-short"), std::string::npos) << shrt;
  const std::string spaced = std::string(20, 'a') + " " + std::string(20, 'b');
  absl::Status space = CheckToken(spaced, "t");
  EXPECT_NE(space.message().find("character 21 is a space"), std::string::npos) << space;
  EXPECT_FALSE(CheckToken(std::string(40, 'a') + ",", "t").ok());
  EXPECT_FALSE(CheckToken(std::string(40, 'a') + "\xc3\xa9", "t").ok());
  EXPECT_FALSE(CheckToken(std::string(40, 'a') + "\n", "t").ok());
}

class TlsFilesTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& text) {
    const auto p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  void SetUp() override { std::filesystem::create_directories(dir_); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_ = std::filesystem::temp_directory_path() /
                               ("kforge_transport_test_" + std::to_string(getpid()));
};

TEST_F(TlsFilesTest, ReadsPemAndRefusesOtherFiles) {
  const std::string pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
  ASSERT_TRUE(ReadPemFile(Write("ca.pem", pem), "--tls-ca").ok());
  absl::StatusOr<std::string> notpem = ReadPemFile(Write("x", "hello"), "--tls-ca");
  EXPECT_EQ(notpem.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(notpem.status().message().find("--tls-ca"), std::string::npos);
  EXPECT_EQ(ReadPemFile((dir_ / "absent").string(), "--tls-ca").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(TlsFilesTest, ClientTlsNeedsACaAndCertWithKey) {
  const std::string pem = "-----BEGIN X-----\n-----END X-----\n";
  const std::string ca = Write("ca.pem", pem), cert = Write("c.pem", pem), key = Write("k.pem", pem);
  EXPECT_TRUE(ReadClientTls({}).ok());
  EXPECT_FALSE(ReadClientTls({.cert_file = cert, .key_file = key}).ok());
  EXPECT_FALSE(ReadClientTls({.ca_file = ca, .cert_file = cert}).ok());
  EXPECT_FALSE(ReadClientTls({.server_name = "kforge"}).ok());
  absl::StatusOr<ClientTlsPem> full =
      ReadClientTls({.ca_file = ca, .cert_file = cert, .key_file = key, .server_name = "kforge"});
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->ca, pem);
  EXPECT_EQ(full->key, pem);
  EXPECT_EQ(full->server_name, "kforge");
}

}  // namespace
}  // namespace kforge

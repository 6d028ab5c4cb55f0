// TLS on the real gRPC server over loopback, with a throwaway CA and
// certificates made at test time (tests/util/pki.h): TLS clients get in,
// plaintext clients and clients trusting another CA do not; with a client CA
// only clients holding a certificate it signed do (mTLS); and the transport
// policy at start (plaintext and --insecure-no-auth on loopback only).
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "grpc/health/v1/health.grpc.pb.h"
#include "kforge/v1/kforge.grpc.pb.h"
#include "server/server.h"
#include "storage/store.h"
#include "tests/util/pki.h"

namespace kforge::server {
namespace {

constexpr char kClient[] = "tls-test-client-token-0123456789abcdef";
constexpr char kWorker[] = "tls-test-worker-token-0123456789abcdef";

ProposerFactory NoProposers() {
  return [](const std::string& name, uint64_t) -> absl::StatusOr<std::unique_ptr<agent::Proposer>> {
    return absl::NotFoundError("no proposer " + name);
  };
}

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::filesystem::temp_directory_path() / ("kforge_tls_test_" + std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
    std::string log;
    ok_ = testing::MakeTestPki(dir_ / "pki", &pki_, &log) &&
          testing::MakeTestPki(dir_ / "other", &other_, &log);
    log_ = log;
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }
  void SetUp() override { ASSERT_TRUE(ok_) << "make-certs.sh failed: " << log_; }

  ServerOptions Options(bool mtls = false) const {
    ServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.client_tokens = {kClient};
    o.worker_tokens = {kWorker};
    o.tls_cert_pem = testing::ReadFileText(pki_.server_cert());
    o.tls_key_pem = testing::ReadFileText(pki_.server_key());
    if (mtls) o.tls_client_ca_pem = testing::ReadFileText(pki_.ca_cert());
    o.drain_timeout_ms = 500;
    return o;
  }

  absl::StatusOr<std::unique_ptr<Server>> StartServer(ServerOptions o) {
    store_ = NewMemoryStore();
    return Server::Start(std::move(o), store_.get(), NoProposers(), nullptr);
  }

  // TLS client credentials trusting `ca`, with a client certificate when
  // `cert_of` is given.
  static std::shared_ptr<grpc::ChannelCredentials> Tls(const testing::TestPki& ca,
                                                       const testing::TestPki* cert_of = nullptr) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = testing::ReadFileText(ca.ca_cert());
    if (cert_of) {
      o.pem_cert_chain = testing::ReadFileText(cert_of->client_cert());
      o.pem_private_key = testing::ReadFileText(cert_of->client_key());
    }
    return grpc::SslCredentials(o);
  }

  // ListShapes with the client token over `creds`; the status.
  static grpc::Status Call(const std::string& target,
                           const std::shared_ptr<grpc::ChannelCredentials>& creds) {
    auto stub = v1::KernelService::NewStub(grpc::CreateChannel(target, creds));
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + kClient);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListShapesRequest req;
    v1::ListShapesResponse resp;
    return stub->ListShapes(&ctx, req, &resp);
  }

  static std::string Local(const Server& s) { return "localhost:" + std::to_string(s.port()); }

  static inline std::filesystem::path dir_;
  static inline testing::TestPki pki_, other_;
  static inline bool ok_ = false;
  static inline std::string log_;
  std::unique_ptr<Store> store_;
};

TEST_F(TlsTest, ServesTlsClientsAndNoPlaintextOnes) {
  auto server = StartServer(Options());
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string target = Local(**server);
  grpc::Status tls = Call(target, Tls(pki_));
  EXPECT_TRUE(tls.ok()) << tls.error_message();
  // The certificate names 127.0.0.1 too, so an IP target verifies as well.
  EXPECT_TRUE(Call("127.0.0.1:" + std::to_string((*server)->port()), Tls(pki_)).ok());
  grpc::Status plain = Call(target, grpc::InsecureChannelCredentials());
  EXPECT_EQ(plain.error_code(), grpc::StatusCode::UNAVAILABLE) << plain.error_message();
  grpc::Status stranger = Call(target, Tls(other_));
  EXPECT_EQ(stranger.error_code(), grpc::StatusCode::UNAVAILABLE)
      << "a client trusting another CA must not accept this server: " << stranger.error_message();
}

TEST_F(TlsTest, HealthAnswersOverTls) {
  auto server = StartServer(Options());
  ASSERT_TRUE(server.ok()) << server.status();
  auto health = grpc::health::v1::Health::NewStub(grpc::CreateChannel(Local(**server), Tls(pki_)));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service("kforge.v1.KernelService");
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(health->Check(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(TlsTest, ClientCaRequiresACertificateItSigned) {
  auto server = StartServer(Options(/*mtls=*/true));
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string target = Local(**server);
  grpc::Status with_cert = Call(target, Tls(pki_, &pki_));
  EXPECT_TRUE(with_cert.ok()) << with_cert.error_message();
  EXPECT_EQ(Call(target, Tls(pki_)).error_code(), grpc::StatusCode::UNAVAILABLE)
      << "no client certificate";
  EXPECT_EQ(Call(target, Tls(pki_, &other_)).error_code(), grpc::StatusCode::UNAVAILABLE)
      << "a client certificate of another CA";
}

TEST_F(TlsTest, TokensAreStillCheckedUnderTls) {
  auto server = StartServer(Options(/*mtls=*/true));
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::KernelService::NewStub(grpc::CreateChannel(Local(**server), Tls(pki_, &pki_)));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListShapesResponse resp;
  EXPECT_EQ(stub->ListShapes(&ctx, v1::ListShapesRequest(), &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(TlsTest, AnyAddressNeedsTlsOrAllowPlaintext) {
  ServerOptions tls = Options();
  tls.listen_address = "0.0.0.0:0";
  auto with_tls = StartServer(tls);
  ASSERT_TRUE(with_tls.ok()) << with_tls.status();
  EXPECT_TRUE(Call("localhost:" + std::to_string((*with_tls)->port()), Tls(pki_)).ok());
  with_tls->reset();

  ServerOptions plain = Options();
  plain.tls_cert_pem.clear();
  plain.tls_key_pem.clear();
  plain.listen_address = "0.0.0.0:0";
  auto refused = StartServer(plain);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("not a loopback address"), std::string::npos)
      << refused.status();
  plain.allow_plaintext = true;
  auto forced = StartServer(plain);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_TRUE(Call("127.0.0.1:" + std::to_string((*forced)->port()),
                   grpc::InsecureChannelCredentials())
                  .ok());
}

TEST_F(TlsTest, InsecureNoAuthRefusesAnyAddressButLoopback) {
  ServerOptions o;
  o.insecure_no_auth = true;
  o.allow_plaintext = true;
  o.listen_address = "0.0.0.0:0";
  auto refused = StartServer(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("loopback addresses only"), std::string::npos)
      << refused.status();
  o.listen_address = "127.0.0.1:0";
  auto local = StartServer(o);
  EXPECT_TRUE(local.ok()) << local.status();
}

}  // namespace
}  // namespace kforge::server

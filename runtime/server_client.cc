#include "runtime/server_client.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include "kforge/v1/kforge.grpc.pb.h"
#include "pack/proto.h"
#include "runtime/request.h"

namespace kforge::runtime {
namespace {

class GrpcKernelServer final : public KernelServer {
 public:
  explicit GrpcKernelServer(ServerOptions o) : options_(std::move(o)) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(256 << 20);  // source + cubin; large model kernels too
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    if (!options_.tls_ca.empty()) {
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = options_.tls_ca;
      creds = grpc::SslCredentials(ssl);
    }
    channel_ = grpc::CreateCustomChannel(options_.address, creds, args);
    stub_ = v1::KernelService::NewStub(channel_);
  }

  absl::StatusOr<Answer> Get(const ShapeKey& key, const std::string& if_none_match) override {
    v1::GetKernelRequest req;
    *req.mutable_shape() = pack::ShapeToProto(key);
    req.set_if_none_match(if_none_match);
    grpc::ClientContext ctx;
    if (!options_.token.empty()) ctx.AddMetadata("authorization", "Bearer " + options_.token);
    ctx.set_deadline(std::chrono::system_clock::now() + options_.timeout);
    v1::GetKernelResponse resp;
    const grpc::Status s = stub_->GetKernel(&ctx, req, &resp);
    if (!s.ok()) {
      const std::string why = fmt::format("GetKernel: {} ({})", s.error_message(),
                                          int(s.error_code()));
      if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
          s.error_code() == grpc::StatusCode::NOT_FOUND)
        return ToStatus(KF_ERR_UNSUPPORTED, why);
      return ToStatus(KF_ERR_SERVER, why);
    }
    Answer a;
    a.not_modified = resp.not_modified();
    if (!a.not_modified)
      a.entry = pack::EntryFromKernel(resp.kernel(), resp.kernel().requested_bucket(), SizeExtent{});
    return a;
  }

  std::string Describe() const override {
    return fmt::format("kforge-server at {}", options_.address);
  }

 private:
  ServerOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KernelService::Stub> stub_;
};

}  // namespace

std::unique_ptr<KernelServer> MakeGrpcKernelServer(ServerOptions options) {
  return std::make_unique<GrpcKernelServer>(std::move(options));
}

}  // namespace kforge::runtime

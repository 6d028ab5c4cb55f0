// The kforge server over gRPC: GetKernel for the resolver. The only file of
// the runtime that sees gRPC or protobuf; it is compiled into the shared
// library only, against lite generated code (runtime/lite_proto.cmake).
//
// Thread-safe (one channel, shared by every call).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "runtime/resolver.h"

namespace kforge::runtime {

struct ServerOptions {
  std::string address;  // "host:port"
  std::string token;    // bearer token; "" for none
  std::string tls_ca;   // PEM CA bundle: TLS, the server's certificate checked; "": plaintext
  std::chrono::milliseconds timeout{10000};
};

// Errors carry KF_ERR_SERVER (unreachable, refused, timed out) or
// KF_ERR_UNSUPPORTED (the server rejects the shape: it serves no kernel for it).
std::unique_ptr<KernelServer> MakeGrpcKernelServer(ServerOptions options);

}  // namespace kforge::runtime

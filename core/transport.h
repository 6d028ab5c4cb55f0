// The transport policy that kforge-server, kforge-worker and the kforge CLI
// share: what a bearer token must look like, when a connection may go
// without TLS, and reading the PEM files TLS needs. No gRPC types here: each
// binary builds its own credentials from these values in its gRPC adapter.
//
// Why the rules:
//   - A token is sent on every call; one short enough to guess, or one with
//     characters gRPC metadata cannot carry, is refused where it is read, so
//     the operator learns it at start and not from an UNAUTHENTICATED later.
//   - Without TLS a token crosses the network in the clear. Plaintext is
//     therefore only for loopback addresses, where it never leaves the host;
//     anything else needs TLS or an explicit --allow-plaintext.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kforge {

// 32 characters of a random token are far beyond guessing; the deploy
// scripts make 64 hex digits.
inline constexpr size_t kMinTokenLength = 32;

// OK when `token` has at least kMinTokenLength characters, all printable
// ASCII without spaces or commas (gRPC metadata carries printable ASCII
// only; a comma separates tokens in KFORGE_*_TOKEN lists). Otherwise
// INVALID_ARGUMENT naming `what` (e.g. "KFORGE_WORKER_TOKEN") and the rule
// broken; the message never contains the token.
absl::Status CheckToken(std::string_view token, std::string_view what);

// True when `address` can only be reached from this host: a loopback IP
// (127.0.0.0/8, ::1, ::ffff:127.x.x.x), "localhost", or a Unix socket
// ("unix:..."). Accepts what gRPC accepts as a listen address or target:
// "host:port", "[v6]:port", and targets with a "dns:", "dns:///", "ipv4:"
// or "ipv6:" prefix. An empty host, "0.0.0.0", "[::]" and every other name
// are not loopback (a name may resolve anywhere).
bool IsLoopbackAddress(std::string_view address);

// The policy for a connection without TLS: OK when `tls` is set, when
// `address` is loopback, or when `allow_plaintext` forces it. Otherwise
// FAILED_PRECONDITION naming `address` and the ways out, with `flags`
// saying how this binary is given TLS (e.g. "--tls-cert and --tls-key").
absl::Status CheckPlaintext(std::string_view address, bool tls, bool allow_plaintext,
                            std::string_view flags);

// The contents of a PEM file (certificate, key or CA bundle). NOT_FOUND /
// PERMISSION_DENIED when it cannot be read, INVALID_ARGUMENT when it holds
// no "-----BEGIN" block. `what` names the flag or key in errors
// ("--tls-ca /etc/kforge/ca.pem: ...").
absl::StatusOr<std::string> ReadPemFile(const std::string& path, std::string_view what);

// Client-side TLS as the worker and the CLI take it. Empty ca_file: no TLS.
struct ClientTlsFiles {
  std::string ca_file;      // CA bundle the server's certificate must chain to
  std::string cert_file;    // client certificate, for servers that ask for one (mTLS)
  std::string key_file;     // its key
  std::string server_name;  // name to check the certificate for; "": the target's host
  bool enabled() const { return !ca_file.empty(); }
};

// The PEM text of the files, read and checked (a certificate without its
// key or the other way round is INVALID_ARGUMENT; so are a cert or key
// without a CA, since the server would go unchecked).
struct ClientTlsPem {
  std::string ca, cert, key, server_name;
};
absl::StatusOr<ClientTlsPem> ReadClientTls(const ClientTlsFiles& files);

}  // namespace kforge

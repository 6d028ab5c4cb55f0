#include "core/transport.h"

#include <arpa/inet.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace kforge {
namespace {

// The host part of a gRPC address; "" when there is none (":50051").
std::string_view HostOf(std::string_view address) {
  for (std::string_view scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (address.starts_with(scheme)) {
      address.remove_prefix(scheme.size());
      break;
    }
  }
  // A dns: target may name its resolver ("dns://8.8.8.8/host:port").
  if (address.starts_with("//")) {
    const size_t slash = address.find('/', 2);
    address = slash == std::string_view::npos ? std::string_view() : address.substr(slash + 1);
  }
  // ipv4:/ipv6: targets may list several addresses; all must be loopback,
  // which the caller checks per entry, so take the first here.
  address = address.substr(0, address.find(','));
  if (address.starts_with('[')) {
    const size_t close = address.find(']');
    return close == std::string_view::npos ? address.substr(1) : address.substr(1, close - 1);
  }
  const size_t first = address.find(':');
  if (first == std::string_view::npos) return address;
  // More than one ':' without brackets is an IPv6 literal without a port.
  if (address.find(':', first + 1) != std::string_view::npos) return address;
  return address.substr(0, first);
}

bool IsLoopbackHost(std::string_view host) {
  std::string h(host);
  for (char& c : h) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (h == "localhost" || h == "localhost.") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

absl::Status FileError(std::string_view what, const std::string& path, int err) {
  std::string why = fmt::format("{} {}: {}", what, path, std::strerror(err));
  return err == EACCES ? absl::PermissionDeniedError(why) : absl::NotFoundError(why);
}

}  // namespace

absl::Status CheckToken(std::string_view token, std::string_view what) {
  if (token.size() < kMinTokenLength)
    return absl::InvalidArgumentError(fmt::format(
        "{}: the token has {} characters, fewer than {}; use a long random one, e.g. "
        "`openssl rand -hex 32`",
        what, token.size(), kMinTokenLength));
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c <= 0x20 || c >= 0x7f || c == ',')
      return absl::InvalidArgumentError(fmt::format(
          "{}: the token's character {} is {}; tokens are printable ASCII without spaces or "
          "commas",
          what, i + 1,
          c == ',' ? "a comma" : c == ' ' ? "a space" : fmt::format("byte 0x{:02x}", c)));
  }
  return absl::OkStatus();
}

bool IsLoopbackAddress(std::string_view address) {
  if (address.starts_with("unix:") || address.starts_with("unix-abstract:")) return true;
  if (address.starts_with("ipv4:") || address.starts_with("ipv6:")) {
    const std::string_view scheme = address.substr(0, 5);
    std::string_view rest = address.substr(5);
    if (rest.empty()) return false;
    for (;;) {
      const size_t comma = rest.find(',');
      if (!IsLoopbackHost(HostOf(fmt::format("{}{}", scheme, rest.substr(0, comma)))))
        return false;
      if (comma == std::string_view::npos) return true;
      rest.remove_prefix(comma + 1);
    }
  }
  return IsLoopbackHost(HostOf(address));
}

absl::Status CheckPlaintext(std::string_view address, bool tls, bool allow_plaintext,
                            std::string_view flags) {
  if (tls || allow_plaintext || IsLoopbackAddress(address)) return absl::OkStatus();
  return absl::FailedPreconditionError(fmt::format(
      "{} is not a loopback address and TLS is off: tokens would cross the network in the "
      "clear; give {}, use a loopback address, or pass --allow-plaintext if another layer "
      "encrypts the traffic",
      address, flags));
}

absl::StatusOr<std::string> ReadPemFile(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return FileError(what, path, errno);
  std::stringstream buf;
  buf << in.rdbuf();
  std::string text = buf.str();
  if (text.find("-----BEGIN ") == std::string::npos)
    return absl::InvalidArgumentError(
        fmt::format("{} {}: not a PEM file (no -----BEGIN line)", what, path));
  return text;
}

absl::StatusOr<ClientTlsPem> ReadClientTls(const ClientTlsFiles& files) {
  ClientTlsPem pem;
  if (files.cert_file.empty() != files.key_file.empty())
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key go together: a client certificate needs its key");
  if (!files.enabled()) {
    if (!files.cert_file.empty() || !files.server_name.empty())
      return absl::InvalidArgumentError(
          "--tls-cert, --tls-key and --tls-server-name need --tls-ca (the CA that signed the "
          "server's certificate): TLS without checking the server is not offered");
    return pem;
  }
  absl::StatusOr<std::string> ca = ReadPemFile(files.ca_file, "--tls-ca");
  if (!ca.ok()) return ca.status();
  pem.ca = *std::move(ca);
  if (!files.cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadPemFile(files.cert_file, "--tls-cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPemFile(files.key_file, "--tls-key");
    if (!key.ok()) return key.status();
    pem.cert = *std::move(cert);
    pem.key = *std::move(key);
  }
  pem.server_name = files.server_name;
  return pem;
}

}  // namespace kforge

// A throwaway private CA and certificates for tests of TLS, made at test
// time by deploy/make-certs.sh (the operators' script, so the tests use what
// they would), so that no key is ever committed. Needs the openssl CLI and
// KFORGE_SOURCE_DIR defined to the repository root.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace kforge::testing {

struct TestPki {
  std::filesystem::path dir;
  std::filesystem::path ca_cert() const { return dir / "ca.crt"; }
  std::filesystem::path server_cert() const { return dir / "server.crt"; }
  std::filesystem::path server_key() const { return dir / "server.key"; }
  std::filesystem::path client_cert() const { return dir / "client.crt"; }
  std::filesystem::path client_key() const { return dir / "client.key"; }
};

// Makes a CA and server/client certificates in `dir` (server valid for
// localhost and 127.0.0.1). False when the script failed; `log` says why.
inline bool MakeTestPki(const std::filesystem::path& dir, TestPki* pki, std::string* log) {
  std::filesystem::create_directories(dir.parent_path());
  const std::filesystem::path out = dir.string() + ".log";
  const std::string cmd = std::string(KFORGE_SOURCE_DIR) + "/deploy/make-certs.sh '" +
                          dir.string() + "' > '" + out.string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  *log = text.str();
  pki->dir = dir;
  return rc == 0;
}

inline std::string ReadFileText(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace kforge::testing

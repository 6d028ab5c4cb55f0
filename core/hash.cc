#include "core/hash.h"

#include <openssl/evp.h>

#include <array>

namespace kforge {

std::string Sha256Hex(std::string_view data) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int len = 0;
  // EVP_Digest with SHA-256 only fails on allocation failure inside OpenSSL;
  // a hash of nothing (len stays 0) then never matches real content.
  EVP_Digest(data.data(), data.size(), digest.data(), &len, EVP_sha256(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 0xf]);
  }
  return out;
}

std::string ContentVariantId(std::string_view source, std::string_view manifest_json,
                             std::string_view compile_options) {
  // Length-prefixed parts: no two different triples hash the same bytes.
  std::string bytes;
  for (std::string_view part : {source, manifest_json, compile_options}) {
    bytes += std::to_string(part.size());
    bytes += ':';
    bytes.append(part);
  }
  return "s-" + Sha256Hex(bytes).substr(0, 24);
}

}  // namespace kforge

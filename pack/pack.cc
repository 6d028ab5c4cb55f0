#include "pack/pack.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/hash.h"

namespace kforge::pack {
namespace {

using nlohmann::json;

constexpr std::string_view kMagic = "KFPACK\r\n";
constexpr std::string_view kEndMagic = "KFPACKEND";
constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8;
constexpr size_t kTrailerBytes = 9 + 64;

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetLE(std::string_view bytes, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
  return v;
}

json TimingJson(const Timing& t) {
  return {{"median_us", t.median_us}, {"min_us", t.min_us}, {"max_us", t.max_us},
          {"p25_us", t.p25_us},       {"p75_us", t.p75_us}, {"samples", t.samples}};
}

json ExtentJson(const SizeExtent& e) {
  return {{"batch", e.batch},       {"max_len_q", e.max_len_q}, {"max_len_k", e.max_len_k},
          {"total_q", e.total_q}, {"total_k", e.total_k}};
}

json ProvenanceJson(const Provenance& p) {
  return {{"origin", p.origin},
          {"template_name", p.template_name},
          {"knobs_json", p.knobs_json},
          {"model", p.model},
          {"prompt_hash", p.prompt_hash},
          {"parent_variant_id", p.parent_variant_id},
          {"job_id", p.job_id}};
}

// Reads the index with every error naming the field's path.
class IndexReader {
 public:
  explicit IndexReader(std::string_view name) : name_(name) {}

  absl::Status Error(std::string_view path, std::string_view why) const {
    return absl::DataLossError(fmt::format("pack {}: index: {}: {}", name_, path, why));
  }

  template <typename T>
  absl::Status Get(const json& obj, std::string_view path, const char* key, T& out,
                   bool required = true) const {
    const std::string at = fmt::format("{}.{}", path, key);
    auto it = obj.find(key);
    if (it == obj.end()) return required ? Error(at, "missing") : absl::OkStatus();
    try {
      out = it->template get<T>();
    } catch (const json::exception&) {
      return Error(at, fmt::format("has the wrong type ({})", it->type_name()));
    }
    return absl::OkStatus();
  }

 private:
  std::string_view name_;
};

#define KF_TRY(expr)                                   \
  do {                                                 \
    if (absl::Status kf_s = (expr); !kf_s.ok()) return kf_s; \
  } while (0)

}  // namespace

std::string NowRfc3339() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

absl::StatusOr<std::string> SerializePack(const Pack& pack) {
  std::string blobs;
  json entries = json::array();
  auto blob = [&](const std::string& data) {
    json b = {{"offset", blobs.size()}, {"bytes", data.size()}, {"sha256", Sha256Hex(data)}};
    blobs += data;
    return b;
  };
  for (size_t i = 0; i < pack.entries.size(); ++i) {
    const Entry& e = pack.entries[i];
    for (auto [field, value] : {std::pair{"bucket", &e.bucket}, std::pair{"arch", &e.arch},
                                std::pair{"source", &e.source},
                                std::pair{"manifest_json", &e.manifest_json}}) {
      if (value->empty())
        return absl::InvalidArgumentError(fmt::format("entries[{}].{}: empty", i, field));
    }
    entries.push_back({{"bucket", e.bucket},
                       {"kernel_bucket", e.kernel_bucket},
                       {"arch", e.arch},
                       {"variant_id", e.variant_id},
                       {"tuned", e.tuned},
                       {"manifest_json", e.manifest_json},
                       {"compile_options", e.compile_options},
                       {"extent", ExtentJson(e.extent)},
                       {"timing", TimingJson(e.timing)},
                       {"provenance", ProvenanceJson(e.provenance)},
                       {"gpu_name", e.gpu_name},
                       {"nvrtc_version", e.nvrtc_version},
                       {"driver_version", e.driver_version},
                       {"source", blob(e.source)},
                       {"cubin", blob(e.cubin)}});
  }
  const json index = {{"format", "kforge-pack"},
                      {"created_at", pack.created_at},
                      {"origin", pack.origin},
                      {"arch", pack.arch},
                      {"entries", std::move(entries)}};
  const std::string index_text =
      index.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out(kMagic);
  PutU32(out, kPackVersion);
  PutU32(out, 0);
  PutU64(out, index_text.size());
  out += index_text;
  out += blobs;
  const std::string digest = Sha256Hex(out);
  out += kEndMagic;
  out += digest;
  return out;
}

absl::StatusOr<Pack> ParsePack(std::string_view bytes, std::string_view name) {
  auto damaged = [&](std::string why) {
    return absl::DataLossError(fmt::format("pack {}: {}", name, why));
  };
  if (bytes.size() < kMagic.size() || bytes.substr(0, kMagic.size()) != kMagic) {
    if (!bytes.empty() && kMagic.substr(0, bytes.size()) == bytes)
      return damaged(fmt::format("truncated: {} bytes, not even the header", bytes.size()));
    return absl::InvalidArgumentError(fmt::format(
        "pack {}: not a kforge kernel pack (it does not start with the KFPACK magic)", name));
  }
  if (bytes.size() < kHeaderBytes)
    return damaged(fmt::format("truncated: {} bytes, shorter than the {}-byte header",
                               bytes.size(), kHeaderBytes));
  const uint32_t version = static_cast<uint32_t>(GetLE(bytes, 8, 4));
  if (version != kPackVersion)
    return absl::InvalidArgumentError(fmt::format(
        "pack {}: format version {}; this kforge reads version {} (written by a newer kforge?)",
        name, version, kPackVersion));
  const uint64_t index_bytes = GetLE(bytes, 16, 8);
  if (index_bytes > bytes.size() || kHeaderBytes + index_bytes + kTrailerBytes > bytes.size())
    return damaged(fmt::format(
        "truncated: the header announces a {}-byte index, but the file has only {} bytes",
        index_bytes, bytes.size()));
  const std::string_view trailer = bytes.substr(bytes.size() - kTrailerBytes);
  if (trailer.substr(0, kEndMagic.size()) != kEndMagic)
    return damaged(fmt::format(
        "truncated or damaged: {} bytes and no end marker (a pack ends with KFPACKEND and "
        "its SHA-256)",
        bytes.size()));
  const std::string_view body = bytes.substr(0, bytes.size() - kTrailerBytes);
  const std::string expected(trailer.substr(kEndMagic.size()));
  const std::string actual = Sha256Hex(body);
  if (actual != expected)
    return damaged(fmt::format("checksum mismatch: the file's SHA-256 is {}, its trailer says {} "
                               "(the file was changed or damaged)",
                               actual, expected));

  const std::string_view index_text = body.substr(kHeaderBytes, index_bytes);
  const std::string_view blobs = body.substr(kHeaderBytes + index_bytes);
  const json index = json::parse(index_text, nullptr, /*allow_exceptions=*/false);
  IndexReader r(name);
  if (index.is_discarded() || !index.is_object()) return r.Error("(root)", "not a JSON object");
  Pack pack;
  std::string format;
  KF_TRY(r.Get(index, "(root)", "format", format));
  if (format != "kforge-pack") return r.Error("(root).format", fmt::format("'{}'", format));
  KF_TRY(r.Get(index, "(root)", "created_at", pack.created_at, false));
  KF_TRY(r.Get(index, "(root)", "origin", pack.origin, false));
  KF_TRY(r.Get(index, "(root)", "arch", pack.arch, false));
  auto entries = index.find("entries");
  if (entries == index.end() || !entries->is_array())
    return r.Error("(root).entries", "missing or not an array");
  for (size_t i = 0; i < entries->size(); ++i) {
    const json& j = (*entries)[i];
    const std::string at = fmt::format("entries[{}]", i);
    if (!j.is_object()) return r.Error(at, "not an object");
    Entry e;
    KF_TRY(r.Get(j, at, "bucket", e.bucket));
    KF_TRY(r.Get(j, at, "kernel_bucket", e.kernel_bucket, false));
    KF_TRY(r.Get(j, at, "arch", e.arch));
    KF_TRY(r.Get(j, at, "variant_id", e.variant_id));
    KF_TRY(r.Get(j, at, "tuned", e.tuned));
    KF_TRY(r.Get(j, at, "manifest_json", e.manifest_json));
    KF_TRY(r.Get(j, at, "compile_options", e.compile_options, false));
    KF_TRY(r.Get(j, at, "gpu_name", e.gpu_name, false));
    KF_TRY(r.Get(j, at, "nvrtc_version", e.nvrtc_version, false));
    KF_TRY(r.Get(j, at, "driver_version", e.driver_version, false));
    if (!ParseBucketId(e.bucket).ok())
      return r.Error(at + ".bucket", fmt::format("'{}' is not a bucket id", e.bucket));
    json extent, timing, provenance;
    KF_TRY(r.Get(j, at, "extent", extent));
    const std::string ext = at + ".extent";
    KF_TRY(r.Get(extent, ext, "batch", e.extent.batch));
    KF_TRY(r.Get(extent, ext, "max_len_q", e.extent.max_len_q));
    KF_TRY(r.Get(extent, ext, "max_len_k", e.extent.max_len_k));
    KF_TRY(r.Get(extent, ext, "total_q", e.extent.total_q));
    KF_TRY(r.Get(extent, ext, "total_k", e.extent.total_k));
    KF_TRY(r.Get(j, at, "timing", timing, false));
    if (timing.is_object()) {
      const std::string t = at + ".timing";
      KF_TRY(r.Get(timing, t, "median_us", e.timing.median_us, false));
      KF_TRY(r.Get(timing, t, "min_us", e.timing.min_us, false));
      KF_TRY(r.Get(timing, t, "max_us", e.timing.max_us, false));
      KF_TRY(r.Get(timing, t, "p25_us", e.timing.p25_us, false));
      KF_TRY(r.Get(timing, t, "p75_us", e.timing.p75_us, false));
      KF_TRY(r.Get(timing, t, "samples", e.timing.samples, false));
    }
    KF_TRY(r.Get(j, at, "provenance", provenance, false));
    if (provenance.is_object()) {
      const std::string p = at + ".provenance";
      Provenance& v = e.provenance;
      for (auto [key, out] : {std::pair{"origin", &v.origin},
                              std::pair{"template_name", &v.template_name},
                              std::pair{"knobs_json", &v.knobs_json}, std::pair{"model", &v.model},
                              std::pair{"prompt_hash", &v.prompt_hash},
                              std::pair{"parent_variant_id", &v.parent_variant_id},
                              std::pair{"job_id", &v.job_id}}) {
        KF_TRY(r.Get(provenance, p, key, *out, false));
      }
    }
    // The blobs: in range and matching their hashes.
    for (auto [key, out] : {std::pair{"source", &e.source}, std::pair{"cubin", &e.cubin}}) {
      json b;
      KF_TRY(r.Get(j, at, key, b));
      uint64_t offset = 0, size = 0;
      std::string sha;
      const std::string bp = fmt::format("{}.{}", at, key);
      KF_TRY(r.Get(b, bp, "offset", offset));
      KF_TRY(r.Get(b, bp, "bytes", size));
      KF_TRY(r.Get(b, bp, "sha256", sha));
      const std::string what =
          fmt::format("{} (bucket {}, variant {}): {}", at, e.bucket,
                      e.variant_id.empty() ? "-" : e.variant_id, key);
      if (offset > blobs.size() || size > blobs.size() - offset)
        return damaged(fmt::format("{} of {} bytes at offset {} lies outside the {} bytes of "
                                   "kernel data",
                                   what, size, offset, blobs.size()));
      *out = std::string(blobs.substr(offset, size));
      if (Sha256Hex(*out) != sha)
        return damaged(fmt::format("{} does not match its SHA-256 {}", what, sha));
    }
    pack.entries.push_back(std::move(e));
  }
  return pack;
}

absl::Status WritePackFile(const std::string& path, const Pack& pack) {
  absl::StatusOr<std::string> bytes = SerializePack(pack);
  if (!bytes.ok()) return bytes.status();
  const std::filesystem::path target(path);
  std::filesystem::path tmp = target;
  tmp += fmt::format(".tmp.{}", ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
    out.flush();
    if (!out)
      return absl::UnavailableError(fmt::format("cannot write {}: {}", tmp.string(),
                                                std::strerror(errno)));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, target, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return absl::UnavailableError(fmt::format("cannot rename {} to {}: {}", tmp.string(), path,
                                              ec.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Pack> ReadPackFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return absl::NotFoundError(fmt::format("pack {}: cannot open: {}", path, std::strerror(errno)));
  std::stringstream buf;
  buf << in.rdbuf();
  return ParsePack(buf.str(), path);
}

}  // namespace kforge::pack

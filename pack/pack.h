// Kernel packs: tuned kernels in one file, for running them with no server.
//
// `kforge export` writes the server's verified winners into a pack; the
// runtime (runtime/) loads packs and keeps its on-disk cache in the same
// format. A pack entry is everything needed to launch a kernel and to know
// where it came from: source, cubin, launch manifest, the bucket it won, the
// sizes it may be run for (extent), its timing and provenance.
//
// File layout (little-endian), format version 1:
//   "KFPACK\r\n"  8-byte magic (the CR LF catches text-mode mangling)
//   u32 version, u32 0 (reserved)
//   u64 N, then N bytes of index JSON: pack metadata and, per entry, its
//       metadata plus offset, size and SHA-256 of its source and cubin
//   the blobs (sources and cubins), back to back
//   "KFPACKEND" + 64 hex digits: the SHA-256 of every byte before them
// ParsePack checks all of it and refuses a pack that is not whole with an
// error naming what is wrong: not a pack, an unknown version, truncated
// (with the sizes), a checksum mismatch, a malformed index (with the
// field), or an entry whose blob does not match its hash (with the entry's
// bucket and variant).
//
// Thread-safe: pure functions, except that the file functions touch the
// file system.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/shape.h"

namespace kforge::pack {

inline constexpr uint32_t kPackVersion = 1;

struct Timing {
  double median_us = 0, min_us = 0, max_us = 0, p25_us = 0, p75_us = 0;
  int32_t samples = 0;
  bool operator==(const Timing&) const = default;
};

struct Provenance {
  std::string origin;  // "template" | "model"
  std::string template_name;
  std::string knobs_json;
  std::string model;
  std::string prompt_hash;
  std::string parent_variant_id;
  std::string job_id;
  bool operator==(const Provenance&) const = default;
};

struct Entry {
  std::string bucket;         // Bucket::Id() it serves
  std::string kernel_bucket;  // the bucket it won: `bucket`, a nearby one, or "" (a seed)
  std::string arch;           // the cubin's target, e.g. "sm_90a"
  std::string variant_id;  // the server's id ("v12", or "s-..." for a seed)
  bool tuned = false;      // the bucket's own verified winner (false: seed or nearest)
  std::string source;
  std::string cubin;  // may be empty: compile `source` for `arch`
  std::string manifest_json;
  std::string compile_options;
  // The largest sizes the kernel may be run for (ExtentCovers).
  SizeExtent extent;
  Timing timing;
  Provenance provenance;
  std::string gpu_name;
  std::string nvrtc_version;
  std::string driver_version;
  bool operator==(const Entry&) const = default;
};

struct Pack {
  std::string created_at;  // RFC 3339, UTC
  std::string origin;      // where it came from, e.g. "kforge-server 127.0.0.1:50051"
  std::string arch;        // the arch filter of the export; "" for any
  std::vector<Entry> entries;
  bool operator==(const Pack&) const = default;
};

// INVALID_ARGUMENT when an entry lacks a bucket, arch, source or manifest.
absl::StatusOr<std::string> SerializePack(const Pack& pack);

// `name` (the file name) prefixes every error: "pack k.kfpack: truncated: ...".
// DATA_LOSS for a damaged pack, INVALID_ARGUMENT for one that is not a pack
// or has a newer version.
absl::StatusOr<Pack> ParsePack(std::string_view bytes, std::string_view name);

// Writes atomically (a temporary file in the same folder, then rename), so a
// reader never sees half a pack.
absl::Status WritePackFile(const std::string& path, const Pack& pack);
absl::StatusOr<Pack> ReadPackFile(const std::string& path);

// Current UTC time in RFC 3339, for Pack::created_at.
std::string NowRfc3339();

}  // namespace kforge::pack

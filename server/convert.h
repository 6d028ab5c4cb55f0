// The edge between the public API (protobuf messages) and kforge's domain
// types: request validation, proto -> domain, domain -> proto, and the one
// mapping of absl::Status onto grpc::Status (in status.h, which needs gRPC).
//
// Validation messages name the offending field with its path in the request,
// e.g. "shape.head_dim: 100 is not a multiple of 8" or
// "shapes[2].cu_seqlens_q: decreases at index 3 (40 -> 12)".
//
// Thread-safe: pure functions.
#pragma once

#include <set>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/shape.h"
#include "kforge/v1/kforge.pb.h"
#include "server/jobs.h"
#include "storage/store.h"

namespace kforge::server {

namespace v1 = ::kforge::v1;

// What the served kernels support, for rejecting shapes no kernel can run.
// Empty sets mean "no restriction beyond core's limits".
struct ServedLimits {
  std::set<int> head_dims;
  bool backward = false;  // a backward template exists (CatalogServesBackward)
};

// Validates every field of `shape` and returns its key; `field` is the path
// of the message in the request ("shape", "shapes[1]").
absl::StatusOr<ShapeKey> ShapeFromProto(const v1::Shape& shape, std::string_view field,
                                        const ServedLimits& limits);
void ShapeToProto(const ShapeKey& key, v1::Shape* out);

// page_size in [0, 1000]; 0 means the default.
absl::StatusOr<Page> PageFromProto(int32_t page_size, const std::string& page_token);
// A store's INVALID_ARGUMENT for a page (a token it did not make) as the
// request error; other errors unchanged.
absl::Status PageTokenError(const absl::Status& store_error);
// Longer than any token a list returns (a bucket id and an arch).
inline constexpr size_t kMaxPageTokenBytes = 512;

// Parses a request from its wire bytes, which gRPC's own parse would answer
// with INTERNAL and no detail when they are not the message: here a request
// larger than `max_bytes` is INVALID_ARGUMENT saying both sizes (the check
// comes before any parsing), a string field that is not UTF-8 is
// INVALID_ARGUMENT naming its path ("gpu.name: is not valid UTF-8",
// "shapes[1].arch: ..."), anything else malformed INVALID_ARGUMENT naming
// the message type.
absl::Status ParseRequest(std::string_view bytes, size_t max_bytes,
                          google::protobuf::Message* request);

// Every field of a RegisterRequest: names and versions bounded and
// printable, the arch known, counts in range, tools known and few. The
// first problem, by field path, never quoting more than a little of it.
absl::Status ValidateRegistration(const v1::RegisterRequest& req);
inline constexpr size_t kMaxWorkerNameBytes = 128;

absl::StatusOr<JobSpec> JobSpecFromProto(const v1::SubmitJobRequest& req,
                                         const ServedLimits& limits);
void JobToProto(const JobView& job, v1::Job* out);

v1::JobState JobStateToProto(JobState s);
// A served figure: the summary and how it was measured, never the samples.
void TimingToProto(const Timing& t, v1::Timing* out, const std::string& measured_by = "");
// A reported timing. With samples, the summary is recomputed from them
// (what is stored and compared is what the samples say); INVALID_ARGUMENT
// naming `field` when they are not finite and positive, more than
// kMaxTimingSamples, or disagree with `samples`.
absl::StatusOr<Timing> TimingFromProto(const v1::Timing& t, std::string_view field);
inline constexpr int kMaxTimingSamples = 4096;
void ProvenanceToProto(const VariantRecord& v, v1::Provenance* out);
// Best-effort: the manifest JSON is the kernels component's format; fields
// it does not have stay at their defaults, and `json` always carries it.
void ManifestToProto(const std::string& manifest_json, v1::LaunchManifest* out);

absl::StatusOr<Outcome> OutcomeFromProto(v1::EvalOutcome o);
v1::TaskKind TaskKindToProto(TaskKind k);

// A reported extent; INVALID_ARGUMENT naming `field` for a negative size.
absl::StatusOr<SizeExtent> ExtentFromProto(const v1::SizeExtent& e, std::string_view field);
// The sizes of one key: what a worker asked to verify `key` verified at
// least (self-attention keys are their queries).
SizeExtent ExtentOf(const ShapeKey& key);

std::string FormatUnixMs(int64_t unix_ms);  // RFC 3339, UTC

// A registered worker as ListWorkers serves it: the stored record, the time
// of its last call (`last_seen_unix_ms`, 0: never) and whether that is
// recent enough to call it connected. The GPU is read from the record's
// gpu_json; fields it lacks (or a malformed one) stay at their defaults.
void WorkerToProto(const WorkerRecord& w, int64_t last_seen_unix_ms, bool connected,
                   v1::Worker* out);

}  // namespace kforge::server

// The catalog of seed kernel templates and their knob spaces.
//
// A template is CUDA source with compile-time knobs (#defines prepended to
// the template text, ThunderKittens-style). Instantiating a template with
// one value per knob and a head dim gives a Variant: complete NVRTC-ready
// source, its launch manifest, and the entry point. The builtin proposer
// searches the knob spaces listed by ListTemplates(); the server serves
// DefaultVariant() for buckets nothing has been tuned for yet.
//
// Templates today:
//   "fwd_mma"  portable FlashAttention-2-style forward on mma.sync
//              (sm_80, sm_90a, sm_100a), head dims 64/128(/256).
//   "fwd_sm90" Hopper wgmma/TMA forward (sm_90a), when built in (owned by
//              the sm90 engineer; see kernels/template_def.h).
//   "fwd_stream" query-streaming forward for long queries over short keys
//              (mma.sync, sm_80+), head dims 64/128.
//
// Thread-safe: everything here is a pure function of its arguments.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/shape.h"
#include "kernels/manifest.h"

namespace kforge {

struct KnobDim {
  std::string name;         // e.g. "BLOCK_M"; prepended as "#define KF_BLOCK_M <v>"
  std::vector<int> values;  // every value the template accepts, ascending
  int default_value = 0;    // used by Instantiate when the knob is not given
};

struct TemplateInfo {
  std::string name;                // "fwd_mma"
  std::vector<std::string> archs;  // targets it compiles for: "sm_80", "sm_90a", ...
  std::vector<std::string> ops;    // "fwd"
  std::vector<int> head_dims;      // 64, 128, ...
  std::vector<KnobDim> knobs;
  std::string description;  // one line for proposers and dashboards
  // Backward templates: the knob values every deterministic variant has
  // (manifest `deterministic`), e.g. bwd_sm90 {DET: 1, ORDER: 0, SPLIT: 0,
  // DQW: 0}; a deterministic shape is tuned over those settings alone.
  // Empty: the template has no deterministic variant (the forward templates,
  // whose output is deterministic anyway).
  std::map<std::string, int> deterministic_knobs;
};

struct Variant {
  std::string template_name;         // empty for hand/model-written variants
  std::map<std::string, int> knobs;  // every knob, defaults filled in
  int head_dim = 0;
  std::string source;         // complete NVRTC source; includes only "kforge/attn_params.h"
  std::string manifest_json;  // ManifestToJson(manifest)
  Manifest manifest;
  std::string entry_point;  // == manifest.entry_point
};

std::vector<TemplateInfo> ListTemplates();

// Checks a knob assignment without building source: unknown template, unknown
// knob, value outside KnobDim::values, head dim unsupported, or a combination
// the template cannot build (e.g. fwd_mma: "BLOCK_M=128 with WARPS=4: each
// warp owns 16 query rows, so BLOCK_M must equal 16*WARPS"). Missing knobs
// take their defaults.
absl::Status ValidateKnobs(const std::string& template_name,
                           const std::map<std::string, int>& knobs, int head_dim);

// Builds the variant. Same errors as ValidateKnobs (InvalidArgument /
// NotFound for an unknown template).
absl::StatusOr<Variant> Instantiate(const std::string& template_name,
                                    const std::map<std::string, int>& knobs,
                                    int head_dim);

// Sensible knobs of a template for a shape (always a valid combination for
// the template's head dims; falls back to the KnobDim defaults).
std::map<std::string, int> DefaultKnobs(const std::string& template_name,
                                        const ShapeKey& shape);

// A good correct seed for a shape: the preferred template that supports
// shape.arch, shape.head_dim, shape.op and the mask, with DefaultKnobs.
// NotFound when no template can serve the shape (e.g. op bwd, head_dim 96),
// and for a deterministic shape when no template has a deterministic variant
// for it (head_dim 96: "no deterministic backward kernel for sm_80: ..."); the variant of
// a deterministic shape always has manifest.deterministic.
absl::StatusOr<Variant> DefaultVariant(const ShapeKey& shape);

// The knobs as the #define prelude a template receives, e.g.
// "#define KF_BLOCK_M 128\n#define KF_HEAD_DIM 128\n".
std::string KnobPrelude(const std::map<std::string, int>& knobs, int head_dim);

}  // namespace kforge

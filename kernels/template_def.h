// How a template plugs into the catalog (for template authors, not callers).
//
// Each template is one .cuh file (embedded into the library with
// kforge_embed) plus a TemplateDef factory. catalog.cc lists the factories:
//   kernels/templates/fwd_mma.cc   -> templates::FwdMmaTemplate()   (always)
//   kernels/templates/bwd_mma.cc   -> templates::BwdMmaTemplate()   (always)
//   kernels/templates/fwd_stream.cc -> templates::FwdStreamTemplate() (always;
//       mma_common.cuh + fwd_stream.cuh)
// The two portable templates share their PTX helpers through
// templates/mma_common.cuh, which their build() prepends to the source.
//   kernels/templates/fwd_sm90.cc  -> templates::FwdSm90Template()  (embeds
//       kernels/templates/fwd_sm90.cuh as kforge::embedded::fwd_sm90_cuh;
//       its build() assembles the source from the shared Hopper parts in
//       templates/sm90/ (sm90/parts.h, notes/parts.md), the kernel file last,
//       and sizes shared memory with sm90/layout.h, which the kernel also uses)
//   kernels/templates/bwd_sm90.cc  -> templates::BwdSm90Template()  (its
//       build() prepends templates/bwd_sm90_layout.h, the shared-memory
//       layout the .cc also evaluates)
#pragma once

#include <functional>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/shape.h"
#include "kernels/catalog.h"

namespace kforge {

struct TemplateDef {
  TemplateInfo info;
  // Extra validity rules beyond "each value is in KnobDim::values" (the
  // catalog checks that first and fills defaults). Knobs are complete here.
  std::function<absl::Status(const std::map<std::string, int>& knobs, int head_dim)> validate;
  // Source (KnobPrelude(knobs, head_dim) + template text) and manifest for
  // complete, validated knobs.
  std::function<absl::StatusOr<Variant>(const std::map<std::string, int>& knobs, int head_dim)> build;
  // Knobs for a shape (need not be complete: defaults fill the rest).
  std::function<std::map<std::string, int>(const ShapeKey& shape)> default_knobs;
  // How much DefaultVariant should prefer this template for a shape it
  // supports (higher wins); <= 0 means never pick it by default.
  std::function<int(const ShapeKey& shape)> preference;
};

namespace templates {
// Mean keys (self attention: the queries) and mean queries per sequence.
inline int64_t MeanKeys(const ShapeKey& s) {
  const int64_t keys = s.cross ? s.total_k : s.total_q;  // self: keys are the queries
  return s.batch > 0 ? keys / s.batch : s.max_len_k;
}
inline int64_t MeanQueries(const ShapeKey& s) {
  return s.batch > 0 ? s.total_q / s.batch : s.max_len_q;
}

// Many sequences, most of them short (a mean of at most 64 queries, or keys
// with `keys`), and a tail reaching 512 or more: powerlaw_short's class,
// which fwd_sm90 serves with packed tiles and bwd_sm90 with split key tiles.
inline bool HeavyTailedShort(const ShapeKey& s, bool keys) {
  const bool k = keys && s.cross;  // self-attention: the keys are the queries
  const int64_t total = k ? s.total_k : s.total_q;
  const int64_t longest = k ? s.max_len_k : s.max_len_q;
  const int64_t mean = s.batch > 0 ? total / s.batch : longest;
  return s.batch >= 64 && mean > 0 && mean <= 64 && longest >= 512;
}

TemplateDef FwdMmaTemplate();
TemplateDef BwdMmaTemplate();
TemplateDef FwdStreamTemplate();
TemplateDef FwdSm90Template();
TemplateDef BwdSm90Template();
}  // namespace templates

}  // namespace kforge

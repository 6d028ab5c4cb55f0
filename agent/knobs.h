// Knobs a model-written kernel declares, so that the builtin search can
// sweep them (the hybrid proposer, hybrid_proposer.h).
//
// A model marks the compile-time constants it wants swept with comment
// lines anywhere in its source, and how manifest fields follow from them:
//
//   // kforge-knob BLOCK_N default=64 values=32,64,128
//   // kforge-knob STAGES default=2 values=1,2,3
//   // kforge-manifest dynamic_smem_bytes = (64 + 2 * BLOCK_N * STAGES) * HEAD_DIM * 2
//   // kforge-manifest tile_n = BLOCK_N
//
// The source reads KF_BLOCK_N, KF_STAGES (and KF_HEAD_DIM, the shape's head
// dim) and does not define them: every instance is the source with
// "#define KF_<NAME> <value>" lines in front, the kernel catalog's
// convention (kernels/catalog.h KnobPrelude). A manifest expression is
// integer arithmetic (+ - * / % and parentheses, min(a, b), max(a, b)) over
// knob names and HEAD_DIM; it replaces that field of the manifest the model
// gave (threads, dynamic_smem_bytes, tile_m, tile_n, ctas_per_sm,
// workspace_fixed_bytes, workspace_per_tile_bytes).
//
// Thread-safe: pure functions; ModelTemplateSource as TemplateSource says.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/template_source.h"
#include "core/shape.h"

namespace kforge::agent {

struct KnobDecl {
  std::string name;         // without the KF_ prefix
  int default_value = 0;
  std::vector<int> values;  // ascending, contains default_value
};

struct KnobTemplate {
  std::string body;                          // the source without any knob prelude
  std::vector<KnobDecl> knobs;               // in the order declared
  std::map<std::string, std::string> manifest_exprs;  // field -> expression
  std::string manifest_json;                 // the manifest as the model gave it
};

// The declarations of `source`; a template with no knobs when it has none.
// InvalidArgument naming the line for a malformed declaration (an unknown
// manifest field, a default outside its values, more than 8 knobs or 64
// values per knob, a name that is not an identifier, an expression that does
// not evaluate for the defaults at `head_dim`).
absl::StatusOr<KnobTemplate> ParseKnobTemplate(std::string_view source, std::string_view manifest_json,
                                               int head_dim);

// The prelude + body and the manifest of one setting (knobs not given take
// their defaults). InvalidArgument for a value a knob does not declare, an
// expression that fails (division by zero, overflow, a name that is not a
// knob) or a manifest that does not parse.
absl::StatusOr<TemplateVariant> InstantiateKnobs(const KnobTemplate& t, const KnobValues& knobs, int head_dim);

// The body of an instance: `source` without its leading "#define KF_<knob>"
// lines for the declared knobs (and KF_HEAD_DIM).
std::string StripKnobPrelude(std::string_view source, const std::vector<KnobDecl>& knobs);

// Integer arithmetic over named values (exposed for tests).
absl::StatusOr<int64_t> EvalIntExpr(std::string_view expr, const std::map<std::string, int64_t>& names);

// The model-written kernels that declared knobs, as templates the builtin
// proposer can search: template "model:<variant id>" serves exactly the
// shape's arch, op and head dim it was written for; its instances pass the
// static checks (kernels/check.h) or are not legal. Not thread-safe (the
// proposer that owns it calls it from one thread).
class ModelTemplateSource final : public TemplateSource {
 public:
  // Adds (or replaces) the template of `variant_id`. `shape` is the bucket's.
  void Add(const std::string& variant_id, KnobTemplate t, const ShapeKey& shape);
  bool Has(const std::string& template_name) const { return templates_.count(template_name) != 0; }
  void Remove(const std::string& template_name) { templates_.erase(template_name); }

  std::vector<TemplateSpec> Templates() const override;
  bool Supports(const TemplateSpec& spec, const ShapeKey& shape) const override;
  absl::StatusOr<KnobValues> DefaultKnobs(const std::string& tmpl, const ShapeKey& shape) const override;
  absl::StatusOr<TemplateVariant> Instantiate(const std::string& tmpl, const KnobValues& knobs,
                                              const ShapeKey& shape) const override;

 private:
  struct Entry {
    KnobTemplate t;
    ShapeKey shape;
  };
  std::map<std::string, Entry> templates_;
};

}  // namespace kforge::agent

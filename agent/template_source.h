// TemplateSource: the seed templates as the builtin proposer sees them.
//
// The builtin search only needs three things from the kernel catalog: which
// templates exist (with the knob space of each), the catalog's default knobs
// for a shape, and the CUDA source + launch manifest for one knob setting.
// This interface keeps the search testable with scripted spaces; the real
// implementation (MakeCatalogTemplateSource) forwards to kernels/catalog.h.
//
// Implementations must be deterministic (the same arguments give the same
// answer) and must outlive every proposer that borrows them. Thread-safety:
// const methods may be called from one thread at a time.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/shape.h"

namespace kforge::agent {

struct KnobRange {
  std::string name;
  std::vector<int> values;  // the legal values, in increasing order
};

struct TemplateSpec {
  std::string name;
  std::vector<std::string> archs;  // e.g. "sm_90a", "sm_80"
  std::vector<std::string> ops;    // "fwd" | "bwd"
  std::vector<int> head_dims;      // empty: any head dim
  std::vector<KnobRange> knobs;
  // The knob values every deterministic variant of the template has
  // (kernels/catalog.h TemplateInfo): for a deterministic shape the search
  // fixes them. Empty: nothing is fixed, and whether a setting is
  // deterministic is its manifest's to say (Instantiate refuses one that
  // is not, for such a shape).
  std::map<std::string, int> deterministic_knobs;
};

struct TemplateVariant {
  std::string source;
  std::string manifest_json;
};

using KnobValues = std::map<std::string, int>;

class TemplateSource {
 public:
  virtual ~TemplateSource() = default;

  virtual std::vector<TemplateSpec> Templates() const = 0;

  // True when `spec` can serve `shape` (op, head dim, architecture, and a
  // deterministic variant when the shape asks for one).
  virtual bool Supports(const TemplateSpec& spec, const ShapeKey& shape) const = 0;

  // The catalog's starting point for `shape`; knobs it leaves out are chosen
  // by the caller. An error means the template has no default for the shape.
  virtual absl::StatusOr<KnobValues> DefaultKnobs(const std::string& tmpl,
                                                  const ShapeKey& shape) const = 0;

  // Source and manifest for one knob setting. An error means the setting is
  // not a legal variant for this shape (e.g. shared memory over the limit,
  // or a manifest that is not deterministic for a deterministic shape).
  virtual absl::StatusOr<TemplateVariant> Instantiate(const std::string& tmpl,
                                                      const KnobValues& knobs,
                                                      const ShapeKey& shape) const = 0;
};

// Default arch rule for templates: an exact name matches; a generic target
// ("sm_80", no suffix) also serves any later architecture, while an
// architecture-specific one ("sm_90a") serves only itself.
bool ArchServes(const std::string& template_arch, const std::string& target_arch);

// The kernel catalog (kernels/catalog.h) behind this interface.
std::unique_ptr<TemplateSource> MakeCatalogTemplateSource();

}  // namespace kforge::agent

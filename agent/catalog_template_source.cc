// TemplateSource over the kernel catalog (kernels/catalog.h).
#include <algorithm>

#include "agent/template_source.h"
#include "kernels/catalog.h"
#include "kernels/check.h"

namespace kforge::agent {
namespace {

class CatalogTemplateSource final : public TemplateSource {
 public:
  std::vector<TemplateSpec> Templates() const override {
    std::vector<TemplateSpec> out;
    for (const TemplateInfo& info : ListTemplates()) {
      TemplateSpec spec{info.name, info.archs, info.ops, info.head_dims, {}, info.deterministic_knobs};
      for (const KnobDim& k : info.knobs) spec.knobs.push_back(KnobRange{k.name, k.values});
      out.push_back(std::move(spec));
    }
    return out;
  }

  bool Supports(const TemplateSpec& spec, const ShapeKey& shape) const override {
    auto has = [](const auto& list, const auto& v) {
      return std::find(list.begin(), list.end(), v) != list.end();
    };
    if (!has(spec.ops, std::string(OpName(shape.op)))) return false;
    if (!spec.head_dims.empty() && !has(spec.head_dims, shape.head_dim)) return false;
    // A catalog template without deterministic knobs has no deterministic
    // variant (the forward templates).
    if (shape.deterministic && spec.deterministic_knobs.empty()) return false;
    return std::any_of(spec.archs.begin(), spec.archs.end(),
                       [&](const std::string& a) { return ArchServes(a, shape.arch); });
  }

  absl::StatusOr<KnobValues> DefaultKnobs(const std::string& tmpl,
                                          const ShapeKey& shape) const override {
    return kforge::DefaultKnobs(tmpl, shape);
  }

  absl::StatusOr<TemplateVariant> Instantiate(const std::string& tmpl, const KnobValues& knobs,
                                              const ShapeKey& shape) const override {
    absl::StatusOr<Variant> v = kforge::Instantiate(tmpl, knobs, shape.head_dim);
    if (!v.ok()) return v.status();
    // A setting the static check refuses (shared memory over the arch limit,
    // mask not supported...) would only cost a compile to learn the same.
    if (absl::Status s = CheckVariant(v->source, v->manifest, shape.arch, shape); !s.ok()) return s;
    // The template search keeps a deterministic setting (DET=1) for
    // the buckets that ask for one: elsewhere its fixed order only costs time
    // (notes/bwd.md v21), and the search would spend evaluations learning so.
    if (v->manifest.deterministic && !shape.deterministic) {
      return absl::FailedPreconditionError(
          "deterministic variant: searched only for shapes that ask for a deterministic kernel");
    }
    return TemplateVariant{std::move(v->source), std::move(v->manifest_json)};
  }
};

}  // namespace

std::unique_ptr<TemplateSource> MakeCatalogTemplateSource() {
  return std::make_unique<CatalogTemplateSource>();
}

}  // namespace kforge::agent

#include "kernels/catalog.h"

#include <algorithm>

#include <fmt/format.h>

#include "kernels/template_def.h"

namespace kforge {
namespace {

// The template list is rebuilt on each call (cheap, and no global state).
std::vector<TemplateDef> AllTemplates() {
  std::vector<TemplateDef> defs;
  defs.push_back(templates::FwdMmaTemplate());
  defs.push_back(templates::BwdMmaTemplate());
  defs.push_back(templates::FwdStreamTemplate());
  defs.push_back(templates::FwdSm90Template());
  defs.push_back(templates::BwdSm90Template());
  return defs;
}

const TemplateDef* Find(const std::vector<TemplateDef>& defs, const std::string& name) {
  for (const auto& d : defs) {
    if (d.info.name == name) return &d;
  }
  return nullptr;
}

// Checks names and values against the knob space and fills defaults.
absl::StatusOr<std::map<std::string, int>> Complete(const TemplateDef& def,
                                                    const std::map<std::string, int>& knobs,
                                                    int head_dim) {
  const auto& info = def.info;
  if (std::find(info.head_dims.begin(), info.head_dims.end(), head_dim) == info.head_dims.end()) {
    return absl::InvalidArgumentError(fmt::format("{}: head_dim {} is not supported (only {})",
                                                  info.name, head_dim,
                                                  fmt::join(info.head_dims, ", ")));
  }
  std::map<std::string, int> full;
  for (const auto& [name, value] : knobs) {
    auto it = std::find_if(info.knobs.begin(), info.knobs.end(),
                           [&](const KnobDim& k) { return k.name == name; });
    if (it == info.knobs.end()) {
      std::vector<std::string> names;
      for (const auto& k : info.knobs) names.push_back(k.name);
      return absl::InvalidArgumentError(fmt::format("{}: unknown knob \"{}\" (knobs: {})",
                                                    info.name, name, fmt::join(names, ", ")));
    }
    if (std::find(it->values.begin(), it->values.end(), value) == it->values.end()) {
      return absl::InvalidArgumentError(fmt::format("{}: {}={} is not one of {}", info.name, name,
                                                    value, fmt::join(it->values, ", ")));
    }
    full[name] = value;
  }
  for (const auto& k : info.knobs) full.emplace(k.name, k.default_value);
  if (def.validate) {
    if (auto s = def.validate(full, head_dim); !s.ok()) return s;
  }
  return full;
}

}  // namespace

std::vector<TemplateInfo> ListTemplates() {
  std::vector<TemplateInfo> out;
  for (auto& d : AllTemplates()) out.push_back(std::move(d.info));
  return out;
}

absl::Status ValidateKnobs(const std::string& template_name,
                           const std::map<std::string, int>& knobs, int head_dim) {
  const auto defs = AllTemplates();
  const TemplateDef* def = Find(defs, template_name);
  if (def == nullptr) {
    return absl::NotFoundError(fmt::format("template \"{}\" is not in the catalog", template_name));
  }
  return Complete(*def, knobs, head_dim).status();
}

absl::StatusOr<Variant> Instantiate(const std::string& template_name,
                                    const std::map<std::string, int>& knobs, int head_dim) {
  const auto defs = AllTemplates();
  const TemplateDef* def = Find(defs, template_name);
  if (def == nullptr) {
    return absl::NotFoundError(fmt::format("template \"{}\" is not in the catalog", template_name));
  }
  auto full = Complete(*def, knobs, head_dim);
  if (!full.ok()) return full.status();
  auto v = def->build(*full, head_dim);
  if (!v.ok()) return v.status();
  v->template_name = template_name;
  v->knobs = *full;
  v->head_dim = head_dim;
  v->manifest_json = ManifestToJson(v->manifest);
  v->entry_point = v->manifest.entry_point;
  return v;
}

std::map<std::string, int> DefaultKnobs(const std::string& template_name, const ShapeKey& shape) {
  const auto defs = AllTemplates();
  const TemplateDef* def = Find(defs, template_name);
  if (def == nullptr) return {};
  std::map<std::string, int> knobs;
  if (def->default_knobs) knobs = def->default_knobs(shape);
  for (const auto& k : def->info.knobs) knobs.emplace(k.name, k.default_value);
  return knobs;
}

absl::StatusOr<Variant> DefaultVariant(const ShapeKey& shape) {
  const auto defs = AllTemplates();
  const TemplateDef* best = nullptr;
  int best_pref = 0;
  const std::string op(OpName(shape.op));
  for (const auto& d : defs) {
    const auto& i = d.info;
    if (std::find(i.archs.begin(), i.archs.end(), shape.arch) == i.archs.end()) continue;
    if (std::find(i.ops.begin(), i.ops.end(), op) == i.ops.end()) continue;
    if (std::find(i.head_dims.begin(), i.head_dims.end(), shape.head_dim) == i.head_dims.end()) {
      continue;
    }
    const int pref = d.preference ? d.preference(shape) : 1;
    if (pref > best_pref) {
      best = &d;
      best_pref = pref;
    }
  }
  if (best == nullptr && shape.deterministic) {
    return absl::NotFoundError(fmt::format(
        "no deterministic backward kernel for {}: no template serving op {} head_dim {} there "
        "sums dQ in a fixed order (bwd_mma DET=1 does, on sm_80 and later, and bwd_sm90 DET=1 on "
        "sm_90a, at head_dim 64 and 128)",
        shape.arch, op, shape.head_dim));
  }
  if (best == nullptr) {
    return absl::NotFoundError(fmt::format(
        "no template serves op {} head_dim {} on arch \"{}\"", op, shape.head_dim, shape.arch));
  }
  std::map<std::string, int> knobs;
  if (best->default_knobs) knobs = best->default_knobs(shape);
  auto v = Instantiate(best->info.name, knobs, shape.head_dim);
  if (!v.ok()) {
    // A template's default knobs must always build; fall back to its plain
    // defaults (with the knobs a deterministic variant needs).
    v = Instantiate(best->info.name, shape.deterministic ? best->info.deterministic_knobs
                                                         : std::map<std::string, int>{},
                    shape.head_dim);
  }
  // The promise is the manifest's: never serve a deterministic shape less.
  if (v.ok() && shape.deterministic && !v->manifest.deterministic) {
    return absl::InternalError(fmt::format(
        "no deterministic backward kernel for {}: {}'s default knobs for the shape build a variant "
        "whose manifest is not deterministic",
        shape.arch, best->info.name));
  }
  return v;
}

std::string KnobPrelude(const std::map<std::string, int>& knobs, int head_dim) {
  std::string out = "// kforge knobs\n";
  for (const auto& [name, value] : knobs) out += fmt::format("#define KF_{} {}\n", name, value);
  out += fmt::format("#define KF_HEAD_DIM {}\n", head_dim);
  return out;
}

}  // namespace kforge

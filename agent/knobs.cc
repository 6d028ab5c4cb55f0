#include "agent/knobs.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/check.h"
#include "kernels/manifest.h"

namespace kforge::agent {
namespace {

using nlohmann::json;

constexpr size_t kMaxKnobs = 8;
constexpr size_t kMaxValues = 64;

const std::set<std::string>& ManifestIntFields() {
  static const std::set<std::string> kFields = {"threads", "dynamic_smem_bytes", "tile_m", "tile_n",
                                                "ctas_per_sm", "workspace_fixed_bytes",
                                                "workspace_per_tile_bytes"};
  return kFields;
}

bool IsIdentifier(std::string_view s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// A recursive-descent parser over one expression.
class Expr {
 public:
  Expr(std::string_view text, const std::map<std::string, int64_t>& names) : s_(text), names_(names) {}

  absl::StatusOr<int64_t> Parse() {
    absl::StatusOr<int64_t> v = Sum();
    if (!v.ok()) return v;
    Skip();
    if (pos_ != s_.size()) return Error(fmt::format("unexpected '{}'", s_.substr(pos_, 10)));
    return v;
  }

 private:
  void Skip() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool Eat(char c) {
    Skip();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(fmt::format("expression \"{}\": {}", s_, what));
  }
  static bool Fits(__int128 v) {
    return v >= std::numeric_limits<int64_t>::min() && v <= std::numeric_limits<int64_t>::max();
  }
  absl::StatusOr<int64_t> Sum() {
    absl::StatusOr<int64_t> left = Product();
    if (!left.ok()) return left;
    __int128 v = *left;
    for (;;) {
      char op = Eat('+') ? '+' : Eat('-') ? '-' : 0;
      if (op == 0) break;
      absl::StatusOr<int64_t> right = Product();
      if (!right.ok()) return right;
      v = op == '+' ? v + *right : v - *right;
      if (!Fits(v)) return Error("overflow");
    }
    return static_cast<int64_t>(v);
  }
  absl::StatusOr<int64_t> Product() {
    absl::StatusOr<int64_t> left = Unary();
    if (!left.ok()) return left;
    __int128 v = *left;
    for (;;) {
      char op = Eat('*') ? '*' : Eat('/') ? '/' : Eat('%') ? '%' : 0;
      if (op == 0) break;
      absl::StatusOr<int64_t> right = Unary();
      if (!right.ok()) return right;
      if (op != '*' && *right == 0) return Error("division by zero");
      v = op == '*' ? v * *right : op == '/' ? v / *right : v % *right;
      if (!Fits(v)) return Error("overflow");
    }
    return static_cast<int64_t>(v);
  }
  absl::StatusOr<int64_t> Unary() {
    if (Eat('-')) {
      absl::StatusOr<int64_t> v = Unary();
      if (!v.ok()) return v;
      if (*v == std::numeric_limits<int64_t>::min()) return Error("overflow");
      return -*v;
    }
    return Atom();
  }
  absl::StatusOr<int64_t> Atom() {
    if (++depth_ > 64) return Error("nested too deeply");
    Skip();
    if (Eat('(')) {
      absl::StatusOr<int64_t> v = Sum();
      if (!v.ok()) return v;
      if (!Eat(')')) return Error("missing ')'");
      --depth_;
      return v;
    }
    if (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
      __int128 v = 0;
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
        v = v * 10 + (s_[pos_++] - '0');
        if (!Fits(v)) return Error("number too large");
      }
      --depth_;
      return static_cast<int64_t>(v);
    }
    size_t start = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
    std::string name(s_.substr(start, pos_ - start));
    if (name.empty()) return Error(pos_ < s_.size() ? fmt::format("unexpected '{}'", s_[pos_]) : "ends early");
    if (name == "min" || name == "max") {
      if (!Eat('(')) return Error(fmt::format("{} needs '('", name));
      absl::StatusOr<int64_t> a = Sum();
      if (!a.ok()) return a;
      if (!Eat(',')) return Error(fmt::format("{} needs two arguments", name));
      absl::StatusOr<int64_t> b = Sum();
      if (!b.ok()) return b;
      if (!Eat(')')) return Error("missing ')'");
      --depth_;
      return name == "min" ? std::min(*a, *b) : std::max(*a, *b);
    }
    auto it = names_.find(name);
    if (it == names_.end()) return Error(fmt::format("unknown name {}", name));
    --depth_;
    return it->second;
  }

  std::string_view s_;
  const std::map<std::string, int64_t>& names_;
  size_t pos_ = 0;
  int depth_ = 0;
};

std::vector<std::string_view> Lines(std::string_view s) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find('\n', pos);
    if (end == std::string_view::npos) end = s.size();
    out.push_back(s.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

// "key=value" fields of a declaration.
std::map<std::string, std::string> Fields(std::string_view rest) {
  std::map<std::string, std::string> out;
  size_t pos = 0;
  while (pos < rest.size()) {
    while (pos < rest.size() && std::isspace(static_cast<unsigned char>(rest[pos]))) ++pos;
    size_t end = pos;
    while (end < rest.size() && !std::isspace(static_cast<unsigned char>(rest[end]))) ++end;
    std::string_view f = rest.substr(pos, end - pos);
    size_t eq = f.find('=');
    if (eq != std::string_view::npos) out[std::string(f.substr(0, eq))] = std::string(f.substr(eq + 1));
    pos = end;
  }
  return out;
}

std::optional<int> ParseInt(std::string_view s) {
  absl::StatusOr<int64_t> v = EvalIntExpr(s, {});
  if (!v.ok() || *v < std::numeric_limits<int>::min() || *v > std::numeric_limits<int>::max()) return std::nullopt;
  return static_cast<int>(*v);
}

std::string Prelude(const KnobTemplate& t, const KnobValues& knobs, int head_dim) {
  std::string out;
  for (const KnobDecl& k : t.knobs) {
    auto it = knobs.find(k.name);
    out += fmt::format("#define KF_{} {}\n", k.name, it == knobs.end() ? k.default_value : it->second);
  }
  out += fmt::format("#define KF_HEAD_DIM {}\n", head_dim);
  return out;
}

}  // namespace

absl::StatusOr<int64_t> EvalIntExpr(std::string_view expr, const std::map<std::string, int64_t>& names) {
  if (Trim(expr).empty()) return absl::InvalidArgumentError("expression is empty");
  return Expr(expr, names).Parse();
}

absl::StatusOr<KnobTemplate> ParseKnobTemplate(std::string_view source, std::string_view manifest_json,
                                               int head_dim) {
  KnobTemplate t;
  t.manifest_json = std::string(manifest_json);
  std::vector<std::string_view> lines = Lines(source);
  std::set<std::string> names;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string_view line = Trim(lines[i]);
    if (line.rfind("//", 0) != 0) continue;
    line = Trim(line.substr(2));
    const int number = static_cast<int>(i) + 1;
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(fmt::format("line {}: {}", number, why));
    };
    if (line.rfind("kforge-knob", 0) == 0 && (line.size() == 11 || std::isspace(static_cast<unsigned char>(line[11])))) {
      std::string_view rest = Trim(line.substr(11));
      size_t sp = rest.find_first_of(" \t");
      std::string name(rest.substr(0, sp));
      if (name.rfind("KF_", 0) == 0) name = name.substr(3);
      if (!IsIdentifier(name) || name == "HEAD_DIM")
        return bad(fmt::format("kforge-knob: \"{}\" is not a knob name (an identifier other than HEAD_DIM)", name));
      if (!names.insert(name).second) return bad(fmt::format("kforge-knob: {} is declared twice", name));
      if (names.size() > kMaxKnobs) return bad(fmt::format("kforge-knob: more than {} knobs", kMaxKnobs));
      std::map<std::string, std::string> f = Fields(sp == std::string_view::npos ? "" : rest.substr(sp));
      KnobDecl k;
      k.name = name;
      if (!f.count("values")) return bad(fmt::format("kforge-knob {}: no values=a,b,c", name));
      std::string_view vs = f["values"];
      size_t pos = 0;
      while (pos <= vs.size()) {
        size_t comma = vs.find(',', pos);
        if (comma == std::string_view::npos) comma = vs.size();
        std::optional<int> v = ParseInt(vs.substr(pos, comma - pos));
        if (!v) return bad(fmt::format("kforge-knob {}: \"{}\" is not an integer", name, vs.substr(pos, comma - pos)));
        k.values.push_back(*v);
        pos = comma + 1;
      }
      std::sort(k.values.begin(), k.values.end());
      k.values.erase(std::unique(k.values.begin(), k.values.end()), k.values.end());
      if (k.values.size() > kMaxValues) return bad(fmt::format("kforge-knob {}: more than {} values", name, kMaxValues));
      std::optional<int> d = f.count("default") ? ParseInt(f["default"]) : std::optional<int>(k.values.front());
      if (!d) return bad(fmt::format("kforge-knob {}: default is not an integer", name));
      if (!std::binary_search(k.values.begin(), k.values.end(), *d))
        return bad(fmt::format("kforge-knob {}: default {} is not one of its values", name, *d));
      k.default_value = *d;
      t.knobs.push_back(std::move(k));
    } else if (line.rfind("kforge-manifest", 0) == 0) {
      std::string_view rest = Trim(line.substr(15));
      size_t eq = rest.find('=');
      if (eq == std::string_view::npos) return bad("kforge-manifest: no '=' (field = expression)");
      std::string field(Trim(rest.substr(0, eq)));
      if (!ManifestIntFields().count(field))
        return bad(fmt::format("kforge-manifest: \"{}\" is not a manifest field an expression may set", field));
      t.manifest_exprs[field] = std::string(Trim(rest.substr(eq + 1)));
    }
  }
  t.body = StripKnobPrelude(source, t.knobs);
  if (!t.knobs.empty()) {
    // The defaults must make a variant: a declaration that cannot is refused
    // now, while the model can still be told which line is wrong.
    if (absl::StatusOr<TemplateVariant> v = InstantiateKnobs(t, {}, head_dim); !v.ok()) return v.status();
  } else if (!t.manifest_exprs.empty()) {
    return absl::InvalidArgumentError("kforge-manifest lines need kforge-knob declarations");
  }
  return t;
}

std::string StripKnobPrelude(std::string_view source, const std::vector<KnobDecl>& knobs) {
  std::set<std::string> names = {"KF_HEAD_DIM"};
  for (const KnobDecl& k : knobs) names.insert("KF_" + k.name);
  size_t pos = 0;
  while (pos < source.size()) {
    size_t end = source.find('\n', pos);
    if (end == std::string_view::npos) end = source.size();
    std::string_view line = Trim(source.substr(pos, end - pos));
    if (line.rfind("#define ", 0) != 0) break;
    std::string_view rest = Trim(line.substr(8));
    std::string name(rest.substr(0, rest.find_first_of(" \t")));
    if (!names.count(name)) break;
    pos = end + 1;
  }
  return std::string(source.substr(std::min(pos, source.size())));
}

absl::StatusOr<TemplateVariant> InstantiateKnobs(const KnobTemplate& t, const KnobValues& knobs, int head_dim) {
  std::map<std::string, int64_t> values = {{"HEAD_DIM", head_dim}};
  for (const KnobDecl& k : t.knobs) {
    auto it = knobs.find(k.name);
    const int v = it == knobs.end() ? k.default_value : it->second;
    if (!std::binary_search(k.values.begin(), k.values.end(), v))
      return absl::InvalidArgumentError(fmt::format("knob {}: {} is not one of its declared values", k.name, v));
    values[k.name] = v;
  }
  for (const auto& [name, v] : knobs) {
    if (!values.count(name)) return absl::InvalidArgumentError(fmt::format("knob {}: not declared", name));
  }
  json manifest = json::parse(t.manifest_json, nullptr, /*allow_exceptions=*/false);
  if (!manifest.is_object()) return absl::InvalidArgumentError("manifest: not a JSON object");
  for (const auto& [field, expr] : t.manifest_exprs) {
    absl::StatusOr<int64_t> v = EvalIntExpr(expr, values);
    if (!v.ok()) return absl::InvalidArgumentError(fmt::format("kforge-manifest {}: {}", field, std::string(v.status().message())));
    if (field == "workspace_fixed_bytes" || field == "workspace_per_tile_bytes") {
      if (!manifest["workspace"].is_object()) manifest["workspace"] = json::object();
      manifest["workspace"][field == "workspace_fixed_bytes" ? "fixed_bytes" : "per_tile_bytes"] = *v;
    } else {
      manifest[field] = *v;
    }
  }
  TemplateVariant out;
  out.source = Prelude(t, knobs, head_dim) + t.body;
  out.manifest_json = manifest.dump();
  if (absl::StatusOr<Manifest> m = ParseManifest(out.manifest_json); !m.ok())
    return absl::InvalidArgumentError(fmt::format("manifest: {}", std::string(m.status().message())));
  return out;
}

void ModelTemplateSource::Add(const std::string& variant_id, KnobTemplate t, const ShapeKey& shape) {
  templates_["model:" + variant_id] = Entry{std::move(t), shape};
}

std::vector<TemplateSpec> ModelTemplateSource::Templates() const {
  std::vector<TemplateSpec> out;
  for (const auto& [name, e] : templates_) {
    TemplateSpec s;
    s.name = name;
    s.archs = {e.shape.arch};
    s.ops = {std::string(OpName(e.shape.op))};
    s.head_dims = {e.shape.head_dim};
    for (const KnobDecl& k : e.t.knobs) s.knobs.push_back(KnobRange{k.name, k.values});
    out.push_back(std::move(s));
  }
  return out;
}

bool ModelTemplateSource::Supports(const TemplateSpec& spec, const ShapeKey& shape) const {
  auto it = templates_.find(spec.name);
  if (it == templates_.end()) return false;
  const ShapeKey& s = it->second.shape;
  return s.arch == shape.arch && s.op == shape.op && s.head_dim == shape.head_dim;
}

absl::StatusOr<KnobValues> ModelTemplateSource::DefaultKnobs(const std::string& tmpl, const ShapeKey&) const {
  auto it = templates_.find(tmpl);
  if (it == templates_.end()) return absl::NotFoundError(fmt::format("no model template {}", tmpl));
  KnobValues out;
  for (const KnobDecl& k : it->second.t.knobs) out[k.name] = k.default_value;
  return out;
}

absl::StatusOr<TemplateVariant> ModelTemplateSource::Instantiate(const std::string& tmpl, const KnobValues& knobs,
                                                                 const ShapeKey& shape) const {
  auto it = templates_.find(tmpl);
  if (it == templates_.end()) return absl::NotFoundError(fmt::format("no model template {}", tmpl));
  absl::StatusOr<TemplateVariant> v = InstantiateKnobs(it->second.t, knobs, shape.head_dim);
  if (!v.ok()) return v.status();
  absl::StatusOr<Manifest> m = ParseManifest(v->manifest_json);
  if (!m.ok()) return m.status();
  if (absl::Status s = CheckVariant(v->source, *m, shape.arch, shape); !s.ok()) return s;
  return v;
}

}  // namespace kforge::agent

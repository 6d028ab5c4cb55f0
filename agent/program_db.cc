#include "agent/program_db.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "agent/normalize.h"
#include "core/hash.h"
#include "core/roofline.h"

namespace kforge::agent {
namespace {

using nlohmann::json;

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

double Unit(uint64_t x) { return static_cast<double>(Mix(x) >> 11) * 0x1.0p-53; }

uint64_t HashOf(const std::string& s) {
  const std::string hex = Sha256Hex(s).substr(0, 16);
  return std::stoull(hex, nullptr, 16);
}

int Int(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int>() : 0;
}

// Pipeline depth: a knob named like one, else a #define of one in the source.
int Stages(const ProgramRecord& p) {
  static const char* kNames[] = {"STAGES", "KV_STAGES", "PIPE", "PIPELINE", "NUM_STAGES"};
  json knobs = json::parse(p.knobs_json.empty() ? "{}" : p.knobs_json, nullptr, false);
  if (knobs.is_object()) {
    for (const char* n : kNames)
      if (knobs.contains(n) && knobs[n].is_number_integer()) return knobs[n].get<int>();
  }
  for (const char* n : kNames) {
    const std::string def = fmt::format("#define KF_{} ", n);
    size_t at = p.source.find(def);
    if (at != std::string::npos) return std::atoi(p.source.c_str() + at + def.size());
  }
  return 0;
}

bool Usable(Outcome o) { return o == Outcome::kVerified || o == Outcome::kCompiled; }

// Faster verified beats slower; verified beats compiled.
bool Better(const ProgramResult& a, const ProgramResult& b) {
  if (a.outcome != b.outcome) return a.outcome == Outcome::kVerified;
  if (a.outcome != Outcome::kVerified) return false;
  return a.median_us > 0 && (b.median_us <= 0 || a.median_us < b.median_us);
}

}  // namespace

ShapeKey ShapeOfBucket(const Bucket& b) {
  ShapeKey s;
  s.op = b.op;
  s.dtype = b.dtype;
  s.head_dim = b.head_dim;
  s.heads = b.heads;
  s.kv_heads = b.kv_heads;
  s.causal = b.causal;
  s.cross = b.cross;
  s.arch = b.arch;
  s.deterministic = b.deterministic;
  s.batch = b.batch;
  s.max_len_q = b.max_q;
  s.total_q = b.batch * b.mean_q;
  s.max_len_k = b.max_k;
  s.total_k = b.batch * b.mean_k;
  return s;
}

std::string FeatureCell(const ProgramRecord& p, const std::string& family) {
  json m = json::parse(p.manifest_json.empty() ? "{}" : p.manifest_json, nullptr, false);
  if (!m.is_object()) m = json::object();
  const std::string grid = m.contains("grid") && m["grid"].is_string() ? m["grid"].get<std::string>() : "per_tile";
  return fmt::format("{}|m{}|n{}|t{}|s{}|{}", family, Int(m, "tile_m"), Int(m, "tile_n"), Int(m, "threads"),
                     Stages(p), grid);
}

ProgramDatabase::ProgramDatabase(ProgramDbOptions options) : options_(options) {}

void ProgramDatabase::Add(const ProgramRecord& p_in, const ProgramResult& r) {
  ProgramRecord p = p_in;
  if (p.normalized_hash.empty() && !p.source.empty()) p.normalized_hash = NormalizedSourceHash(p.source);
  std::lock_guard lock(mu_);
  if (!r.bucket.empty()) {
    // A source noted while its variant had no id yet gets the id now.
    if (!p.normalized_hash.empty()) {
      auto [at, fresh] = sources_[r.bucket].try_emplace(p.normalized_hash, p.variant_id);
      if (!fresh && at->second.empty()) at->second = p.variant_id;
    }
    if (!r.cubin_hash.empty()) cubins_[r.bucket].try_emplace(r.cubin_hash, p.variant_id);
  }
  auto [it, fresh] = programs_.try_emplace(p.variant_id);
  Entry& e = it->second;
  if (fresh) {
    e.program = std::move(p);
    // A lineage keeps its parent's island and family; a root gets its own.
    auto parent = programs_.find(e.program.parent_id);
    if (!e.program.parent_id.empty() && parent != programs_.end() && parent != it) {
      e.island = parent->second.island;
      e.family = parent->second.family;
    } else {
      const std::string root = e.program.origin == "template"
                                   ? e.program.template_name + e.program.knobs_json
                                   : e.program.variant_id;
      e.island = static_cast<int>(HashOf(root) % static_cast<uint64_t>(std::max(1, options_.islands)));
      e.family = !e.program.template_name.empty() && e.program.template_name.rfind("model:", 0) != 0
                     ? e.program.template_name
                     : "model";
    }
  }
  if (r.bucket.empty() || !Usable(r.outcome)) return;
  auto res = e.results.find(r.bucket);
  if (res == e.results.end() || Better(r, res->second)) e.results[r.bucket] = r;
}

void ProgramDatabase::NoteProposed(const std::string& bucket, const std::string& normalized_hash,
                                   const std::string& variant_id) {
  if (bucket.empty() || normalized_hash.empty()) return;
  std::lock_guard lock(mu_);
  sources_[bucket].try_emplace(normalized_hash, variant_id);
}

std::optional<std::string> ProgramDatabase::SameSource(const std::string& bucket,
                                                       const std::string& normalized_hash) const {
  std::lock_guard lock(mu_);
  auto b = sources_.find(bucket);
  if (b == sources_.end()) return std::nullopt;
  auto it = b->second.find(normalized_hash);
  if (it == b->second.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> ProgramDatabase::SameCubin(const std::string& bucket, const std::string& cubin_hash) const {
  std::lock_guard lock(mu_);
  auto b = cubins_.find(bucket);
  if (b == cubins_.end()) return std::nullopt;
  auto it = b->second.find(cubin_hash);
  if (it == b->second.end()) return std::nullopt;
  return it->second;
}

size_t ProgramDatabase::size() const {
  std::lock_guard lock(mu_);
  return programs_.size();
}

std::optional<ProgramView> ProgramDatabase::ViewLocked(const Entry& e, const Bucket& target, bool verified) const {
  std::optional<ProgramView> best;
  for (const auto& [bucket_id, r] : e.results) {
    if ((r.outcome == Outcome::kVerified) != verified) continue;
    absl::StatusOr<Bucket> b = ParseBucketId(bucket_id);
    if (!b.ok()) continue;
    std::optional<int> d = BucketDistance(target, *b);
    if (!d) continue;
    ProgramView v;
    v.program = e.program;
    v.result = r;
    v.distance = *d;
    v.island = e.island;
    v.cell = FeatureCell(e.program, e.family);
    if (verified && r.median_us > 0) {
      const double floor = FloorOf(ShapeOfBucket(*b), b->arch).us;
      v.efficiency = floor > 0 ? floor / r.median_us : 0;
      v.score = v.efficiency * std::pow(options_.transfer_discount, *d);
    }
    if (!best || v.distance < best->distance || (v.distance == best->distance && v.score > best->score))
      best = std::move(v);
  }
  return best;
}

std::vector<ProgramView> ProgramDatabase::ViewsLocked(const Bucket& target, bool verified) const {
  std::vector<ProgramView> out;
  for (const auto& [id, e] : programs_) {
    std::optional<ProgramView> v = ViewLocked(e, target, verified);
    if (v) out.push_back(*std::move(v));
  }
  std::stable_sort(out.begin(), out.end(), [](const ProgramView& a, const ProgramView& b) {
    if (a.score != b.score) return a.score > b.score;
    return a.distance < b.distance;
  });
  return out;
}

std::vector<ProgramView> ProgramDatabase::Ranked(const Bucket& target) const {
  std::lock_guard lock(mu_);
  return ViewsLocked(target, /*verified=*/true);
}

std::optional<ProgramView> ProgramDatabase::View(const std::string& variant_id, const Bucket& target) const {
  std::lock_guard lock(mu_);
  auto it = programs_.find(variant_id);
  if (it == programs_.end()) return std::nullopt;
  if (auto v = ViewLocked(it->second, target, true)) return v;
  return ViewLocked(it->second, target, false);
}

ProgramDatabase::Selection ProgramDatabase::Select(const Bucket& target, uint64_t draw, int inspirations) const {
  std::lock_guard lock(mu_);
  Selection out;
  const int islands = std::max(1, options_.islands);
  out.island = static_cast<int>(draw % static_cast<uint64_t>(islands));
  std::vector<ProgramView> ranked = ViewsLocked(target, /*verified=*/true);
  if (ranked.empty()) {
    // Nothing timed (compile-only jobs): any compiled program, uniformly.
    std::vector<ProgramView> compiled = ViewsLocked(target, /*verified=*/false);
    if (compiled.empty()) {
      out.why = "nothing verified or compiled for this family yet: the seed";
      return out;
    }
    const size_t pick = static_cast<size_t>(Mix(draw) % compiled.size());
    out.parent = compiled[pick];
    out.why = fmt::format("compiled program {} of {} (nothing is timed yet)", pick + 1, compiled.size());
    for (size_t i = 1; i < compiled.size() && static_cast<int>(out.inspirations.size()) < inspirations; ++i)
      out.inspirations.push_back(compiled[(pick + i) % compiled.size()]);
    return out;
  }
  // Elites: the best of each cell, in score order.
  auto elites_of = [](const std::vector<ProgramView>& views) {
    std::vector<ProgramView> elites;
    std::set<std::string> cells;
    for (const ProgramView& v : views)
      if (cells.insert(v.cell).second) elites.push_back(v);
    return elites;
  };
  std::vector<ProgramView> pool;
  for (const ProgramView& v : ranked)
    if (v.island == out.island) pool.push_back(v);
  const bool whole = pool.empty();
  if (whole) pool = ranked;
  std::vector<ProgramView> elites = elites_of(pool);
  const std::string where = whole ? fmt::format("island {} is empty, all islands", out.island)
                                  : fmt::format("island {}", out.island);
  if (elites.size() == 1 || Unit(draw ^ 0x51ed) < options_.exploit) {
    out.parent = elites.front();
    out.why = fmt::format("{}: best elite of {} cell(s)", where, elites.size());
  } else {
    double total = 0;
    for (size_t r = 0; r < elites.size(); ++r) total += 1.0 / static_cast<double>(r + 1);
    double u = Unit(draw ^ 0xd1ce) * total;
    size_t pick = 0;
    for (; pick + 1 < elites.size(); ++pick) {
      u -= 1.0 / static_cast<double>(pick + 1);
      if (u < 0) break;
    }
    out.parent = elites[pick];
    out.why = fmt::format("{}: elite {} of {} (drawn for diversity)", where, pick + 1, elites.size());
  }
  // Inspirations: the best elites of other cells, over every island, then
  // other programs of the parent's cell.
  std::vector<ProgramView> global = elites_of(ranked);
  for (const ProgramView& v : global) {
    if (static_cast<int>(out.inspirations.size()) >= inspirations) break;
    if (v.program.variant_id == out.parent->program.variant_id || v.cell == out.parent->cell) continue;
    out.inspirations.push_back(v);
  }
  for (const ProgramView& v : ranked) {
    if (static_cast<int>(out.inspirations.size()) >= inspirations) break;
    if (v.program.variant_id == out.parent->program.variant_id) continue;
    if (std::any_of(out.inspirations.begin(), out.inspirations.end(),
                    [&](const ProgramView& i) { return i.program.variant_id == v.program.variant_id; }))
      continue;
    out.inspirations.push_back(v);
  }
  return out;
}

}  // namespace kforge::agent

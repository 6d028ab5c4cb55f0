#include "kernels/manifest.h"

#include <algorithm>
#include <cctype>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/arch.h"

namespace kforge {
namespace {

using nlohmann::json;

absl::Status Bad(const std::string& msg) {
  return absl::InvalidArgumentError("manifest: " + msg);
}

// 0 for a name ParseArch does not read.
int ArchNumber(std::string_view arch) {
  const absl::StatusOr<Arch> parsed = ParseArch(arch);
  return parsed.ok() ? parsed->number() : 0;
}

}  // namespace

std::string_view GridPolicyName(GridPolicy g) {
  return g == GridPolicy::kPersistent ? "persistent" : "per_tile";
}

std::string_view TileOrderName(TileOrder o) {
  switch (o) {
    case TileOrder::kGrouped: return "grouped";
    case TileOrder::kBalanced: return "balanced";
    case TileOrder::kKeyLevels: return "levels";
    case TileOrder::kLongestFirst: break;
  }
  return "lpt";
}

bool ArchHasFeature(std::string_view arch, std::string_view feature) {
  const absl::StatusOr<Arch> parsed = ParseArch(arch);
  if (!parsed.ok()) return false;
  const int n = parsed->number();
  const bool arch_specific = parsed->arch_specific;
  if (feature == "wgmma" || feature == "setmaxnreg") return n == 90 && arch_specific;
  if (feature == "tma" || feature == "mbarrier_tx" || feature == "cluster") return n >= 90;
  if (feature == "tcgen05" || feature == "tmem") return n == 100 && arch_specific;
  if (feature == "cp_async" || feature == "mma_sync" || feature == "ldmatrix") return n >= 80;
  return false;
}

int MaxSmemPerBlock(std::string_view arch) {
  const int n = ArchNumber(arch);
  if (n == 80 || n == 87) return 166912;
  if (n == 86 || n == 89) return 101376;
  if (n == 90 || n == 100 || n == 103) return 232448;
  if (n == 120) return 101376;
  return 0;
}

int SmemPerSm(std::string_view arch) {
  const int n = ArchNumber(arch);
  if (n == 80 || n == 87) return 167936;
  if (n == 86 || n == 89 || n == 120) return 102400;
  if (n == 90 || n == 100 || n == 103) return 233472;
  return 0;
}

int EstimateCtasPerSm(const Manifest& m, std::string_view arch) {
  if (m.ctas_per_sm > 0) return m.ctas_per_sm;
  int by_threads = m.threads > 0 ? 2048 / m.threads : 1;
  if (ArchNumber(arch) == 86 || ArchNumber(arch) == 89 || ArchNumber(arch) == 120) {
    by_threads = m.threads > 0 ? 1536 / m.threads : 1;
  }
  int by_smem = 32;
  const int per_sm = SmemPerSm(arch);
  if (m.dynamic_smem_bytes > 0 && per_sm > 0) {
    by_smem = per_sm / (m.dynamic_smem_bytes + 1024);  // 1 KB reserved per CTA
  }
  return std::max(1, std::min({by_threads, by_smem, 32}));
}

absl::StatusOr<Manifest> ParseManifest(std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad("not valid JSON");
  if (!j.is_object()) return Bad("top level must be an object");
  static const std::set<std::string> kKnown = {
      "contract_version", "entry_point", "threads", "dynamic_smem_bytes", "grid",
      "tile_m", "tile_n", "workspace", "archs", "features", "head_dims", "ops",
      "causal", "noncausal", "gqa", "ctas_per_sm", "pack_short", "tile_order", "key_major",
      "split_slot_bytes", "tensor_maps", "zero_dq_accum", "restores_dq_accum",
      "deterministic"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!kKnown.count(it.key())) return Bad(fmt::format("unknown key \"{}\"", it.key()));
  }
  Manifest m;
  auto get_int = [&](const char* key, bool required, int64_t lo, int64_t hi,
                     int64_t& out) -> absl::Status {
    if (!j.contains(key)) {
      return required ? Bad(fmt::format("{}: missing", key)) : absl::OkStatus();
    }
    const json& v = j[key];
    if (!v.is_number_integer()) return Bad(fmt::format("{}: must be an integer", key));
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) return Bad(fmt::format("{}: {} is outside [{}, {}]", key, x, lo, hi));
    out = x;
    return absl::OkStatus();
  };
  auto get_strings = [&](const char* key, bool required,
                         std::vector<std::string>& out) -> absl::Status {
    if (!j.contains(key)) {
      return required ? Bad(fmt::format("{}: missing", key)) : absl::OkStatus();
    }
    if (!j[key].is_array()) return Bad(fmt::format("{}: must be an array of strings", key));
    out.clear();
    for (const json& e : j[key]) {
      if (!e.is_string()) return Bad(fmt::format("{}: must be an array of strings", key));
      out.push_back(e.get<std::string>());
    }
    return absl::OkStatus();
  };
  auto get_bool = [&](const char* key, bool& out) -> absl::Status {
    if (!j.contains(key)) return absl::OkStatus();
    if (!j[key].is_boolean()) return Bad(fmt::format("{}: must be true or false", key));
    out = j[key].get<bool>();
    return absl::OkStatus();
  };

  int64_t v = 0;
  v = 1;
  if (auto s = get_int("contract_version", false, 1, 1, v); !s.ok()) return s;
  m.contract_version = static_cast<int>(v);
  if (!j.contains("entry_point") || !j["entry_point"].is_string()) {
    return Bad("entry_point: missing or not a string");
  }
  m.entry_point = j["entry_point"].get<std::string>();
  if (m.entry_point.empty() ||
      !std::all_of(m.entry_point.begin(), m.entry_point.end(),
                   [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; })) {
    return Bad(fmt::format("entry_point: \"{}\" is not a C identifier", m.entry_point));
  }
  if (auto s = get_int("threads", true, 1, 1 << 20, v); !s.ok()) return s;
  m.threads = static_cast<int>(v);
  v = 0;
  if (auto s = get_int("dynamic_smem_bytes", false, 0, 1 << 24, v); !s.ok()) return s;
  m.dynamic_smem_bytes = static_cast<int>(v);
  if (j.contains("grid")) {
    if (!j["grid"].is_string()) return Bad("grid: must be \"per_tile\" or \"persistent\"");
    const std::string g = j["grid"].get<std::string>();
    if (g == "per_tile") {
      m.grid = GridPolicy::kPerTile;
    } else if (g == "persistent") {
      m.grid = GridPolicy::kPersistent;
    } else {
      return Bad(fmt::format("grid: \"{}\" is not \"per_tile\" or \"persistent\"", g));
    }
  }
  if (auto s = get_int("tile_m", true, 1, 1024, v); !s.ok()) return s;
  m.tile_m = static_cast<int>(v);
  if (auto s = get_int("tile_n", true, 1, 1024, v); !s.ok()) return s;
  m.tile_n = static_cast<int>(v);
  if (j.contains("workspace")) {
    const json& w = j["workspace"];
    if (!w.is_object()) return Bad("workspace: must be an object {fixed_bytes, per_tile_bytes}");
    for (auto it = w.begin(); it != w.end(); ++it) {
      if (it.key() != "fixed_bytes" && it.key() != "per_tile_bytes") {
        return Bad(fmt::format("workspace: unknown key \"{}\"", it.key()));
      }
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0) {
        return Bad(fmt::format("workspace.{}: must be a non-negative integer", it.key()));
      }
    }
    m.workspace_fixed_bytes = w.value("fixed_bytes", int64_t{0});
    m.workspace_per_tile_bytes = w.value("per_tile_bytes", int64_t{0});
  }
  if (auto s = get_strings("archs", true, m.archs); !s.ok()) return s;
  if (m.archs.empty()) return Bad("archs: empty");
  if (auto s = get_strings("features", false, m.features); !s.ok()) return s;
  m.ops = {"fwd"};
  if (auto s = get_strings("ops", false, m.ops); !s.ok()) return s;
  for (const auto& op : m.ops) {
    if (op != "fwd" && op != "bwd") return Bad(fmt::format("ops: \"{}\" is not fwd or bwd", op));
  }
  if (!j.contains("head_dims") || !j["head_dims"].is_array() || j["head_dims"].empty()) {
    return Bad("head_dims: missing or empty");
  }
  for (const json& e : j["head_dims"]) {
    if (!e.is_number_integer() || e.get<int>() <= 0 || e.get<int>() > 256) {
      return Bad("head_dims: must be positive integers <= 256");
    }
    m.head_dims.push_back(e.get<int>());
  }
  if (auto s = get_bool("causal", m.causal); !s.ok()) return s;
  if (auto s = get_bool("noncausal", m.noncausal); !s.ok()) return s;
  if (auto s = get_bool("gqa", m.gqa); !s.ok()) return s;
  if (auto s = get_bool("pack_short", m.pack_short); !s.ok()) return s;
  if (j.contains("tile_order")) {
    const json& o = j["tile_order"];
    if (!o.is_string() || (o != "lpt" && o != "grouped" && o != "balanced" && o != "levels")) {
      return Bad("tile_order: must be \"lpt\", \"grouped\", \"balanced\" or \"levels\"");
    }
    m.tile_order = o == "grouped"    ? TileOrder::kGrouped
                   : o == "balanced" ? TileOrder::kBalanced
                   : o == "levels"   ? TileOrder::kKeyLevels
                                     : TileOrder::kLongestFirst;
  }
  if (auto s = get_bool("key_major", m.key_major); !s.ok()) return s;
  if (m.key_major && (m.grid != GridPolicy::kPersistent || m.ops != std::vector<std::string>{"bwd"})) {
    return Bad("key_major: needs grid \"persistent\" and ops [\"bwd\"]");
  }
  if (m.tile_order == TileOrder::kBalanced && (m.grid != GridPolicy::kPersistent || m.key_major)) {
    return Bad("tile_order: \"balanced\" needs grid \"persistent\" and no key_major");
  }
  if (m.tile_order == TileOrder::kKeyLevels && !m.key_major) {
    return Bad("tile_order: \"levels\" orders key blocks: it needs key_major");
  }
  if (auto s = get_bool("zero_dq_accum", m.zero_dq_accum); !s.ok()) return s;
  if (!m.zero_dq_accum && m.ops != std::vector<std::string>{"bwd"}) {
    return Bad("zero_dq_accum: false needs ops [\"bwd\"] (dq_accum is backward scratch)");
  }
  if (auto s = get_bool("restores_dq_accum", m.restores_dq_accum); !s.ok()) return s;
  if (m.restores_dq_accum && (m.ops != std::vector<std::string>{"bwd"} || !m.zero_dq_accum)) {
    return Bad(
        "restores_dq_accum: true needs ops [\"bwd\"] and zero_dq_accum true (it gives back the "
        "zeros it was given)");
  }
  if (auto s = get_bool("deterministic", m.deterministic); !s.ok()) return s;
  if (m.deterministic && m.ops != std::vector<std::string>{"bwd"}) {
    return Bad("deterministic: true is for ops [\"bwd\"] (every forward variant must be)");
  }
  if (m.pack_short && m.grid != GridPolicy::kPersistent) {
    return Bad("pack_short: needs grid \"persistent\"");
  }
  v = 0;
  if (auto s = get_int("ctas_per_sm", false, 0, 32, v); !s.ok()) return s;
  m.ctas_per_sm = static_cast<int>(v);
  v = 0;
  if (auto s = get_int("split_slot_bytes", false, 0, int64_t{1} << 24, v); !s.ok()) return s;
  m.split_slot_bytes = v;
  if (m.split_slot_bytes > 0 && !m.key_major) {
    return Bad("split_slot_bytes: split key tiles need key_major");
  }
  if (j.contains("tensor_maps")) {
    const json& t = j["tensor_maps"];
    if (!t.is_array()) return Bad("tensor_maps: must be an array of {tensor, box_rows}");
    if (t.size() > size_t(kMaxTensorMaps)) {
      return Bad(fmt::format("tensor_maps: {} maps, at most {}", t.size(), kMaxTensorMaps));
    }
    for (const json& e : t) {
      if (!e.is_object() || !e.contains("tensor") || !e["tensor"].is_string() ||
          !e.contains("box_rows") || !e["box_rows"].is_number_integer() || e.size() != 2) {
        return Bad("tensor_maps: each entry must be {\"tensor\": name, \"box_rows\": n}");
      }
      TensorMapRequest r{e["tensor"].get<std::string>(), 0};
      if (!IsMappableTensor(r.tensor)) {
        return Bad(fmt::format("tensor_maps: \"{}\" is not q, k, v, o, dout, dk or dv", r.tensor));
      }
      const int64_t rows = e["box_rows"].get<int64_t>();
      if (rows < 1 || rows > 256) {
        return Bad(fmt::format("tensor_maps: box_rows {} of \"{}\" is outside [1, 256]", rows,
                               r.tensor));
      }
      r.box_rows = int(rows);
      // dk and dv are the backward's outputs: a forward has none to write
      // (its launch passes null there)
      if (IsBackwardOutputTensor(r.tensor) && m.ops != std::vector<std::string>{"bwd"}) {
        return Bad(fmt::format("tensor_maps: \"{}\" is a backward output; ops must be [\"bwd\"]",
                               r.tensor));
      }
      m.tensor_maps.push_back(std::move(r));
    }
    if (!m.tensor_maps.empty() &&
        std::find(m.features.begin(), m.features.end(), "tma") == m.features.end()) {
      return Bad("tensor_maps: a variant that reads tensor maps must list the feature \"tma\"");
    }
  }
  return m;
}

std::string ManifestToJson(const Manifest& m) {
  json j;
  j["contract_version"] = m.contract_version;
  j["entry_point"] = m.entry_point;
  j["threads"] = m.threads;
  j["dynamic_smem_bytes"] = m.dynamic_smem_bytes;
  j["grid"] = std::string(GridPolicyName(m.grid));
  j["tile_m"] = m.tile_m;
  j["tile_n"] = m.tile_n;
  j["workspace"] = {{"fixed_bytes", m.workspace_fixed_bytes},
                    {"per_tile_bytes", m.workspace_per_tile_bytes}};
  j["archs"] = m.archs;
  j["features"] = m.features;
  j["head_dims"] = m.head_dims;
  j["ops"] = m.ops;
  j["causal"] = m.causal;
  j["noncausal"] = m.noncausal;
  j["gqa"] = m.gqa;
  j["ctas_per_sm"] = m.ctas_per_sm;
  j["pack_short"] = m.pack_short;
  j["tile_order"] = std::string(TileOrderName(m.tile_order));
  if (m.key_major) j["key_major"] = true;
  if (m.split_slot_bytes > 0) j["split_slot_bytes"] = m.split_slot_bytes;
  if (!m.zero_dq_accum) j["zero_dq_accum"] = false;
  if (m.restores_dq_accum) j["restores_dq_accum"] = true;
  if (m.deterministic) j["deterministic"] = true;
  if (!m.tensor_maps.empty()) {
    json t = json::array();
    for (const auto& r : m.tensor_maps) t.push_back({{"tensor", r.tensor}, {"box_rows", r.box_rows}});
    j["tensor_maps"] = std::move(t);
  }
  return j.dump();
}

}  // namespace kforge

#include "bench/search/table.h"

#include <algorithm>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kforge::search {
namespace {

using nlohmann::json;

absl::Status Bad(std::string what) { return absl::InvalidArgumentError(std::move(what)); }

absl::StatusOr<ShapeKey> KeyOfJson(const json& s, Op op, const std::string& arch) {
  if (!s.is_object()) return Bad("a lengths entry is not an object");
  for (const char* field : {"name", "H", "D", "causal", "lq", "lk"}) {
    if (!s.contains(field)) return Bad(fmt::format("lengths entry lacks {}", field));
  }
  try {
    const std::vector<int32_t> lq = s.at("lq").get<std::vector<int32_t>>();
    const std::vector<int32_t> lk = s.at("lk").get<std::vector<int32_t>>();
    if (lq.empty() || lq.size() != lk.size()) {
      return Bad(fmt::format("{}: lq and lk need the same, non-zero, length",
                             s.at("name").get<std::string>()));
    }
    ShapeKey key;
    key.op = op;
    key.head_dim = s.at("D").get<int>();
    key.heads = s.at("H").get<int>();
    key.kv_heads = s.value("KVH", key.heads);
    key.causal = s.at("causal").get<bool>();
    key.arch = arch;
    std::vector<int32_t> cu_q = {0}, cu_k = {0};
    for (int32_t x : lq) cu_q.push_back(cu_q.back() + x);
    for (int32_t x : lk) cu_k.push_back(cu_k.back() + x);
    // kforge-bench-attn's rule: cross exactly when the key lengths differ.
    const bool cross = lq != lk;
    if (absl::Status st = FillLengthStats(cu_q, cross ? std::span<const int32_t>(cu_k)
                                                      : std::span<const int32_t>(),
                                          key);
        !st.ok()) {
      return st;
    }
    return key;
  } catch (const json::exception& e) {
    return Bad(fmt::format("lengths entry: {}", e.what()));
  }
}

}  // namespace

std::string SettingKey(std::string_view template_name, const agent::KnobValues& knobs) {
  json j = json::object();
  for (const auto& [name, value] : knobs) j[name] = value;
  return fmt::format("{} {}", template_name, j.dump());
}

ShapeTable::ShapeTable(std::string name, ShapeKey shape, std::vector<Setting> settings)
    : name_(std::move(name)), shape_(std::move(shape)), settings_(std::move(settings)) {
  for (size_t i = 0; i < settings_.size(); ++i) {
    index_.emplace(SettingKey(settings_[i].template_name, settings_[i].knobs), i);
    const Setting& s = settings_[i];
    if (s.outcome == Outcome::kVerified && s.median_us > 0 &&
        (best_ == nullptr || s.median_us < best_us_)) {
      best_ = &s;
      best_us_ = s.median_us;
    }
  }
}

const Setting* ShapeTable::Find(std::string_view template_name,
                                const agent::KnobValues& knobs) const {
  auto it = index_.find(SettingKey(template_name, knobs));
  return it == index_.end() ? nullptr : &settings_[it->second];
}

int ShapeTable::CountWithin(double fraction) const {
  if (best_ == nullptr) return 0;
  return static_cast<int>(std::count_if(settings_.begin(), settings_.end(), [&](const Setting& s) {
    return s.outcome == Outcome::kVerified && s.median_us <= best_us_ * (1 + fraction);
  }));
}

absl::StatusOr<ShapeKey> ShapeKeyOf(std::string_view lengths_entry_json, Op op,
                                    const std::string& arch) {
  json j = json::parse(lengths_entry_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad("lengths entry is not JSON");
  return KeyOfJson(j, op, arch);
}

absl::StatusOr<std::vector<ShapeTable>> LoadTables(std::string_view sweep_json,
                                                   std::string_view lengths_json,
                                                   const std::vector<std::string>& only) {
  const json sweep = json::parse(sweep_json, nullptr, false);
  if (sweep.is_discarded() || !sweep.is_object() || !sweep.contains("shapes") ||
      !sweep["shapes"].is_array()) {
    return Bad("the sweep is not a kforge-bench-attn --out object with \"shapes\"");
  }
  const json lengths = json::parse(lengths_json, nullptr, false);
  if (lengths.is_discarded() || !lengths.is_array()) return Bad("lengths is not a JSON array");
  const std::string arch = sweep.value("arch", "");
  if (arch.empty()) return Bad("the sweep does not say which arch it ran on (\"arch\")");

  std::vector<ShapeTable> out;
  for (const json& s : sweep["shapes"]) {
    const std::string name = s.value("shape", "");
    if (!only.empty() && std::find(only.begin(), only.end(), name) == only.end()) continue;
    const std::optional<Op> op = ParseOp(s.value("op", "fwd"));
    if (!op) return Bad(fmt::format("{}: unknown op", name));
    auto entry = std::find_if(lengths.begin(), lengths.end(), [&](const json& l) {
      return l.is_object() && l.value("name", "") == name;
    });
    if (entry == lengths.end()) return Bad(fmt::format("{}: not in the lengths file", name));
    absl::StatusOr<ShapeKey> key = KeyOfJson(*entry, *op, arch);
    if (!key.ok()) return key.status();
    if (!s.contains("variants") || !s["variants"].is_array()) {
      return Bad(fmt::format("{}: no variants", name));
    }
    std::vector<Setting> settings;
    std::set<std::string> keys;
    for (const json& v : s["variants"]) {
      Setting st;
      st.template_name = v.value("template", "");
      if (st.template_name.empty() || !v.contains("knobs") || !v["knobs"].is_object()) {
        return Bad(fmt::format("{}: a setting without template or knobs", name));
      }
      for (const auto& [k, x] : v["knobs"].items()) {
        if (!x.is_number_integer()) return Bad(fmt::format("{}: knob {} is not an integer", name, k));
        st.knobs[k] = x.get<int>();
      }
      const std::optional<Outcome> outcome = ParseOutcome(v.value("outcome", ""));
      if (!outcome) {
        return Bad(fmt::format("{}: {} has no known outcome (a sweep from before --variants all?)",
                               name, SettingKey(st.template_name, st.knobs)));
      }
      st.outcome = *outcome;
      if (st.outcome == Outcome::kVerified) {
        st.median_us = v.value("us", 0.0);
        st.q1_us = v.value("us_q1", st.median_us);
        st.q3_us = v.value("us_q3", st.median_us);
        if (!(st.median_us > 0)) {
          return Bad(fmt::format("{}: verified {} without a time", name,
                                 SettingKey(st.template_name, st.knobs)));
        }
      }
      st.message = v.value("error", v.value("hostile_detail", ""));
      if (!keys.insert(SettingKey(st.template_name, st.knobs)).second) {
        return Bad(fmt::format("{}: {} twice", name, SettingKey(st.template_name, st.knobs)));
      }
      settings.push_back(std::move(st));
    }
    // A run stopped by its cap leaves a shape's table short: its best would
    // not be the space's best, and every figure against it would be wrong.
    if (s.contains("space") && s["space"].is_object() && s["space"].contains("kept") &&
        s["space"]["kept"].get<size_t>() != settings.size()) {
      return Bad(fmt::format("{}: {} of the space's {} settings (a run cut short): not exhaustive; "
                             "leave it out with --only",
                             name, settings.size(), s["space"]["kept"].get<size_t>()));
    }
    out.emplace_back(name, *std::move(key), std::move(settings));
  }
  return out;
}

}  // namespace kforge::search

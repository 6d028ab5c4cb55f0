#include "core/lengths.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kforge {
namespace {

using nlohmann::json;

absl::StatusOr<int64_t> IntField(const json& j, const char* name, std::optional<int64_t> fallback) {
  auto it = j.find(name);
  if (it == j.end()) {
    if (fallback) return *fallback;
    return absl::InvalidArgumentError(fmt::format("\"{}\" is missing", name));
  }
  if (!it->is_number_integer())
    return absl::InvalidArgumentError(fmt::format("\"{}\" must be an integer", name));
  return it->get<int64_t>();
}

absl::Status Bad(const std::string& why) { return absl::InvalidArgumentError(why); }

}  // namespace

absl::StatusOr<LengthDistribution> LengthDistributionFromJson(const json& j) {
  if (!j.is_object()) return Bad("a length distribution must be an object");
  LengthDistribution d;
  const auto dist = j.find("dist");
  if (dist == j.end() || !dist->is_string())
    return Bad("\"dist\" must be \"fixed\", \"uniform\" or \"pareto\"");
  const std::string name = dist->get<std::string>();
  if (name == "fixed") d.kind = LengthDistribution::Kind::kFixed;
  else if (name == "uniform") d.kind = LengthDistribution::Kind::kUniform;
  else if (name == "pareto") d.kind = LengthDistribution::Kind::kPareto;
  else return Bad(fmt::format("unknown length distribution '{}'", name));

  absl::StatusOr<int64_t> hi = IntField(j, "hi", std::nullopt);
  if (!hi.ok()) return hi.status();
  absl::StatusOr<int64_t> lo = IntField(j, "lo", 1);
  if (!lo.ok()) return lo.status();
  d.hi = *hi;
  d.lo = *lo;
  if (d.hi < 0) return Bad("\"hi\" must not be negative");
  if (d.kind == LengthDistribution::Kind::kFixed) return d;
  if (d.lo < 0) return Bad("\"lo\" must not be negative");
  if (d.lo > d.hi) return Bad(fmt::format("\"lo\" {} is above \"hi\" {}", d.lo, d.hi));
  if (d.kind == LengthDistribution::Kind::kPareto) {
    if (d.lo < 1) return Bad("a pareto \"lo\" must be at least 1");
    const auto alpha = j.find("alpha");
    if (alpha == j.end() || !alpha->is_number())
      return Bad("a pareto distribution needs a number \"alpha\"");
    d.alpha = alpha->get<double>();
    if (!(d.alpha > 0) || !std::isfinite(d.alpha)) return Bad("\"alpha\" must be positive");
  }
  return d;
}

uint64_t LengthRng::Next() {
  state_ += 0x9e3779b97f4a7c15ULL;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::vector<int64_t> DrawLengths(const LengthDistribution& d, int64_t batch, LengthRng& rng) {
  std::vector<int64_t> out;
  out.reserve(size_t(std::max<int64_t>(0, batch)));
  for (int64_t b = 0; b < batch; ++b) {
    switch (d.kind) {
      case LengthDistribution::Kind::kFixed:
        out.push_back(d.hi);
        break;
      case LengthDistribution::Kind::kUniform:
        out.push_back(d.lo + int64_t(rng.Next() % uint64_t(d.hi - d.lo + 1)));
        break;
      case LengthDistribution::Kind::kPareto: {
        // Inverse CDF of a Pareto(lo, alpha); u is never 0, so the power is
        // finite, and the clamp keeps the tail below hi before the cast.
        const double u = double((rng.Next() >> 11) + 1) * 0x1p-53;
        const double v = double(d.lo) * std::pow(u, -1.0 / d.alpha);
        out.push_back(int64_t(std::clamp(v, double(d.lo), double(d.hi))));
        break;
      }
    }
  }
  return out;
}

absl::StatusOr<DrawnLengths> DrawShapeLengths(const json& shape, uint64_t seed) {
  if (!shape.is_object()) return Bad("a shape must be an object");
  absl::StatusOr<int64_t> batch = IntField(shape, shape.contains("B") ? "B" : "batch", std::nullopt);
  if (!batch.ok()) return batch.status();
  if (*batch < 0) return Bad("the batch must not be negative");
  if (!shape.contains("q")) return Bad("\"q\" is missing");
  absl::StatusOr<LengthDistribution> q = LengthDistributionFromJson(shape["q"]);
  if (!q.ok()) return Bad(fmt::format("q: {}", std::string(q.status().message())));
  std::optional<LengthDistribution> kv;
  const auto kv_entry = shape.find("kv");
  if (kv_entry != shape.end() && !(kv_entry->is_string() && kv_entry->get<std::string>() == "same")) {
    absl::StatusOr<LengthDistribution> k = LengthDistributionFromJson(*kv_entry);
    if (!k.ok()) return Bad(fmt::format("kv: {}", std::string(k.status().message())));
    kv = *k;
  }
  LengthRng rng(seed);
  DrawnLengths out;
  out.q = DrawLengths(*q, *batch, rng);
  if (kv) {
    out.cross = true;
    out.k = DrawLengths(*kv, *batch, rng);
  }
  return out;
}

}  // namespace kforge

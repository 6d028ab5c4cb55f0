// Test tool: the lengths core/lengths.h draws for every entry of a shapes
// file, as one JSON array on stdout: {"lq": [...], "lk": [...] or null} per
// entry, or {"error": "..."} for an entry the rule refuses.
//
//   kforge_draw_lengths SHAPES.json SEED
#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/lengths.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: kforge_draw_lengths SHAPES.json SEED\n");
    return 2;
  }
  std::ifstream in(argv[1]);
  const nlohmann::json shapes = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!shapes.is_array()) {
    std::fprintf(stderr, "%s: not a JSON array\n", argv[1]);
    return 2;
  }
  const uint64_t seed = std::stoull(argv[2]);
  nlohmann::json out = nlohmann::json::array();
  for (const nlohmann::json& shape : shapes) {
    absl::StatusOr<kforge::DrawnLengths> d = kforge::DrawShapeLengths(shape, seed);
    if (!d.ok()) {
      out.push_back({{"error", std::string(d.status().message())}});
      continue;
    }
    out.push_back({{"lq", d->q}, {"lk", d->cross ? nlohmann::json(d->k) : nlohmann::json(nullptr)}});
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

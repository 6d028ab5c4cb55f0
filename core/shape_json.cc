#include "core/shape_json.h"

#include <fmt/format.h>

namespace kforge {

using nlohmann::json;

json ShapeKeyToJson(const ShapeKey& k) {
  json j{{"op", std::string(OpName(k.op))},
              {"dtype", std::string(DTypeName(k.dtype))},
              {"head_dim", k.head_dim},
              {"heads", k.heads},
              {"kv_heads", k.kv_heads},
              {"causal", k.causal},
              {"cross", k.cross},
              {"arch", k.arch},
              {"batch", k.batch},
              {"max_len_q", k.max_len_q},
              {"total_q", k.total_q},
              {"max_len_k", k.max_len_k},
              {"total_k", k.total_k}};
  // Only when set, so that every shape stored before the field existed (and
  // every other shape) keeps its encoding.
  if (k.deterministic) j["deterministic"] = true;
  return j;
}

absl::StatusOr<ShapeKey> ShapeKeyFromJson(const json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("shape: not a JSON object");
  ShapeKey k;
  const char* field = "op";
  try {
    auto op = ParseOp(j.at(field).get<std::string>());
    if (!op) return absl::InvalidArgumentError("shape.op: unknown");
    k.op = *op;
    field = "dtype";
    auto dtype = ParseDType(j.at(field).get<std::string>());
    if (!dtype) return absl::InvalidArgumentError("shape.dtype: unknown");
    k.dtype = *dtype;
    auto get = [&](const char* name, auto& out) {
      field = name;
      out = j.at(name).get<std::remove_reference_t<decltype(out)>>();
    };
    get("head_dim", k.head_dim);
    get("heads", k.heads);
    get("kv_heads", k.kv_heads);
    get("causal", k.causal);
    get("cross", k.cross);
    get("arch", k.arch);
    get("batch", k.batch);
    get("max_len_q", k.max_len_q);
    get("total_q", k.total_q);
    get("max_len_k", k.max_len_k);
    get("total_k", k.total_k);
    if (j.contains("deterministic")) get("deterministic", k.deterministic);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("shape.{}: {}", field, e.what()));
  }
  return k;
}

}  // namespace kforge

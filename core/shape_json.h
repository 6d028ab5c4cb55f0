// ShapeKey <-> JSON, the one encoding used wherever a shape is stored or
// passed as text (job specs and tasks in the store, the worker's child
// requests). Field names are the ShapeKey member names; op and dtype use
// OpName/DTypeName. Decoding checks types, not values: callers that take a
// shape from outside still run ValidateShapeKey.
#pragma once

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "core/shape.h"

namespace kforge {

nlohmann::json ShapeKeyToJson(const ShapeKey& key);
// INVALID_ARGUMENT naming the field when one is missing or of the wrong type.
absl::StatusOr<ShapeKey> ShapeKeyFromJson(const nlohmann::json& j);

}  // namespace kforge

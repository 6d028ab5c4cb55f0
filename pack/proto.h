// Pack entries from kforge.v1 messages: the client side of GetKernel and
// ExportKernels (the CLI's export and the runtime's server source).
//
// Thread-safe: pure functions.
#pragma once

#include <string>

#include "core/shape.h"
#include "kforge/v1/kforge.pb.h"
#include "pack/pack.h"

namespace kforge::pack {

// `bucket` is the bucket the entry is kept under, `extent` the sizes it may
// be run for. The kernel's own bucket is its served_bucket.
Entry EntryFromKernel(const v1::Kernel& kernel, const std::string& bucket,
                      const SizeExtent& extent);

SizeExtent ExtentFromProto(const v1::ExportedKernel::Extent& e);

// The request for `key` (summary statistics: the server derives the same
// bucket from them as from offsets).
v1::Shape ShapeToProto(const ShapeKey& key);

}  // namespace kforge::pack

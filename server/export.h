// ExportKernels: every bucket's best kernel as GetKernel serves it, with the
// sizes it is served for, for kernel packs (`kforge export`, runtime/).
//
// The source is the KernelCache, not the store: an export holds exactly what
// the server serves at that moment (a best whose cubin cannot be read is
// left out of the cache, and so out of the export).
//
// Thread-safe: reads a snapshot of the cache.
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "core/shape.h"
#include "kforge/v1/kforge.pb.h"
#include "server/kernel_cache.h"

namespace kforge::server {

// Writes one ExportedKernel per best matching `req` (arch and op filters), in
// bucket-id order; stops early (CANCELLED) when `write` returns false.
// INVALID_ARGUMENT for a malformed arch or op.
absl::Status ExportKernels(const KernelCache& cache, const v1::ExportKernelsRequest& req,
                           const std::function<bool(const v1::ExportedKernel&)>& write);

}  // namespace kforge::server

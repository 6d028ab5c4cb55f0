// Scratch memory for launches, one growing block per stream.
//
// A launch needs scratch the host prepares (the tile counter, workspace and
// backward's delta and dq_accum, zeroed; the tile list and offsets,
// uploaded). Launches on one stream run in order, so they can all use the
// same block: the stream orders each launch's memset after the previous
// kernel. A block too small is replaced by a larger one; the old block is
// freed once an event says the stream is done with it (queried, never
// waited for), so no call blocks on the device. Growing allocates device
// memory, which the driver may serialise with other work: blocks grow
// geometrically, so that happens a few times per stream.
//
// A stream handle seen again after its stream was destroyed (and the handle
// reused) is still safe: every use first makes the stream wait for the
// block's last use.
//
// Each block also remembers one byte range that its last use left zero (a
// backward variant that restores dq_accum's zeros: manifest
// restores_dq_accum), so that the next use need not zero it again. A new
// block, or a use that fails, knows nothing zero.
//
// Thread-safe; calls on one stream are serialised while they enqueue.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "gpu/gpu.h"

namespace kforge::runtime {

class ScratchArenas {
 public:
  // `driver` must outlive this; the device's context must be current on
  // every calling thread.
  explicit ScratchArenas(const gpu::Driver* driver) : driver_(driver) {}

  // Bytes [begin, end) of a block, by offset, that hold zeros once the work
  // enqueued so far on its stream is done.
  struct ZeroRange {
    size_t begin = 0, end = 0;
    bool Covers(size_t b, size_t e) const { return b >= e || (begin <= b && e <= end); }
  };

  // Calls `enqueue(address, zeroed)` with `bytes` of device memory that only
  // the work `enqueue` puts on `stream` uses. `zeroed` says what the block's
  // last use left zero; `enqueue` sets what its own work leaves zero (it is
  // forgotten when `enqueue` fails).
  absl::Status Use(const gpu::Stream& stream, size_t bytes,
                   const std::function<absl::Status(uint64_t address, ZeroRange& zeroed)>& enqueue);

 private:
  struct Arena {
    std::mutex mu;
    gpu::DeviceBuffer block;                // guarded by mu
    std::optional<gpu::Event> last_use;     // guarded by mu
    ZeroRange zeroed;                       // guarded by mu
    struct Retired {
      gpu::DeviceBuffer block;
      gpu::Event done;
    };
    std::vector<Retired> retired;           // guarded by mu
  };

  const gpu::Driver* driver_;
  std::mutex mu_;
  std::map<void*, std::unique_ptr<Arena>> arenas_;  // by stream handle; guarded by mu_
};

}  // namespace kforge::runtime

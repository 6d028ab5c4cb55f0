#include "runtime/scratch.h"

#include <algorithm>

namespace kforge::runtime {
namespace {

constexpr size_t kGranule = size_t{1} << 20;

}  // namespace

absl::Status ScratchArenas::Use(
    const gpu::Stream& stream, size_t bytes,
    const std::function<absl::Status(uint64_t, ZeroRange&)>& enqueue) {
  Arena* arena;
  {
    std::lock_guard lock(mu_);
    auto& a = arenas_[stream.handle()];
    if (!a) a = std::make_unique<Arena>();
    arena = a.get();
  }
  std::lock_guard lock(arena->mu);
  std::erase_if(arena->retired, [](const Arena::Retired& r) {
    auto done = r.done.Query();
    return done.ok() && *done;
  });
  if (arena->last_use) {
    if (absl::Status s = stream.WaitEvent(*arena->last_use); !s.ok()) return s;
  }
  if (arena->block.size() < bytes) {
    const size_t old_size = arena->block.size();
    if (old_size > 0) {
      absl::StatusOr<gpu::Event> done = gpu::Event::Create(*driver_, /*timing=*/false);
      if (!done.ok()) return done.status();
      if (absl::Status s = done->Record(stream); !s.ok()) return s;
      arena->retired.push_back({std::move(arena->block), *std::move(done)});
    }
    // Geometric growth: a stream whose batches grow slowly reallocates a few times.
    const size_t want = std::max(bytes, 2 * old_size);
    const size_t size = (std::max(want, kGranule) + kGranule - 1) / kGranule * kGranule;
    absl::StatusOr<gpu::DeviceBuffer> block = gpu::DeviceBuffer::Allocate(*driver_, size);
    if (!block.ok()) return block.status();
    arena->block = *std::move(block);
    arena->zeroed = {};  // fresh memory holds anything
  }
  absl::Status s = enqueue(arena->block.address(), arena->zeroed);
  if (!s.ok()) arena->zeroed = {};
  if (!arena->last_use) {
    absl::StatusOr<gpu::Event> e = gpu::Event::Create(*driver_, /*timing=*/false);
    if (!e.ok()) return e.status();
    arena->last_use = *std::move(e);
  }
  if (absl::Status r = arena->last_use->Record(stream); !r.ok() && s.ok()) s = r;
  return s;
}

}  // namespace kforge::runtime

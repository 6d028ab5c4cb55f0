#include "kernels/templates/sm90/parts.h"

namespace kforge::embedded {
extern const char sm90_ptx_cuh[];
extern const char sm90_wgmma_ops_cuh[];
extern const char sm90_layout_h[];
extern const char sm90_tile_scheduler_cuh[];
extern const char sm90_softmax_cuh[];
extern const char sm90_fwd_ring_cuh[];
extern const char sm90_fwd_producer_cuh[];
extern const char sm90_fwd_consumer_cuh[];
extern const char sm90_fwd_epilogue_cuh[];
extern const char sm90_packed_rows_cuh[];
extern const char sm90_bwd_tiles_cuh[];
extern const char sm90_bwd_dq_cuh[];
extern const char sm90_tma_cuh[];
extern const char fwd_sm90_cuh[];
extern const char bwd_sm90_layout_h[];
extern const char bwd_sm90_cuh[];
}  // namespace kforge::embedded

namespace kforge::templates::sm90 {

const std::vector<Part>& FwdSm90Parts() {
  // Order: each part uses only what comes before it.
  static const std::vector<Part>* parts = new std::vector<Part>{
      {"sm90/ptx.cuh", embedded::sm90_ptx_cuh},
      {"sm90/wgmma_ops.cuh", embedded::sm90_wgmma_ops_cuh},
      {"sm90/layout.h", embedded::sm90_layout_h},
      {"sm90/tile_scheduler.cuh", embedded::sm90_tile_scheduler_cuh},
      {"sm90/packed_rows.cuh", embedded::sm90_packed_rows_cuh},
      {"sm90/softmax.cuh", embedded::sm90_softmax_cuh},
      {"sm90/fwd_ring.cuh", embedded::sm90_fwd_ring_cuh},
      {"sm90/fwd_producer.cuh", embedded::sm90_fwd_producer_cuh},
      {"sm90/fwd_consumer.cuh", embedded::sm90_fwd_consumer_cuh},
      {"sm90/fwd_epilogue.cuh", embedded::sm90_fwd_epilogue_cuh},
      {"fwd_sm90.cuh", embedded::fwd_sm90_cuh},
  };
  return *parts;
}

const std::vector<Part>& BwdSm90Parts() {
  static const std::vector<Part>* parts = new std::vector<Part>{
      {"sm90/ptx.cuh", embedded::sm90_ptx_cuh},
      {"sm90/wgmma_ops.cuh", embedded::sm90_wgmma_ops_cuh},
      {"sm90/packed_rows.cuh", embedded::sm90_packed_rows_cuh},
      {"sm90/bwd_tiles.cuh", embedded::sm90_bwd_tiles_cuh},
      {"sm90/bwd_dq.cuh", embedded::sm90_bwd_dq_cuh},
      {"sm90/tma.cuh", embedded::sm90_tma_cuh},
      {"bwd_sm90_layout.h", embedded::bwd_sm90_layout_h},
      {"bwd_sm90.cuh", embedded::bwd_sm90_cuh},
  };
  return *parts;
}

std::string Assemble(const std::vector<Part>& parts) {
  std::string out;
  for (const Part& p : parts) out += p.text;
  return out;
}

}  // namespace kforge::templates::sm90

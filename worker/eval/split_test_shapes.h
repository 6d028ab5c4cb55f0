// The heavy-tailed backward batches that bwd_sm90's split key tiles (SPLIT=1)
// are verified on: the GPU test (eval_gpu_test.cc, EvalGpu.BwdSm90Verifies)
// evaluates them, and a host test (batches_test.cc) proves that their check
// and timing problems really plan split tiles, so that the GPU test does not
// pass by never taking the split path.
#pragma once
#include <cstdint>
#include <string>

#include "core/shape.h"

namespace kforge::eval::split_cases {

// 600 sequences of 6 queries on average (cross: 5 keys) with a tail up to
// 1500 (cross: 1200 keys): a few long sequences' key tiles against many
// packed runs, powerlaw_short's class.
inline ShapeKey HeavyTailedBwdShape(int d, int h, int kvh, bool causal, bool cross,
                                    const std::string& arch) {
  ShapeKey k;
  k.op = Op::kBackward;
  k.head_dim = d;
  k.heads = h;
  k.kv_heads = kvh;
  k.causal = causal;
  k.cross = cross;
  k.arch = arch;
  k.batch = 600;
  k.max_len_q = 1500;
  k.total_q = 600 * 6;
  k.max_len_k = cross ? 1200 : 1500;
  k.total_k = cross ? 600 * 5 : 600 * 6;
  return k;
}

// One SPLIT=1 case of the GPU test: the shape's head layout and mask, and
// bwd_sm90's BLOCK_M.
struct SplitCase {
  int d, h, kvh;
  bool causal, cross;
  int bm;
};
// Splits inside one head's steps (no GQA), at a head boundary (GQA 2:1),
// causal cross attention at head dim 64.
inline constexpr SplitCase kSplitCases[] = {
    {128, 4, 4, false, false, 64}, {128, 4, 2, true, false, 64}, {64, 4, 4, true, true, 128}};
// The evaluation seed of a case (any fixed value; the host test uses the same).
inline uint64_t SplitCaseSeed(const SplitCase& c) {
  return 1900 + c.d + c.bm + 3 * c.h + 5 * c.kvh + 7 * c.causal + 11 * c.cross;
}

}  // namespace kforge::eval::split_cases

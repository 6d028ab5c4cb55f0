#include "pack/proto.h"

namespace kforge::pack {

Entry EntryFromKernel(const v1::Kernel& k, const std::string& bucket, const SizeExtent& extent) {
  Entry e;
  e.bucket = bucket;
  e.kernel_bucket = k.served_bucket();
  e.arch = k.arch();
  e.variant_id = k.variant_id();
  e.tuned = k.tuned();
  e.source = k.source();
  e.cubin = k.cubin();
  e.manifest_json = k.manifest().json();
  e.compile_options = k.compile_options();
  e.extent = extent;
  e.timing = {k.timing().median_us(), k.timing().min_us(), k.timing().max_us(),
              k.timing().p25_us(),    k.timing().p75_us(), k.timing().samples()};
  const v1::Provenance& p = k.provenance();
  e.provenance = {p.origin(),      p.template_name(),     p.knobs_json(), p.model(),
                  p.prompt_hash(), p.parent_variant_id(), p.job_id()};
  e.gpu_name = k.gpu_name();
  e.nvrtc_version = k.nvrtc_version();
  e.driver_version = k.driver_version();
  return e;
}

SizeExtent ExtentFromProto(const v1::ExportedKernel::Extent& x) {
  return SizeExtent{x.batch(), x.max_len_q(), x.max_len_k(), x.total_q(), x.total_k()};
}

v1::Shape ShapeToProto(const ShapeKey& k) {
  v1::Shape s;
  s.set_op(k.op == Op::kForward ? v1::OP_FORWARD : v1::OP_BACKWARD);
  s.set_dtype(v1::DTYPE_BF16);
  s.set_head_dim(k.head_dim);
  s.set_heads(k.heads);
  s.set_kv_heads(k.kv_heads);
  s.set_causal(k.causal);
  s.set_cross(k.cross);
  s.set_arch(k.arch);
  s.set_deterministic(k.deterministic);
  s.set_batch(k.batch);
  s.set_max_len_q(k.max_len_q);
  s.set_total_q(k.total_q);
  if (k.cross) {
    s.set_max_len_k(k.max_len_k);
    s.set_total_k(k.total_k);
  }
  return s;
}

}  // namespace kforge::pack

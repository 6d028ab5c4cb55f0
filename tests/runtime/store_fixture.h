// A verified best put straight into a store, as if a worker had reported it:
// the server then serves it (GetKernel, ExportKernels) with no GPU anywhere.
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "core/hash.h"
#include "core/shape.h"
#include "core/shape_json.h"
#include "storage/store.h"

namespace kforge::testing {

struct StoredBest {
  std::string variant_id;
  std::string bucket;
};

// Stores `source` (with `manifest_json` and `cubin` compiled for key.arch)
// as the verified best of key's bucket, at `median_us`.
inline StoredBest PutBest(Store& store, const ShapeKey& key, const std::string& source,
                          const std::string& manifest_json, const std::string& cubin,
                          double median_us = 812.5) {
  JobRecord job;
  job.name = "runtime-test";
  job.state = JobState::kSucceeded;  // the server's engine leaves it alone
  job.proposer = "builtin";
  job.spec_json = "{}";
  auto job_id = store.CreateJob(job);
  EXPECT_TRUE(job_id.ok()) << job_id.status();
  VariantRecord v;
  v.source = source;
  v.manifest_json = manifest_json;
  v.origin = "template";
  v.template_name = "fwd_mma";
  v.knobs_json = R"({"BLOCK_M":64})";
  v.job_id = *job_id;
  auto variant_id = store.PutVariant(v);
  EXPECT_TRUE(variant_id.ok()) << variant_id.status();
  const std::string bucket = BucketOf(key).Id();
  TaskRecord t;
  t.job_id = *job_id;
  t.kind = TaskKind::kEvaluate;
  t.variant_id = *variant_id;
  t.bucket = bucket;
  t.arch = key.arch;
  t.shape_json = ShapeKeyToJson(key).dump();
  t.seed = 1;
  auto tasks = store.EnqueueTasks({t});
  EXPECT_TRUE(tasks.ok()) << tasks.status();
  WorkerRecord w;
  w.name = "runtime-test-worker";
  w.arch = key.arch;
  auto worker = store.UpsertWorker(w);
  EXPECT_TRUE(worker.ok()) << worker.status();
  auto leased = store.LeaseTask(*worker, key.arch, false, 1, 600000, PromotionLease::kAny);
  EXPECT_TRUE(leased.ok() && leased->has_value());
  EvaluationRecord e;
  e.outcome = Outcome::kVerified;
  e.gpu_name = "NVIDIA H200";
  e.nvrtc_version = "13.0";
  e.compile_options = "-arch=" + key.arch;
  e.timing.median_us = median_us;
  e.timing.min_us = median_us - 10;
  e.timing.max_us = median_us + 10;
  e.timing.p25_us = median_us - 2;
  e.timing.p75_us = median_us + 2;
  e.timing.samples = 20;
  // The best is served for its whole bucket, as a promotion would record.
  BestRecord best;
  best.verified = BucketExtent(BucketOf(key));
  e.verified = best.verified;
  TaskCompletion completion{.eval = e, .cubin = cubin, .new_best = best, .follow_ups = {}};
  auto done = store.CompleteTask(tasks->front(), *worker, 2, std::move(completion));
  EXPECT_TRUE(done.ok()) << done.status();
  return {*variant_id, bucket};
}

}  // namespace kforge::testing

// ProgramDatabase: the kernels a server has verified, with their timings and
// resource use, from which the model loop picks what to build on next.
//
// Evolutionary kernel search (FunSearch, AlphaEvolve) keeps a population
// rather than one incumbent: building every prompt on the global best is
// hill climbing and gets stuck. Here:
//   - Every verified result is kept per bucket, and a bucket also sees the
//     results of *similar* buckets (same op, dtype, head layout, mask, arch;
//     other length statistics: core/shape.h BucketDistance), discounted by
//     their distance, so a new bucket starts from what worked nearby.
//   - Programs are scored by roofline efficiency (core/roofline.h floor /
//     median), which is comparable across buckets, unlike microseconds.
//   - MAP-Elites: each program falls into a feature cell (its family: the
//     seed template it descends from; tile_m, tile_n, threads, pipeline
//     stages, grid policy), and only the best of each cell is an elite, so a
//     slower but different design survives next to the fastest one.
//   - Islands: a program belongs to the island of its lineage's root (a
//     hash), and each selection draws from one island, round-robin by the
//     draw, so lineages evolve apart and do not all collapse onto one.
//   - A parent is the island's best elite (exploitation) or, with
//     probability 1 - exploit, an elite drawn with weight 1/(rank+1)
//     (diversity); inspirations are other elites, of other cells first.
// Compile-only jobs verify nothing: compiled programs are kept too and used,
// uniformly, only where nothing verified exists for the family.
//
// The database also answers dedupe questions: has a source with the same
// normalized text (agent/normalize.h), or a variant with the same cubin,
// been proposed or evaluated on a bucket already?
//
// Shared by every proposer of a server (server/components.cc fills it from
// the store at start). Thread-safe: every method may be called from any
// thread. Selection is a pure function of the contents and the draw.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/outcome.h"
#include "core/shape.h"

namespace kforge::agent {

struct ProgramRecord {
  std::string variant_id;
  std::string source;
  std::string manifest_json;
  std::string origin;         // "template" | "model"
  std::string template_name;
  std::string knobs_json;
  std::string model;
  std::string parent_id;
  std::string kind;
  std::string normalized_hash;  // computed when empty
};

// One evaluation of a program on one bucket.
struct ProgramResult {
  std::string bucket;         // Bucket::Id()
  Outcome outcome = Outcome::kCompiled;  // only kVerified and kCompiled are kept for selection
  double median_us = 0;
  double spread_us = 0;
  int32_t registers = 0;
  int32_t spill_bytes = 0;
  int32_t static_smem_bytes = 0;
  int32_t dynamic_smem_bytes = 0;
  std::string cubin_hash;
};

// A program as seen from a target bucket.
struct ProgramView {
  ProgramRecord program;
  ProgramResult result;       // its best result on `result.bucket`
  int distance = 0;           // from the target (0: measured on the target itself)
  double efficiency = 0;      // floor / median on result.bucket; 0 when untimed
  double score = 0;           // efficiency * transfer_discount^distance
  std::string cell;           // its MAP-Elites cell
  int island = 0;
};

struct ProgramDbOptions {
  int islands = 4;
  double exploit = 0.5;            // probability of taking the island's best elite
  double transfer_discount = 0.85;  // per unit of bucket distance
};

class ProgramDatabase {
 public:
  explicit ProgramDatabase(ProgramDbOptions options = {});

  // Records `p` (once; later calls only add results) and, when `r` is
  // verified or compiled, its result. Any outcome makes the source known on
  // r.bucket for dedupe.
  void Add(const ProgramRecord& p, const ProgramResult& r);
  // A source proposed for `bucket` and not evaluated yet: known for dedupe.
  // `variant_id` may be "" (not stored yet): Add() fills it in later.
  void NoteProposed(const std::string& bucket, const std::string& normalized_hash, const std::string& variant_id);

  // The variant of `bucket` whose source normalizes the same ("" when it was
  // noted before it had an id), or whose evaluation produced the same cubin;
  // nullopt when none.
  std::optional<std::string> SameSource(const std::string& bucket, const std::string& normalized_hash) const;
  std::optional<std::string> SameCubin(const std::string& bucket, const std::string& cubin_hash) const;

  struct Selection {
    std::optional<ProgramView> parent;  // none: start from the seed
    std::vector<ProgramView> inspirations;
    int island = 0;
    std::string why;  // "island 2: best elite", "island 0: elite 3 of 5 (diversity)", ...
  };
  // `draw`: the caller's random number (e.g. a seeded hash of its request
  // count), so that a selection can be reproduced.
  Selection Select(const Bucket& target, uint64_t draw, int inspirations) const;

  // Verified programs usable for `target`, best score first.
  std::vector<ProgramView> Ranked(const Bucket& target) const;
  // `variant_id` as seen from `target` (its nearest result); nullopt when
  // unknown or without a result usable for `target`.
  std::optional<ProgramView> View(const std::string& variant_id, const Bucket& target) const;

  size_t size() const;

 private:
  struct Entry {
    ProgramRecord program;
    std::map<std::string, ProgramResult> results;  // by bucket: the fastest verified, else compiled
    int island = 0;
    std::string family;
  };
  std::vector<ProgramView> ViewsLocked(const Bucket& target, bool verified) const;
  std::optional<ProgramView> ViewLocked(const Entry& e, const Bucket& target, bool verified) const;

  const ProgramDbOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> programs_;  // by variant id; guarded by mu_
  // bucket -> normalized hash / cubin hash -> variant id; guarded by mu_
  std::map<std::string, std::map<std::string, std::string>> sources_;
  std::map<std::string, std::map<std::string, std::string>> cubins_;
};

// The MAP-Elites cell of a program (exposed for tests): family, tile sizes,
// threads, pipeline stages and grid policy, e.g.
// "fwd_mma|m128|n64|t256|s2|persistent".
std::string FeatureCell(const ProgramRecord& p, const std::string& family);

// A representative shape of a bucket (its rounded-up statistics).
ShapeKey ShapeOfBucket(const Bucket& b);

}  // namespace kforge::agent

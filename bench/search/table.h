// An exhaustive table: what every setting of the builtin proposer's space
// measured on one shape (`kforge-bench-attn --variants all`, bench/search/
// sweep.sh), read back as the oracle a replayed search asks instead of a GPU.
//
// Input: the bench's --out JSON (shapes[].variants[] with template, knobs,
// outcome, us, us_q1, us_q3) and the lengths file it ran on (lengths.py's
// output), from which each shape's ShapeKey is rebuilt exactly as the bench
// built it, so the proposer sees the shape the table was measured on.
//
// Thread-safe: immutable once loaded.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/template_source.h"
#include "core/outcome.h"
#include "core/shape.h"

namespace kforge::search {

struct Setting {
  std::string template_name;
  agent::KnobValues knobs;
  Outcome outcome = Outcome::kCompileError;
  double median_us = 0;  // verified settings only; 0 otherwise
  double q1_us = 0, q3_us = 0;
  std::string message;   // why it failed, when it did
};

// "fwd_mma {"BLOCK_M":64,...}": the template and its knobs as canonical JSON
// (keys sorted, no spaces), the one key the tables and replays agree on.
std::string SettingKey(std::string_view template_name, const agent::KnobValues& knobs);

class ShapeTable {
 public:
  ShapeTable(std::string name, ShapeKey shape, std::vector<Setting> settings);

  const std::string& name() const { return name_; }
  const ShapeKey& shape() const { return shape_; }
  const std::vector<Setting>& settings() const { return settings_; }
  size_t size() const { return settings_.size(); }  // the whole space

  // nullptr when the table has no such setting.
  const Setting* Find(std::string_view template_name, const agent::KnobValues& knobs) const;

  // The fastest verified median; 0 when nothing verified.
  double best_us() const { return best_us_; }
  const Setting* best() const { return best_; }
  // Verified settings within `fraction` of the best (0.05: at most 1.05x).
  int CountWithin(double fraction) const;

 private:
  std::string name_;
  ShapeKey shape_;
  std::vector<Setting> settings_;
  std::map<std::string, size_t, std::less<>> index_;
  double best_us_ = 0;
  const Setting* best_ = nullptr;
};

// Every forward or backward shape of `sweep_json` (all of them when `only`
// is empty), with its ShapeKey from the matching entry of `lengths_json` on
// the sweep's arch. InvalidArgument naming what is missing or malformed
// (a shape without lengths, a setting without knobs, an unknown outcome, a
// key twice, fewer settings than the shape's "space" block says it has: a
// sweep stopped by its cap).
absl::StatusOr<std::vector<ShapeTable>> LoadTables(std::string_view sweep_json,
                                                   std::string_view lengths_json,
                                                   const std::vector<std::string>& only = {});

// The ShapeKey of one lengths.py entry (H, KVH, D, causal, lq, lk) on `arch`,
// as kforge-bench-attn builds it: cross when the key lengths differ from the
// query lengths.
absl::StatusOr<ShapeKey> ShapeKeyOf(std::string_view lengths_entry_json, Op op,
                                    const std::string& arch);

}  // namespace kforge::search

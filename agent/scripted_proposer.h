// ScriptedProposer: a Proposer that hands out `limit` trivial candidates in
// all (distinct sources, one given manifest), for tests of what runs
// proposers (the job engine, the server, the dashboard) without the builtin
// proposer's search. Named "builtin", as the server asks for that one by
// default. Remember() counts a replayed candidate as handed out, so a
// restarted job continues where it stopped. Header-only. Not thread-safe
// (the engine calls a proposer from one thread).
#pragma once

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "agent/proposer.h"

namespace kforge::agent {

class ScriptedProposer final : public Proposer {
 public:
  ScriptedProposer(int limit, std::string manifest_json)
      : limit_(limit), manifest_json_(std::move(manifest_json)) {}

  absl::StatusOr<std::vector<Candidate>> Propose(const ProposalContext& ctx, int n) override {
    std::vector<Candidate> out;
    while (n-- > 0 && next_ < limit_) {
      Candidate c;
      // (a process-wide counter too, so that jobs never share a variant)
      c.source = fmt::format(
          "// scripted candidate {} ({}) for {}\nextern \"C\" __global__ void kf_attn_fwd() {{}}\n",
          next_++, Counter()++, ctx.bucket.Id());
      c.manifest_json = manifest_json_;
      c.origin = "template";
      c.template_name = "scripted";
      c.knobs_json = "{}";
      out.push_back(std::move(c));
    }
    return out;
  }
  void Observe(const Feedback&) override {}
  void Remember(const Candidate&) override { ++next_; }
  std::string Name() const override { return "builtin"; }

 private:
  static std::atomic<int>& Counter() {
    static std::atomic<int> n{0};
    return n;
  }
  int limit_;
  std::string manifest_json_;
  int next_ = 0;
};

}  // namespace kforge::agent

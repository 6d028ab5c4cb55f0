// Timing: what a kernel's timed launches measured, and the one rule that
// decides whether a candidate beats an incumbent.
//
// The worker's evaluator summarises its samples into a Timing, the child
// protocol, the wire and the store carry it, and the worker (for its
// message) and the server (for the promotion) decide with CompareTimings.
// Each adapter converts to and from this type; none has a rule of its own.
//
// The rule. A RETIME runs candidate and incumbent alternately on the same
// batch, launch by launch (A B, B A, A B, ...), so sample i of each ran
// back to back under the same clocks. The decision is a paired statistic on
// the ratios incumbent_us[i] / candidate_us[i]: the candidate wins when the
// one-sided sign-test lower bound, at `confidence`, on the median ratio
// exceeds 1 + `min_gain`. A clock that moves between pairs moves both
// halves of a pair, so it widens neither the ratios nor the bound, where
// the older rule (medians apart by more than either interquartile range)
// turned real wins down. The bound is order statistics only: no random
// numbers, so a decision is reproduced exactly from the stored samples.
//
// Timings without per-launch samples (older workers, rows stored before
// schema v5) are compared with that older rule.
//
// Thread-safe: plain values and pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kforge {

struct Timing {
  double median_us = 0, min_us = 0, max_us = 0;
  int32_t samples = 0;            // how many launches were timed
  double p25_us = 0, p75_us = 0;  // quartiles; 0 when unknown (older rows)
  // Every timed launch in launch order, when kept (empty for older workers
  // and rows); then samples == samples_us.size().
  std::vector<double> samples_us;

  // How much two medians must differ to be told apart by the unpaired
  // rule: the interquartile range (max - min for rows stored before
  // quartiles were).
  double Spread() const;
};

// Median, min, max and quartiles (linear interpolation) of `samples_us`,
// which the Timing keeps in the order given.
Timing Summarize(std::vector<double> samples_us);

struct WinRule {
  double confidence = 0.95;  // of the lower bound on the median ratio
  double min_gain = 0.01;    // the bound must exceed 1 + min_gain
};

// The sign-test statistic on paired ratios incumbent / candidate (> 1: the
// candidate is faster).
struct PairedRatios {
  int pairs = 0;
  double median = 0;       // median of the ratios
  // One-sided lower bound at the confidence asked for: the k-th smallest
  // ratio, k the largest with P(Binomial(pairs, 1/2) < k) <= 1 - confidence.
  // 0 when there are too few pairs for any bound (MinPairs).
  double lower_bound = 0;
  int favouring = 0;       // pairs whose ratio is above 1
};

// The fewest pairs for which a lower bound at `confidence` exists
// (0.5^n <= 1 - confidence: 5 at 95%).
int MinPairs(double confidence);

// INVALID_ARGUMENT unless both hold the same number of finite positive
// samples.
absl::StatusOr<PairedRatios> ComparePaired(std::span<const double> candidate_us,
                                           std::span<const double> incumbent_us,
                                           double confidence);

struct Comparison {
  bool candidate_wins = false;
  bool paired = false;     // decided on PairedRatios, else on the spreads
  PairedRatios ratios;     // paired only
  double spread_us = 0;    // unpaired only: the larger interquartile range
  double candidate_median_us = 0, incumbent_median_us = 0;
  WinRule rule;

  // One line for messages and logs, e.g. "candidate wins: median of 24
  // paired ratios 1.074 (95% lower bound 1.052 > 1.01; 22 of 24 favour
  // it); 1554.80 vs 1700.70 us".
  std::string Describe() const;
};

// The win rule: paired when both timings kept their samples and hold the
// same number of them (a RETIME's pairs); the medians apart by more than the
// larger spread otherwise.
Comparison CompareTimings(const Timing& candidate, const Timing& incumbent,
                          const WinRule& rule = {});

// How a figure was measured, for a served best: "retime: ..." from the
// comparison that promoted it, "confirm: median of 23 launches" for a
// timing taken alone.
std::string MeasuredAlone(std::string_view how, const Timing& t);
std::string MeasuredAgainst(const Comparison& c, std::string_view incumbent_variant_id);

// Samples as stored: comma-separated, each written so that it reads back
// as the same double (a decision recomputed from them is the same).
std::string EncodeSamples(std::span<const double> samples_us);
absl::StatusOr<std::vector<double>> DecodeSamples(std::string_view text);

}  // namespace kforge

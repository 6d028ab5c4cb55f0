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
// one-sided sign-test lower bound on the median ratio exceeds
// 1 + `min_gain`. A clock that moves between pairs moves both halves of a
// pair, so it widens neither the ratios nor the bound, where the older rule
// (medians apart by more than either interquartile range) turned real wins
// down. The bound is order statistics only: no random numbers, so a
// decision is reproduced exactly from the stored samples.
//
// How many pairs. A RETIME takes pairs until the decision is clear, up to a
// cap: it looks after every `look_pairs` pairs (16, 32, ... up to
// `max_pairs`, 96) and stops at the first look where the lower bound clears
// 1 + min_gain (the candidate wins) or the upper bound is at or below it
// (the candidate's gain is below the minimum: the incumbent holds); at the
// cap, undecided, the incumbent holds. Each look bounds at the confidence
// 1 - (1 - confidence) / looks, looks = max_pairs / look_pairs (Bonferroni),
// so that however many looks are taken the chance of declaring a win for a
// candidate whose true gain is below min_gain stays within 1 - confidence
// (5%): peeking costs no stated confidence. A close call thus gets up to 96
// pairs, where a clear one is settled in 16 (at 16 pairs the per-look bound
// is the 3rd smallest ratio; at 96 the 36th: a median gain of about
// min_gain plus a third of the per-pair noise is resolved). The worker
// stops timing at the deciding look (EnoughPairs) and the server decides
// again on the samples it gets with the same looks (DecidePairs), so both
// reach the same verdict at the same look.
//
// Every verdict says the rule it used (Describe: the per-look and the
// overall confidence, the look, the minimum gain): the server writes it
// into the RETIME's stored evaluation message, and a promotion's served
// figure (MeasuredAgainst) carries it. RETIMEs stored before the schedule
// were decided by LegacyWinRule: one look at all pairs at 95%. Timings
// without per-launch samples (older workers, rows stored before schema v5)
// are compared with the unpaired rule.
//
// Thread-safe: plain values and pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
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
  // Of the whole decision: a candidate whose true median gain is below
  // min_gain is declared the winner with probability at most 1 - confidence.
  double confidence = 0.95;
  double min_gain = 0.01;  // the lower bound must exceed 1 + min_gain
  // The pair schedule: a look after every look_pairs pairs, up to
  // max_pairs. look_pairs 0: one look at all the pairs there are, at
  // `confidence` (LegacyWinRule).
  int look_pairs = 16;
  int max_pairs = 96;

  // Looks the schedule allows (1 for a single look).
  int Looks() const;
  // The confidence of each look's bounds.
  double LookConfidence() const;
};

// How RETIMEs were decided before the schedule (rows before schema v6).
WinRule LegacyWinRule();

// OK when the rule can decide: confidence in (0.5, 1), min_gain >= 0,
// look_pairs >= 0, and with looks, max_pairs >= look_pairs and the first
// look large enough for a bound at the per-look confidence (MinPairs).
absl::Status ValidateWinRule(const WinRule& rule);

// The sign-test statistic on paired ratios incumbent / candidate (> 1: the
// candidate is faster).
struct PairedRatios {
  int pairs = 0;
  double median = 0;       // median of the ratios
  // One-sided lower bound at the confidence asked for: the k-th smallest
  // ratio, k the largest with P(Binomial(pairs, 1/2) < k) <= 1 - confidence.
  // 0 when there are too few pairs for any bound (MinPairs).
  double lower_bound = 0;
  // The one-sided upper bound at the same confidence: the k-th largest
  // ratio; 0 when there is none.
  double upper_bound = 0;
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

// The sequential rule on paired samples (see the top of this file).
enum class PairVerdict {
  kUndecided,  // no look was clear: the incumbent holds
  kWins,       // a look's lower bound cleared 1 + min_gain
  kBelowGain,  // a look's upper bound was at or below 1 + min_gain
};

struct PairDecision {
  PairVerdict verdict = PairVerdict::kUndecided;
  // At the deciding look, or the last one taken when none decided.
  PairedRatios ratios;
  int look = 0;        // which look (1-based); 0: none could be taken
  int looks_taken = 0;
};

// Decides on the first min(pairs, max_pairs) pairs, looking where the
// schedule does and once more at the last pair. INVALID_ARGUMENT as
// ComparePaired, or when the rule is not valid.
absl::StatusOr<PairDecision> DecidePairs(std::span<const double> candidate_us,
                                         std::span<const double> incumbent_us,
                                         const WinRule& rule);

// Whether a RETIME that has timed these pairs should time no more: it
// reached max_pairs, or it stands at a look of the schedule and that look
// decided. Never for a rule without looks: its pair count is the caller's.
bool EnoughPairs(std::span<const double> candidate_us, std::span<const double> incumbent_us,
                 const WinRule& rule);

struct Comparison {
  bool candidate_wins = false;
  bool paired = false;     // decided on the pairs (DecidePairs), else on the spreads
  PairDecision decision;   // paired only
  double spread_us = 0;    // unpaired only: the larger interquartile range
  double candidate_median_us = 0, incumbent_median_us = 0;
  WinRule rule;

  // One line for messages and logs, e.g. "candidate wins: median of 16
  // paired ratios 1.074 (99.2% lower bound 1.052 > 1.01 at look 1 of 6, 95%
  // overall; 16 of 16 favour the candidate); 1554.80 vs 1700.70 us".
  std::string Describe() const;
};

// The win rule: paired when both timings kept their samples and hold the
// same number of them (a RETIME's pairs); the medians apart by more than the
// larger spread otherwise.
Comparison CompareTimings(const Timing& candidate, const Timing& incumbent,
                          const WinRule& rule = {});

// How a figure was measured, for a served best: "retime: ..." from the
// comparison that promoted it (with the confidence and the rule's
// schedule), "confirm: median of 23 launches" for a timing taken alone.
std::string MeasuredAlone(std::string_view how, const Timing& t);
std::string MeasuredAgainst(const Comparison& c, std::string_view incumbent_variant_id);

// Samples as stored: comma-separated, each written so that it reads back
// as the same double (a decision recomputed from them is the same).
std::string EncodeSamples(std::span<const double> samples_us);
absl::StatusOr<std::vector<double>> DecodeSamples(std::string_view text);

}  // namespace kforge

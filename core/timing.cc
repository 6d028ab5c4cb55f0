#include "core/timing.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include <fmt/format.h>

namespace kforge {
namespace {

// Linear interpolation between order statistics of sorted `s`.
double Quantile(const std::vector<double>& s, double q) {
  const double pos = q * double(s.size() - 1);
  const size_t lo = size_t(std::floor(pos)), hi = size_t(std::ceil(pos));
  return s[lo] + (s[hi] - s[lo]) * (pos - double(lo));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return Quantile(v, 0.5);
}

// P(Binomial(n, 1/2) <= k), in log space so that large n does not underflow.
double BinomialHalfCdf(int n, int k) {
  if (k < 0) return 0;
  if (k >= n) return 1;
  double total = 0;
  const double log_half_n = double(n) * std::log(0.5);
  for (int i = 0; i <= k; ++i) {
    total += std::exp(std::lgamma(n + 1.0) - std::lgamma(i + 1.0) - std::lgamma(n - i + 1.0) +
                      log_half_n);
  }
  return std::min(1.0, total);
}

// "95", "99.2": a confidence as a percentage, one decimal when it has one.
std::string Percent(double confidence) {
  const double p = confidence * 100;
  if (std::abs(p - std::round(p)) < 0.05) return fmt::format("{}", std::lround(p));
  return fmt::format("{:.1f}", p);
}

std::string PercentOf(double fraction) { return fmt::format("{:g}", fraction * 100); }

// Where the schedule looks at `n` pairs: every look_pairs below n, then n.
std::vector<int> LookPoints(const WinRule& rule, int n) {
  std::vector<int> points;
  if (rule.look_pairs > 0) {
    for (int m = rule.look_pairs; m < n; m += rule.look_pairs) points.push_back(m);
  }
  points.push_back(n);
  return points;
}

}  // namespace

double Timing::Spread() const {
  return p75_us > 0 ? std::max(0.0, p75_us - p25_us) : std::max(0.0, max_us - min_us);
}

Timing Summarize(std::vector<double> samples_us) {
  Timing t;
  if (samples_us.empty()) return t;
  std::vector<double> s = samples_us;
  std::sort(s.begin(), s.end());
  t.samples = int32_t(s.size());
  t.min_us = s.front();
  t.max_us = s.back();
  t.median_us = Quantile(s, 0.5);
  t.p25_us = Quantile(s, 0.25);
  t.p75_us = Quantile(s, 0.75);
  t.samples_us = std::move(samples_us);
  return t;
}

int WinRule::Looks() const {
  if (look_pairs <= 0) return 1;
  return std::max(1, (max_pairs + look_pairs - 1) / look_pairs);
}

double WinRule::LookConfidence() const { return 1 - (1 - confidence) / Looks(); }

WinRule LegacyWinRule() {
  return WinRule{.confidence = 0.95, .min_gain = 0.01, .look_pairs = 0, .max_pairs = 0};
}

absl::Status ValidateWinRule(const WinRule& rule) {
  if (!(rule.confidence > 0.5 && rule.confidence < 1))
    return absl::InvalidArgumentError(fmt::format("win rule: confidence {} is not in (0.5, 1)", rule.confidence));
  if (!(rule.min_gain >= 0) || !std::isfinite(rule.min_gain))
    return absl::InvalidArgumentError(fmt::format("win rule: min_gain {} is negative", rule.min_gain));
  if (rule.look_pairs < 0) return absl::InvalidArgumentError("win rule: look_pairs is negative");
  if (rule.look_pairs == 0) return absl::OkStatus();
  if (rule.max_pairs < rule.look_pairs)
    return absl::InvalidArgumentError(fmt::format("win rule: max_pairs {} is below look_pairs {}",
                                                  rule.max_pairs, rule.look_pairs));
  if (const int need = MinPairs(rule.LookConfidence()); rule.look_pairs < need) {
    return absl::InvalidArgumentError(
        fmt::format("win rule: a look of {} pairs has no {}% bound (needs {})", rule.look_pairs,
                    Percent(rule.LookConfidence()), need));
  }
  return absl::OkStatus();
}

int MinPairs(double confidence) {
  const double alpha = 1 - confidence;
  int n = 1;
  while (std::pow(0.5, n) > alpha && n < 64) ++n;
  return n;
}

absl::StatusOr<PairedRatios> ComparePaired(std::span<const double> candidate_us,
                                           std::span<const double> incumbent_us,
                                           double confidence) {
  if (candidate_us.size() != incumbent_us.size())
    return absl::InvalidArgumentError(fmt::format("{} candidate samples but {} incumbent samples",
                                                  candidate_us.size(), incumbent_us.size()));
  if (candidate_us.empty()) return absl::InvalidArgumentError("no pairs");
  PairedRatios r;
  std::vector<double> ratios;
  ratios.reserve(candidate_us.size());
  for (size_t i = 0; i < candidate_us.size(); ++i) {
    const double c = candidate_us[i], inc = incumbent_us[i];
    if (!std::isfinite(c) || !std::isfinite(inc) || c <= 0 || inc <= 0)
      return absl::InvalidArgumentError(fmt::format("pair {}: samples must be finite and positive", i));
    ratios.push_back(inc / c);
    if (inc > c) ++r.favouring;
  }
  std::sort(ratios.begin(), ratios.end());
  r.pairs = int(ratios.size());
  r.median = Quantile(ratios, 0.5);
  // The k-th smallest ratio lies above the true median only when fewer
  // than k ratios do: P(Binomial(n, 1/2) <= k - 1).
  const double alpha = 1 - confidence;
  int k = 0;
  while (k < r.pairs && BinomialHalfCdf(r.pairs, k) <= alpha) ++k;
  if (k > 0) {
    r.lower_bound = ratios[size_t(k - 1)];
    r.upper_bound = ratios[size_t(r.pairs - k)];  // the same order statistic from the top
  }
  return r;
}

absl::StatusOr<PairDecision> DecidePairs(std::span<const double> candidate_us,
                                         std::span<const double> incumbent_us,
                                         const WinRule& rule) {
  if (absl::Status s = ValidateWinRule(rule); !s.ok()) return s;
  // Every sample is checked, those past the cap too: a report is well
  // formed as a whole or not at all.
  if (absl::StatusOr<PairedRatios> all = ComparePaired(candidate_us, incumbent_us, 0.5); !all.ok())
    return all.status();
  int n = int(candidate_us.size());
  if (rule.look_pairs > 0) n = std::min(n, rule.max_pairs);
  const double confidence = rule.LookConfidence();
  const double threshold = 1 + rule.min_gain;
  PairDecision d;
  const std::vector<int> points = LookPoints(rule, n);
  for (size_t look = 0; look < points.size(); ++look) {
    const size_t m = size_t(points[look]);
    absl::StatusOr<PairedRatios> r =
        ComparePaired(candidate_us.first(m), incumbent_us.first(m), confidence);
    if (!r.ok()) return r.status();
    d.ratios = *r;
    d.look = int(look) + 1;
    d.looks_taken = d.look;
    if (r->lower_bound > threshold) {
      d.verdict = PairVerdict::kWins;
      return d;
    }
    if (r->upper_bound > 0 && r->upper_bound <= threshold) {
      d.verdict = PairVerdict::kBelowGain;
      return d;
    }
  }
  return d;
}

bool EnoughPairs(std::span<const double> candidate_us, std::span<const double> incumbent_us,
                 const WinRule& rule) {
  const size_t n = std::min(candidate_us.size(), incumbent_us.size());
  if (rule.look_pairs <= 0) return false;
  if (n >= size_t(rule.max_pairs)) return true;
  if (n == 0 || n % size_t(rule.look_pairs) != 0) return false;
  absl::StatusOr<PairDecision> d = DecidePairs(candidate_us.first(n), incumbent_us.first(n), rule);
  return d.ok() && d->verdict != PairVerdict::kUndecided;
}

namespace {

// The bound that decided (or the bounds that did not), e.g. "99.2% lower
// bound 1.052 > 1.01 at look 1 of 6, 95% overall".
std::string BoundText(const Comparison& c) {
  const PairedRatios& r = c.decision.ratios;
  const double look_confidence = c.rule.LookConfidence();
  const std::string at = c.rule.look_pairs > 0
                             ? fmt::format(" at look {} of {}, {}% overall", c.decision.look,
                                           c.rule.Looks(), Percent(c.rule.confidence))
                             : "";
  if (r.lower_bound <= 0) {
    return fmt::format("too few pairs for a {}% bound (needs {})", Percent(look_confidence),
                       MinPairs(look_confidence));
  }
  const double threshold = 1 + c.rule.min_gain;
  switch (c.decision.verdict) {
    case PairVerdict::kWins:
      return fmt::format("{}% lower bound {:.3f} > {:.2f}{}", Percent(look_confidence), r.lower_bound,
                         threshold, at);
    case PairVerdict::kBelowGain:
      return fmt::format("{}% upper bound {:.3f} <= {:.2f}{}", Percent(look_confidence),
                         r.upper_bound, threshold, at);
    case PairVerdict::kUndecided:
      break;
  }
  if (c.rule.look_pairs <= 0) {
    return fmt::format("{}% lower bound {:.3f} <= {:.2f}", Percent(look_confidence), r.lower_bound,
                       threshold);
  }
  return fmt::format("{}% bounds {:.3f} to {:.3f} around {:.2f}{}: undecided", Percent(look_confidence),
                     r.lower_bound, r.upper_bound, threshold, at);
}

}  // namespace

std::string Comparison::Describe() const {
  const char* verdict = candidate_wins ? "candidate wins" : "incumbent holds";
  if (paired) {
    const PairedRatios& r = decision.ratios;
    return fmt::format("{}: median of {} paired ratios {:.3f} ({}; {} of {} favour the candidate); "
                       "{:.2f} vs {:.2f} us",
                       verdict, r.pairs, r.median, BoundText(*this), r.favouring, r.pairs,
                       candidate_median_us, incumbent_median_us);
  }
  return fmt::format("{}: {:.2f} vs {:.2f} us (unpaired, spread {:.2f} us)", verdict,
                     candidate_median_us, incumbent_median_us, spread_us);
}

Comparison CompareTimings(const Timing& candidate, const Timing& incumbent, const WinRule& rule) {
  Comparison c;
  c.rule = rule;
  c.candidate_median_us = candidate.median_us;
  c.incumbent_median_us = incumbent.median_us;
  if (!candidate.samples_us.empty() && candidate.samples_us.size() == incumbent.samples_us.size()) {
    absl::StatusOr<PairDecision> d = DecidePairs(candidate.samples_us, incumbent.samples_us, rule);
    if (d.ok()) {
      c.paired = true;
      c.decision = *d;
      c.candidate_wins = d->verdict == PairVerdict::kWins;
      return c;
    }
  }
  c.spread_us = std::max(candidate.Spread(), incumbent.Spread());
  c.candidate_wins = incumbent.median_us - candidate.median_us > c.spread_us;
  return c;
}

std::string MeasuredAlone(std::string_view how, const Timing& t) {
  return fmt::format("{}: median of {} launches", how, t.samples);
}

std::string MeasuredAgainst(const Comparison& c, std::string_view incumbent_variant_id) {
  if (c.paired) {
    const PairedRatios& r = c.decision.ratios;
    const std::string schedule =
        c.rule.look_pairs > 0
            ? fmt::format(", look {} of {}: {}% overall, min gain {}%", c.decision.look,
                          c.rule.Looks(), Percent(c.rule.confidence), PercentOf(c.rule.min_gain))
            : "";
    return fmt::format("retime: median of {} paired ratios {:.3f} ({}% lower bound {:.3f}{}) vs {}; "
                       "median {:.2f} us",
                       r.pairs, r.median, Percent(c.rule.LookConfidence()), r.lower_bound, schedule,
                       incumbent_variant_id, c.candidate_median_us);
  }
  return fmt::format("retime: median {:.2f} us vs {:.2f} us (unpaired, spread {:.2f} us) vs {}",
                     c.candidate_median_us, c.incumbent_median_us, c.spread_us,
                     incumbent_variant_id);
}

std::string EncodeSamples(std::span<const double> samples_us) {
  std::string out;
  for (size_t i = 0; i < samples_us.size(); ++i) {
    if (i > 0) out += ',';
    out += fmt::format("{}", samples_us[i]);  // shortest text that reads back exactly
  }
  return out;
}

absl::StatusOr<std::vector<double>> DecodeSamples(std::string_view text) {
  std::vector<double> out;
  if (text.empty()) return out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    double v = 0;
    const char* first = text.data() + start;
    const char* last = text.data() + end;
    auto [ptr, ec] = std::from_chars(first, last, v);
    if (ec != std::errc() || ptr != last)
      return absl::InvalidArgumentError(
          fmt::format("samples: '{}' is not a number", text.substr(start, end - start)));
    out.push_back(v);
    start = end + 1;
  }
  return out;
}

}  // namespace kforge

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

int Percent(double confidence) { return int(std::lround(confidence * 100)); }

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
  if (k > 0) r.lower_bound = ratios[size_t(k - 1)];
  return r;
}

std::string Comparison::Describe() const {
  const char* verdict = candidate_wins ? "candidate wins" : "incumbent holds";
  if (paired) {
    const std::string bound =
        ratios.lower_bound > 0
            ? fmt::format("{}% lower bound {:.3f} {} {:.2f}", Percent(rule.confidence),
                          ratios.lower_bound, candidate_wins ? ">" : "<=", 1 + rule.min_gain)
            : fmt::format("too few pairs for a {}% bound (needs {})", Percent(rule.confidence),
                          MinPairs(rule.confidence));
    return fmt::format("{}: median of {} paired ratios {:.3f} ({}; {} of {} favour the candidate); "
                       "{:.2f} vs {:.2f} us",
                       verdict, ratios.pairs, ratios.median, bound, ratios.favouring, ratios.pairs,
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
    absl::StatusOr<PairedRatios> r =
        ComparePaired(candidate.samples_us, incumbent.samples_us, rule.confidence);
    if (r.ok()) {
      c.paired = true;
      c.ratios = *r;
      c.candidate_wins = r->lower_bound > 1 + rule.min_gain;
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
    return fmt::format("retime: median of {} paired ratios {:.3f} ({}% lower bound {:.3f}) vs {}; "
                       "median {:.2f} us",
                       c.ratios.pairs, c.ratios.median, Percent(c.rule.confidence),
                       c.ratios.lower_bound, incumbent_variant_id, c.candidate_median_us);
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

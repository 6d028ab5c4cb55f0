// KnobModel: what the builtin search believes about the settings it has not
// measured yet, from the ones it has.
//
// A Gaussian process over knob settings, fitted to log(median time) of the
// verified ones. Kernel settings are made of independent knobs whose values
// are ordered (tile sizes, stage counts, flags), and their effects interact
// (a tile size that wins with one stage count loses with another), so the
// covariance of two settings of one template is a product over knobs,
// exp(-sum_d theta_d |x_d - x'_d|) with each knob's value position scaled to
// [0, 1], plus a constant per template (settings of one template share its
// level) and a smaller constant across templates. The decay rate theta_d of
// each knob, the noise and the scale are chosen by the marginal likelihood of
// the data over a fixed grid (coordinate-wise, deterministic), so a knob that
// changes nothing ends up with theta near 0 and one that matters with a
// large theta, learned per bucket from its own measurements only.
//
// What the search asks: the expected improvement of a setting over the best
// measured time (in log time, so a 5% gain is the same on a 50 us and a 5 ms
// shape), and the predicted mean and spread. Settings proposed and not yet
// measured ("pending") count as measured at their predicted mean (the
// kriging believer), so one batch spreads out instead of piling onto one
// optimum.
//
// Deterministic: a pure function of its inputs, in the order given.
// Thread-compatible (immutable once built).
#pragma once

#include <cstddef>
#include <vector>

namespace kforge::agent {

struct KnobPoint {
  int tmpl = 0;            // index of the template among those searched
  std::vector<double> x;   // per knob: value index / (number of values - 1); 0 for one value
};

struct KnobModelOptions {
  double template_level = 0.5;   // prior covariance shared by the settings of one template
  double across_templates = 0.2; // prior covariance shared by all settings
  std::vector<double> theta_grid = {0.125, 0.25, 0.5, 1, 2, 4, 8};
  std::vector<double> noise_grid = {1e-4, 1e-3, 1e-2, 5e-2};  // relative to the scale
  double theta_start = 1;
  int sweeps = 2;                // coordinate passes over the knobs
  int max_points = 192;          // the fastest this many are fitted when there are more
  int max_search_points = 64;    // ... and the fastest this many choose the hyperparameters
};

class KnobModel {
 public:
  // `points` and `log_us` are the verified settings (same length, at least
  // one); `pending`, settings proposed and not measured; `knobs_per_template`,
  // how many knobs each template has (indexed by KnobPoint::tmpl).
  KnobModel(const std::vector<KnobPoint>& points, const std::vector<double>& log_us,
            const std::vector<int>& knobs_per_template, KnobModelOptions options = {});

  // Conditions on `pending` as measured at their predicted means, keeping the
  // fitted hyperparameters; replaces any pending set given before.
  void SetPending(const std::vector<KnobPoint>& pending);

  struct Prediction {
    double mean = 0;  // log(us)
    double sd = 0;
  };
  Prediction Predict(const KnobPoint& p) const;
  // E[max(0, best - y(p))] in log(us), best = the fastest measured.
  double ExpectedImprovement(const KnobPoint& p) const;

  double best_log_us() const { return best_; }
  // The fitted decay rate of knob d of template t (for tests and logs).
  double theta(int tmpl, int knob) const { return theta_[tmpl][knob]; }
  double noise() const { return noise_; }

 private:
  double Kernel(const KnobPoint& a, const KnobPoint& b) const;
  // Cholesky factor of the covariance of `pts` (plus noise) into chol_,
  // false when it is not positive definite.
  bool Factor(const std::vector<KnobPoint>& pts);
  // -0.5 * (n log(scale) + log det) of `y` (one per factored point) under
  // the current factor: the log marginal likelihood with the scale profiled
  // out. Sets scale_ and alpha_.
  double LogLikelihood(const std::vector<double>& y);
  void Solve(const std::vector<double>& y);  // alpha_ = K^-1 (y - mean), current factor

  KnobModelOptions options_;
  std::vector<KnobPoint> points_;   // fitted points (then the pending ones)
  std::vector<double> y_;           // their log times (pending: predicted means)
  size_t measured_ = 0;             // how many of points_ were measured
  std::vector<std::vector<double>> theta_;
  double noise_ = 1e-3;
  double mean_ = 0;
  double scale_ = 1;                // the prior variance, profiled
  double best_ = 0;
  std::vector<double> chol_;        // row-major lower triangle, n x n
  std::vector<double> alpha_;
};

}  // namespace kforge::agent

#include "agent/knob_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace kforge::agent {
namespace {

double NormalPdf(double z) { return std::exp(-0.5 * z * z) / std::sqrt(2 * M_PI); }
double NormalCdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

}  // namespace

KnobModel::KnobModel(const std::vector<KnobPoint>& points, const std::vector<double>& log_us,
                     const std::vector<int>& knobs_per_template, KnobModelOptions options)
    : options_(std::move(options)) {
  // The fastest ones when there are too many: they are where an improvement
  // can come from, and the fit's cost grows with the cube of their number.
  std::vector<size_t> order(points.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return log_us[a] < log_us[b]; });
  if (static_cast<int>(order.size()) > options_.max_points) order.resize(options_.max_points);
  std::sort(order.begin(), order.end());  // back to the given order: the fit must not depend on ties
  for (size_t i : order) {
    points_.push_back(points[i]);
    y_.push_back(log_us[i]);
  }
  measured_ = points_.size();
  theta_.resize(knobs_per_template.size());
  for (size_t t = 0; t < theta_.size(); ++t) theta_[t].assign(knobs_per_template[t], options_.theta_start);
  if (measured_ == 0) return;
  mean_ = std::accumulate(y_.begin(), y_.end(), 0.0) / measured_;
  best_ = *std::min_element(y_.begin(), y_.end());

  // Hyperparameters by the marginal likelihood, one coordinate at a time
  // over fixed grids; a change must win by a margin, so ties keep the start.
  // On the fastest max_search_points (points_ is in the given order, which
  // the caller sorts fastest first; the selection keeps that order).
  std::vector<KnobPoint> search_points;
  std::vector<double> search_y;
  {
    std::vector<size_t> fastest(measured_);
    std::iota(fastest.begin(), fastest.end(), 0);
    std::stable_sort(fastest.begin(), fastest.end(), [&](size_t a, size_t b) { return y_[a] < y_[b]; });
    if (static_cast<int>(fastest.size()) > options_.max_search_points) {
      fastest.resize(options_.max_search_points);
    }
    std::sort(fastest.begin(), fastest.end());
    for (size_t i : fastest) search_points.push_back(points_[i]), search_y.push_back(y_[i]);
  }
  const double all_mean = mean_;
  mean_ = std::accumulate(search_y.begin(), search_y.end(), 0.0) / search_y.size();
  auto score = [&]() {
    if (!Factor(search_points)) return -std::numeric_limits<double>::infinity();
    return LogLikelihood(search_y);
  };
  auto pick = [&](double& param, const std::vector<double>& grid) {
    const double start = param;
    double best_value = start, best_score = score();
    for (double g : grid) {
      if (g == start) continue;
      param = g;
      const double s = score();
      if (s > best_score + 1e-9) best_score = s, best_value = g;
    }
    param = best_value;
  };
  if (search_points.size() >= 3) {
    std::vector<int> per_template(theta_.size(), 0);
    for (const KnobPoint& p : search_points) ++per_template[p.tmpl];
    pick(noise_, options_.noise_grid);
    for (int sweep = 0; sweep < options_.sweeps; ++sweep) {
      for (size_t t = 0; t < theta_.size(); ++t) {
        if (per_template[t] < 2) continue;  // nothing to learn its knobs from
        for (double& theta : theta_[t]) pick(theta, options_.theta_grid);
      }
    }
    pick(noise_, options_.noise_grid);
  }
  mean_ = all_mean;
  if (!Factor(points_)) {
    noise_ = options_.noise_grid.back();
    Factor(points_);
  }
  LogLikelihood(y_);  // sets scale_ (and alpha_)
}

void KnobModel::SetPending(const std::vector<KnobPoint>& pending) {
  points_.resize(measured_);
  y_.resize(measured_);
  Factor(points_);
  Solve(y_);
  for (const KnobPoint& p : pending) y_.push_back(Predict(p).mean);
  points_.insert(points_.end(), pending.begin(), pending.end());
  if (!Factor(points_)) {
    // Numerically singular (a pending point on top of a measured one with
    // the smallest noise): fall back to the measured ones alone.
    points_.resize(measured_);
    y_.resize(measured_);
    Factor(points_);
  }
  Solve(y_);
}

double KnobModel::Kernel(const KnobPoint& a, const KnobPoint& b) const {
  double k = options_.across_templates;
  if (a.tmpl == b.tmpl) {
    double d = 0;
    const std::vector<double>& theta = theta_[a.tmpl];
    for (size_t i = 0; i < a.x.size() && i < theta.size(); ++i) d += theta[i] * std::abs(a.x[i] - b.x[i]);
    k += options_.template_level + std::exp(-d);
  }
  return k / (options_.across_templates + options_.template_level + 1);
}

bool KnobModel::Factor(const std::vector<KnobPoint>& pts) {
  const size_t n = pts.size();
  chol_.assign(n * n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j <= i; ++j) {
      double s = Kernel(pts[i], pts[j]) + (i == j ? noise_ : 0.0);
      for (size_t k = 0; k < j; ++k) s -= chol_[i * n + k] * chol_[j * n + k];
      if (i == j) {
        if (s <= 1e-12) return false;
        chol_[i * n + i] = std::sqrt(s);
      } else {
        chol_[i * n + j] = s / chol_[j * n + j];
      }
    }
  }
  return true;
}

void KnobModel::Solve(const std::vector<double>& y) {
  const size_t n = y.size();
  alpha_.assign(n, 0.0);
  for (size_t i = 0; i < n; ++i) {  // L z = y - mean
    double s = y[i] - mean_;
    for (size_t k = 0; k < i; ++k) s -= chol_[i * n + k] * alpha_[k];
    alpha_[i] = s / chol_[i * n + i];
  }
  for (size_t i = n; i-- > 0;) {  // L^T alpha = z
    double s = alpha_[i];
    for (size_t k = i + 1; k < n; ++k) s -= chol_[k * n + i] * alpha_[k];
    alpha_[i] = s / chol_[i * n + i];
  }
}

double KnobModel::LogLikelihood(const std::vector<double>& y) {
  Solve(y);
  const size_t n = y.size();

  double quad = 0, logdet = 0;
  for (size_t i = 0; i < n; ++i) {
    quad += (y[i] - mean_) * alpha_[i];
    logdet += 2 * std::log(chol_[i * n + i]);
  }
  scale_ = std::max(quad / n, 1e-8);
  return -0.5 * (n * std::log(scale_) + logdet);
}

KnobModel::Prediction KnobModel::Predict(const KnobPoint& p) const {
  const size_t n = points_.size();
  if (n == 0) return {mean_, std::sqrt(scale_)};
  std::vector<double> k(n), v(n);
  double mean = mean_;
  for (size_t i = 0; i < n; ++i) {
    k[i] = Kernel(p, points_[i]);
    mean += k[i] * alpha_[i];
  }
  double explained = 0;
  for (size_t i = 0; i < n; ++i) {  // L v = k
    double s = k[i];
    for (size_t j = 0; j < i; ++j) s -= chol_[i * n + j] * v[j];
    v[i] = s / chol_[i * n + i];
    explained += v[i] * v[i];
  }
  const double var = scale_ * std::max(0.0, Kernel(p, p) - explained);
  return {mean, std::sqrt(var)};
}

double KnobModel::ExpectedImprovement(const KnobPoint& p) const {
  const Prediction pr = Predict(p);
  const double gain = best_ - pr.mean;
  if (pr.sd < 1e-12) return std::max(0.0, gain);
  const double z = gain / pr.sd;
  return gain * NormalCdf(z) + pr.sd * NormalPdf(z);
}

}  // namespace kforge::agent

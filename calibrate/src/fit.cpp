#include "hetpar/calibrate/fit.h"

#include <fmt/format.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>

#include "hetpar/core/check.h"

namespace hetpar::calibrate {

double quantile(std::vector<double> values, double q) {
  HETPAR_CHECK(!values.empty());
  std::sort(values.begin(), values.end());
  const double pos = q * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (pos - static_cast<double>(lo)) * (values[hi] - values[lo]);
}

TimingStats summarize(std::vector<double> seconds) {
  HETPAR_CHECK(!seconds.empty());
  std::sort(seconds.begin(), seconds.end());
  TimingStats s;
  s.median_s = quantile(seconds, 0.5);
  s.p10_s = quantile(seconds, 0.1);
  s.p90_s = quantile(seconds, 0.9);
  s.min_s = seconds.front();
  s.max_s = seconds.back();
  s.reps = static_cast<int>(seconds.size());
  return s;
}

Result<AlphaBetaFit> fit_alpha_beta(std::span<const SizeTime> samples) {
  const auto n = static_cast<Eigen::Index>(samples.size());
  double smin = INFINITY, smax = 0;
  for (const SizeTime& p : samples) {
    if (!(p.bytes > 0) || !(p.seconds > 0))
      return Status::invalid_argument(
          fmt::format("alpha-beta fit: sample ({} B, {} s) is not positive", p.bytes, p.seconds));
    smin = std::min(smin, p.bytes);
    smax = std::max(smax, p.bytes);
  }
  if (n < 2 || smin == smax)
    return Status::invalid_argument("alpha-beta fit: needs at least two distinct sizes");

  // Relative residuals: rows divided by the measured time. Columns are scaled to unit
  // norm so the 2x2 problem stays well conditioned across nine decades of sizes.
  Eigen::MatrixXd a(n, 2);
  Eigen::VectorXd y(n);
  for (Eigen::Index i = 0; i < n; ++i) {
    const SizeTime& p = samples[static_cast<size_t>(i)];
    a(i, 0) = 1.0 / p.seconds;
    a(i, 1) = p.bytes / p.seconds;
    y(i) = 1.0;
  }
  const Eigen::Vector2d scale(a.col(0).norm(), a.col(1).norm());
  const Eigen::MatrixXd as = a * scale.cwiseInverse().asDiagonal();
  Eigen::Vector2d x = as.colPivHouseholderQr().solve(y).cwiseQuotient(scale);

  AlphaBetaFit f;
  f.points = static_cast<int>(n);
  if (x(0) < 0) {  // latency cannot be negative: best line through the origin instead
    x(0) = 0;
    x(1) = a.col(1).dot(y) / a.col(1).squaredNorm();
    f.alpha_clamped = true;
  }
  if (!(x(1) > 0))
    return Status::invalid_argument(
        "alpha-beta fit: time does not grow with size (no positive bandwidth fits)");
  AlphaBetaFit out = evaluate_line(x(0), 1.0 / x(1), samples);
  out.alpha_clamped = f.alpha_clamped;
  return out;
}

AlphaBetaFit evaluate_line(double alpha_s, double beta_Bps, std::span<const SizeTime> samples) {
  AlphaBetaFit f;
  f.alpha_s = alpha_s;
  f.beta_Bps = beta_Bps;
  f.points = static_cast<int>(samples.size());
  if (samples.empty()) return f;
  double mean = 0;
  for (const SizeTime& p : samples) mean += p.seconds;
  mean /= static_cast<double>(samples.size());
  double ss_res = 0, ss_tot = 0;
  for (const SizeTime& p : samples) {
    const double pred = f.predict_s(p.bytes);
    ss_res += (pred - p.seconds) * (pred - p.seconds);
    ss_tot += (p.seconds - mean) * (p.seconds - mean);
    f.max_rel_residual = std::max(f.max_rel_residual, std::fabs(pred - p.seconds) / p.seconds);
  }
  f.r2 = ss_tot > 0 ? 1.0 - ss_res / ss_tot : 1.0;
  return f;
}

AlphaBetaFit fit_alpha_beta_or_bounds(std::span<const SizeTime> samples) {
  HETPAR_CHECK(!samples.empty());
  if (Result<AlphaBetaFit> f = fit_alpha_beta(samples); f.is_ok()) return *f;
  auto [lo, hi] =
      std::minmax_element(samples.begin(), samples.end(),
                          [](const auto& a, const auto& b) { return a.bytes < b.bytes; });
  double alpha = lo->bytes < hi->bytes ? lo->seconds : 0.0;
  if (!(hi->seconds - alpha > 0)) alpha = 0;
  AlphaBetaFit f = evaluate_line(alpha, hi->bytes / (hi->seconds - alpha), samples);
  f.fallback = true;
  return f;
}

}  // namespace hetpar::calibrate

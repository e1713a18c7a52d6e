// Fits of calibration samples (Eigen least squares) and the summary statistics of repeated
// timings. The alpha-beta model t(S) = alpha + S / beta is the Hockney form nccl-tests'
// algbw and the simulator's collective figures use; it is fitted in relative terms
// (weights 1 / t^2) so that a 1 KiB sample counts as much as a 1 GiB one: an unweighted
// fit lets the largest sizes decide alpha alone.
#pragma once

#include <span>
#include <vector>

#include "hetpar/core/status.h"

namespace hetpar::calibrate {

/// Median and spread of repeated timings of one sample (seconds).
struct TimingStats {
  double median_s = 0;
  double p10_s = 0;
  double p90_s = 0;
  double min_s = 0;
  double max_s = 0;
  int reps = 0;
};
/// REQUIRES: !seconds.empty(). Percentiles by linear interpolation between order statistics.
TimingStats summarize(std::vector<double> seconds);
/// The q-quantile (0..1) of `values` (copied and sorted), linear interpolation.
double quantile(std::vector<double> values, double q);

/// One point of a size sweep: bytes moved (the size convention of the caller) and time.
struct SizeTime {
  double bytes = 0;
  double seconds = 0;
};

struct AlphaBetaFit {
  double alpha_s = 0;           // latency of a zero-byte call
  double beta_Bps = 0;          // bytes per second as the size grows (nccl-tests algbw)
  double r2 = 0;                // coefficient of determination of the fitted line on the raw times
  double max_rel_residual = 0;  // max over samples of |predicted - measured| / measured
  int points = 0;
  bool alpha_clamped = false;  // the free fit gave alpha < 0; refitted through the origin
  bool fallback = false;       // no least-squares fit existed: the bounds line (below)
  double predict_s(double bytes) const { return alpha_s + bytes / beta_Bps; }
};

/// Weighted least squares of t = alpha + S / beta. Errors: fewer than two distinct sizes,
/// non-positive times or sizes, or times that do not grow with size (beta would be <= 0).
Result<AlphaBetaFit> fit_alpha_beta(std::span<const SizeTime> samples);
/// fit_alpha_beta, or where it fails (one size, noise that makes time shrink with size)
/// the line through the smallest sample's time and the largest sample's bandwidth (or a
/// pure bandwidth when that is not positive). r2 and max_rel_residual are those of the line.
AlphaBetaFit fit_alpha_beta_or_bounds(std::span<const SizeTime> samples);
/// R^2 and max relative residual of the line (alpha, beta) on `samples`.
AlphaBetaFit evaluate_line(double alpha_s, double beta_Bps, std::span<const SizeTime> samples);

}  // namespace hetpar::calibrate

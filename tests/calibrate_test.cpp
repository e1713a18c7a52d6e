// calibrate: the alpha-beta fit on synthetic samples with known parameters, and the
// timing statistics. Sweeps, grid and profile writer: tests/calibrate/*.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "hetpar/calibrate/fit.h"

namespace hetpar::calibrate {
namespace {

std::vector<SizeTime> synthetic(double alpha, double beta, double noise) {
  std::vector<SizeTime> v;
  int i = 0;
  for (double s = 1024; s <= 1024.0 * 1024 * 1024; s *= 2, ++i) {
    // Deterministic multiplicative noise alternating in sign, up to `noise`.
    const double wobble = 1.0 + noise * std::sin(1.7 * i);
    v.push_back({s, (alpha + s / beta) * wobble});
  }
  return v;
}

TEST(AlphaBetaFit, RecoversKnownParametersWithinOnePercent) {
  struct Case {
    double alpha, beta, noise;
  };
  for (const Case c : {Case{5e-6, 12e9, 0.0}, Case{5e-6, 12e9, 0.005}, Case{40e-6, 45e9, 0.005},
                       Case{1.5e-6, 3e9, 0.003}, Case{12e-6, 450e9, 0.002}}) {
    SCOPED_TRACE(::testing::Message() << c.alpha << " s, " << c.beta << " B/s, noise " << c.noise);
    const auto pts = synthetic(c.alpha, c.beta, c.noise);
    Result<AlphaBetaFit> f = fit_alpha_beta(pts);
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    EXPECT_NEAR(f->alpha_s / c.alpha, 1.0, 0.01);
    EXPECT_NEAR(f->beta_Bps / c.beta, 1.0, 0.01);
    EXPECT_GT(f->r2, 0.999);
    EXPECT_LE(f->max_rel_residual, 2.5 * c.noise + 1e-9);
    EXPECT_EQ(f->points, static_cast<int>(pts.size()));
    EXPECT_FALSE(f->alpha_clamped);
    // The reported residual bounds the fit's own samples.
    for (const SizeTime& p : pts)
      EXPECT_LE(std::fabs(f->predict_s(p.bytes) - p.seconds) / p.seconds,
                f->max_rel_residual + 1e-12);
  }
}

TEST(AlphaBetaFit, NoiseFreeFitIsExactAndR2IsOne) {
  const auto pts = synthetic(7e-6, 20e9, 0);
  Result<AlphaBetaFit> f = fit_alpha_beta(pts);
  ASSERT_TRUE(f.is_ok());
  EXPECT_NEAR(f->alpha_s, 7e-6, 7e-6 * 1e-9);
  EXPECT_NEAR(f->beta_Bps, 20e9, 20e9 * 1e-9);
  EXPECT_NEAR(f->r2, 1.0, 1e-12);
  EXPECT_LT(f->max_rel_residual, 1e-9);
}

TEST(AlphaBetaFit, NegativeLatencyIsClampedToALineThroughTheOrigin) {
  // Pure bandwidth with the smallest sizes measured a little fast.
  std::vector<SizeTime> pts;
  for (double s = 1e6; s <= 1e9; s *= 10) pts.push_back({s, s / 10e9});
  pts[0].seconds *= 0.5;
  Result<AlphaBetaFit> f = fit_alpha_beta(pts);
  ASSERT_TRUE(f.is_ok());
  EXPECT_TRUE(f->alpha_clamped);
  EXPECT_EQ(f->alpha_s, 0);
  EXPECT_GT(f->beta_Bps, 0);
}

TEST(AlphaBetaFit, RejectsDegenerateSamples) {
  const std::vector<SizeTime> one_size = {{1024, 1e-6}, {1024, 2e-6}};
  EXPECT_NE(fit_alpha_beta(one_size).status().message().find("two distinct sizes"),
            std::string::npos);
  const std::vector<SizeTime> zero = {{1024, 0}, {2048, 1e-6}};
  EXPECT_NE(fit_alpha_beta(zero).status().message().find("not positive"), std::string::npos);
  const std::vector<SizeTime> shrinking = {{1024, 2e-6}, {1e9, 1e-6}};
  EXPECT_NE(fit_alpha_beta(shrinking).status().message().find("does not grow"), std::string::npos);
  // The bounds fallback still gives a usable line, flagged.
  AlphaBetaFit b = fit_alpha_beta_or_bounds(one_size);
  EXPECT_TRUE(b.fallback);
  EXPECT_GT(b.beta_Bps, 0);
  AlphaBetaFit s = fit_alpha_beta_or_bounds(shrinking);
  EXPECT_TRUE(s.fallback);
  EXPECT_EQ(s.alpha_s, 0);
  EXPECT_NEAR(s.beta_Bps, 1e15, 1);
}

TEST(TimingStats, MedianAndPercentiles) {
  TimingStats t = summarize({5, 1, 4, 2, 3});
  EXPECT_EQ(t.median_s, 3);
  EXPECT_EQ(t.min_s, 1);
  EXPECT_EQ(t.max_s, 5);
  EXPECT_NEAR(t.p10_s, 1.4, 1e-12);
  EXPECT_NEAR(t.p90_s, 4.6, 1e-12);
  EXPECT_EQ(t.reps, 5);
  EXPECT_EQ(summarize({2.5}).median_s, 2.5);
}

}  // namespace
}  // namespace hetpar::calibrate

// The GEMM shapes a calibration measures, derived from the model zoo: every GEMM of every
// zoo model's op graph (micro-batch 1, the LLM at 4096 tokens per sample, each encoder at
// its own tokens), under tensor parallelism 1..8 (N split for column-parallel, K split for
// row-parallel: both are taken for every GEMM, a superset of what the planner applies),
// in all three passes (forward m x n x k, dgrad m x k x n, wgrad k x n x m). Each
// dimension is rounded to the nearest power of two in log space and duplicates dropped,
// which keeps the grid to a few hundred shapes while every zoo shape lies within a factor
// sqrt(2) of a grid point per dimension. Skinny shapes come from the zoo itself (per-expert
// token counts of MoE layers, KV projections of GQA models under TP 8, routers).
#pragma once

#include <cstdint>
#include <vector>

namespace hetpar::calibrate {

struct GemmDims {
  int64_t m = 0, n = 0, k = 0;
  bool operator==(const GemmDims&) const = default;
  auto operator<=>(const GemmDims&) const = default;
  double flops() const { return 2.0 * static_cast<double>(m) * n * k; }
};

/// Every zoo GEMM under TP 1..max_tp, unrounded (for coverage checks), sorted, unique.
std::vector<GemmDims> zoo_gemm_shapes(int max_tp = 8);
/// The calibration grid: zoo_gemm_shapes rounded to powers of two, with every dimension
/// capped at `max_dim` (0 = no cap: a capped grid keeps the zoo's aspect ratios up to the
/// cap, for slow backends), sorted, unique.
std::vector<GemmDims> zoo_gemm_grid(int64_t max_dim = 0, int max_tp = 8);
/// Nearest power of two to v >= 1 in log space.
int64_t round_pow2(int64_t v);

}  // namespace hetpar::calibrate

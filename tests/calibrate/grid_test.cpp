// The GEMM grid covers the model zoo's shapes under TP 1..8.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "hetpar/calibrate/gemm_grid.h"

namespace hetpar::calibrate {
namespace {

TEST(GemmGrid, EveryZooShapeIsWithinSqrt2OfAGridPointPerDimension) {
  const std::vector<GemmDims> shapes = zoo_gemm_shapes();
  const std::vector<GemmDims> grid = zoo_gemm_grid();
  ASSERT_GT(shapes.size(), 100u);
  EXPECT_LT(grid.size(), 800u);  // a sweep, not a census
  EXPECT_LT(grid.size(), shapes.size());
  for (const GemmDims& s : shapes) {
    auto far = [](int64_t a, int64_t b) {
      return std::fabs(std::log2(static_cast<double>(a) / static_cast<double>(b))) > 0.5 + 1e-9;
    };
    const bool covered = std::any_of(grid.begin(), grid.end(), [&](const GemmDims& g) {
      return !far(s.m, g.m) && !far(s.n, g.n) && !far(s.k, g.k);
    });
    EXPECT_TRUE(covered) << s.m << "x" << s.n << "x" << s.k;
  }
  // Skinny shapes are in: some dimension at 128 or below (MoE experts, GQA under TP 8).
  EXPECT_TRUE(std::any_of(grid.begin(), grid.end(), [](const GemmDims& g) {
    return std::min({g.m, g.n, g.k}) <= 128;
  }));
  // TP 8 shards appear next to the unsharded shapes: Llama-3.1-70B's MLP fc1 (28672 wide).
  auto has = [&](int64_t m, int64_t n, int64_t k) {
    return std::find(shapes.begin(), shapes.end(), GemmDims{m, n, k}) != shapes.end();
  };
  EXPECT_TRUE(has(4096, 2 * 28672, 8192) || has(4096, 28672, 8192));
  EXPECT_TRUE(has(4096, 2 * 28672 / 8, 8192) || has(4096, 28672 / 8, 8192));
}

TEST(GemmGrid, CapKeepsEveryDimensionBelowIt) {
  for (const GemmDims& g : zoo_gemm_grid(1024)) {
    EXPECT_LE(g.m, 1024);
    EXPECT_LE(g.n, 1024);
    EXPECT_LE(g.k, 1024);
  }
  EXPECT_EQ(round_pow2(1), 1);
  EXPECT_EQ(round_pow2(3), 4);  // log2(3) = 1.58
  EXPECT_EQ(round_pow2(5), 4);
  EXPECT_EQ(round_pow2(11008), 8192);  // log2 = 13.43
  EXPECT_EQ(round_pow2(14336), 16384);
}

}  // namespace
}  // namespace hetpar::calibrate

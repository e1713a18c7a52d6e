// The cpu backend's GEMM against a naive triple loop: transposes, batches, alpha/beta, dtypes.
#include <gtest/gtest.h>

#include <cmath>

#include "test_util.h"

namespace hetpar::runtime {
namespace {

using testing::download;
using testing::must_make;
using testing::random_values;
using testing::upload;

// Column-major element (r, c) of a stored matrix with `rows` rows.
float at(const std::vector<float>& m, int64_t offset, int64_t rows, int64_t r, int64_t c) {
  return m[offset + c * rows + r];
}

std::vector<float> naive_gemm(const GemmDesc& d, const std::vector<float>& a,
                              const std::vector<float>& b, const std::vector<float>& c0) {
  std::vector<float> c = c0;
  for (int64_t i = 0; i < d.batch; ++i) {
    for (int64_t r = 0; r < d.m; ++r) {
      for (int64_t col = 0; col < d.n; ++col) {
        double acc = 0;
        for (int64_t x = 0; x < d.k; ++x) {
          float av = d.trans_a ? at(a, i * d.m * d.k, d.k, x, r) : at(a, i * d.m * d.k, d.m, r, x);
          float bv =
              d.trans_b ? at(b, i * d.k * d.n, d.n, col, x) : at(b, i * d.k * d.n, d.k, x, col);
          acc += static_cast<double>(av) * bv;
        }
        float& out = c[i * d.m * d.n + col * d.m + r];
        out = static_cast<float>(d.alpha * acc + (d.beta == 0 ? 0.0 : d.beta * out));
      }
    }
  }
  return c;
}

struct GemmCase {
  bool ta, tb;
  int64_t batch;
  float alpha, beta;
  DType dtype;
  bool fp32_c = false;
};

class CpuGemm : public ::testing::TestWithParam<GemmCase> {};

TEST_P(CpuGemm, MatchesANaiveLoop) {
  const GemmCase p = GetParam();
  auto be = must_make("cpu");
  ASSERT_NE(be, nullptr);
  GemmDesc d{.m = 5,
             .n = 7,
             .k = 9,
             .batch = p.batch,
             .trans_a = p.ta,
             .trans_b = p.tb,
             .dtype = p.dtype,
             .alpha = p.alpha,
             .beta = p.beta,
             .fp32_c = p.fp32_c};
  const DType ct = d.c_dtype();
  auto a = random_values(d.dtype, d.m * d.k * d.batch, 1, 1.0f);
  auto b = random_values(d.dtype, d.k * d.n * d.batch, 2, 1.0f);
  auto c0 = random_values(ct, d.m * d.n * d.batch, 3, 1.0f);
  Buffer ba = upload(*be, d.dtype, a), bb = upload(*be, d.dtype, b), bc = upload(*be, ct, c0);
  ASSERT_TRUE(be->gemm(kComputeStream, d, ba, bb, bc).is_ok());
  auto got = download(*be, bc, ct, d.m * d.n * d.batch);
  auto want = naive_gemm(d, a, b, c0);
  for (size_t i = 0; i < want.size(); ++i) {
    // fp32 accumulation, one rounding of the result to C's type.
    EXPECT_NEAR(got[i], want[i], 1e-5f * d.k + testing::eps(ct) * std::fabs(want[i])) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CpuGemm,
                         ::testing::Values(GemmCase{false, false, 1, 1.0f, 0.0f, DType::kF32},
                                           GemmCase{true, false, 1, 1.0f, 0.0f, DType::kF32},
                                           GemmCase{false, true, 1, 1.0f, 0.0f, DType::kF32},
                                           GemmCase{true, true, 1, 1.0f, 0.0f, DType::kF32},
                                           GemmCase{false, false, 3, 0.5f, 1.0f, DType::kF32},
                                           GemmCase{true, true, 2, 2.0f, -0.5f, DType::kF32},
                                           GemmCase{false, true, 2, 1.0f, 1.0f, DType::kBf16},
                                           GemmCase{true, false, 1, 1.0f, 0.0f, DType::kF16},
                                           GemmCase{true, false, 2, 1.0f, 0.5f, DType::kF8E4M3},
                                           // A weight gradient added into an fp32 main_grad.
                                           GemmCase{true, false, 1, 1.0f, 1.0f, DType::kBf16, true},
                                           GemmCase{true, false, 2, 1.0f, 1.0f, DType::kF8E4M3,
                                                    true}));

TEST(CpuGemmBeta, BetaZeroIgnoresWhatCHolds) {
  auto be = must_make("cpu");
  GemmDesc d{.m = 2, .n = 2, .k = 1, .dtype = DType::kF32};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Buffer a = upload(*be, DType::kF32, std::vector<float>{1, 2});
  Buffer b = upload(*be, DType::kF32, std::vector<float>{3, 4});
  Buffer c = upload(*be, DType::kF32, std::vector<float>{nan, nan, nan, nan});
  ASSERT_TRUE(be->gemm(kComputeStream, d, a, b, c).is_ok());
  EXPECT_EQ(download(*be, c, DType::kF32, 4), (std::vector<float>{3, 6, 4, 8}));
}

}  // namespace
}  // namespace hetpar::runtime

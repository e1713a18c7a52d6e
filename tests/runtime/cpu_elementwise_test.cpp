// The cpu backend's elementwise ops against their formulas; backward ops against finite
// differences of the forward ones.
#include <gtest/gtest.h>

#include <cmath>

#include "test_util.h"

namespace hetpar::runtime {
namespace {

using testing::download;
using testing::must_make;
using testing::random_values;
using testing::upload;

std::vector<float> run(Backend& be, ElementwiseDesc d, const std::vector<float>& x,
                       const std::vector<float>& y = {}) {
  Buffer bx = upload(be, d.dtype, x);
  Buffer by = upload(be, d.dtype, y.empty() ? x : y);
  Buffer out = testing::zeros(be, d.dtype, d.elements);
  std::vector<const Buffer*> in = {&bx};
  if (elementwise_inputs(d.op) == 2) in.push_back(&by);
  Status st = be.elementwise(kComputeStream, d, in, out);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return download(be, out, d.dtype, d.elements);
}

double gelu(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST(CpuElementwise, ForwardOpsMatchTheirFormulas) {
  auto be = must_make("cpu");
  const int64_t n = 20000;  // more than one internal chunk
  for (DType t : {DType::kF32, DType::kBf16, DType::kF16}) {
    auto x = random_values(t, n, 1, 3.0f), y = random_values(t, n, 2, 3.0f);
    auto tol = [&](double want) { return 1e-6 + 2 * testing::eps(t) * std::fabs(want); };
    auto copy = run(*be, {.op = ElementwiseOp::kCopy, .elements = n, .dtype = t}, x);
    EXPECT_EQ(copy, x);
    auto add =
        run(*be, {.op = ElementwiseOp::kAdd, .elements = n, .scale = -0.5f, .dtype = t}, x, y);
    auto scale =
        run(*be, {.op = ElementwiseOp::kScale, .elements = n, .scale = 3.0f, .dtype = t}, x);
    auto mul = run(*be, {.op = ElementwiseOp::kMul, .elements = n, .dtype = t}, x, y);
    auto g = run(*be, {.op = ElementwiseOp::kGelu, .elements = n, .dtype = t}, x);
    for (int64_t i = 0; i < n; i += 7) {
      double w = x[i] - 0.5 * y[i];
      EXPECT_NEAR(add[i], w, tol(w));
      EXPECT_NEAR(scale[i], 3.0 * x[i], tol(3.0 * x[i]));
      EXPECT_NEAR(mul[i], double(x[i]) * y[i], tol(double(x[i]) * y[i]));
      EXPECT_NEAR(g[i], gelu(x[i]), tol(gelu(x[i])) + 1e-6);
    }
  }
}

TEST(CpuElementwise, RmsNormMakesRowsOfUnitRms) {
  auto be = must_make("cpu");
  const int64_t rows = 3, w = 5000;
  auto x = random_values(DType::kF32, rows * w, 1, 2.0f);
  auto y = run(
      *be,
      {.op = ElementwiseOp::kRmsNorm, .elements = rows * w, .row_size = w, .dtype = DType::kF32},
      x);
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0, xs = 0;
    for (int64_t j = 0; j < w; ++j) ms += double(y[r * w + j]) * y[r * w + j];
    for (int64_t j = 0; j < w; ++j) xs += double(x[r * w + j]) * x[r * w + j];
    EXPECT_NEAR(ms / w, 1.0, 1e-4);
    EXPECT_NEAR(y[r * w + 1], x[r * w + 1] / std::sqrt(xs / w + 1e-6), 1e-5);
  }
}

TEST(CpuElementwise, BackwardOpsMatchFiniteDifferences) {
  auto be = must_make("cpu");
  const int64_t rows = 2, w = 6, n = rows * w;
  auto x = random_values(DType::kF32, n, 1, 2.0f), dy = random_values(DType::kF32, n, 2, 1.0f);
  auto loss = [&](ElementwiseOp op, const std::vector<float>& xx) {
    auto y = run(*be, {.op = op, .elements = n, .row_size = w, .dtype = DType::kF32}, xx);
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += double(y[i]) * dy[i];
    return s;
  };
  for (auto [fwd, bwd] : {std::pair{ElementwiseOp::kGelu, ElementwiseOp::kGeluBackward},
                          std::pair{ElementwiseOp::kRmsNorm, ElementwiseOp::kRmsNormBackward}}) {
    auto dx = run(*be, {.op = bwd, .elements = n, .row_size = w, .dtype = DType::kF32}, x, dy);
    for (int64_t i = 0; i < n; ++i) {
      auto xp = x, xm = x;
      xp[i] += 1e-2f;
      xm[i] -= 1e-2f;
      EXPECT_NEAR(dx[i], (loss(fwd, xp) - loss(fwd, xm)) / 2e-2, 2e-3) << i;
    }
  }
}

TEST(CpuElementwise, RowOpsNeedRowSizeDividingElements) {
  auto be = must_make("cpu");
  Buffer b = testing::zeros(*be, DType::kF32, 10);
  const Buffer* in[] = {&b};
  Status st = be->elementwise(
      kComputeStream, {.op = ElementwiseOp::kRmsNorm, .elements = 10, .row_size = 4}, in, b);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
}

}  // namespace
}  // namespace hetpar::runtime

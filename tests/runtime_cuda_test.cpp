// The cuda backend against the cpu backend on the same inputs: fill_random bit for bit,
// GEMMs in every dtype, attention forward/backward (GQA, causal, windowed), elementwise ops,
// collectives on a world-sized group, events. Labelled `gpu` in ctest; every test skips
// (GTEST_SKIP, with the reason) where make_backend("cuda") is unavailable: no GPU, or a
// build without CUDA/NCCL.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "runtime/test_util.h"

namespace hetpar::runtime {
namespace {

using testing::download;
using testing::upload;

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    auto r = make_backend("cuda");
    if (!r.is_ok()) {
      if (r.status().code() == Status::Code::kUnavailable) {
        GTEST_SKIP() << r.status().message();
      }
      FAIL() << r.status().to_string();
    }
    gpu_ = std::move(r).value();
    cpu_ = testing::must_make("cpu");
  }
  // The same values on both backends.
  std::pair<Buffer, Buffer> both(DType t, int64_t n, uint64_t seed, float scale = 1.0f) {
    auto v = testing::random_values(t, n, seed, scale);
    return {upload(*cpu_, t, v), upload(*gpu_, t, v)};
  }
  void expect_close(const Buffer& c, const Buffer& g, DType t, int64_t n, float abs_tol,
                    const char* what) {
    auto want = download(*cpu_, c, t, n), got = download(*gpu_, g, t, n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(got[i], want[i], abs_tol + 2 * testing::eps(t) * std::fabs(want[i]))
          << what << "[" << i << "] " << to_string(t);
    }
  }
  std::unique_ptr<Backend> gpu_, cpu_;
};

TEST_F(Cuda, InfoNamesTheDevice) {
  EXPECT_EQ(gpu_->info().backend, "cuda");
  EXPECT_FALSE(gpu_->info().name.empty());
  EXPECT_GT(gpu_->info().memory.count(), 0);
  EXPECT_NE(gpu_->info().versions.find("NCCL"), std::string::npos);
}

TEST_F(Cuda, FillRandomIsBitIdenticalToTheHost) {
  for (DType t : {DType::kF32, DType::kBf16, DType::kF16, DType::kF8E4M3}) {
    auto b = gpu_->allocate(Bytes(100000 * dtype_bytes(t)));
    ASSERT_TRUE(b.is_ok());
    ASSERT_TRUE(gpu_->fill_random(kComputeStream, *b, t, 100000, 9, 3.0f).is_ok());
    EXPECT_EQ(download(*gpu_, *b, t, 100000), testing::random_values(t, 100000, 9, 3.0f))
        << to_string(t);
  }
}

TEST_F(Cuda, GemmsMatchTheCpuBackend) {
  struct Case {
    int64_t m, n, k, batch;
    bool ta, tb;
    DType t;
    float beta;
    bool fp32_c = false;  // a weight gradient added into an fp32 main_grad
  };
  for (const Case& c : {Case{64, 48, 32, 1, false, false, DType::kF32, 0.0f},
                        Case{128, 64, 256, 2, true, false, DType::kBf16, 0.0f},
                        Case{96, 80, 64, 1, false, true, DType::kF16, 1.0f},
                        Case{64, 64, 128, 3, true, true, DType::kBf16, 0.5f},
                        Case{128, 128, 128, 1, true, false, DType::kF8E4M3, 0.0f},
                        Case{128, 64, 256, 1, true, false, DType::kBf16, 1.0f, true},
                        Case{128, 128, 128, 1, true, false, DType::kF8E4M3, 1.0f, true}}) {
    GemmDesc d{.m = c.m,
               .n = c.n,
               .k = c.k,
               .batch = c.batch,
               .trans_a = c.ta,
               .trans_b = c.tb,
               .dtype = c.t,
               .beta = c.beta,
               .fp32_c = c.fp32_c};
    auto [ca, ga] = both(c.t, c.m * c.k * c.batch, 1);
    auto [cb, gb] = both(c.t, c.k * c.n * c.batch, 2);
    auto [cc, gc] = both(d.c_dtype(), c.m * c.n * c.batch, 3);
    ASSERT_TRUE(cpu_->gemm(kComputeStream, d, ca, cb, cc).is_ok());
    Status st = gpu_->gemm(kComputeStream, d, ga, gb, gc);
    if (c.t == DType::kF8E4M3 && st.code() == Status::Code::kUnavailable) continue;  // pre-sm_89
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    // Hopper's FP8 tensor cores accumulate in about 14 bits between cuBLASLt's promotions
    // to fp32 (DeepSeek-V3 technical report, 3.3.2): up to 2^-13 of the sum of |a_i b_i|,
    // k/4 for these uniform inputs; an H200 missed fp32 by 1.8e-3 at k = 128 (2026-12-04).
    const float fp8_accumulation = c.t == DType::kF8E4M3 ? c.k / 4.0f * std::ldexp(1.0f, -13) : 0;
    expect_close(cc, gc, d.c_dtype(), c.m * c.n * c.batch,
                 1e-4f * std::sqrt(float(c.k)) + fp8_accumulation, "C");
  }
}

TEST_F(Cuda, AttentionMatchesTheCpuBackend) {
  // Unmasked, causal, causal with a 16-key sliding window, and that with attention sinks.
  for (int mask : {0, 1, 2, 3}) {
    AttentionDesc d{.batch = 2,
                    .heads = 4,
                    .kv_heads = 2,
                    .seq_q = 48,
                    .seq_kv = 64,
                    .head_dim = 32,
                    .causal = mask > 0,
                    .window = mask >= 2 ? 16 : 0,
                    .sinks = mask == 3,
                    .dtype = DType::kBf16};
    const int64_t nq = d.batch * d.seq_q * d.heads * d.head_dim;
    const int64_t nkv = d.batch * d.seq_kv * d.kv_heads * d.head_dim;
    const int64_t ns = d.batch * d.heads * d.seq_q;
    auto [cq, gq] = both(d.dtype, nq, 1);
    auto [ck, gk] = both(d.dtype, nkv, 2);
    auto [cv, gv] = both(d.dtype, nkv, 3);
    auto [cdo, gdo] = both(d.dtype, nq, 4);
    Buffer co = testing::zeros(*cpu_, d.dtype, nq), go = testing::zeros(*gpu_, d.dtype, nq);
    Buffer cs = testing::zeros(*cpu_, DType::kF32, ns), gs = testing::zeros(*gpu_, DType::kF32, ns);
    auto [csk, gsk] = both(DType::kF32, d.heads, 5, 2.0f);
    const Buffer* cs_in = d.sinks ? &csk : nullptr;
    const Buffer* gs_in = d.sinks ? &gsk : nullptr;
    ASSERT_TRUE(cpu_->attention_forward(kComputeStream, d, cq, ck, cv, cs_in, co, cs).is_ok());
    Status st = gpu_->attention_forward(kComputeStream, d, gq, gk, gv, gs_in, go, gs);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    expect_close(co, go, d.dtype, nq, 2e-3f, "out");
    auto lse_c = download(*cpu_, cs, DType::kF32, ns), lse_g = download(*gpu_, gs, DType::kF32, ns);
    for (int64_t i = 0; i < ns; ++i) {
      if (std::isinf(lse_c[i])) {
        EXPECT_TRUE(std::isinf(lse_g[i])) << i;
      } else {
        EXPECT_NEAR(lse_g[i], lse_c[i], 1e-3f) << i;
      }
    }
    Buffer cdq = testing::zeros(*cpu_, d.dtype, nq), gdq = testing::zeros(*gpu_, d.dtype, nq);
    Buffer cdk = testing::zeros(*cpu_, d.dtype, nkv), gdk = testing::zeros(*gpu_, d.dtype, nkv);
    Buffer cdv = testing::zeros(*cpu_, d.dtype, nkv), gdv = testing::zeros(*gpu_, d.dtype, nkv);
    Buffer cds = testing::zeros(*cpu_, DType::kF32, d.heads),
           gds = testing::zeros(*gpu_, DType::kF32, d.heads);
    ASSERT_TRUE(cpu_->attention_backward(kComputeStream, d, cq, ck, cv, cs_in, co, cdo, cs, cdq,
                                         cdk, cdv, d.sinks ? &cds : nullptr)
                    .is_ok());
    st = gpu_->attention_backward(kComputeStream, d, gq, gk, gv, gs_in, go, gdo, gs, gdq, gdk, gdv,
                                  d.sinks ? &gds : nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    expect_close(cdq, gdq, d.dtype, nq, 1e-2f, "dq");
    expect_close(cdk, gdk, d.dtype, nkv, 1e-2f, "dk");
    expect_close(cdv, gdv, d.dtype, nkv, 1e-2f, "dv");
    // A head's sink gradient sums b * seq_q rows: tolerance to match.
    if (d.sinks) expect_close(cds, gds, DType::kF32, d.heads, 5e-2f, "d_sinks");
  }
}

TEST_F(Cuda, ElementwiseOpsMatchTheCpuBackend) {
  const int64_t rows = 16, w = 1000, n = rows * w;
  for (DType t : {DType::kF32, DType::kBf16, DType::kF16}) {
    auto [cx, gx] = both(t, n, 1, 3.0f);
    auto [cy, gy] = both(t, n, 2, 3.0f);
    for (ElementwiseOp op : {ElementwiseOp::kCopy, ElementwiseOp::kAdd, ElementwiseOp::kScale,
                             ElementwiseOp::kGelu, ElementwiseOp::kRmsNorm, ElementwiseOp::kMul,
                             ElementwiseOp::kGeluBackward, ElementwiseOp::kRmsNormBackward}) {
      ElementwiseDesc d{.op = op, .elements = n, .row_size = w, .scale = 0.5f, .dtype = t};
      Buffer co = testing::zeros(*cpu_, t, n), go = testing::zeros(*gpu_, t, n);
      std::vector<const Buffer*> ci = {&cx, &cy}, gi = {&gx, &gy};
      ci.resize(elementwise_inputs(op));
      gi.resize(elementwise_inputs(op));
      ASSERT_TRUE(cpu_->elementwise(kComputeStream, d, ci, co).is_ok());
      Status st = gpu_->elementwise(kComputeStream, d, gi, go);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      expect_close(co, go, t, n, 1e-4f, "elementwise");
    }
  }
}

TEST_F(Cuda, CollectivesOnTheWorldGroup) {
  const int world = gpu_->info().world, rank = gpu_->info().rank;
  std::vector<int> all(world);
  std::iota(all.begin(), all.end(), 0);
  auto g = gpu_->make_group(all);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  std::vector<float> mine(1000, static_cast<float>(rank + 1));
  Buffer send = upload(*gpu_, DType::kBf16, mine);
  Buffer recv = testing::zeros(*gpu_, DType::kBf16, 1000 * world);
  ASSERT_TRUE(gpu_->all_reduce(kCommStream, *g, send, recv, 1000, DType::kBf16).is_ok());
  ASSERT_TRUE(gpu_->synchronize().is_ok());
  EXPECT_EQ(download(*gpu_, recv, DType::kBf16, 1000),
            std::vector<float>(1000, world * (world + 1) / 2.0f));
  ASSERT_TRUE(gpu_->all_gather(kCommStream, *g, send, recv, 1000, DType::kBf16).is_ok());
  ASSERT_TRUE(gpu_->synchronize().is_ok());
  auto gathered = download(*gpu_, recv, DType::kBf16, 1000 * world);
  for (int r = 0; r < world; ++r) EXPECT_EQ(gathered[r * 1000], r + 1.0f);
}

TEST_F(Cuda, EventsTimeAGemm) {
  GemmDesc d{.m = 2048, .n = 2048, .k = 2048, .dtype = DType::kBf16};
  auto a = gpu_->allocate(Bytes(2048 * 2048 * 2));
  auto c = gpu_->allocate(Bytes(2048 * 2048 * 2));
  ASSERT_TRUE(a.is_ok() && c.is_ok());
  ASSERT_TRUE(gpu_->fill_random(kComputeStream, *a, DType::kBf16, 2048 * 2048, 1, 1.0f).is_ok());
  ASSERT_TRUE(gpu_->flush_cache(kComputeStream).is_ok());
  auto e0 = gpu_->record(kComputeStream);
  ASSERT_TRUE(gpu_->gemm(kComputeStream, d, *a, *a, *c).is_ok());
  auto e1 = gpu_->record(kComputeStream);
  ASSERT_TRUE(e0.is_ok() && e1.is_ok());
  auto t = gpu_->elapsed(*e0, *e1);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_GT(*t, Time::zero());
  std::printf("bf16 2048^3 GEMM: %.1f us, %.0f TFLOP/s\n", t->to_us(),
              d.flops() / t->to_seconds() * 1e-12);
}

}  // namespace
}  // namespace hetpar::runtime

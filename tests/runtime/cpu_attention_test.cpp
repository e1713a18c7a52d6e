// The cpu backend's attention against a naive reference (forward) and against finite
// differences of the forward (backward), with GQA, causal masks, sliding windows and seq_q !=
// seq_kv.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "test_util.h"

namespace hetpar::runtime {
namespace {

using testing::download;
using testing::must_make;
using testing::random_values;
using testing::upload;

// out and lse by definition, in double, one (b, h, i) at a time.
void naive_attention(const AttentionDesc& d, const std::vector<float>& q,
                     const std::vector<float>& k, const std::vector<float>& v,
                     std::vector<double>& out, std::vector<double>& lse) {
  const int64_t H = d.heads, KH = d.kv_heads, D = d.head_dim, g = H / KH;
  out.assign(q.size(), 0.0);
  lse.assign(static_cast<size_t>(d.batch * H * d.seq_q), 0.0);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < d.seq_q; ++i) {
        std::vector<double> s;
        std::vector<int64_t> keys;
        for (int64_t j = 0; j < d.seq_kv; ++j) {
          if (d.causal && j > i + d.seq_kv - d.seq_q) break;
          if (d.causal && d.window > 0 && j < i + d.seq_kv - d.seq_q - d.window) continue;
          keys.push_back(j);
          double dot = 0;
          for (int64_t x = 0; x < D; ++x) {
            dot += static_cast<double>(q[((b * d.seq_q + i) * H + h) * D + x]) *
                   k[((b * d.seq_kv + j) * KH + h / g) * D + x];
          }
          s.push_back(dot / std::sqrt(static_cast<double>(D)));
        }
        double& l = lse[(b * H + h) * d.seq_q + i];
        if (s.empty()) {
          l = -std::numeric_limits<double>::infinity();
          continue;
        }
        double mx = *std::max_element(s.begin(), s.end()), sum = 0;
        for (double x : s) sum += std::exp(x - mx);
        l = mx + std::log(sum);
        for (size_t j = 0; j < s.size(); ++j) {
          double p = std::exp(s[j] - l);
          for (int64_t x = 0; x < D; ++x) {
            out[((b * d.seq_q + i) * H + h) * D + x] +=
                p * v[((b * d.seq_kv + keys[j]) * KH + h / g) * D + x];
          }
        }
      }
    }
  }
}

struct AttnCase {
  int64_t batch, heads, kv_heads, seq_q, seq_kv, head_dim;
  bool causal;
  int64_t window = 0;
};

class CpuAttention : public ::testing::TestWithParam<AttnCase> {
 protected:
  AttentionDesc desc(DType t) const {
    const AttnCase p = GetParam();
    return {.batch = p.batch,
            .heads = p.heads,
            .kv_heads = p.kv_heads,
            .seq_q = p.seq_q,
            .seq_kv = p.seq_kv,
            .head_dim = p.head_dim,
            .causal = p.causal,
            .window = p.window,
            .dtype = t};
  }
};

TEST_P(CpuAttention, ForwardMatchesTheDefinition) {
  for (DType t : {DType::kF32, DType::kBf16}) {
    const AttentionDesc d = desc(t);
    auto be = must_make("cpu");
    const int64_t nq = d.batch * d.seq_q * d.heads * d.head_dim;
    const int64_t nkv = d.batch * d.seq_kv * d.kv_heads * d.head_dim;
    auto q = random_values(t, nq, 1, 1.0f), k = random_values(t, nkv, 2, 1.0f),
         v = random_values(t, nkv, 3, 1.0f);
    Buffer bq = upload(*be, t, q), bk = upload(*be, t, k), bv = upload(*be, t, v);
    Buffer out = testing::zeros(*be, t, nq);
    Buffer stats = testing::zeros(*be, DType::kF32, d.batch * d.heads * d.seq_q);
    ASSERT_TRUE(be->attention_forward(kComputeStream, d, bq, bk, bv, out, stats).is_ok());
    std::vector<double> want_out, want_lse;
    naive_attention(d, q, k, v, want_out, want_lse);
    auto got_out = download(*be, out, t, nq);
    auto got_lse = download(*be, stats, DType::kF32, d.batch * d.heads * d.seq_q);
    for (size_t i = 0; i < want_out.size(); ++i) {
      EXPECT_NEAR(got_out[i], want_out[i], 1e-5 + testing::eps(t)) << i;
    }
    for (size_t i = 0; i < want_lse.size(); ++i) {
      if (std::isinf(want_lse[i])) {
        EXPECT_TRUE(std::isinf(got_lse[i]) && got_lse[i] < 0) << i;
      } else {
        EXPECT_NEAR(got_lse[i], want_lse[i], 1e-5) << i;
      }
    }
  }
}

// loss = sum(out o W); its gradients by central differences in double on the definition.
TEST_P(CpuAttention, BackwardMatchesFiniteDifferences) {
  const AttentionDesc d = desc(DType::kF32);
  auto be = must_make("cpu");
  const int64_t nq = d.batch * d.seq_q * d.heads * d.head_dim;
  const int64_t nkv = d.batch * d.seq_kv * d.kv_heads * d.head_dim;
  auto q = random_values(DType::kF32, nq, 1, 1.0f), k = random_values(DType::kF32, nkv, 2, 1.0f),
       v = random_values(DType::kF32, nkv, 3, 1.0f), w = random_values(DType::kF32, nq, 4, 1.0f);
  Buffer bq = upload(*be, DType::kF32, q), bk = upload(*be, DType::kF32, k),
         bv = upload(*be, DType::kF32, v), bw = upload(*be, DType::kF32, w);
  Buffer out = testing::zeros(*be, DType::kF32, nq);
  Buffer stats = testing::zeros(*be, DType::kF32, d.batch * d.heads * d.seq_q);
  ASSERT_TRUE(be->attention_forward(kComputeStream, d, bq, bk, bv, out, stats).is_ok());
  Buffer dq = testing::zeros(*be, DType::kF32, nq), dk = testing::zeros(*be, DType::kF32, nkv),
         dv = testing::zeros(*be, DType::kF32, nkv);
  ASSERT_TRUE(
      be->attention_backward(kComputeStream, d, bq, bk, bv, out, bw, stats, dq, dk, dv).is_ok());

  auto loss = [&](const std::vector<float>& qq, const std::vector<float>& kk,
                  const std::vector<float>& vv) {
    std::vector<double> o, l;
    naive_attention(d, qq, kk, vv, o, l);
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += o[i] * w[i];
    return s;
  };
  auto check = [&](std::vector<float>& x, const Buffer& grad, const char* name) {
    auto g = download(*be, grad, DType::kF32, static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      const float h = 1e-2f, keep = x[i];
      x[i] = keep + h;
      double up = &x == &q ? loss(x, k, v) : &x == &k ? loss(q, x, v) : loss(q, k, x);
      x[i] = keep - h;
      double down = &x == &q ? loss(x, k, v) : &x == &k ? loss(q, x, v) : loss(q, k, x);
      x[i] = keep;
      EXPECT_NEAR(g[i], (up - down) / (2 * h), 2e-3) << name << "[" << i << "]";
    }
  };
  check(q, dq, "dq");
  check(k, dk, "dk");
  check(v, dv, "dv");
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuAttention,
                         ::testing::Values(AttnCase{1, 1, 1, 3, 3, 4, false},
                                           AttnCase{2, 2, 2, 3, 4, 2, false},
                                           AttnCase{1, 4, 2, 4, 4, 3, true},  // GQA, causal
                                           AttnCase{1, 2, 1, 3, 5, 2, true},  // seq_q < seq_kv
                                           AttnCase{2, 2, 1, 4, 2, 2, true},  // rows see none
                                           // sliding windows: 2 keys before each query; one
                                           // with seq_q < seq_kv
                                           AttnCase{1, 2, 1, 6, 6, 2, true, 2},
                                           AttnCase{1, 2, 2, 3, 5, 2, true, 1}));

}  // namespace
}  // namespace hetpar::runtime

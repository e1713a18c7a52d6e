// The cpu backend's attention against a naive reference (forward) and against finite
// differences of the forward (backward), with GQA, causal masks, sliding windows, attention
// sinks and seq_q != seq_kv.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>

#include "test_util.h"

namespace hetpar::runtime {
namespace {

using testing::download;
using testing::must_make;
using testing::random_values;
using testing::upload;

// out and lse by definition, in double, one (b, h, i) at a time; `sinks` (empty: none) one
// more logit per head in each row's softmax, with no value.
void naive_attention(const AttentionDesc& d, const std::vector<float>& q,
                     const std::vector<float>& k, const std::vector<float>& v,
                     const std::vector<float>& sinks, std::vector<double>& out,
                     std::vector<double>& lse) {
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
        if (s.empty() && sinks.empty()) {
          l = -std::numeric_limits<double>::infinity();
          continue;
        }
        double sum = 0;
        for (double x : s) sum += std::exp(x);
        if (!sinks.empty()) sum += std::exp(static_cast<double>(sinks[h]));
        l = std::log(sum);  // (scores of magnitude ~1: no overflow to guard)
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
  bool sinks = false;
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
            .sinks = p.sinks,
            .dtype = t};
  }
  // The sink logits, in [-2, 2] (empty without sinks).
  std::vector<float> sinks() const {
    const AttnCase p = GetParam();
    return p.sinks ? random_values(DType::kF32, p.heads, 5, 2.0f) : std::vector<float>();
  }
  static std::optional<Buffer> sink_buffer(Backend& be, const std::vector<float>& s) {
    if (s.empty()) return std::nullopt;
    return upload(be, DType::kF32, s);
  }
};
const Buffer* ptr(const std::optional<Buffer>& b) {
  return b ? &*b : nullptr;
}
Buffer* ptr(std::optional<Buffer>& b) {
  return b ? &*b : nullptr;
}

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
    const std::vector<float> sk = sinks();
    const std::optional<Buffer> bs = sink_buffer(*be, sk);
    ASSERT_TRUE(be->attention_forward(kComputeStream, d, bq, bk, bv, ptr(bs), out, stats).is_ok());
    std::vector<double> want_out, want_lse;
    naive_attention(d, q, k, v, sk, want_out, want_lse);
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
  std::vector<float> sk = sinks();
  const std::optional<Buffer> bs = sink_buffer(*be, sk);
  ASSERT_TRUE(be->attention_forward(kComputeStream, d, bq, bk, bv, ptr(bs), out, stats).is_ok());
  Buffer dq = testing::zeros(*be, DType::kF32, nq), dk = testing::zeros(*be, DType::kF32, nkv),
         dv = testing::zeros(*be, DType::kF32, nkv);
  // d_sinks starts non-zero: backward overwrites it.
  std::optional<Buffer> ds = sink_buffer(*be, std::vector<float>(sk.size(), 7.0f));
  ASSERT_TRUE(be->attention_backward(kComputeStream, d, bq, bk, bv, ptr(bs), out, bw, stats, dq, dk,
                                     dv, ptr(ds))
                  .is_ok());

  // loss(x) with x one of q, k, v, sinks perturbed.
  auto loss = [&](const std::vector<float>* changed, const std::vector<float>& x) {
    std::vector<double> o, l;
    auto pick = [&](const std::vector<float>& t) -> const std::vector<float>& {
      return changed == &t ? x : t;
    };
    naive_attention(d, pick(q), pick(k), pick(v), pick(sk), o, l);
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += o[i] * w[i];
    return s;
  };
  auto check = [&](const std::vector<float>& x0, const Buffer& grad, const char* name) {
    auto g = download(*be, grad, DType::kF32, static_cast<int64_t>(x0.size()));
    std::vector<float> x = x0;
    for (size_t i = 0; i < x.size(); ++i) {
      const float h = 1e-2f, keep = x[i];
      x[i] = keep + h;
      const double up = loss(&x0, x);
      x[i] = keep - h;
      const double down = loss(&x0, x);
      x[i] = keep;
      EXPECT_NEAR(g[i], (up - down) / (2 * h), 2e-3) << name << "[" << i << "]";
    }
  };
  check(q, dq, "dq");
  check(k, dk, "dk");
  check(v, dv, "dv");
  if (ds) check(sk, *ds, "d_sinks");
}

TEST(CpuAttentionSinks, BuffersMustMatchTheDesc) {
  auto be = must_make("cpu");
  AttentionDesc d{.heads = 2, .kv_heads = 1, .seq_q = 2, .seq_kv = 2, .head_dim = 2};
  Buffer big = testing::zeros(*be, DType::kBf16, 64);
  Buffer stats = testing::zeros(*be, DType::kF32, 4);
  Buffer one = testing::zeros(*be, DType::kF32, 1);
  Status st = be->attention_forward(kComputeStream, d, big, big, big, &one, big, stats);
  EXPECT_NE(st.message().find("sinks given for a desc without sinks"), std::string::npos)
      << st.message();
  d.sinks = true;
  st = be->attention_forward(kComputeStream, d, big, big, big, nullptr, big, stats);
  EXPECT_NE(st.message().find("sinks set but sinks is null"), std::string::npos) << st.message();
  st = be->attention_forward(kComputeStream, d, big, big, big, &one, big, stats);  // 1 of 2 heads
  EXPECT_NE(st.message().find("attention sinks"), std::string::npos) << st.message();
  Buffer two = testing::zeros(*be, DType::kF32, 2);
  ASSERT_TRUE(be->attention_forward(kComputeStream, d, big, big, big, &two, big, stats).is_ok());
  st = be->attention_backward(kComputeStream, d, big, big, big, &two, big, big, stats, big, big,
                              big, nullptr);
  EXPECT_NE(st.message().find("sinks set but d_sinks is null"), std::string::npos) << st.message();
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
                                           AttnCase{1, 2, 2, 3, 5, 2, true, 1},
                                           // sinks: unmasked, GQA causal with rows that
                                           // see no key, a window
                                           AttnCase{2, 2, 2, 3, 4, 2, false, 0, true},
                                           AttnCase{2, 2, 1, 4, 2, 2, true, 0, true},
                                           AttnCase{1, 2, 1, 6, 6, 2, true, 2, true}));

}  // namespace
}  // namespace hetpar::runtime

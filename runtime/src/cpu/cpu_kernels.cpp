#include "cpu_kernels.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

namespace hetpar::runtime::cpu {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstView = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;
using View = Eigen::Map<RowMat, 0, Eigen::OuterStride<>>;

// The per-(batch, head) slices of the BSHD tensors.
struct Slices {
  const AttentionDesc& d;
  int64_t group() const { return d.heads / d.kv_heads; }
  int64_t q_offset(int64_t b, int64_t h) const { return (b * d.seq_q * d.heads + h) * d.head_dim; }
  int64_t kv_offset(int64_t b, int64_t h) const {
    return (b * d.seq_kv * d.kv_heads + h / group()) * d.head_dim;
  }
  Eigen::OuterStride<> q_stride() const { return Eigen::OuterStride<>(d.heads * d.head_dim); }
  Eigen::OuterStride<> kv_stride() const { return Eigen::OuterStride<>(d.kv_heads * d.head_dim); }
  // Head h of batch b of a q-shaped / kv-shaped tensor, as a seq x head_dim matrix.
  template <class T>
  auto q(T* base, int64_t b, int64_t h) const {
    using M = std::conditional_t<std::is_const_v<T>, ConstView, View>;
    return M(base + q_offset(b, h), d.seq_q, d.head_dim, q_stride());
  }
  template <class T>
  auto kv(T* base, int64_t b, int64_t h) const {
    using M = std::conditional_t<std::is_const_v<T>, ConstView, View>;
    return M(base + kv_offset(b, h), d.seq_kv, d.head_dim, kv_stride());
  }
  // Keys query i sees: all, or (causal, bottom-right aligned) j <= i + seq_kv - seq_q.
  int64_t visible(int64_t i) const {
    if (!d.causal) return d.seq_kv;
    return std::clamp<int64_t>(i + d.seq_kv - d.seq_q + 1, 0, d.seq_kv);
  }
  // The first of them under a sliding window (0 without): keys [first(i), visible(i)).
  int64_t first(int64_t i) const {
    if (!d.causal || d.window <= 0) return 0;
    return std::clamp<int64_t>(i + d.seq_kv - d.seq_q - d.window, 0, visible(i));
  }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(d.head_dim)); }
};

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
constexpr float kRmsEps = 1e-6f;

float gelu(float x) {
  return 0.5f * x * (1.0f + std::tanh(kGeluC * (x + kGeluA * x * x * x)));
}
float gelu_grad(float x) {
  float t = std::tanh(kGeluC * (x + kGeluA * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluA * x * x);
}

}  // namespace

void attention_forward(const AttentionDesc& d, const float* q, const float* k, const float* v,
                       const float* sinks, float* out, float* lse) {
  const Slices sl{d};
  RowMat s(d.seq_q, d.seq_kv);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.heads; ++h) {
      auto Q = sl.q(q, b, h);
      auto K = sl.kv(k, b, h);
      auto V = sl.kv(v, b, h);
      auto O = sl.q(out, b, h);
      s.noalias() = sl.scale() * Q * K.transpose();
      float* stats = lse + (b * d.heads + h) * d.seq_q;
      // The sink joins each row's softmax as one more logit with no value.
      const float sink = sinks ? sinks[h] : -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < d.seq_q; ++i) {
        const int64_t n = sl.visible(i), lo = sl.first(i);
        auto row = s.row(i);
        row.tail(d.seq_kv - n).setZero();
        row.head(lo).setZero();
        if (n == lo) {
          stats[i] = sink;
          continue;
        }
        auto seen = row.segment(lo, n - lo);
        const float mx = std::max(seen.maxCoeff(), sink);
        seen = (seen.array() - mx).exp().matrix();
        const float sum = seen.sum() + std::exp(sink - mx);
        stats[i] = mx + std::log(sum);
        seen /= sum;
      }
      O.noalias() = s * V;
    }
  }
}

void attention_backward(const AttentionDesc& d, const float* q, const float* k, const float* v,
                        const float* sinks, const float* out, const float* d_out, const float* lse,
                        float* dq, float* dk, float* dv, float* d_sinks) {
  const Slices sl{d};
  if (d_sinks != nullptr) std::fill(d_sinks, d_sinks + d.heads, 0.0f);
  RowMat p(d.seq_q, d.seq_kv), ds(d.seq_q, d.seq_kv);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.heads; ++h) {
      auto Q = sl.q(q, b, h);
      auto K = sl.kv(k, b, h);
      auto V = sl.kv(v, b, h);
      auto O = sl.q(out, b, h);
      auto dO = sl.q(d_out, b, h);
      auto dQ = sl.q(dq, b, h);
      auto dK = sl.kv(dk, b, h);
      auto dV = sl.kv(dv, b, h);
      // P from the saved log-sum-exps (as flash attention's backward recomputes it).
      p.noalias() = sl.scale() * Q * K.transpose();
      const float* stats = lse + (b * d.heads + h) * d.seq_q;
      for (int64_t i = 0; i < d.seq_q; ++i) {
        const int64_t n = sl.visible(i), lo = sl.first(i);
        auto row = p.row(i);
        row.tail(d.seq_kv - n).setZero();
        row.head(lo).setZero();
        if (n > lo)
          row.segment(lo, n - lo) = (row.segment(lo, n - lo).array() - stats[i]).exp().matrix();
      }
      // dS = P o (dP - rowsum(dO o O)), dP = dO V^T. The sink's dP is 0 (it has no value),
      // so its logit's gradient is -P_sink * delta.
      ds.noalias() = dO * V.transpose();
      double d_sink = 0;
      for (int64_t i = 0; i < d.seq_q; ++i) {
        const float delta = dO.row(i).dot(O.row(i));
        ds.row(i) = (p.row(i).array() * (ds.row(i).array() - delta)).matrix();
        if (sinks != nullptr) d_sink -= std::exp(sinks[h] - stats[i]) * delta;
      }
      if (d_sinks != nullptr) d_sinks[h] += static_cast<float>(d_sink);
      dQ.noalias() = sl.scale() * ds * K;
      dK.noalias() += sl.scale() * ds.transpose() * Q;
      dV.noalias() += p.transpose() * dO;
    }
  }
}

void elementwise(const ElementwiseDesc& d, const float* const* in, float* out, int64_t n) {
  const float* x = in[0];
  const float* y = elementwise_inputs(d.op) > 1 ? in[1] : nullptr;
  switch (d.op) {
    case ElementwiseOp::kCopy:
      for (int64_t i = 0; i < n; ++i) out[i] = x[i];
      return;
    case ElementwiseOp::kAdd:
      for (int64_t i = 0; i < n; ++i) out[i] = x[i] + d.scale * y[i];
      return;
    case ElementwiseOp::kScale:
      for (int64_t i = 0; i < n; ++i) out[i] = d.scale * x[i];
      return;
    case ElementwiseOp::kMul:
      for (int64_t i = 0; i < n; ++i) out[i] = x[i] * y[i];
      return;
    case ElementwiseOp::kGelu:
      for (int64_t i = 0; i < n; ++i) out[i] = gelu(x[i]);
      return;
    case ElementwiseOp::kGeluBackward:
      for (int64_t i = 0; i < n; ++i) out[i] = gelu_grad(x[i]) * y[i];
      return;
    case ElementwiseOp::kRmsNorm:
    case ElementwiseOp::kRmsNormBackward: {
      const int64_t w = d.row_size;
      for (int64_t r = 0; r < n; r += w) {
        double ms = 0, dot = 0;
        for (int64_t j = r; j < r + w; ++j) {
          ms += static_cast<double>(x[j]) * x[j];
          if (y != nullptr) dot += static_cast<double>(x[j]) * y[j];
        }
        const float inv = static_cast<float>(1.0 / std::sqrt(ms / w + kRmsEps));
        if (d.op == ElementwiseOp::kRmsNorm) {
          for (int64_t j = r; j < r + w; ++j) out[j] = x[j] * inv;
        } else {
          // dx = inv * dy - x * inv^3 * mean(dy o x)
          const float c = static_cast<float>(dot / w) * inv * inv * inv;
          for (int64_t j = r; j < r + w; ++j) out[j] = inv * y[j] - x[j] * c;
        }
      }
      return;
    }
  }
}

}  // namespace hetpar::runtime::cpu

// Launchers of the cuda backend's own kernels (kernels.cu): random fill, elementwise ops,
// and the pieces of unfused attention around cuBLAS's batched GEMMs. Plain C++ so that
// cuda_backend.cpp (built by the host compiler) can call them; dtypes and ops travel as
// the integer values of runtime::DType and runtime::ElementwiseOp. Every launcher returns
// the launch's cudaError_t. Internal to runtime/.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace hetpar::runtime::cuda {

/// dst[i] = random_value(seed_key, i, scale) rounded to `dtype` (see random_hash.h).
cudaError_t launch_fill_random(cudaStream_t s, void* dst, int dtype, int64_t n, uint64_t seed_key,
                               float scale);

/// ElementwiseOp `op` over `n` elements (rows of `row_size` for the row ops); in1 may be null
/// for one-input ops.
cudaError_t launch_elementwise(cudaStream_t s, int op, int dtype, int64_t n, int64_t row_size,
                               float scale, const void* in0, const void* in1, void* out);

/// out[i] = base + b * b_stride + (h / group) * h_stride bytes for pair p = first + i
/// (b = p / heads, h = p % heads), i < count: the per-(batch, head) matrices of a tensor.
cudaError_t launch_pair_pointers(cudaStream_t s, const void** out, const void* base, int64_t first,
                                 int64_t count, int64_t heads, int64_t group, int64_t b_stride,
                                 int64_t h_stride);

/// Row-wise softmax of scaled scores `scores` (rows x seq_kv fp32, row r is query
/// r % seq_q of (batch, head) pair first_pair + r / seq_q), causal bottom-right mask (with
/// `window` > 0 also hiding the keys more than `window` before a query): probabilities to
/// `probs` (dtype), log-sum-exps to `lse` (rows floats, -inf where a query sees no key).
/// `sinks` (null: none): per head fp32 logits that join each row's sum with no value
/// (AttentionDesc::sinks); pair p's head is p % heads.
cudaError_t launch_softmax_forward(cudaStream_t s, const float* scores, void* probs, float* lse,
                                   int dtype, int64_t rows, int64_t seq_q, int64_t seq_kv,
                                   bool causal, int64_t window, const float* sinks,
                                   int64_t first_pair, int64_t heads);

/// d_sinks[h] = -sum over b, i of exp(sinks[h] - lse[b, h, i]) * delta[b, h, i] (fp32).
cudaError_t launch_sink_grad(cudaStream_t s, const float* sinks, const float* lse,
                             const float* delta, float* d_sinks, int64_t batch, int64_t heads,
                             int64_t seq_q);

/// From the scores again: probs = exp(scores - lse) (masked; dtype) and
/// d_scores = probs * (d_probs - delta[row]) (dtype).
cudaError_t launch_softmax_backward(cudaStream_t s, const float* scores, const float* d_probs,
                                    const float* lse, const float* delta, void* probs,
                                    void* d_scores, int dtype, int64_t rows, int64_t seq_q,
                                    int64_t seq_kv, bool causal, int64_t window);

/// delta[(b * heads + h) * seq_q + i] = sum_x d_out[b, i, h, x] * out[b, i, h, x] (BSHD).
cudaError_t launch_attention_delta(cudaStream_t s, const void* out, const void* d_out, float* delta,
                                   int dtype, int64_t batch, int64_t seq_q, int64_t heads,
                                   int64_t head_dim);

/// dst[b, j, kh, x] (BSHD, dtype) = sum over the heads h of kv head kh of
/// src[(b * heads + h), j, x] (fp32 per-query-head gradients).
cudaError_t launch_reduce_kv_grad(cudaStream_t s, const float* src, void* dst, int dtype,
                                  int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq_kv,
                                  int64_t head_dim);

}  // namespace hetpar::runtime::cuda

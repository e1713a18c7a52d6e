// The cuda backend's kernels (see kernels.h). Arithmetic in fp32; loads and stores convert
// with CUDA's round-to-nearest-even intrinsics (fp8: saturating), as host_data.cpp does.
// Plain grid-stride loops and one-block-per-row reductions: these kernels are memory-bound
// stand-ins for a framework's, not tuned ones.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../random_hash.h"
#include "kernels.h"

namespace hetpar::runtime::cuda {
namespace {

// DType and ElementwiseOp values (backend.h; cuda_backend.cpp static_asserts them).
enum : int { kF32 = 0, kBf16 = 1, kF16 = 2, kF8 = 3 };
enum : int {
  kCopy = 0,
  kAdd = 1,
  kScale = 2,
  kGelu = 3,
  kRmsNorm = 4,
  kMul = 5,
  kGeluBackward = 6,
  kRmsNormBackward = 7
};

constexpr int kThreads = 256;

__device__ __forceinline__ float load(const float* p) {
  return *p;
}
__device__ __forceinline__ float load(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}
__device__ __forceinline__ float load(const __half* p) {
  return __half2float(*p);
}
__device__ __forceinline__ float load(const __nv_fp8_e4m3* p) {
  return static_cast<float>(*p);
}
__device__ __forceinline__ void store(float* p, float x) {
  *p = x;
}
__device__ __forceinline__ void store(__nv_bfloat16* p, float x) {
  *p = __float2bfloat16_rn(x);
}
__device__ __forceinline__ void store(__half* p, float x) {
  *p = __float2half_rn(x);
}
__device__ __forceinline__ void store(__nv_fp8_e4m3* p, float x) {
  p->__x = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

// Calls f.template operator()<T>() with T the element type of `dtype`.
template <class F>
cudaError_t dispatch(int dtype, F&& f) {
  switch (dtype) {
    case kF32:
      f(static_cast<float*>(nullptr));
      break;
    case kBf16:
      f(static_cast<__nv_bfloat16*>(nullptr));
      break;
    case kF16:
      f(static_cast<__half*>(nullptr));
      break;
    case kF8:
      f(static_cast<__nv_fp8_e4m3*>(nullptr));
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

unsigned blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  if (b > 65536) b = 65536;  // grid-stride loops cover the rest
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

#define GRID_STRIDE(i, n)                                                                \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Block-wide sum / max over kThreads threads.
__device__ float block_reduce(float v, bool is_max) {
  __shared__ float part[kThreads / 32];
  for (int o = 16; o > 0; o /= 2) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // part[] may still be read by a previous reduction
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = part[0];
  for (int w = 1; w < kThreads / 32; ++w) v = is_max ? fmaxf(v, part[w]) : v + part[w];
  return v;
}

template <class T>
__global__ void fill_random_kernel(T* dst, int64_t n, uint64_t seed_key, float scale) {
  GRID_STRIDE(i, n) {
    store(dst + i, detail::random_value(seed_key, i, scale));
  }
}

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
constexpr float kRmsEps = 1e-6f;

template <class T>
__global__ void pointwise_kernel(int op, int64_t n, float scale, const T* x, const T* y, T* out) {
  GRID_STRIDE(i, n) {
    const float a = load(x + i);
    float r = 0;
    switch (op) {
      case kCopy:
        r = a;
        break;
      case kAdd:
        r = a + scale * load(y + i);
        break;
      case kScale:
        r = scale * a;
        break;
      case kMul:
        r = a * load(y + i);
        break;
      case kGelu:
        r = 0.5f * a * (1.0f + tanhf(kGeluC * (a + kGeluA * a * a * a)));
        break;
      case kGeluBackward: {
        const float t = tanhf(kGeluC * (a + kGeluA * a * a * a));
        r = (0.5f * (1.0f + t) +
             0.5f * a * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluA * a * a)) *
            load(y + i);
        break;
      }
    }
    store(out + i, r);
  }
}

// One block per row: rmsnorm (dy == nullptr) or its backward.
template <class T>
__global__ void rms_kernel(int64_t row_size, const T* x, const T* dy, T* out) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * row_size;
  float ms = 0, dot = 0;
  for (int64_t j = threadIdx.x; j < row_size; j += blockDim.x) {
    const float a = load(x + base + j);
    ms += a * a;
    if (dy != nullptr) dot += a * load(dy + base + j);
  }
  ms = block_reduce(ms, false);
  if (dy != nullptr) dot = block_reduce(dot, false);
  const float inv = rsqrtf(ms / static_cast<float>(row_size) + kRmsEps);
  const float c = dot / static_cast<float>(row_size) * inv * inv * inv;
  for (int64_t j = threadIdx.x; j < row_size; j += blockDim.x) {
    const float a = load(x + base + j);
    store(out + base + j, dy == nullptr ? a * inv : inv * load(dy + base + j) - a * c);
  }
}

__global__ void pair_pointers_kernel(const void** out, const char* base, int64_t first,
                                     int64_t count, int64_t heads, int64_t group, int64_t b_stride,
                                     int64_t h_stride) {
  GRID_STRIDE(i, count) {
    const int64_t p = first + i, b = p / heads, h = p % heads;
    out[i] = base + b * b_stride + (h / group) * h_stride;
  }
}

__device__ __forceinline__ int64_t visible_keys(int64_t i, int64_t seq_q, int64_t seq_kv,
                                                bool causal) {
  if (!causal) return seq_kv;
  const int64_t v = i + seq_kv - seq_q + 1;
  return v < 0 ? 0 : (v > seq_kv ? seq_kv : v);
}

// The first key query i sees under a sliding window of `window` keys (0: none): keys
// [first_key, visible_keys).
__device__ __forceinline__ int64_t first_key(int64_t i, int64_t seq_q, int64_t seq_kv, bool causal,
                                             int64_t window) {
  if (!causal || window <= 0) return 0;
  const int64_t f = i + seq_kv - seq_q - window;
  const int64_t n = visible_keys(i, seq_q, seq_kv, causal);
  return f < 0 ? 0 : (f > n ? n : f);
}

// Row `row` of the chunk is query row % seq_q of (batch, head) pair first_pair + row / seq_q;
// with `sinks` its head's logit joins the softmax with no value.
template <class T>
__global__ void softmax_forward_kernel(const float* scores, T* probs, float* lse, int64_t seq_q,
                                       int64_t seq_kv, bool causal, int64_t window,
                                       const float* sinks, int64_t first_pair, int64_t heads) {
  const int64_t row = blockIdx.x;
  const int64_t n = visible_keys(row % seq_q, seq_q, seq_kv, causal);
  const int64_t lo = first_key(row % seq_q, seq_q, seq_kv, causal, window);
  const float* s = scores + row * seq_kv;
  T* p = probs + row * seq_kv;
  const float sink = sinks ? sinks[(first_pair + row / seq_q) % heads] : -INFINITY;
  float mx = -INFINITY;
  for (int64_t j = lo + threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, s[j]);
  mx = fmaxf(block_reduce(mx, true), sink);
  float sum = 0;
  for (int64_t j = lo + threadIdx.x; j < n; j += blockDim.x) sum += expf(s[j] - mx);
  sum = block_reduce(sum, false);
  if (sinks) sum += expf(sink - mx);
  const float l = n > lo || sinks ? mx + logf(sum) : -INFINITY;
  for (int64_t j = threadIdx.x; j < seq_kv; j += blockDim.x) {
    store(p + j, j >= lo && j < n ? expf(s[j] - l) : 0.0f);
  }
  if (threadIdx.x == 0) lse[row] = l;
}

template <class T>
__global__ void softmax_backward_kernel(const float* scores, const float* d_probs, const float* lse,
                                        const float* delta, T* probs, T* d_scores, int64_t seq_q,
                                        int64_t seq_kv, bool causal, int64_t window) {
  const int64_t row = blockIdx.x;
  const int64_t n = visible_keys(row % seq_q, seq_q, seq_kv, causal);
  const int64_t lo = first_key(row % seq_q, seq_q, seq_kv, causal, window);
  const float l = lse[row], dl = delta[row];
  for (int64_t j = threadIdx.x; j < seq_kv; j += blockDim.x) {
    const int64_t at = row * seq_kv + j;
    const float p = j >= lo && j < n ? expf(scores[at] - l) : 0.0f;
    store(probs + at, p);
    store(d_scores + at, p * (d_probs[at] - dl));
  }
}

template <class T>
__global__ void delta_kernel(const T* out, const T* d_out, float* delta, int64_t batch,
                             int64_t seq_q, int64_t heads, int64_t head_dim) {
  GRID_STRIDE(r, batch * heads * seq_q) {
    const int64_t i = r % seq_q, h = (r / seq_q) % heads, b = r / (seq_q * heads);
    const int64_t base = ((b * seq_q + i) * heads + h) * head_dim;
    float acc = 0;
    for (int64_t x = 0; x < head_dim; ++x) acc += load(out + base + x) * load(d_out + base + x);
    delta[r] = acc;
  }
}

// One block per head h: d_sinks[h] = -sum over (b, i) of exp(sinks[h] - lse) * delta.
__global__ void sink_grad_kernel(const float* sinks, const float* lse, const float* delta,
                                 float* d_sinks, int64_t batch, int64_t heads, int64_t seq_q) {
  const int64_t h = blockIdx.x;
  float acc = 0;
  for (int64_t t = threadIdx.x; t < batch * seq_q; t += blockDim.x) {
    const int64_t r = ((t / seq_q) * heads + h) * seq_q + t % seq_q;
    acc += expf(sinks[h] - lse[r]) * delta[r];
  }
  acc = block_reduce(acc, false);
  if (threadIdx.x == 0) d_sinks[h] = -acc;
}

template <class T>
__global__ void reduce_kv_grad_kernel(const float* src, T* dst, int64_t batch, int64_t heads,
                                      int64_t kv_heads, int64_t seq_kv, int64_t head_dim) {
  const int64_t group = heads / kv_heads;
  GRID_STRIDE(o, batch * seq_kv * kv_heads * head_dim) {
    const int64_t x = o % head_dim, kh = (o / head_dim) % kv_heads,
                  j = (o / (head_dim * kv_heads)) % seq_kv, b = o / (head_dim * kv_heads * seq_kv);
    float acc = 0;
    for (int64_t t = 0; t < group; ++t) {
      acc += src[((b * heads + kh * group + t) * seq_kv + j) * head_dim + x];
    }
    store(dst + o, acc);
  }
}

}  // namespace

cudaError_t launch_fill_random(cudaStream_t s, void* dst, int dtype, int64_t n, uint64_t seed_key,
                               float scale) {
  if (n == 0) return cudaSuccess;
  return dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    fill_random_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(dst), n, seed_key, scale);
  });
}

cudaError_t launch_elementwise(cudaStream_t s, int op, int dtype, int64_t n, int64_t row_size,
                               float scale, const void* in0, const void* in1, void* out) {
  if (n == 0) return cudaSuccess;
  return dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* x = static_cast<const T*>(in0);
    const T* y = static_cast<const T*>(in1);
    if (op == kRmsNorm || op == kRmsNormBackward) {
      rms_kernel<<<static_cast<unsigned>(n / row_size), kThreads, 0, s>>>(
          row_size, x, op == kRmsNorm ? nullptr : y, static_cast<T*>(out));
    } else {
      pointwise_kernel<<<blocks_for(n), kThreads, 0, s>>>(op, n, scale, x, y, static_cast<T*>(out));
    }
  });
}

cudaError_t launch_pair_pointers(cudaStream_t s, const void** out, const void* base, int64_t first,
                                 int64_t count, int64_t heads, int64_t group, int64_t b_stride,
                                 int64_t h_stride) {
  pair_pointers_kernel<<<blocks_for(count), kThreads, 0, s>>>(
      out, static_cast<const char*>(base), first, count, heads, group, b_stride, h_stride);
  return cudaGetLastError();
}

cudaError_t launch_softmax_forward(cudaStream_t s, const float* scores, void* probs, float* lse,
                                   int dtype, int64_t rows, int64_t seq_q, int64_t seq_kv,
                                   bool causal, int64_t window, const float* sinks,
                                   int64_t first_pair, int64_t heads) {
  return dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    softmax_forward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(
        scores, static_cast<T*>(probs), lse, seq_q, seq_kv, causal, window, sinks, first_pair,
        heads);
  });
}

cudaError_t launch_sink_grad(cudaStream_t s, const float* sinks, const float* lse,
                             const float* delta, float* d_sinks, int64_t batch, int64_t heads,
                             int64_t seq_q) {
  sink_grad_kernel<<<static_cast<unsigned>(heads), kThreads, 0, s>>>(sinks, lse, delta, d_sinks,
                                                                     batch, heads, seq_q);
  return cudaGetLastError();
}

cudaError_t launch_softmax_backward(cudaStream_t s, const float* scores, const float* d_probs,
                                    const float* lse, const float* delta, void* probs,
                                    void* d_scores, int dtype, int64_t rows, int64_t seq_q,
                                    int64_t seq_kv, bool causal, int64_t window) {
  return dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    softmax_backward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(
        scores, d_probs, lse, delta, static_cast<T*>(probs), static_cast<T*>(d_scores), seq_q,
        seq_kv, causal, window);
  });
}

cudaError_t launch_attention_delta(cudaStream_t s, const void* out, const void* d_out, float* delta,
                                   int dtype, int64_t batch, int64_t seq_q, int64_t heads,
                                   int64_t head_dim) {
  return dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    delta_kernel<<<blocks_for(batch * heads * seq_q), kThreads, 0, s>>>(
        static_cast<const T*>(out), static_cast<const T*>(d_out), delta, batch, seq_q, heads,
        head_dim);
  });
}

cudaError_t launch_reduce_kv_grad(cudaStream_t s, const float* src, void* dst, int dtype,
                                  int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq_kv,
                                  int64_t head_dim) {
  return dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    reduce_kv_grad_kernel<<<blocks_for(batch * seq_kv * kv_heads * head_dim), kThreads, 0, s>>>(
        src, static_cast<T*>(dst), batch, heads, kv_heads, seq_kv, head_dim);
  });
}

}  // namespace hetpar::runtime::cuda

#include "cuda_backend.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>
#include <vector>

#include "../checks.h"
#include "../mpi_env.h"
#include "../random_hash.h"
#include "kernels.h"

namespace hetpar::runtime {
namespace {

// kernels.cu receives DType and ElementwiseOp as their integer values.
static_assert(static_cast<int>(DType::kF32) == 0 && static_cast<int>(DType::kBf16) == 1 &&
              static_cast<int>(DType::kF16) == 2 && static_cast<int>(DType::kF8E4M3) == 3);
static_assert(static_cast<int>(ElementwiseOp::kCopy) == 0 &&
              static_cast<int>(ElementwiseOp::kAdd) == 1 &&
              static_cast<int>(ElementwiseOp::kScale) == 2 &&
              static_cast<int>(ElementwiseOp::kGelu) == 3 &&
              static_cast<int>(ElementwiseOp::kRmsNorm) == 4 &&
              static_cast<int>(ElementwiseOp::kMul) == 5 &&
              static_cast<int>(ElementwiseOp::kGeluBackward) == 6 &&
              static_cast<int>(ElementwiseOp::kRmsNormBackward) == 7);

Status cuda_check(cudaError_t e, std::string_view what) {
  if (e == cudaSuccess) return Status::ok();
  return Status::internal(
      fmt::format("{}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e)));
}
Status cublas_check(cublasStatus_t s, std::string_view what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::ok();
  // A configuration this cuBLAS(Lt) has no kernel for (e.g. FP8 with unaligned leading
  // dimensions): the caller may leave it out, as for a shape without an algorithm.
  if (s == CUBLAS_STATUS_NOT_SUPPORTED)
    return Status::unavailable(fmt::format("{}: {}", what, cublasGetStatusString(s)));
  return Status::internal(fmt::format("{}: {}", what, cublasGetStatusString(s)));
}
Status nccl_check(ncclResult_t r, std::string_view what) {
  if (r == ncclSuccess) return Status::ok();
  return Status::internal(fmt::format("{}: {}", what, ncclGetErrorString(r)));
}
#define HP_CUDA(expr) HETPAR_RETURN_IF_ERROR(cuda_check((expr), #expr))
#define HP_CUBLAS(expr) HETPAR_RETURN_IF_ERROR(cublas_check((expr), #expr))
#define HP_NCCL(expr) HETPAR_RETURN_IF_ERROR(nccl_check((expr), #expr))

int code(DType t) {
  return static_cast<int>(t);
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kBf16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kF8E4M3:
      return CUDA_R_8F_E4M3;
  }
  return CUDA_R_32F;
}

Result<ncclDataType_t> nccl_type(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBf16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kF8E4M3:
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
      return ncclFloat8e4m3;
#else
      return Status::invalid_argument("fp8 collectives need NCCL 2.24 or newer");
#endif
  }
  return Status::invalid_argument("unknown dtype");
}

void release_device(void* /*owner*/, void* p) {
  cudaFree(p);
}

const std::byte* bytes_of(const Buffer& b) {
  return static_cast<const std::byte*>(b.data());
}
std::byte* bytes_of(Buffer& b) {
  return static_cast<std::byte*>(b.data());
}

// The largest power of two (<= 256) dividing the address: what cuBLASLt's heuristic may
// assume about a pointer.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

constexpr int64_t kLtWorkspace = int64_t{32} << 20;      // cuBLASLt's advice for Hopper
constexpr int64_t kAttentionScratch = int64_t{2} << 30;  // score matrices per chunk
constexpr int64_t kAlignBytes = 256;

int64_t round_up(int64_t x) {
  return (x + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
}

// A cuBLASLt matmul set up for one shape and alignment: descriptors and the heuristic's
// first algorithm.
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~LtPlan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};
using LtKey = std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, int, int, uint32_t,
                         uint32_t, uint32_t>;  // ..., input dtype, C dtype, alignments

// One batched GEMM over per-(batch, head) pointer arrays (column-major, as cuBLAS).
struct BatchedGemm {
  bool ta, tb;
  int64_t m, n, k;
  float alpha;
  const void** a;
  int64_t lda;
  const void** b;
  int64_t ldb;
  void** c;
  cudaDataType_t c_type;
  int64_t ldc;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend() = default;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Status init(int device_count, const MpiWorld& w) {
    device_ = w.local_rank % device_count;
    HP_CUDA(cudaSetDevice(device_));
    cudaDeviceProp prop{};
    HP_CUDA(cudaGetDeviceProperties(&prop, device_));
    cc_ = prop.major * 10 + prop.minor;
    l2_bytes_ = prop.l2CacheSize;
    int driver = 0, runtime = 0, nccl = 0;
    HP_CUDA(cudaDriverGetVersion(&driver));
    HP_CUDA(cudaRuntimeGetVersion(&runtime));
    HP_NCCL(ncclGetVersion(&nccl));
    info_.backend = "cuda";
    info_.name = prop.name;
    info_.memory = Bytes(static_cast<int64_t>(prop.totalGlobalMem));
    info_.versions = fmt::format("CUDA driver {} runtime {}; cuBLASLt {}; NCCL {}; sm_{}; {}",
                                 driver, runtime, cublasLtGetVersion(), nccl, cc_, w.version);
    info_.world = w.size;
    info_.rank = w.rank;
    info_.local_rank = w.local_rank;
    info_.hosts = w.hosts;
    HP_CUBLAS(cublasLtCreate(&lt_));
    HP_CUBLAS(cublasCreate(&blas_));
    // The world communicator: rank 0's unique id, broadcast over MPI.
    ncclUniqueId id{};
    if (w.rank == 0) HP_NCCL(ncclGetUniqueId(&id));
    HETPAR_RETURN_IF_ERROR(
        mpi_check(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast(nccl id)"));
    HP_NCCL(ncclCommInitRank(&world_, w.size, id, w.rank));
    return Status::ok();
  }

  ~CudaBackend() override {
    cudaDeviceSynchronize();
    plans_.clear();
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    for (ncclComm_t c : comms_) {
      if (c != nullptr) ncclCommDestroy(c);
    }
    if (world_ != nullptr) ncclCommDestroy(world_);
    if (blas_ != nullptr) cublasDestroy(blas_);
    if (lt_ != nullptr) cublasLtDestroy(lt_);
    scratch_.clear();
    for (cudaStream_t s : streams_) {
      if (s != nullptr) cudaStreamDestroy(s);
    }
  }

  const DeviceInfo& info() const override { return info_; }

  Result<Buffer> allocate(Bytes size) override {
    if (size.count() < 0) return Status::invalid_argument("allocate: negative size");
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(size.count(), 1)));
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the sticky-free error so later calls work
      return Status::unavailable(
          fmt::format("allocate: out of device memory ({} bytes)", size.count()));
    }
    HETPAR_RETURN_IF_ERROR(cuda_check(e, "cudaMalloc"));
    return Buffer(p, size, &release_device, nullptr);
  }

  Status fill_random(Stream s, Buffer& b, DType t, int64_t count, uint64_t seed,
                     float scale) override {
    HETPAR_ASSIGN_OR_RETURN(cudaStream_t st, stream(s));
    HETPAR_RETURN_IF_ERROR(check_buffer("fill_random", b, count, t));
    HP_CUDA(cuda::launch_fill_random(st, b.data(), code(t), count, detail::mix64(seed), scale));
    return Status::ok();
  }

  Status copy_to_host(Stream s, const Buffer& b, std::span<std::byte> host) override {
    HETPAR_ASSIGN_OR_RETURN(cudaStream_t st, stream(s));
    HETPAR_RETURN_IF_ERROR(
        check_buffer("copy_to_host", b, static_cast<int64_t>(host.size()), DType::kF8E4M3));
    if (host.empty()) return Status::ok();
    HP_CUDA(cudaMemcpyAsync(host.data(), b.data(), host.size(), cudaMemcpyDeviceToHost, st));
    HP_CUDA(cudaStreamSynchronize(st));
    return Status::ok();
  }

  Status copy_from_host(Stream s, std::span<const std::byte> host, Buffer& b) override {
    HETPAR_ASSIGN_OR_RETURN(cudaStream_t st, stream(s));
    HETPAR_RETURN_IF_ERROR(
        check_buffer("copy_from_host", b, static_cast<int64_t>(host.size()), DType::kF8E4M3));
    if (host.empty()) return Status::ok();
    HP_CUDA(cudaMemcpyAsync(b.data(), host.data(), host.size(), cudaMemcpyHostToDevice, st));
    HP_CUDA(cudaStreamSynchronize(st));
    return Status::ok();
  }

  Status gemm(Stream s, const GemmDesc& d, const Buffer& a, const Buffer& b, Buffer& c) override {
    HETPAR_ASSIGN_OR_RETURN(cudaStream_t st, stream(s));
    HETPAR_RETURN_IF_ERROR(check_gemm(d, a, b, c));
    if (d.dtype == DType::kF8E4M3) {
      if (cc_ < 89) {
        return Status::unavailable(
            fmt::format("gemm: fp8 needs sm_89 or newer, this is sm_{}", cc_));
      }
      if (!d.trans_a || d.trans_b) {
        return Status::invalid_argument("gemm: fp8 needs trans_a = true, trans_b = false (TN)");
      }
    }
    HETPAR_ASSIGN_OR_RETURN(const LtPlan* plan, lt_plan(d, a.data(), b.data(), c.data()));
    HETPAR_ASSIGN_OR_RETURN(std::byte * ws, scratch(s, kLtWorkspace));
    HP_CUBLAS(cublasLtMatmul(lt_, plan->op, &d.alpha, a.data(), plan->a, b.data(), plan->b, &d.beta,
                             c.data(), plan->c, c.data(), plan->c, &plan->algo, ws, kLtWorkspace,
                             st));
    return Status::ok();
  }

  Status attention_forward(Stream s, const AttentionDesc& d, const Buffer& q, const Buffer& k,
                           const Buffer& v, const Buffer* sinks, Buffer& out,
                           Buffer& softmax_stats) override {
    HETPAR_ASSIGN_OR_RETURN(cudaStream_t st, stream(s));
    HETPAR_RETURN_IF_ERROR(check_attention(d, q, k, v, sinks, out, softmax_stats));
    const Layout L(d);
    const int64_t chunk = L.chunk(4 + L.es);
    // Workspace: 6 pointer arrays, then the scores (fp32) and probabilities (dtype).
    const int64_t ptr_bytes = round_up(chunk * int64_t{sizeof(void*)});
    const int64_t s_bytes = round_up(chunk * L.pair_scores * 4);
    HETPAR_ASSIGN_OR_RETURN(std::byte * ws, scratch(s, kLtWorkspace + 6 * ptr_bytes + s_bytes +
                                                           chunk * L.pair_scores * L.es));
    ws += kLtWorkspace;  // the front is gemm()'s; keep it free for GEMMs on this stream
    auto ptrs = [&](int i) { return reinterpret_cast<const void**>(ws + i * ptr_bytes); };
    std::byte* scores = ws + 6 * ptr_bytes;
    std::byte* probs = scores + s_bytes;
    float* lse = static_cast<float*>(softmax_stats.data());
    for (int64_t first = 0; first < L.pairs; first += chunk) {
      const int64_t n = std::min(chunk, L.pairs - first);
      HETPAR_RETURN_IF_ERROR(L.q_pointers(st, ptrs(0), q.data(), first, n));
      HETPAR_RETURN_IF_ERROR(L.kv_pointers(st, ptrs(1), k.data(), first, n));
      HETPAR_RETURN_IF_ERROR(L.kv_pointers(st, ptrs(2), v.data(), first, n));
      HETPAR_RETURN_IF_ERROR(L.q_pointers(st, ptrs(3), out.data(), first, n));
      HETPAR_RETURN_IF_ERROR(L.scratch_pointers(st, ptrs(4), scores, n, 4));
      HETPAR_RETURN_IF_ERROR(L.scratch_pointers(st, ptrs(5), probs, n, L.es));
      // S^T (seq_kv x seq_q) = scale * K Q^T, i.e. row-major S = scale * Q K^T per pair.
      HETPAR_RETURN_IF_ERROR(
          batched(st, d.dtype, n,
                  {true, false, d.seq_kv, d.seq_q, d.head_dim, L.scale, ptrs(1), L.kv_ld, ptrs(0),
                   L.q_ld, mut(ptrs(4)), CUDA_R_32F, d.seq_kv}));
      HP_CUDA(cuda::launch_softmax_forward(
          st, reinterpret_cast<const float*>(scores), probs, lse + first * d.seq_q, code(d.dtype),
          n * d.seq_q, d.seq_q, d.seq_kv, d.causal, d.window,
          sinks ? static_cast<const float*>(sinks->data()) : nullptr, first, d.heads));
      // O^T (d x seq_q) = V^T P^T, i.e. O = P V.
      HETPAR_RETURN_IF_ERROR(
          batched(st, d.dtype, n,
                  {false, false, d.head_dim, d.seq_q, d.seq_kv, 1.0f, ptrs(2), L.kv_ld, ptrs(5),
                   d.seq_kv, mut(ptrs(3)), cuda_type(d.dtype), L.q_ld}));
    }
    return Status::ok();
  }

  Status attention_backward(Stream s, const AttentionDesc& d, const Buffer& q, const Buffer& k,
                            const Buffer& v, const Buffer* sinks, const Buffer& out,
                            const Buffer& d_out, const Buffer& softmax_stats, Buffer& d_q,
                            Buffer& d_k, Buffer& d_v, Buffer* d_sinks) override {
    HETPAR_ASSIGN_OR_RETURN(cudaStream_t st, stream(s));
    HETPAR_RETURN_IF_ERROR(check_attention_backward(d, q, k, v, sinks, out, d_out, softmax_stats,
                                                    d_q, d_k, d_v, d_sinks));
    const Layout L(d);
    const int64_t chunk = L.chunk(2 * (4 + L.es));
    // Workspace: 11 pointer arrays, delta (pairs x seq_q), the per-query-head dK and dV
    // (fp32), then per chunk scores and dP (fp32), P and dS (dtype).
    const int64_t ptr_bytes = round_up(chunk * int64_t{sizeof(void*)});
    const int64_t delta_bytes = round_up(L.pairs * d.seq_q * 4);
    const int64_t kv_grad_bytes = round_up(L.pairs * d.seq_kv * d.head_dim * 4);
    const int64_t f_bytes = round_up(chunk * L.pair_scores * 4);
    const int64_t t_bytes = round_up(chunk * L.pair_scores * L.es);
    HETPAR_ASSIGN_OR_RETURN(
        std::byte * ws, scratch(s, kLtWorkspace + 11 * ptr_bytes + delta_bytes + 2 * kv_grad_bytes +
                                       2 * f_bytes + 2 * t_bytes));
    ws += kLtWorkspace;
    auto ptrs = [&](int i) { return reinterpret_cast<const void**>(ws + i * ptr_bytes); };
    std::byte* p = ws + 11 * ptr_bytes;
    auto* delta = reinterpret_cast<float*>(p);
    auto* dk_heads = reinterpret_cast<float*>(p += delta_bytes);
    auto* dv_heads = reinterpret_cast<float*>(p += kv_grad_bytes);
    std::byte* scores = p += kv_grad_bytes;
    std::byte* d_probs = p += f_bytes;
    std::byte* probs = p += f_bytes;
    std::byte* d_scores = p += t_bytes;
    const float* lse = static_cast<const float*>(softmax_stats.data());
    HP_CUDA(cuda::launch_attention_delta(st, out.data(), d_out.data(), delta, code(d.dtype),
                                         d.batch, d.seq_q, d.heads, d.head_dim));
    if (sinks != nullptr)
      HP_CUDA(cuda::launch_sink_grad(st, static_cast<const float*>(sinks->data()), lse, delta,
                                     static_cast<float*>(d_sinks->data()), d.batch, d.heads,
                                     d.seq_q));
    for (int64_t first = 0; first < L.pairs; first += chunk) {
      const int64_t n = std::min(chunk, L.pairs - first);
      HETPAR_RETURN_IF_ERROR(L.q_pointers(st, ptrs(0), q.data(), first, n));
      HETPAR_RETURN_IF_ERROR(L.kv_pointers(st, ptrs(1), k.data(), first, n));
      HETPAR_RETURN_IF_ERROR(L.kv_pointers(st, ptrs(2), v.data(), first, n));
      HETPAR_RETURN_IF_ERROR(L.q_pointers(st, ptrs(3), d_out.data(), first, n));
      HETPAR_RETURN_IF_ERROR(L.q_pointers(st, ptrs(4), d_q.data(), first, n));
      HETPAR_RETURN_IF_ERROR(L.scratch_pointers(st, ptrs(5), scores, n, 4));
      HETPAR_RETURN_IF_ERROR(L.scratch_pointers(st, ptrs(6), d_probs, n, 4));
      HETPAR_RETURN_IF_ERROR(L.scratch_pointers(st, ptrs(7), probs, n, L.es));
      HETPAR_RETURN_IF_ERROR(L.scratch_pointers(st, ptrs(8), d_scores, n, L.es));
      const int64_t head_grad = d.seq_kv * d.head_dim * 4;
      HETPAR_RETURN_IF_ERROR(L.pair_pointers(st, ptrs(9), dk_heads, first, n, head_grad));
      HETPAR_RETURN_IF_ERROR(L.pair_pointers(st, ptrs(10), dv_heads, first, n, head_grad));
      // Scores again (as forward), dP^T (seq_kv x seq_q) = V dO^T, i.e. dP = dO V^T.
      HETPAR_RETURN_IF_ERROR(
          batched(st, d.dtype, n,
                  {true, false, d.seq_kv, d.seq_q, d.head_dim, L.scale, ptrs(1), L.kv_ld, ptrs(0),
                   L.q_ld, mut(ptrs(5)), CUDA_R_32F, d.seq_kv}));
      HETPAR_RETURN_IF_ERROR(
          batched(st, d.dtype, n,
                  {true, false, d.seq_kv, d.seq_q, d.head_dim, 1.0f, ptrs(2), L.kv_ld, ptrs(3),
                   L.q_ld, mut(ptrs(6)), CUDA_R_32F, d.seq_kv}));
      HP_CUDA(cuda::launch_softmax_backward(
          st, reinterpret_cast<const float*>(scores), reinterpret_cast<const float*>(d_probs),
          lse + first * d.seq_q, delta + first * d.seq_q, probs, d_scores, code(d.dtype),
          n * d.seq_q, d.seq_q, d.seq_kv, d.causal, d.window));
      // dQ^T (d x seq_q) = scale * K^T dS^T, i.e. dQ = scale * dS K.
      HETPAR_RETURN_IF_ERROR(
          batched(st, d.dtype, n,
                  {false, false, d.head_dim, d.seq_q, d.seq_kv, L.scale, ptrs(1), L.kv_ld, ptrs(8),
                   d.seq_kv, mut(ptrs(4)), cuda_type(d.dtype), L.q_ld}));
      // Per query head: dK^T (d x seq_kv) = scale * Q^T dS, dV^T = dO^T P.
      HETPAR_RETURN_IF_ERROR(
          batched(st, d.dtype, n,
                  {false, true, d.head_dim, d.seq_kv, d.seq_q, L.scale, ptrs(0), L.q_ld, ptrs(8),
                   d.seq_kv, mut(ptrs(9)), CUDA_R_32F, d.head_dim}));
      HETPAR_RETURN_IF_ERROR(
          batched(st, d.dtype, n,
                  {false, true, d.head_dim, d.seq_kv, d.seq_q, 1.0f, ptrs(3), L.q_ld, ptrs(7),
                   d.seq_kv, mut(ptrs(10)), CUDA_R_32F, d.head_dim}));
    }
    // Sum the query heads of each kv head (GQA) into d_k and d_v.
    HP_CUDA(cuda::launch_reduce_kv_grad(st, dk_heads, d_k.data(), code(d.dtype), d.batch, d.heads,
                                        d.kv_heads, d.seq_kv, d.head_dim));
    HP_CUDA(cuda::launch_reduce_kv_grad(st, dv_heads, d_v.data(), code(d.dtype), d.batch, d.heads,
                                        d.kv_heads, d.seq_kv, d.head_dim));
    return Status::ok();
  }

  Status elementwise(Stream s, const ElementwiseDesc& d, std::span<const Buffer* const> inputs,
                     Buffer& out) override {
    HETPAR_ASSIGN_OR_RETURN(cudaStream_t st, stream(s));
    HETPAR_RETURN_IF_ERROR(check_elementwise(d, inputs, out));
    if (d.op == ElementwiseOp::kCopy) {
      if (d.elements == 0) return Status::ok();
      HP_CUDA(cudaMemcpyAsync(out.data(), inputs[0]->data(), d.elements * dtype_bytes(d.dtype),
                              cudaMemcpyDeviceToDevice, st));
      return Status::ok();
    }
    const void* second = inputs.size() > 1 ? inputs[1]->data() : nullptr;
    HP_CUDA(cuda::launch_elementwise(st, static_cast<int>(d.op), code(d.dtype), d.elements,
                                     d.row_size, d.scale, inputs[0]->data(), second, out.data()));
    return Status::ok();
  }

  Status flush_cache(Stream s) override {
    HETPAR_ASSIGN_OR_RETURN(cudaStream_t st, stream(s));
    if (flush_.empty()) {
      HETPAR_ASSIGN_OR_RETURN(flush_, allocate(Bytes(2 * std::max<int64_t>(l2_bytes_, 1 << 20))));
    }
    HP_CUDA(cudaMemsetAsync(flush_.data(), ++flush_value_, flush_.size().count(), st));
    return Status::ok();
  }

  Result<Group> make_group(std::span<const int> ranks) override {
    HETPAR_ASSIGN_OR_RETURN(
        Group g, new_group(ranks, info_.world, static_cast<int64_t>(comms_.size()), info_.rank));
    ncclComm_t comm = nullptr;
    HP_NCCL(ncclCommSplit(world_, g.rank < 0 ? NCCL_SPLIT_NOCOLOR : 0, std::max(g.rank, 0), &comm,
                          nullptr));
    comms_.push_back(comm);
    return g;
  }

  Status all_reduce(Stream s, const Group& g, const Buffer& send, Buffer& recv, int64_t count,
                    DType t) override {
    HETPAR_ASSIGN_OR_RETURN(Coll c,
                            coll("all_reduce", Collective::kAllReduce, s, g, send, recv, count, t));
    HP_NCCL(ncclAllReduce(send.data(), recv.data(), count, c.type, ncclSum, c.comm, c.stream));
    return Status::ok();
  }

  Status all_gather(Stream s, const Group& g, const Buffer& send, Buffer& recv, int64_t count,
                    DType t) override {
    HETPAR_ASSIGN_OR_RETURN(Coll c,
                            coll("all_gather", Collective::kAllGather, s, g, send, recv, count, t));
    HP_NCCL(ncclAllGather(send.data(), recv.data(), count, c.type, c.comm, c.stream));
    return Status::ok();
  }

  Status reduce_scatter(Stream s, const Group& g, const Buffer& send, Buffer& recv, int64_t count,
                        DType t) override {
    HETPAR_ASSIGN_OR_RETURN(
        Coll c, coll("reduce_scatter", Collective::kReduceScatter, s, g, send, recv, count, t));
    HP_NCCL(ncclReduceScatter(send.data(), recv.data(), count, c.type, ncclSum, c.comm, c.stream));
    return Status::ok();
  }

  Status all_to_all(Stream s, const Group& g, const Buffer& send, Buffer& recv, int64_t count,
                    DType t) override {
    HETPAR_ASSIGN_OR_RETURN(Coll c,
                            coll("all_to_all", Collective::kAllToAll, s, g, send, recv, count, t));
    const int64_t bytes = count * dtype_bytes(t);
    // Block p goes to member p (the group communicator's rank p): one grouped send/recv each.
    HP_NCCL(ncclGroupStart());
    Status st;
    for (int p = 0; p < g.size() && st.is_ok(); ++p) {
      st = nccl_check(ncclSend(bytes_of(send) + p * bytes, count, c.type, p, c.comm, c.stream),
                      "ncclSend (all_to_all)");
      if (st.is_ok()) {
        st = nccl_check(ncclRecv(bytes_of(recv) + p * bytes, count, c.type, p, c.comm, c.stream),
                        "ncclRecv (all_to_all)");
      }
    }
    Status end = nccl_check(ncclGroupEnd(), "ncclGroupEnd (all_to_all)");
    return st.is_ok() ? end : st;
  }

  Status broadcast(Stream s, const Group& g, Buffer& buf, int64_t count, DType t,
                   int root) override {
    HETPAR_ASSIGN_OR_RETURN(Coll c, coll("broadcast", s, g, t));
    HETPAR_RETURN_IF_ERROR(check_buffer("broadcast", buf, count, t));
    HETPAR_RETURN_IF_ERROR(check_root("broadcast", g, root));
    HP_NCCL(ncclBroadcast(buf.data(), buf.data(), count, c.type, root, c.comm, c.stream));
    return Status::ok();
  }

  Status send(Stream s, const Buffer& buf, int64_t count, DType t, int peer) override {
    HETPAR_ASSIGN_OR_RETURN(Coll c, p2p("send", s, count, t, peer));
    HETPAR_RETURN_IF_ERROR(check_buffer("send", buf, count, t));
    HP_NCCL(ncclSend(buf.data(), count, c.type, peer, c.comm, c.stream));
    return Status::ok();
  }

  Status recv(Stream s, Buffer& buf, int64_t count, DType t, int peer) override {
    HETPAR_ASSIGN_OR_RETURN(Coll c, p2p("recv", s, count, t, peer));
    HETPAR_RETURN_IF_ERROR(check_buffer("recv", buf, count, t));
    HP_NCCL(ncclRecv(buf.data(), count, c.type, peer, c.comm, c.stream));
    return Status::ok();
  }

  Status group_start() override {
    HP_NCCL(ncclGroupStart());
    ++group_depth_;
    return Status::ok();
  }

  Status group_end() override {
    if (group_depth_ == 0) return Status::invalid_argument("group_end without group_start");
    --group_depth_;
    HP_NCCL(ncclGroupEnd());
    return Status::ok();
  }

  Result<Event> record(Stream s) override {
    HETPAR_ASSIGN_OR_RETURN(cudaStream_t st, stream(s));
    cudaEvent_t e = nullptr;
    HP_CUDA(cudaEventCreate(&e));
    events_.push_back(e);
    HP_CUDA(cudaEventRecord(e, st));
    return Event{static_cast<int64_t>(events_.size()) - 1};
  }

  Status wait(Stream s, Event e) override {
    HETPAR_ASSIGN_OR_RETURN(cudaStream_t st, stream(s));
    HETPAR_ASSIGN_OR_RETURN(cudaEvent_t ev, event(e));
    HP_CUDA(cudaStreamWaitEvent(st, ev, 0));
    return Status::ok();
  }

  Status synchronize() override {
    for (cudaStream_t s : streams_) {
      if (s != nullptr) HP_CUDA(cudaStreamSynchronize(s));
    }
    return Status::ok();
  }

  Result<Time> elapsed(Event from, Event to) override {
    HETPAR_ASSIGN_OR_RETURN(cudaEvent_t a, event(from));
    HETPAR_ASSIGN_OR_RETURN(cudaEvent_t b, event(to));
    HP_CUDA(cudaEventSynchronize(a));
    HP_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    HP_CUDA(cudaEventElapsedTime(&ms, a, b));
    return Time::ms(static_cast<double>(ms));
  }

  Status barrier() override {
    HETPAR_RETURN_IF_ERROR(synchronize());
    return mpi_check(MPI_Barrier(MPI_COMM_WORLD), "barrier: MPI_Barrier");
  }

 private:
  // The BSHD layout of an attention call, in bytes, and the pair pointer arrays over it.
  struct Layout {
    explicit Layout(const AttentionDesc& desc) : d(desc) {}
    const AttentionDesc& d;
    const int64_t es = dtype_bytes(d.dtype);
    const int64_t pairs = d.batch * d.heads;
    const int64_t pair_scores = d.seq_q * d.seq_kv;
    const int64_t q_ld = d.heads * d.head_dim, kv_ld = d.kv_heads * d.head_dim;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d.head_dim));
    // Pairs per chunk so that `bytes_per_score` per score element fits the scratch budget.
    int64_t chunk(int64_t bytes_per_score) const {
      return std::clamp<int64_t>(kAttentionScratch / (pair_scores * bytes_per_score), 1, pairs);
    }
    Status q_pointers(cudaStream_t s, const void** out, const void* base, int64_t first,
                      int64_t n) const {
      return cuda_check(cuda::launch_pair_pointers(s, out, base, first, n, d.heads, 1,
                                                   d.seq_q * q_ld * es, d.head_dim * es),
                        "attention pointers");
    }
    Status kv_pointers(cudaStream_t s, const void** out, const void* base, int64_t first,
                       int64_t n) const {
      return cuda_check(
          cuda::launch_pair_pointers(s, out, base, first, n, d.heads, d.heads / d.kv_heads,
                                     d.seq_kv * kv_ld * es, d.head_dim * es),
          "attention pointers");
    }
    // Pair i of a chunk's scratch matrices (seq_q x seq_kv of `elem` bytes each).
    Status scratch_pointers(cudaStream_t s, const void** out, const void* base, int64_t n,
                            int64_t elem) const {
      return pair_pointers(s, out, base, 0, n, pair_scores * elem);
    }
    // base + (first + i) * stride.
    Status pair_pointers(cudaStream_t s, const void** out, const void* base, int64_t first,
                         int64_t n, int64_t stride) const {
      return cuda_check(cuda::launch_pair_pointers(s, out, base, first, n, 1, 1, stride, 0),
                        "attention pointers");
    }
  };

  static void** mut(const void** p) { return const_cast<void**>(p); }

  Status batched(cudaStream_t st, DType t, int64_t count, const BatchedGemm& g) {
    HP_CUBLAS(cublasSetStream(blas_, st));
    const float beta = 0.0f;
    HP_CUBLAS(cublasGemmBatchedEx(
        blas_, g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, g.tb ? CUBLAS_OP_T : CUBLAS_OP_N,
        static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), &g.alpha, g.a,
        cuda_type(t), static_cast<int>(g.lda), g.b, cuda_type(t), static_cast<int>(g.ldb), &beta,
        g.c, g.c_type, static_cast<int>(g.ldc), static_cast<int>(count), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
    return Status::ok();
  }

  Result<const LtPlan*> lt_plan(const GemmDesc& d, const void* a, const void* b, const void* c) {
    const LtKey key{d.m,          d.n,          d.k,           d.batch,
                    d.trans_a,    d.trans_b,    code(d.dtype), code(d.c_dtype()),
                    alignment(a), alignment(b), alignment(c)};
    if (auto it = plans_.find(key); it != plans_.end()) return &it->second;
    LtPlan& p = plans_[key];
    Status st = build_plan(d, std::get<8>(key), std::get<9>(key), std::get<10>(key), p);
    if (!st.is_ok()) {
      plans_.erase(key);
      return st;
    }
    return &p;
  }

  Status build_plan(const GemmDesc& d, uint32_t al_a, uint32_t al_b, uint32_t al_c, LtPlan& p) {
    const cudaDataType_t in = cuda_type(d.dtype), out = cuda_type(d.c_dtype());
    HP_CUBLAS(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = d.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = d.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    HP_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    HP_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    auto layout = [&](cublasLtMatrixLayout_t* l, cudaDataType_t t, int64_t rows,
                      int64_t cols) -> Status {
      HP_CUBLAS(cublasLtMatrixLayoutCreate(l, t, rows, cols, rows));
      if (d.batch > 1) {
        const int32_t n = static_cast<int32_t>(d.batch);
        const int64_t stride = rows * cols;
        HP_CUBLAS(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n,
                                                   sizeof(n)));
        HP_CUBLAS(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                   &stride, sizeof(stride)));
      }
      return Status::ok();
    };
    HETPAR_RETURN_IF_ERROR(layout(&p.a, in, d.trans_a ? d.k : d.m, d.trans_a ? d.m : d.k));
    HETPAR_RETURN_IF_ERROR(layout(&p.b, in, d.trans_b ? d.n : d.k, d.trans_b ? d.k : d.n));
    HETPAR_RETURN_IF_ERROR(layout(&p.c, out, d.m, d.n));
    cublasLtMatmulPreference_t pref = nullptr;
    HP_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = kLtWorkspace;
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_c}};
    for (const auto& [attr, value] : aligns) {
      if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value));
      }
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
      s = cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    HETPAR_RETURN_IF_ERROR(cublas_check(s, "cublasLtMatmulAlgoGetHeuristic"));
    if (found == 0) {
      return Status::unavailable(fmt::format("gemm: cuBLASLt has no algorithm for {}x{}x{} {}{} {}",
                                             d.m, d.n, d.k, d.trans_a ? 'T' : 'N',
                                             d.trans_b ? 'T' : 'N', to_string(d.dtype)));
    }
    p.algo = result.algo;
    return Status::ok();
  }

  Result<cudaStream_t> stream(Stream s) {
    HETPAR_RETURN_IF_ERROR(check_stream(s));
    const auto i = static_cast<size_t>(s.index);
    if (streams_.size() <= i) streams_.resize(i + 1, nullptr);
    if (streams_[i] == nullptr) {
      HP_CUDA(cudaStreamCreateWithFlags(&streams_[i], cudaStreamNonBlocking));
    }
    return streams_[i];
  }

  // A per-stream workspace of at least `bytes` (streams may run concurrently, so each has
  // its own). Growing it frees the old one: cudaFree waits for the work that uses it.
  Result<std::byte*> scratch(Stream s, int64_t bytes) {
    const auto i = static_cast<size_t>(s.index);
    if (scratch_.size() <= i) scratch_.resize(i + 1);
    if (scratch_[i].size().count() < bytes) {
      scratch_[i] = Buffer();
      HETPAR_ASSIGN_OR_RETURN(scratch_[i], allocate(Bytes(bytes)));
    }
    return bytes_of(scratch_[i]);
  }

  Result<cudaEvent_t> event(Event e) const {
    if (e.id < 0 || e.id >= static_cast<int64_t>(events_.size())) {
      return Status::invalid_argument(fmt::format("event {} was not recorded here", e.id));
    }
    return events_[static_cast<size_t>(e.id)];
  }

  struct Coll {
    ncclComm_t comm;
    ncclDataType_t type;
    cudaStream_t stream;
  };

  // The communicator, NCCL type and stream of a collective, after the shared checks.
  Result<Coll> coll(std::string_view op, Collective kind, Stream s, const Group& g,
                    const Buffer& send, const Buffer& recv, int64_t count, DType t) {
    HETPAR_ASSIGN_OR_RETURN(Coll c, coll(op, s, g, t));
    HETPAR_RETURN_IF_ERROR(check_collective(op, kind, g, send, recv, count, t).status());
    return c;
  }

  Result<Coll> coll(std::string_view op, Stream s, const Group& g, DType t) {
    HETPAR_ASSIGN_OR_RETURN(cudaStream_t st, stream(s));
    HETPAR_RETURN_IF_ERROR(check_member(op, g, static_cast<int64_t>(comms_.size())));
    HETPAR_ASSIGN_OR_RETURN(ncclDataType_t type, nccl_type(t));
    return Coll{comms_[static_cast<size_t>(g.id)], type, st};
  }

  Result<Coll> p2p(std::string_view op, Stream s, int64_t count, DType t, int peer) {
    HETPAR_ASSIGN_OR_RETURN(cudaStream_t st, stream(s));
    HETPAR_RETURN_IF_ERROR(
        check_peer(op, peer, info_.world, info_.rank, count, std::numeric_limits<int64_t>::max()));
    HETPAR_ASSIGN_OR_RETURN(ncclDataType_t type, nccl_type(t));
    return Coll{world_, type, st};
  }

  DeviceInfo info_;
  int device_ = 0;
  int cc_ = 0;  // compute capability, e.g. 90
  int64_t l2_bytes_ = 0;
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  ncclComm_t world_ = nullptr;
  std::vector<ncclComm_t> comms_;  // by Group::id; null where not a member
  std::vector<cudaStream_t> streams_;
  std::vector<Buffer> scratch_;  // by stream index
  std::vector<cudaEvent_t> events_;
  std::map<LtKey, LtPlan> plans_;
  int group_depth_ = 0;
  Buffer flush_;
  unsigned char flush_value_ = 0;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_cuda_backend() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return Status::unavailable(fmt::format("cuda: no usable GPU ({})",
                                           e != cudaSuccess ? cudaGetErrorString(e) : "no device"));
  }
  HETPAR_ASSIGN_OR_RETURN(const MpiWorld* world, mpi_world());
  auto be = std::make_unique<CudaBackend>();
  HETPAR_RETURN_IF_ERROR(be->init(count, *world).with_context("cuda"));
  return std::unique_ptr<Backend>(std::move(be));
}

}  // namespace hetpar::runtime

// Backend: the device seam shared by calibrate/ (microbenchmarks) and executor/ (running a
// plan's per-rank programs). Plain C++ — no CUDA, NCCL or MPI headers — so everything above
// runtime/ builds on a machine without a GPU. Two implementations: "cpu" (Eigen GEMMs,
// plain C++ memory kernels, MPI collectives and P2P) and "cuda" (cuBLASLt GEMMs, cuDNN or
// batched-GEMM attention, NCCL collectives bootstrapped over MPI, CUDA events). One process
// per rank, launched by `mpirun`; the backend learns its rank and world from MPI.
//
// Execution model (CUDA's): work is issued on a Stream and runs in issue order on that
// stream; different streams may overlap (the cpu backend runs every stream in issue order
// on the calling thread — it does not overlap). Events order streams and time them.
// Collectives and P2P must be issued in the same order on every member (as in NCCL);
// batched send/recv go between group_start() and group_end() so they cannot deadlock.
//
// Matrices are column-major (BLAS convention). Attention tensors are [batch, seq, heads,
// head_dim] (BSHD), contiguous.
//
// Data: a buffer holds each dtype's real bit pattern (fp32, bf16, IEEE fp16, OCP fp8 e4m3fn)
// on every backend, so bytes copied to the host read the same everywhere; host_data.h
// converts them to and from float.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hetpar/core/status.h"
#include "hetpar/core/units.h"

namespace hetpar::runtime {

enum class DType : uint8_t { kF32, kBf16, kF16, kF8E4M3 };
int dtype_bytes(DType t);
std::string_view to_string(DType t);  // "fp32", "bf16", "fp16", "fp8"
Result<DType> parse_dtype(std::string_view s);

/// Device memory owned by the backend that allocated it. Move-only; freed on destruction.
class Buffer {
 public:
  Buffer() = default;
  Buffer(void* data, Bytes size, void (*release)(void*, void*), void* owner)
      : data_(data), size_(size), release_(release), owner_(owner) {}
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    Buffer(std::move(o)).swap(*this);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (data_ != nullptr && release_ != nullptr) release_(owner_, data_);
  }
  void* data() const { return data_; }
  Bytes size() const { return size_; }
  bool empty() const { return data_ == nullptr; }
  /// A non-owning view of bytes [offset, offset + size) of this buffer (for a shard, a
  /// chunk of a send, a slot of an all-gather). Valid while this buffer lives.
  /// REQUIRES: the range lies inside the buffer.
  Buffer slice(Bytes offset, Bytes size) const;

 private:
  void swap(Buffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(release_, o.release_);
    std::swap(owner_, o.owner_);
  }
  void* data_ = nullptr;
  Bytes size_;
  void (*release_)(void*, void*) = nullptr;
  void* owner_ = nullptr;
};

/// A stream of work: 0 is the compute stream, 1.. are communication streams (created on
/// first use). Matches sim::TaskGraph's stream indices.
struct Stream {
  int index = 0;
  bool operator==(const Stream&) const = default;
};
inline constexpr Stream kComputeStream{0};
inline constexpr Stream kCommStream{1};

/// A point on a stream (cudaEvent_t). Opaque id owned by the backend.
struct Event {
  int64_t id = -1;
};

/// A communicator over a subset of the world's ranks (ncclComm_t / MPI_Comm). `rank` is this
/// process's position in `ranks`, -1 when it is not a member (then it must not be used).
struct Group {
  int64_t id = -1;
  std::vector<int> ranks;  // world ranks, in group order
  int rank = -1;
  int size() const { return static_cast<int>(ranks.size()); }
};

/// C = alpha * op(A) * op(B) + beta * C, `batch` times over consecutive matrices (strided),
/// op(A) m x k, op(B) k x n, C m x n, column-major, leading dimensions = stored rows.
/// Inputs and C share `dtype`, except fp8: A and B are fp8 e4m3 and C is bf16 (fp8 training
/// keeps outputs in bf16; cuBLASLt has no fp8 C), and the cuda backend needs trans_a = true,
/// trans_b = false for fp8 (Hopper's fp8 tensor cores take "TN" only). Accumulation in fp32
/// on every backend; beta = 0 never reads C. `fp32_c`: C is fp32 whatever the inputs, the
/// way a weight gradient is added (beta 1) into Megatron's fp32 main_grad when gradient
/// accumulation is fused into the wgrad GEMM.
struct GemmDesc {
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;
  bool trans_a = false, trans_b = false;
  DType dtype = DType::kBf16;
  float alpha = 1.0f, beta = 0.0f;
  bool fp32_c = false;
  double flops() const { return 2.0 * static_cast<double>(m) * n * k * batch; }
  DType c_dtype() const {
    return fp32_c ? DType::kF32 : dtype == DType::kF8E4M3 ? DType::kBf16 : dtype;
  }
};

/// Scaled-dot-product attention over [batch, seq, heads, head_dim] tensors; kv_heads divides
/// heads (grouped-query attention: query head h reads kv head h / (heads / kv_heads)).
/// softmax(Q K^T / sqrt(head_dim)) V. Causal masks bottom-right aligned (query i sees keys
/// j <= i + seq_kv - seq_q, as FlashAttention); a query that sees no key outputs 0.
/// Forward writes `out` and the softmax statistics (batch x heads x seq_q fp32 log-sum-exps,
/// of the scaled scores, -inf for a query that sees no key) that backward needs. Backward
/// writes d_q, d_k, d_v (overwrites them). dtype fp32, bf16 or fp16 (no fp8 attention).
/// With `sinks` (Megatron-Core's softmax_type learnable, GPT-OSS) each query head h has a
/// learned logit s_h that joins every row's softmax with no value: p_ij = exp(x_ij - lse_i),
/// lse_i = log(exp(s_h) + sum_j exp(x_ij)), so a row's probabilities sum to below one (a
/// query that sees no key outputs 0 with lse s_h). The sinks buffer holds the `heads` fp32
/// logits; backward writes their gradient, -sum over b, i of exp(s_h - lse_i) * delta_i with
/// delta_i = dO_i . O_i, into d_sinks (overwrites it). Both are null without sinks.
struct AttentionDesc {
  int64_t batch = 1, heads = 1, kv_heads = 1, seq_q = 0, seq_kv = 0, head_dim = 0;
  bool causal = false;
  /// Causal only, > 0: a sliding window, query i seeing keys i + seq_kv - seq_q - window
  /// through i + seq_kv - seq_q (itself and the `window` keys before it); 0: none.
  int64_t window = 0;
  bool sinks = false;
  DType dtype = DType::kBf16;
  /// 4*b*h*d per scored pair: sq*skv of them, causal causal_score_pairs(sq, skv, window)
  /// (core/attention_mask.h; sq*skv / 2 for a square call).
  double forward_flops() const;
};

/// Memory-bound kernels of the sizes a layer has (norms, activations, residual adds).
/// Arithmetic in fp32, result rounded to dtype. gelu is the tanh approximation (GPT-2,
/// Megatron); rms(row) = sqrt(mean(row^2) + 1e-6). Backward ops take the forward input as
/// in[0] and the output gradient as in[1].
enum class ElementwiseOp : uint8_t {
  kCopy,             // out = in[0]
  kAdd,              // out = in[0] + scale * in[1] (scale 1: a residual add; SGD step)
  kScale,            // out = scale * in[0]
  kGelu,             // out = gelu(in[0])
  kRmsNorm,          // out row r = in[0] row r / rms(row r); rows of `row_size` elements
  kMul,              // out = in[0] * in[1]
  kGeluBackward,     // out = gelu'(in[0]) * in[1]
  kRmsNormBackward,  // out = d(rmsnorm)/d(in[0]) applied to in[1], per row of `row_size`
};
int elementwise_inputs(ElementwiseOp op);  // how many inputs `op` takes
struct ElementwiseDesc {
  ElementwiseOp op = ElementwiseOp::kCopy;
  int64_t elements = 0;
  int64_t row_size = 0;  // kRmsNorm, kRmsNormBackward: divides elements
  float scale = 1.0f;    // kAdd, kScale
  DType dtype = DType::kBf16;
};

struct DeviceInfo {
  std::string backend;   // "cpu" | "cuda"
  std::string name;      // "NVIDIA H200", CPU model name
  Bytes memory;          // device memory (cpu: the host's)
  std::string versions;  // driver / CUDA / cuBLASLt / NCCL / MPI versions, free text
  int world = 1;
  int rank = 0;
  int local_rank = 0;  // rank within its host
  int hosts = 1;       // distinct hosts in the world
  /// cpu: the cores this process may run on (its affinity mask), which the host's ranks
  /// share; cuda: 0 (each rank has its own GPU).
  int host_cores = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const DeviceInfo& info() const = 0;

  // Memory. Contents of a fresh buffer are unspecified.
  virtual Result<Buffer> allocate(Bytes size) = 0;
  /// Deterministic pseudo-random values in [-scale, scale): element i is
  /// random_uniform(seed, i, scale) of host_data.h rounded to `t`, on every backend, so any
  /// slice of a tensor can be reproduced on the host.
  virtual Status fill_random(Stream s, Buffer& b, DType t, int64_t count, uint64_t seed,
                             float scale) = 0;
  /// Synchronous copies between host and device (they wait for the stream's prior work).
  virtual Status copy_to_host(Stream s, const Buffer& b, std::span<std::byte> host) = 0;
  virtual Status copy_from_host(Stream s, std::span<const std::byte> host, Buffer& b) = 0;

  // Compute.
  virtual Status gemm(Stream s, const GemmDesc& d, const Buffer& a, const Buffer& b, Buffer& c) = 0;
  // `sinks` / `d_sinks`: non-null exactly when d.sinks (AttentionDesc).
  virtual Status attention_forward(Stream s, const AttentionDesc& d, const Buffer& q,
                                   const Buffer& k, const Buffer& v, const Buffer* sinks,
                                   Buffer& out, Buffer& softmax_stats) = 0;
  virtual Status attention_backward(Stream s, const AttentionDesc& d, const Buffer& q,
                                    const Buffer& k, const Buffer& v, const Buffer* sinks,
                                    const Buffer& out, const Buffer& d_out,
                                    const Buffer& softmax_stats, Buffer& d_q, Buffer& d_k,
                                    Buffer& d_v, Buffer* d_sinks) = 0;
  virtual Status elementwise(Stream s, const ElementwiseDesc& d,
                             std::span<const Buffer* const> inputs, Buffer& out) = 0;
  /// Evicts the L2 cache (writes a buffer larger than it) so that timed kernels start cold.
  virtual Status flush_cache(Stream s) = 0;

  // Communication. Every member issues the same calls in the same order. Reductions are
  /// sums (accumulated in fp32 on the cpu backend, as NCCL does in the dtype on the cuda one).
  /// A buffer smaller than the call needs, or a call on a group this rank is not a member
  /// of, is an invalid_argument.
  /// Collective over all world ranks: every rank passes the same `ranks` (distinct world
  /// ranks, in group order). Non-members get the Group too, with rank -1.
  virtual Result<Group> make_group(std::span<const int> ranks) = 0;
  /// In place when send.data() == recv.data(). `count` elements per rank's buffer.
  virtual Status all_reduce(Stream s, const Group& g, const Buffer& send, Buffer& recv,
                            int64_t count, DType t) = 0;
  /// `count` elements contributed per rank; recv holds count * g.size(), in group order.
  /// In place when send is this rank's slot of recv (recv.slice(rank * count elements)).
  virtual Status all_gather(Stream s, const Group& g, const Buffer& send, Buffer& recv,
                            int64_t count, DType t) = 0;
  /// send holds count * g.size(); `count` elements of the sum land in recv.
  virtual Status reduce_scatter(Stream s, const Group& g, const Buffer& send, Buffer& recv,
                                int64_t count, DType t) = 0;
  /// `count` elements to and from every member.
  virtual Status all_to_all(Stream s, const Group& g, const Buffer& send, Buffer& recv,
                            int64_t count, DType t) = 0;
  /// `root` is a position in the group.
  virtual Status broadcast(Stream s, const Group& g, Buffer& buf, int64_t count, DType t,
                           int root) = 0;
  /// Point to point with world ranks; pair them between group_start / group_end when several
  /// (the cpu backend posts them non-blocking there and waits at group_end; outside a group
  /// they block, so two ranks that both send first deadlock, as in NCCL). Messages between
  /// a pair arrive in the order they were sent.
  virtual Status send(Stream s, const Buffer& buf, int64_t count, DType t, int peer) = 0;
  virtual Status recv(Stream s, Buffer& buf, int64_t count, DType t, int peer) = 0;
  virtual Status group_start() = 0;
  virtual Status group_end() = 0;

  // Ordering and timing.
  virtual Result<Event> record(Stream s) = 0;
  /// Work issued on `s` after this call waits for `e`.
  virtual Status wait(Stream s, Event e) = 0;
  virtual Status synchronize() = 0;  // every stream of this rank
  /// Time between two recorded events, once both have completed.
  virtual Result<Time> elapsed(Event from, Event to) = 0;
  /// World barrier (MPI_Barrier after synchronize()).
  virtual Status barrier() = 0;
};

/// Backend names this build has: always "cpu"; "cuda" when built with CUDA and NCCL.
std::vector<std::string> available_backends();

/// Creates the backend `name` for this process. Initialises MPI (thread level funneled)
/// on first use and finalises it at exit; a process run without mpirun is a world of one.
/// Collective under mpirun: every rank creates the same backends in the same order (each
/// sets up its world communicator: MPI_Comm_dup, ncclCommInitRank). A backend must not
/// outlive the process's static destructors (MPI_Finalize runs there).
/// Errors: unknown name, a backend not built in, no usable device (e.g. "cuda" without a
/// GPU: Status::unavailable, which tests use to skip).
Result<std::unique_ptr<Backend>> make_backend(std::string_view name);

}  // namespace hetpar::runtime

// DeviceProfile: one GPU type — datasheet peaks plus the efficiencies cost models apply
// (GEMM wave-quantization model, flash-attention and memory-bound fractions of peak),
// optionally with measured GEMM rates per shape (from `hetpar calibrate`) that correct
// the GEMM model where it was measured.
// Plain data with cheap, deterministic, allocation-free cost functions that are safe to
// call from many threads; the numbers come from profiles/*.json (see system_profile.h).
#pragma once

#include <array>
#include <compare>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hetpar/core/curve.h"
#include "hetpar/core/units.h"
#include "hetpar/hardware/precision.h"

namespace hetpar::hardware {

/// Dense (no sparsity) tensor-core peak of one precision and the largest fraction of it
/// a well-shaped GEMM reaches (measured "maximum achievable matmul FLOPS" / peak).
struct PrecisionRate {
  FlopRate peak;
  double eta_max = 0;
  bool operator==(const PrecisionRate&) const = default;
};

/// One output tile shape the GEMM library may pick (one CTA per tile), with its
/// throughput relative to the best tile (smaller tiles reuse less data).
struct GemmTile {
  int m = 0;
  int n = 0;
  double efficiency = 1.0;
  bool operator==(const GemmTile&) const = default;
};

/// Work of a flash-attention backward kernel per model-FLOP of backward (2.5x forward in
/// the FlashAttention benchmark convention over the 2x forward model FLOPs).
inline constexpr double kFlashBackwardWork = 2.5 / 2.0;
/// The largest gpu.attention.noncausal_scale factor a profile may hold: a causal kernel that
/// computes the whole square and masks half of it is 2x slower per model FLOP than its
/// unmasked call; the rest is room for a short length's noise.
inline constexpr double kMaxNoncausalScale = 3.0;
/// The score-matrix elements of an attention call of `flops` model FLOPs at head dim `d`:
/// F / (4·d) of a forward's (4·b·h·s_q·s_kv·d, halved when causal), F / (8·d) of a
/// backward's, which counts twice a forward's FLOPs. With keys and values of different
/// widths (latent attention) `d` is their mean, which F counts per element.
inline double attention_score_elements(double flops, bool backward, int64_t head_dim) {
  return flops / ((backward ? 8.0 : 4.0) * static_cast<double>(head_dim));
}

/// One point of an efficiency curve (core/curve.h): at size `at` a kernel runs at `factor`
/// times the profile's reference efficiency. Attention: `at` = key/value tokens per call,
/// against the long-sequence efficiency; GEMMs: `at` = the reduction length K, against
/// eta_max; collectives (system_profile.h): `at` = the message's bytes.
using hetpar::CurvePoint;

/// One measured GEMM (batch 1, m x k times k x n) and the rate it ran at.
struct GemmMeasurement {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  FlopRate rate;
  bool operator==(const GemmMeasurement&) const = default;
};

/// The fused attention kernels whose rates a profile may give (Layout::attention_kernel).
enum class AttentionKernel {
  kDefault,  // the profile's own rates (gpu.attention): the kernel its trainers pick
  kCudnn,    // cuDNN's fused attention (Transformer Engine's FusedAttention on Hopper+)
  kFlash2,   // FlashAttention-2 (PyTorch SDPA's flash backend through torch 2.8)
  kFlash3,   // FlashAttention-3 (Hopper)
};
inline constexpr std::array<AttentionKernel, 4> kAttentionKernels = {
    AttentionKernel::kDefault, AttentionKernel::kCudnn, AttentionKernel::kFlash2,
    AttentionKernel::kFlash3};
std::string_view to_string(AttentionKernel k);  // "default", "cudnn", "flash2", "flash3"
std::optional<AttentionKernel> parse_attention_kernel(std::string_view s);

/// One attention kernel's rates: fractions of the precision's peak for long sequences, and
/// their sequence-length curves (as DeviceProfile's attention_* fields).
struct AttentionRates {
  double fwd_efficiency = 0;
  double bwd_efficiency = 0;
  std::vector<CurvePoint> fwd_seq_scale;
  std::vector<CurvePoint> bwd_seq_scale;
  std::vector<CurvePoint> noncausal_scale;  // as DeviceProfile::attention_noncausal_scale
  std::vector<CurvePoint> head_dim_scale;   // as DeviceProfile::attention_head_dim_scale
  bool operator==(const AttentionRates&) const = default;
};

struct DeviceProfile {
  std::string model;
  int sm_count = 0;
  Bytes l2;
  Bytes memory_capacity;
  Bandwidth memory_bandwidth;    // datasheet peak
  double memory_efficiency = 0;  // achievable fraction of peak for streaming kernels
  Bandwidth host_link;           // PCIe, per direction, achievable
  std::array<std::optional<PrecisionRate>, kAllPrecisions.size()> compute;
  std::vector<GemmTile> gemm_tiles;
  /// Per-kernel launch overhead (profile key gpu.gemm.launch_us). Every kernel pays it:
  /// gemm_time, attention_time and memory_kernel_time add it once per call.
  Time gemm_launch_overhead;
  bool gemm_split_k = true;
  /// Measured GEMM rates per precision (indexed like `compute`; empty = none measured).
  std::array<std::vector<GemmMeasurement>, kAllPrecisions.size()> gemm_measured;
  /// Measured rates of GEMMs that add into an fp32 output (beta 1, fp32 C), per precision
  /// (profile key gpu.gemm.measured_accumulate; empty = none measured).
  std::array<std::vector<GemmMeasurement>, kAllPrecisions.size()> gemm_accumulate_measured;
  /// The fraction of an fp32-accumulating GEMM's output traffic (its fp32 C read and D
  /// written, 8 bytes per element, at the streaming bandwidth) that its main loop does not
  /// hide (gpu.gemm.accumulate_exposed; 0: all hidden). cuBLASLt reads C in the epilogue,
  /// after each tile's main loop. Used where gemm_accumulate_measured has no rows for the
  /// precision; its rows are ratios to the model with this term.
  double gemm_accumulate_exposed = 0;
  /// Sustained GEMM rate against the reduction length K, per precision (indexed like
  /// `compute`; empty: none): factors on eta_max, ascending in K, interpolated linearly in
  /// log2(K) and clamped. At the power limit a longer K holds a lower clock (more power per
  /// tile), a short K loses to each tile's prologue and epilogue.
  std::array<std::vector<CurvePoint>, kAllPrecisions.size()> gemm_k_scale;
  double attention_fwd_efficiency = 0;  // fraction of the precision's peak (long sequences)
  double attention_bwd_efficiency = 0;
  /// Sequence-length dependence of the flash-attention rates (empty: none): factors on the
  /// efficiencies above, ascending in seq, interpolated linearly in log2(seq) and clamped
  /// at both ends. Short sequences run slower (causal tiles on the diagonal, pipeline
  /// prologue and epilogue per query block).
  std::vector<CurvePoint> attention_fwd_seq_scale;
  std::vector<CurvePoint> attention_bwd_seq_scale;
  /// The efficiencies above are of causal calls; a call without a mask (an encoder's, a
  /// context-parallel ring's steps off the diagonal) runs this factor faster per FLOP at
  /// its key/value length (gpu.attention.noncausal_scale; empty: 1), as the diagonal
  /// tiles' partial work and the triangle's uneven rows cost a causal kernel.
  std::vector<CurvePoint> attention_noncausal_scale;
  /// The rates above are at head dim 128; a call of another head dim runs this factor of
  /// them (gpu.attention.head_dim_scale; empty: 1), interpolated in log2(d) and clamped at
  /// both ends: fused kernels run smaller heads slower per FLOP, as their exponentials
  /// (one per score element) weigh more against the products (FlashAttention-3 §3). On both
  /// passes and masks alike.
  std::vector<CurvePoint> attention_head_dim_scale;
  /// The kernel the rates above are of (gpu.attention.kernel; kDefault: unnamed), and other
  /// kernels' rates (gpu.attention.alternatives), which a plan may ask for by name.
  AttentionKernel attention_kernel = AttentionKernel::kDefault;
  std::map<AttentionKernel, AttentionRates> attention_alternatives;
  /// The fraction of the attention rates above (the own kernel's and the alternatives')
  /// that the GPU sustains through a training step (gpu.attention.sustain; 1: the rates
  /// are sustained ones). Attention benchmarks time tens of back-to-back calls, before the
  /// clock settles at the power limit, where a step keeps the GPU; the GEMM rates
  /// (compute.*.eta_max) are sustained measurements already.
  double attention_sustain = 1.0;
  /// Time per element of the score matrix of the profile's own attention kernel, beyond its
  /// FLOPs (gpu.attention.fwd_element_ps / bwd_element_ps; 0: none): the softmax's max,
  /// exponential and sum per element, which the model FLOPs (4·b·h·s_q·s_kv·d) do not count
  /// and which weigh more the smaller the head dim (FlashAttention-3, arXiv 2407.08608 §3:
  /// exponentials run at a fraction of the matmul rate). Calibrate fits it from two head dims
  /// per key length; the rates above then exclude it. A call of F model FLOPs at head dim
  /// d has F / (4·d) elements forward (F / (8·d) of the backward's 2x FLOPs).
  double attention_fwd_element_ps = 0, attention_bwd_element_ps = 0;
  /// Compute kernels take (1 + this) times as long while a collective of this GPU runs
  /// (NCCL's kernels occupy SMs and memory bandwidth); 0 = overlap is free.
  double collective_overlap_slowdown = 0;
  /// Relative standard deviation of the sustained SM clock across GPUs of this model under a
  /// training load (gpu.clock_spread; 0: not modelled). Tensor-core work runs at the clock,
  /// so in a job the GPUs' rates spread alike, and a synchronous job runs at its slowest.
  double clock_spread = 0;
  /// The share of the tensor-core rates above that the slowest of the job's GPUs of this
  /// model sustains (ClusterSpec::create sets it from clock_spread and their count; 1 for a
  /// profile on its own). gemm_time() and attention_time() include it; memory-bound kernels
  /// run at the HBM's rate, which the SM clock does not set.
  double compute_scale = 1.0;

  bool operator==(const DeviceProfile&) const = default;

  bool supports(Precision p) const { return compute[precision_index(p)].has_value(); }
  /// REQUIRES: supports(p).
  FlopRate peak(Precision p) const;
  double eta_max(Precision p) const;

  /// Predicted time of `batch` independent (m x k)·(k x n) GEMMs in precision `p`:
  /// the best tile of max(waves · tile time at eta_max, bytes / (HBM bw · mem eff))
  /// plus the launch overhead, with split-K when the tiles cannot fill the SMs.
  /// With measurements for `p`, that model time is multiplied by the measured / model time
  /// ratio interpolated from the (up to) 4 measured shapes nearest in (log2 m, log2 n,
  /// log2 k), inverse-square-distance weighted in log space: exact at a measured shape,
  /// the model's shape dependence (waves, roofline, batch) in between.
  /// `accumulate_fp32`: the product is added into an fp32 output (a weight gradient into
  /// Megatron's fp32 main_grad): the model adds gemm_accumulate_exposed of that output's
  /// traffic, and with measurements of such GEMMs for `p` (gemm_accumulate_measured) the
  /// ratio comes from those, else from the plain ones.
  /// REQUIRES: supports(p), all sizes >= 1.
  Time gemm_time(int64_t m, int64_t n, int64_t k, int64_t batch, Precision p,
                 bool accumulate_fp32 = false) const;
  /// Achieved fraction of peak(p) implied by gemm_time().
  double gemm_efficiency(int64_t m, int64_t n, int64_t k, int64_t batch, Precision p) const;
  /// Flash attention: `flops` (model FLOPs: forward 4·b·h·s_q·s_kv·d, halved when causal;
  /// backward twice that) at the forward or backward fraction of peak(p) times
  /// attention_sustain, plus launch. The
  /// efficiencies are FlashAttention benchmark rates (flash-attention
  /// benchmarks/benchmark_flash_attention.py), which count the backward kernel's work as
  /// 2.5x the forward FLOPs (its recompute of QK^T included): the backward time is
  /// flops · kFlashBackwardWork / (peak · bwd efficiency). `seq_kv` (> 0) is the key/value
  /// length of one kernel call and selects the point on the seq-scale curves; 0 means a
  /// long sequence (factor 1).
  /// `rates`: another kernel's (attention_rates()); nullptr: the profile's own, whose time
  /// per score element is added for a `head_dim` > 0. `causal` false: a call without a
  /// mask, at the noncausal_scale's faster rate. `head_dim` > 0 (where keys and values differ
  /// in width, their mean) picks the point on the head_dim_scale curve (0: head dim 128's
  /// rates).
  Time attention_time(Flops flops, Precision p, bool backward, int64_t seq_kv = 0,
                      const AttentionRates* rates = nullptr, bool causal = true,
                      int64_t head_dim = 0) const;
  /// Whether the profile has rates for `k` (kDefault and its own kernel always).
  bool has_attention_kernel(AttentionKernel k) const;
  /// `k`'s rates for attention_time(): nullptr for the profile's own kernel.
  /// REQUIRES: has_attention_kernel(k).
  const AttentionRates* attention_rates(AttentionKernel k) const;
  /// `bytes` (reads + writes) streamed through HBM at the effective bandwidth, no launch.
  Time memory_time(Bytes bytes) const;
  /// One memory-bound kernel moving `bytes`: memory_time(bytes) plus the per-kernel launch
  /// overhead, as gemm_time and attention_time charge it (calibration.md 3.4:
  /// t = max(compute, bytes / (BW·eta_mem)) + t_launch). Zero bytes: no kernel, zero time.
  Time memory_kernel_time(Bytes bytes) const;
  Bandwidth effective_memory_bandwidth() const { return memory_bandwidth * memory_efficiency; }

 private:
  /// The tile / roofline model of gemm_time() without launch overhead and measurements, the
  /// tensor-core rate times `rate_scale`.
  double model_gemm_seconds(int64_t m, int64_t n, int64_t k, int64_t batch, Precision p,
                            double rate_scale) const;
};

/// The share of the mean GPU's rate that the slowest of `n` GPUs sustains when their rates
/// spread normally with relative standard deviation `spread`: 1 - spread * z_n, z_n the
/// expected largest of n standard normal draws (Blom's approximation, Phi^-1((n - 0.375) /
/// (n + 0.25)): 0 for one GPU, 1.42 for 8, 3.4 for 2048). REQUIRES n >= 1, 0 <= spread <= 0.2.
double slowest_rate_share(double spread, int64_t n);

}  // namespace hetpar::hardware

// From calibration samples to a hardware profile: the fits (alpha-beta per collective,
// scope and group size; P2P per pair and pooled per scope; memory and host-link
// bandwidth; attention efficiency; the GEMM rate table) and the SystemProfile they make,
// in the schema of the built-in profiles (system_profile.h) so that `simulate --profile`
// and scenario files load it like any other. Fields a run cannot measure (inter-node
// figures of a one-host run, datasheet peaks) come from a base profile when one is given
// (`--base dgx-h200`), else from the measurement itself; provenance says which, per field.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "hetpar/calibrate/fit.h"
#include "hetpar/calibrate/sweep.h"
#include "hetpar/core/status.h"
#include "hetpar/hardware/system_profile.h"

namespace hetpar::calibrate {

struct CollectiveFit {
  hardware::Collective op = hardware::Collective::kAllReduce;
  hardware::CollectiveScope scope = hardware::CollectiveScope::kIntraNode;
  int ranks = 0;  // group size in ranks (send_recv: 2)
  int nodes = 1;
  AlphaBetaFit fit;
  double busbw_Bps = 0;  // fit.beta_Bps x the nccl-tests bus factor of op and ranks
};

struct PairFit {
  int src = 0, dst = 0;
  hardware::CollectiveScope scope = hardware::CollectiveScope::kIntraNode;
  AlphaBetaFit fit;
};

struct GemmFit {
  runtime::DType dtype = runtime::DType::kBf16;
  int shapes = 0;
  double max_flops_per_s = 0;
  double median_flops_per_s = 0;
  double min_flops_per_s = 0;
  GemmDims best;
};

struct Fits {
  std::vector<GemmFit> gemm;             // plain GEMMs, per dtype
  std::vector<GemmFit> gemm_accumulate;  // GEMMs adding into an fp32 output, per input dtype
  double launch_s = 0;                   // median time of the smallest GEMM
  /// Causal attention rates: model FLOPs / (time - launch_s - the elements' time), pooled over
  /// the shapes of one key length, ascending in seq_kv. The *_flops_per_s figures are the
  /// longest length's (the profile's efficiency); the shorter ones become its seq-scale curve.
  std::vector<std::pair<int64_t, double>> attention_fwd_by_seq, attention_bwd_by_seq;
  /// Time per score element (the softmax), from causal calls at two head dims of one key
  /// length (the median over lengths; attention_elements_fitted: some length had two); the
  /// rates above are fitted on each call's time less it.
  double attention_fwd_element_s = 0, attention_bwd_element_s = 0;
  bool attention_elements_fitted = false;
  double attention_fwd_flops_per_s = 0;
  double attention_bwd_flops_per_s = 0;
  /// Of key lengths timed both causal and unmasked, ascending: the unmasked calls' speed per
  /// model FLOP over the causal ones' (forward and backward together), the profile's
  /// gpu.attention.noncausal_scale. The rates above are the causal calls'.
  std::vector<std::pair<int64_t, double>> attention_unmasked_by_seq;
  std::optional<AlphaBetaFit> memory;  // on memory traffic (read + write = 2x copied)
  /// The profile's memory bandwidth: the median over copies of traffic / time. The
  /// simulator's memory kernel is launch_s + bytes / bandwidth (memory_kernel_time), its
  /// intercept the GEMM-measured launch, so a fitted slope whose intercept came out large
  /// (noise on a loaded host) would predict too fast.
  double memory_Bps = 0;
  double host_to_device_Bps = 0;
  double device_to_host_Bps = 0;
  std::vector<CollectiveFit> collectives;  // sorted by (scope, op, ranks); incl. send_recv
  std::vector<PairFit> pairs;
};

/// nccl-tests busbw / algbw (calibration.md 2.5): all_reduce 2(n-1)/n; all_gather,
/// reduce_scatter, all_to_all (n-1)/n; broadcast, send_recv 1.
double bus_factor(hardware::Collective op, int n);

/// Fits every sample group. Errors name the sample group whose fit failed.
Result<Fits> fit_samples(const Samples& samples);

struct ProfileOptions {
  std::string name;  // "" = "calibrated-<backend>"
  /// Datasheet peaks and unmeasured fields come from here when set.
  std::optional<hardware::SystemProfile> base;
  std::string base_ref;  // how the base was named, for provenance
  std::string date;      // ISO 8601, UTC
  std::string mode;      // "quick" or "full", for the record
  /// Where the plan shapes beyond the grid came from (`--shapes-from`), for the record;
  /// "" = the grid alone.
  std::string plan_shapes;
  /// The run's NCCL had NVLS switched off (NCCL_NVLS_ENABLE=0 in a cuda calibration's
  /// environment), so its intra-node all_reduce samples are the ring NCCL runs without it.
  /// Where the base's node has NVLS, the profile keeps the base's all_reduce figure and
  /// takes the measured one as its busbw_without_nvls_GBps / size_scale_without_nvls (what a
  /// cluster's "nvls": false runs); elsewhere the measured figure is the node's own.
  bool nvls_disabled = false;
};

/// The profile; it passes hardware::validate_profile and has no missing provenance.
Result<hardware::SystemProfile> build_profile(const Samples& samples, const Fits& fits,
                                              const ProfileOptions& opts);

/// The profile JSON (system_profile.h schema) with a "$calibration" annotation holding
/// the provenance of the run (device, versions, date, hosts, backend), the fits and the
/// raw samples. Hardware's parser reads the file as a plain profile ("$" keys are
/// annotations).
std::string calibration_to_json_text(const hardware::SystemProfile& profile, const Samples& samples,
                                     const Fits& fits, const ProfileOptions& opts);

}  // namespace hetpar::calibrate

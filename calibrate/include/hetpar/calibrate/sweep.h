// Microbenchmark sweeps on a runtime::Backend: GEMMs over shapes, attention forward and
// backward, device memory copies, host <-> device copies, point-to-point between every pair
// of ranks, and each collective over message sizes and group sizes, inside a host and
// across hosts. Every rank of the world calls run_sweeps() with the same plan (the
// collectives need all of them); the complete Samples are on rank 0 only.
//
// How a sample is timed: `warmup` untimed calls, then `reps` timed repetitions, each
// between two backend events, reported as median, p10 and p90 over the repetitions.
// - GEMM and attention: one call per repetition, the L2 cache flushed before each
//   (calibration.md 4.3: otherwise a repeated GEMM runs from a warm cache) — except GEMMs
//   whose operands fit in 64 KiB (the 8x8x8 launch probe), timed warm like copies: their
//   time is per-call overhead, not memory traffic.
// - Copies, P2P and collectives: `inner` back-to-back calls per repetition, inner chosen
//   after warm-up so that a repetition lasts about min_rep_s (timer resolution, launch and
//   start skew amortized, as nccl-tests does with its iteration count).
// - P2P and collectives: a world barrier before every repetition; the repetition's time is
//   the slowest member's (a collective ends when its last rank does).
// Compute sweeps run on rank 0 only unless compute_on_every_rank: on the cpu backend the
// ranks share cores and memory, so concurrent GEMMs would measure the contention of
// oversubscription, not the device; on GPUs every rank measures its own GPU concurrently
// and the repetitions of all ranks are pooled (GPU-to-GPU spread shows in p10/p90; each
// rank's own GEMM median is kept too, GemmSample::rank_median_s).
//
// Size conventions are nccl-tests' (calibration.md 2.5): all_reduce and broadcast S = the
// buffer, all_gather / reduce_scatter S = the whole gathered / scattered array,
// all_to_all S = one rank's send buffer, P2P S = the message. Device copies count bytes
// copied once (memory traffic is twice that).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "hetpar/calibrate/fit.h"
#include "hetpar/calibrate/gemm_grid.h"
#include "hetpar/core/status.h"
#include "hetpar/hardware/system_profile.h"
#include "hetpar/runtime/backend.h"

namespace hetpar::calibrate {

/// A GEMM timed as a weight gradient added into an fp32 main_grad (beta 1, fp32 C): how
/// Megatron's fused gradient accumulation runs every wgrad GEMM.
struct AccumulateGemm {
  GemmDims dims;
  runtime::DType dtype = runtime::DType::kBf16;  // the inputs'
  bool operator==(const AccumulateGemm&) const = default;
};

struct SweepPlan {
  std::vector<GemmDims> gemms;  // each in every gemm_dtypes
  std::vector<runtime::DType> gemm_dtypes;
  std::vector<AccumulateGemm> accumulate_gemms;
  /// Each timed forward and backward. The causal ones give the profile's attention rates; an
  /// unmasked one beside a causal one of its key length gives that length's noncausal_scale.
  std::vector<runtime::AttentionDesc> attention;
  std::vector<int64_t> copy_bytes;
  int64_t host_copy_bytes = 0;  // 0 = no host link measurement
  std::vector<int64_t> p2p_bytes;
  std::vector<int64_t> collective_bytes;
  std::vector<hardware::Collective> collectives = {
      hardware::Collective::kAllReduce, hardware::Collective::kAllGather,
      hardware::Collective::kReduceScatter, hardware::Collective::kAllToAll,
      hardware::Collective::kBroadcast};
  runtime::DType comm_dtype = runtime::DType::kF32;  // nccl-tests' default (float)
  int warmup = 2;
  int reps = 5;
  /// > 0: each GEMM (but the call-overhead probe) runs back to back for this long before its
  /// repetitions, which then run back to back too (no cache flush): the rate a GPU holds at
  /// its power limit, as a training step runs its GEMMs (the built-in profiles' MSMF), not a
  /// cold burst. 0: burst (cache flushed before each repetition).
  double gemm_sustain_s = 0;
  double min_rep_s = 1e-3;
  int max_inner = 100;
  bool compute_on_every_rank = false;
};

/// The plan `hetpar calibrate` runs. quick: a small grid that finishes in seconds on the
/// cpu backend (sizes capped so Eigen and MPI over shared memory stay fast). Full on cuda:
/// the zoo GEMM grid, collectives 1 KiB .. 1 GiB; full on cpu: the zoo grid capped at 1024
/// per dimension and messages capped at 64 MiB.
SweepPlan default_plan(std::string_view backend, bool quick);

/// Which host each rank runs on (from the hostnames the ranks exchange at the start).
struct RankTopology {
  int world = 1;
  std::vector<int> host_of_rank;  // host index in order of first appearance
  int hosts() const;
  /// Ranks on host h, ascending.
  std::vector<int> ranks_on_host(int h) const;
  /// The fewest ranks any host has.
  int min_ranks_per_host() const;
};

struct GemmSample {
  GemmDims dims;
  runtime::DType dtype = runtime::DType::kBf16;
  TimingStats t;
  bool accumulate_fp32 = false;  // an AccumulateGemm
  /// Each rank's own median time, where every rank timed its own device (compute on every
  /// rank, more than one rank): the spread of a job's GPUs; empty otherwise.
  std::vector<double> rank_median_s;
  double flops_per_s() const { return dims.flops() / t.median_s; }
};

struct AttentionSample {
  runtime::AttentionDesc desc;
  bool backward = false;
  TimingStats t;
  /// Model FLOPs: forward_flops(), backward twice that (op_graph.h's convention).
  double flops() const { return desc.forward_flops() * (backward ? 2.0 : 1.0); }
};

struct CopySample {
  bool host = false;     // false: device -> device copy kernel; true: host link
  bool to_host = false;  // host link direction
  int64_t bytes = 0;
  TimingStats t;
};

struct P2PSample {
  int src = 0, dst = 0;
  hardware::CollectiveScope scope = hardware::CollectiveScope::kIntraNode;
  int64_t bytes = 0;
  TimingStats t;
};

struct CollectiveSample {
  hardware::Collective op = hardware::Collective::kAllReduce;
  hardware::CollectiveScope scope = hardware::CollectiveScope::kIntraNode;
  int ranks = 0;  // group size in ranks
  int nodes = 1;  // hosts the group spans
  int64_t bytes = 0;
  TimingStats t;
};

struct Samples {
  runtime::DeviceInfo device;  // rank 0's
  RankTopology topology;
  int warmup = 0;
  int reps = 0;
  double gemm_sustain_s = 0;  // SweepPlan::gemm_sustain_s
  std::vector<GemmSample> gemms;
  std::vector<AttentionSample> attention;
  std::vector<CopySample> copies;
  std::vector<P2PSample> p2p;
  std::vector<CollectiveSample> collectives;
  double wall_s = 0;
};

/// Called on rank 0 before each sample: the phase ("gemm", "all_reduce", ...), the
/// sample's index and the total number of samples of the whole run.
using Progress = std::function<void(std::string_view phase, int done, int total)>;

/// Runs `plan` on every rank of the backend's world (all ranks must call it).
Result<Samples> run_sweeps(runtime::Backend& backend, const SweepPlan& plan,
                           const Progress& progress = {});

}  // namespace hetpar::calibrate

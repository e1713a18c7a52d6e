// Memory model: the bytes one rank of each pipeline stage holds at its peak under a Plan,
// Megatron-LM conventions with mixed-precision Adam.
//
// Model state per local parameter (Megatron-LM distributed optimizer guide,
// docs.nvidia.com/megatron-core/developer-guide/latest/api-guide/dist_optimizer.html:
// "bf16 parameters, fp32 gradients: 18 bytes, 6 + 12/d distributed"; Rajbhandari et al.,
// ZeRO, arXiv 1910.02054, sec. 3.1):
// - weights: 2 B (bf16/fp16/fp8 training keeps bf16 weights); 4 B for fp32/tf32;
// - gradients: the main-grad buffer Megatron's DDP accumulates and reduces in,
//   gradient_bytes(): 4 B (fp32) for bf16 / fp8 training, 2 B for fp16 training, unless
//   the layout's grad_reduce_dtype says otherwise (2 B for bf16 gradients);
// - optimizer: fp32 master weights + Adam m + v = 12 B (8 B for fp32 training, whose
//   weights are their own master copy), divided by the data-parallel group (dp * cp; for
//   routed experts dp * cp / ep) under the distributed optimizer, which shards only this
//   state, not the gradient or parameter buffers.
// Which parameters a rank holds: the LLM's layers split over pp * vpp model chunks as the
// layout says (schedule.h's layers_per_virtual_stage: even, or Megatron's uneven first /
// last stage and embedding / loss accounting; chunk c on stage c % pp; when no valid split
// exists, the first chunks take one more layer), the embedding on the first stage, the final norm
// and output layer on the last (tied embeddings: the last stage keeps its own copy of the table, as
// Megatron does). Encoders and projectors sit whole on the first stage (the homogeneous baseline:
// every module uses the plan's layout). TP shards GEMM weights (column/row parallel) and
// the vocabulary; norms, the MoE router, position tables and encoder stems (patch embedding,
// audio convolutions) are replicated. Routed experts: experts / ep per rank, each sharded by
// tp (Megatron's expert tensor parallel size defaults to tp).
//
// Activations follow models::OpGraph (Korthikanti et al., arXiv 2205.05198): the saved
// bytes of each op for one micro-batch, kept under the recompute policy, split by CP (every
// module's tokens) and by TP: without sequence parallelism only the tensors inside the TP
// region (attention core, the output projection's input, the MLP activation and fc2 input,
// the vocab-parallel loss) are divided, giving Korthikanti's Table 2 sbh(10 + 24/t +
// 5as/(ht)) per layer; with SP everything inside the layers is, sbh(34/t + 5as/(ht)).
// FP8 training: Transformer Engine's Linear modules keep the 1-byte FP8 transpose of their
// input for the weight gradient, so the layers' GEMM inputs (qkv, attn_out, fc1, fc2: 14 of
// the 34sbh) count half; the output layer (Megatron's own) and the MoE router keep bf16.
// Times the micro-batches the schedule holds (in_flight_micro_batches); the output layer
// and loss (4sbv/t fp32 logits) are held as many times as the last virtual stage holds
// micro-batches. Recompute adds its working set: one layer of one micro-batch re-materialised
// during backward (full: the whole layer; selective: the attention scores).
#pragma once

#include <cstdint>
#include <vector>

#include "hetpar/core/units.h"
#include "hetpar/planner/layout.h"
#include "hetpar/planner/scenario.h"

namespace hetpar::planner {

struct MemoryBreakdown {  // one rank
  Bytes weights;
  Bytes gradients;
  Bytes optimizer_state;
  Bytes activations;
  Bytes communication_buffers;
  Bytes workspace;
  Bytes total() const;
  bool operator==(const MemoryBreakdown&) const = default;
};

struct MemoryReport {
  /// Index = pipeline stage; the ranks of one stage are alike. With vpp > 1 a rank holds
  /// vpp model chunks, all counted here. Non-colocated plans: one entry per encoder
  /// pipeline stage (its ranks, in plan.modules order) first, then the LLM's stages.
  std::vector<MemoryBreakdown> per_stage;
  int peak_stage = 0;  // the stage with the largest total (the first of equals)
  Bytes peak;          // its total
  /// Per stage: the device memory of its GPUs (the smallest over the node groups its ranks
  /// lie on; a cluster may mix GPU types).
  std::vector<Bytes> stage_capacity;
  /// The stage with the least room: its total over its capacity is the largest (the first
  /// of equals; on one kind of GPU, peak_stage).
  int tightest_stage = 0;
  /// The tightest stage's capacity and total.
  Bytes capacity() const {
    return stage_capacity.empty() ? Bytes() : stage_capacity[static_cast<size_t>(tightest_stage)];
  }
  Bytes tightest() const {
    return per_stage.empty() ? Bytes() : per_stage[static_cast<size_t>(tightest_stage)].total();
  }
  /// Whether every stage fits its GPUs.
  bool fits() const { return tightest() <= capacity(); }
  /// Sets peak_stage / peak and tightest_stage from per_stage and stage_capacity.
  void summarise();
};

struct MemoryOptions {
  /// An allowance, not a measurement: CUDA context and kernel images (~0.5 GiB on Hopper),
  /// cuBLAS/cuBLASLt workspaces (PyTorch reserves 32 MiB per handle on Hopper) and NCCL
  /// communicator buffers (NCCL_BUFFSIZE, 4 MiB per channel and peer, for each of the TP,
  /// DP, PP and CP communicators).
  Bytes fixed_workspace = Bytes::GiB(1);
  /// An allowance for the caching allocator's fragmentation, as a fraction of the
  /// activations (the model state lives in contiguous buffers allocated once; activations
  /// are allocated and freed every micro-batch).
  double fragmentation = 0.1;
  /// Where to take the modules' op graphs from (a search thread's, across its layouts);
  /// null: built afresh. The estimate does not depend on it.
  ModuleGraphCache* graphs = nullptr;
};

/// Per-stage memory of `p` on `s`. Communication buffers: pipeline send and receive
/// tensors (2 x s*b*h / cp, and / tp with SP, as Megatron's P2P shapes) and, with SP, the
/// all-gathered layer input (s*b*h / cp, Megatron's global memory buffer). DP gradient
/// reduction works in place in the gradient buffer and adds nothing.
/// Heterogeneous plans: the LLM under p.layout; each encoder with its projectors under its
/// ModulePlan's layout, holding the activations of the encoder steps its program keeps in
/// flight (boundary.h's encoder_program: colocated with pp 1, one step; non-colocated, the
/// steps the LLM's warm-up needs; colocated three-phase, every step of the local batch, whose
/// outputs the LLM's first stage also holds); frozen encoders hold weights only (no gradients,
/// optimizer state or saved activations). Colocated: every rank adds its encoder shard to
/// its LLM stage. Non-colocated: a pipelined encoder (pp > 1) splits its layers as lower.h
/// says, each stage holding the steps its own 1F1B program keeps in flight, plus the
/// pipeline's send / receive buffers. Communication buffers add the received encoder output
/// of one encoder step (the LLM side) and, non-colocated, the encoder's send buffer (on its
/// last stage).
/// REQUIRES: p is feasible for s (infeasibility() is empty).
MemoryReport estimate_memory(const Scenario& s, const Plan& p, const MemoryOptions& opts = {});

/// Bytes per element of Megatron's gradient buffer (main_grad), which DP reduces: bf16 and
/// fp8 training accumulate and reduce in fp32 (Megatron-LM arguments.py forces
/// accumulate_allreduce_grads_in_fp32 for bf16: "bfloat16 requires gradient accumulation and
/// all-reduce to be done in fp32"); fp16 training keeps the parameters' dtype (the flag
/// defaults off), 2 bytes; fp32 / tf32 training 4. A layout's grad_reduce_dtype other than
/// kDefault names the dtype itself (fp32: 4, bf16 / fp16: 2); infeasibility() has checked
/// that it suits the precision.
int gradient_bytes(hardware::Precision p, GradReduceDtype d = GradReduceDtype::kDefault);
/// Bytes per element of the parameters a rank holds (and FSDP gathers): 2 (bf16 / fp16;
/// fp8 training keeps bf16 weights), 4 for fp32 / tf32 training.
int weight_bytes(hardware::Precision p);
/// Whether op's weight is a Transformer Engine Linear's (every GEMM of the layers but the
/// MoE router), which FP8 training runs in FP8 and Layout::fp8_param_gather holds in FP8.
bool is_fp8_linear(const models::Op& op);
/// Bytes `params` parameters occupy (and an all-gather of them moves), `fp8_params` of them
/// TE Linear weights: 1 byte each for those with the layout's fp8_param_gather, else
/// weight_bytes(). Fractional counts (a rank's shard of a tally) are allowed.
double held_weight_bytes(double params, double fp8_params, hardware::Precision p, const Layout& l);

/// Micro-batches whose activations pipeline stage `stage` (0-based, of pp) holds at its
/// peak, in units of the stage's whole activations for one micro-batch, with m micro-batches
/// per iteration:
/// - GPipe: m (all forwards run before any backward);
/// - 1F1B and ZB-H1: min(pp - stage, m) (pp - stage - 1 warm-up forwards, then one more
///   before each backward). ZB-H1 (Qi et al. arXiv 2401.10241) holds these whole, as 1F1B;
///   estimate_memory adds the GEMM inputs of the micro-batches whose deferred weight-
///   gradient passes are pending (up to min(pp, m) in flight on every stage, schedule.h),
///   so the peak, stage 0's, stays 1F1B's;
/// - interleaved: Megatron-LM's warm-up of w = 2(pp - stage - 1) + (vpp - 1)pp chunk
///   forwards (all m*vpp of them when m == pp), so min(w + 1, m*vpp) chunks of 1/vpp of the
///   stage: on stage 0, pp + (pp - 1)/vpp, Korthikanti et al.'s L(1 + (p - 1)/(pm)) layers;
///   `extra_warmup` more forwards as stage_order() runs them (Layout::ep_comm_overlap);
///   with a micro-batch group (Layout::microbatch_group; `group`, 0 = pp) (vpp - 1)group
///   in place of (vpp - 1)pp.
/// REQUIRES: 0 <= stage < pp, vpp >= 1, m >= 1.
double in_flight_micro_batches(Schedule sch, int stage, int pp, int vpp, int64_t m,
                               int extra_warmup = 0, int64_t group = 0);

}  // namespace hetpar::planner

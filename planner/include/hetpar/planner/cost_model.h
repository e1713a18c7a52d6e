// Cost model: what one rank computes and communicates for one micro-batch of one module
// under a Layout, as blocks (the work before a module's layers, one transformer layer, the
// work after them) of steps in forward order: local compute (the module's ops sharded by
// the layout and timed with DeviceProfile) and the communication points between them.
//
// Sharding (Megatron-LM):
// - GEMMs: qkv, fc1 (MLP, experts, shared experts, a two-layer projector) and the logits
//   are column-parallel (N / tp); attn_out and fc2 row-parallel (K / tp); the router, patch
//   and conv embeddings and a one-layer projector are replicated. M is the micro-batch's
//   tokens / cp for the LLM (encoders are not split by CP: their CP ranks replicate them).
//   Experts: E / ep local experts, each with the tokens the ep group routes to it.
//   Forward gemm_time(m, n, k); dgrad gemm_time(m, k, n); wgrad gemm_time(k, n, m).
// - Attention core: FLOPs / (tp * cp) (heads / tp; causal load-balanced CP chunks) at the
//   flash efficiency (attention_time, at the kernel's key/value length s_kv / cp: short
//   chunks run slower, gpu.attention.*_seq_scale). Without flash attention (Megatron-LM 2021-2022):
//   batched GEMMs over micro-batch x local heads computing the full (unmasked) score
//   matrix, QK^T and PV forward and their four backward products, plus the memory-bound
//   softmax (and attention dropout) passes over the materialized scores.
// - Pointwise ops: memory bound, read + written bytes (backward twice that); split by tp
//   when they act on head- / ffn- / vocab-sharded tensors (rope, activations, loss) or on
//   sequence-parallel regions (SP: norms, residuals, dropout), by cp for the LLM. The loss
//   is Megatron's unfused fp32 vocab-parallel cross-entropy (38 bytes per logit forward,
//   14 backward).
// - FP8 (Transformer Engine): only the GEMMs of the layers' Linear modules run in fp8, each
//   with its cast + transpose kernels (input of attn_out / fc2 forward, output gradient
//   backward); attention, the logits GEMM (Megatron's own output layer), pointwise ops and
//   all activation traffic (TP, CP, PP, EP) stay bf16. Current scaling (Layout::fp8_recipe
//   tensorwise) adds each cast's separate amax pass and the cast the norm can no longer fuse.
// - Selective recompute re-runs the attention core before its backward (cost.recompute);
//   full recompute re-runs each layer's forward, which lower() replays from the block.
//
// Communication points (tp > 1): a layer's entry "f" after each norm (forward: SP
// all-gather; backward: SP reduce-scatter, else all-reduce, beside the wgrad GEMM of the
// column-parallel linear that follows it, WorkStep::overlaps_tp_entry) and exit "g" before each
// residual add (forward: SP reduce-scatter, else all-reduce; backward: SP all-gather),
// over the full s·b·h/cp activation (nccl-tests size); the vocab-parallel embedding's
// output is a "g", the logits' input an "f". MoE with ep > 1: all-to-all of the routed
// tokens (tokens/cp/(tp with SP) · top_k · h) after dispatch and before combine, both
// directions. CP > 1: the attention core is a ring-attention step exchanging K,V chunks
// (with the memory-bound output / LSE corrections and gradient accumulation Transformer
// Engine's ring runs around its attention calls); with cp_comm all_gather, two calls per
// rank (one per local chunk) against the gathered keys, and TE's reorder copies; with a2a,
// all-to-alls of Q, K, V and of the output around one call over the whole sequence with
// heads / cp, and TE's layout copies around each; with a2a+p2p, those all-to-alls over
// groups of cp_a2a ranks around a ring over cp / cp_a2a of them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hetpar/core/units.h"
#include "hetpar/hardware/device_profile.h"
#include "hetpar/models/op_graph.h"
#include "hetpar/planner/layout.h"

namespace hetpar::planner {

/// One rank's time and FLOPs of a piece of work, per pass.
struct PassCost {
  Time forward, dgrad, wgrad, recompute;
  Flops forward_flops, dgrad_flops, wgrad_flops, recompute_flops;  // GEMMs + attention core
  /// A causal context-parallel ring's attention: how much longer its first (diagonal,
  /// masked) step takes than each other (unmasked) one, forward and backward; lower()'s
  /// ring gives the first step that much more of the op's time.
  Time ring_diagonal_forward, ring_diagonal_dgrad;
  PassCost& operator+=(const PassCost& o);
};

enum class StepKind : uint8_t {
  kCompute,
  kTpEntry,      // "f": forward SP all-gather; backward SP reduce-scatter or all-reduce
  kTpExit,       // "g": forward SP reduce-scatter or all-reduce; backward SP all-gather
  kEpAllToAll,   // both directions
  kCpAttention,  // ring attention over the cp group: cost split into cp steps
  /// The vocab-parallel loss's statistics combined over TP (cross-entropy's max, sum of
  /// exponentials, target logit per token): forward an all-reduce of `bytes`; backward
  /// nothing (each rank's gradient needs only its own logits and the combined statistics).
  kTpLossAllReduce,
  kTpLossAllGather,  // as kTpLossAllReduce, an all-gather of `bytes` in total
};

struct WorkStep {
  StepKind kind = StepKind::kCompute;
  PassCost cost;  // kCompute, kCpAttention
  /// Communication size: TP: the full activation (nccl-tests all-reduce buffer /
  /// all-gather total); all-to-all: one rank's send buffer; CP: the K,V chunk one ring
  /// step sends forward (backward sends K,V and their gradients: twice that; a2a+p2p: the
  /// chunk after the all-to-all, the same size); a2a CP: one rank's K,V.
  Bytes bytes;
  /// kTpEntry: what its SP all-gathers (forward, and the backward re-gather of
  /// overlaps_tp_entry) move: `bytes`, or half of it where the linear after the entry is a
  /// Transformer Engine FP8 module, which quantises its input before the gather.
  Bytes gather_bytes;
  /// kCompute, kCpAttention: the graph's ops (indices into OpGraph::ops, forward order)
  /// whose work this step is, for their kernels (kernels.h).
  std::vector<int32_t> ops;
  /// kCpAttention under a2a and a2a+p2p CP: one rank's Q (all-to-all'd with `bytes` of K,V
  /// before the attention, their gradients after its backward) and its attention output
  /// (all-to-all'd after the forward; before the backward the output and its gradient go,
  /// twice this).
  Bytes query_bytes = Bytes(0);
  Bytes out_bytes = Bytes(0);
  /// kCompute: this step is one column-parallel linear (qkv, fc1, logits) right after a
  /// TP entry, alone in its step. Its backward runs as Megatron's
  /// LinearWithGradAccumulationAndAsyncCommunication (and Transformer Engine's Linear /
  /// LayerNormLinear) do: dgrad first, then the entry's backward collective (SP
  /// reduce-scatter, else all-reduce of the input gradient) runs beside the wgrad GEMM;
  /// under SP the linear's input, saved as this rank's sequence slice, is all-gathered
  /// again beside the dgrad GEMM, which the wgrad GEMM waits for.
  bool overlaps_tp_entry = false;
  /// With overlaps_tp_entry: the linear is the output layer (logits), whose wgrad
  /// Layout::defer_embedding_wgrad puts off.
  bool output_layer = false;
  /// kCompute: this step is one row-parallel linear (proj, fc2) right before a TP exit,
  /// alone in its step (Layout::tp_comm_overlap).
  bool overlaps_tp_exit = false;
  /// kCompute, with overlaps_tp_entry or overlaps_tp_exit: Transformer Engine's userbuffers
  /// ring exchange runs the adjacent TP collective chunk by chunk beside this linear's GEMM
  /// (Layout::tp_comm_overlap); the cost is that of the GEMM split into tp chunks of rows
  /// (GemmChunks), its forward and, before an exit, its dgrad.
  bool ring_exchange = false;
  /// With overlaps_tp_exit and ring_exchange: the chunks the exit's reduce-scatter moves in,
  /// all but the last beside the GEMM (tp for a ring exchange, num_splits for userbuffers'
  /// "pipeline" method).
  int32_t exit_chunks = 1;
  /// kEpAllToAll of the dispatch: the routing probabilities' own all-to-all right after the
  /// tokens' (Megatron-Core's MoEAlltoAllTokenDispatcher sends permuted_probs as a second
  /// call, forward and for their gradients backward), one fp32 per routed token; 0: none.
  Bytes probs_bytes{};
  /// kEpAllToAll of the dispatch: one rank's tokens-per-expert counts (an int64 per expert),
  /// which the dispatcher all-gathers over the EP group before it (its preprocess) to size
  /// the all-to-all; 0: none.
  Bytes expert_counts_bytes{};
  /// kTpEntry (forward) and kTpExit (backward) next to a Transformer Engine FP8 linear under
  /// current scaling (Fp8Recipe::kTensorwise) with SP: the tensor the collective gathers in
  /// FP8 (qkv's / fc1's input; proj's / fc2's output gradient) needs one scale on every TP
  /// rank, so its amax is all-reduced over the TP group before the cast (TE's quantizer
  /// with_amax_reduction), a blocking 4-byte all-reduce before the gather.
  bool amax_reduce = false;
  /// kCompute, kTpEntry, kTpExit: a step of the shared experts that
  /// Layout::moe_shared_expert_overlap runs beside an EP all-to-all: a run of such steps
  /// follows the all-to-all it hides in forward order (their entry, first linear and
  /// activation the dispatch's; their second linear and exit the combine's) and, in the
  /// backward direction's list (for_direction), precedes it, as the backward runs the list
  /// from its end. The run starts from the task before the all-to-all, not waiting for it;
  /// the step after the run waits for both.
  bool beside_all_to_all = false;

  /// Whether this step does graph op `op`'s work (its `ops`, in graph `g`).
  bool holds(const models::OpGraph& g, std::string_view op) const {
    for (int32_t i : ops)
      if (g.ops[static_cast<size_t>(i)].name == op) return true;
    return false;
  }
};

/// A GEMM's rows split into chunks run one after another (userbuffers' ring exchange): its
/// forward (m rows) and dgrad (m rows) in `forward` and `dgrad` chunks; 1 = whole.
struct GemmChunks {
  int64_t forward = 1;
  int64_t dgrad = 1;
};

/// Parameters one rank holds: how many, and how many of them are Transformer Engine Linear
/// weights (memory.h is_fp8_linear), which Layout::fp8_param_gather holds and gathers in FP8.
struct ParamCount {
  int64_t all = 0, fp8 = 0;
  ParamCount& operator+=(const ParamCount& o) {
    all += o.all;
    fp8 += o.fp8;
    return *this;
  }
};

/// The layers of a module share one Block; so do the ops before and after them.
struct Block {
  std::vector<WorkStep> steps;  // forward order; adjacent compute steps already merged
  ParamCount dense;             // this rank's shard, reduced over dp x cp
  ParamCount expert;            // this rank's routed experts (Lowering::param_parts)
  /// Of `dense`, the parameters TP replicates whose gradients differ between the TP ranks,
  /// which Megatron-LM all-reduces over TP after the DP sync (finalize_model_grads'
  /// _allreduce_layernorm_grads): under SP the norms and the MoE router (each rank sees
  /// its sequence slice), and the q/k norms (each rank its heads); 0 with tp 1.
  int64_t tp_synced = 0;
  bool empty() const { return steps.empty() && dense.all == 0 && expert.all == 0; }
};

struct ModuleCost {
  Block pre;    // before the first layer (embeddings; the whole of a projector)
  Block layer;  // one transformer layer (of an MoE LLM: one of its MoE layers)
  Block post;   // after the last layer (final norm, logits, loss)
  int64_t layers = 0;
  /// An MoE LLM's dense layers (models::LayerKinds::dense), each `dense_layer`; the other
  /// layers are `layer`. Empty with none.
  Block dense_layer;
  /// The layers with sliding-window attention (models::LayerKinds::windowed), each
  /// `window_layer`, or of an MoE LLM's dense layers `window_dense_layer`, in place of
  /// `layer` / `dense_layer`. Empty without.
  Block window_layer;
  Block window_dense_layer;
  /// Which layers are which (the op graph's).
  models::LayerKinds kinds;
  /// Which block layer `i` (0-based, below `layers`) runs: 0 `layer`, 1 `dense_layer`,
  /// 2 `window_layer`, 3 `window_dense_layer`.
  int layer_kind(int64_t i) const { return kinds.kind(i); }
  const Block& kind_block(int kind) const {
    switch (kind) {
      case 1:
        return dense_layer;
      case 2:
        return window_layer;
      case 3:
        return window_dense_layer;
    }
    return layer;
  }
  Block& kind_block(int kind) { return const_cast<Block&>(std::as_const(*this).kind_block(kind)); }
  const Block& layer_block(int64_t i) const { return kind_block(layer_kind(i)); }
  Block& layer_block(int64_t i) { return kind_block(layer_kind(i)); }
  /// An LLM's multi-token-prediction depths (models::LlmSpec::mtp_layers), after `post` on
  /// the last virtual stage; empty without.
  Block mtp;
  /// Activation one rank sends to the next pipeline stage: s·b·h/cp, divided by tp under
  /// sequence parallelism (each rank sends its sequence slice) or with
  /// Layout::pp_scatter_gather (its 1/tp piece); otherwise every TP rank sends the full
  /// tensor.
  Bytes boundary_bytes;
  /// With pp_scatter_gather (tp > 1, no SP): the tensor the receiving stage all-gathers
  /// over its TP group from the pieces, s·b·h/cp; else zero.
  Bytes boundary_gather_bytes;
};

/// One op's cost on one rank under `l`. `context_parallel`: whether cp splits the op's
/// tokens (the LLM) or every cp rank repeats it (encoders, projector). `chunks`: a GEMM's
/// rows split as userbuffers runs them (ignored by other ops).
PassCost op_cost(const models::Op& op, const models::OpGraph& g, const Layout& l,
                 bool context_parallel, const hardware::DeviceProfile& dev, hardware::Precision p,
                 GemmChunks chunks = {});

/// The blocks of module graph `g` (built for one micro-batch) under `l`.
/// REQUIRES: the layout is feasible for the module (infeasibility() is empty).
ModuleCost module_cost(const models::OpGraph& g, const Layout& l, bool context_parallel,
                       const hardware::DeviceProfile& dev, hardware::Precision p);

}  // namespace hetpar::planner

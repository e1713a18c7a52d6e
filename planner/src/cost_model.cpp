#include "hetpar/planner/cost_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <map>
#include <optional>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "hetpar/core/attention_mask.h"
#include "hetpar/core/check.h"
#include "hetpar/planner/kernels.h"
#include "hetpar/planner/memory.h"

namespace hetpar::planner {

PassCost& PassCost::operator+=(const PassCost& o) {
  forward += o.forward;
  dgrad += o.dgrad;
  wgrad += o.wgrad;
  recompute += o.recompute;
  forward_flops += o.forward_flops;
  dgrad_flops += o.dgrad_flops;
  wgrad_flops += o.wgrad_flops;
  recompute_flops += o.recompute_flops;
  ring_diagonal_forward += o.ring_diagonal_forward;
  ring_diagonal_dgrad += o.ring_diagonal_dgrad;
  return *this;
}

namespace {

enum class Split { kNone, kColumn, kRow };

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool is_expert(const models::Op& op) {
  return op.name.starts_with("expert_");
}

// The output layer: the LLM's, and each multi-token-prediction depth's pass through it.
bool is_output_layer(const models::Op& op) {
  return op.name == "logits" || op.name == "mtp_logits";
}

// How tensor parallelism splits a GEMM (see cost_model.h).
Split gemm_split(const models::Op& op, const models::OpGraph& g) {
  if (g.kind == models::ModuleKind::kProjector) {
    const bool two_layers = std::any_of(g.ops.begin(), g.ops.end(),
                                        [](const models::Op& o) { return o.name == "fc2"; });
    if (!two_layers) return Split::kNone;
  }
  // A multi-token-prediction depth's eh_proj: Megatron's ColumnParallelLinear; latent
  // attention's up projections (and q_proj without a query latent) likewise.
  if (op.name == "qkv" || is_output_layer(op) || op.name == "mtp_eh_proj" || op.name == "q_up" ||
      op.name == "kv_up" || op.name == "q_proj" || ends_with(op.name, "fc1"))
    return Split::kColumn;
  if (op.name == "attn_out" || ends_with(op.name, "fc2")) return Split::kRow;
  return Split::kNone;
}

// Whether a pointwise op runs on a tp-sharded tensor.
bool pointwise_tp_sharded(const models::Op& op, const Layout& l, models::ModuleKind kind) {
  if (op.kind == models::OpKind::kLoss || op.name == "rope" || op.name == "qk_norm" ||
      op.name == "repeat_kv")
    return true;
  if (ends_with(op.name, "act") && (op.layer >= 0 || kind == models::ModuleKind::kProjector))
    return true;
  return l.sequence_parallel && (op.layer >= 0 || op.name == "final_norm");
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

using hardware::Precision;

// The routed experts of layer `layer` of `g` (its expert fc1 GEMMs, one per expert).
int64_t routed_experts(const models::OpGraph& g, int layer) {
  int64_t experts = 0;
  for (const models::Op& o : g.ops)
    if (o.layer == layer && o.name == "expert_fc1")
      for (const models::GemmShape& s : o.gemms) experts += s.batch;
  return experts;
}

// The dispatcher's reorder of the routed tokens by local expert (the graph's moe_sort and
// moe_unsort): a copy of this rank's routed tokens, read and written, forward and (the
// inverse order for the gradient) backward; none without expert parallelism or with one
// local expert (sort_chunks_by_idxs runs only then). The tokens are those after the EP
// all-to-all: this rank's sequence slice under SP with whole experts, all its TP group's
// when the experts are split over TP (gathered first). Elements, or 0 when it does not run.
// Only the all-to-all dispatcher runs it: its all-to-all delivers (source rank, expert)
// chunks. DeepEP's flex dispatcher receives each token once per rank and permutes the
// received tokens straight into expert order (Megatron-Core's _DeepepManager:
// get_permuted_hidden_states_by_experts, one permute; the restore one unpermute), the
// graph's moe_dispatch and moe_combine.
bool is_expert_reorder(const models::Op& op) {
  return op.name == "moe_sort" || op.name == "moe_unsort";
}
int64_t expert_reorder_elements(const models::Op& op, const models::OpGraph& g, const Layout& l,
                                int64_t cp) {
  const int64_t experts = routed_experts(g, op.layer);
  if (l.ep <= 1 || experts / l.ep <= 1 || l.moe_dispatcher != MoeDispatcher::kAllToAll) return 0;
  const int64_t slice = l.sequence_parallel && l.expert_tp() == 1 ? l.tp : 1;
  return op.read.count() / g.dtype_bytes / (cp * slice);
}

// HybridEP permutes the tokens into expert order inside its dispatch kernel and back inside
// its combine (Megatron-Core's _HybridEPManager: hybrid_ep_dispatch "permute + dispatch a2a
// + permute", hybrid_ep_combine the reverse; get_permuted_hidden_states_by_experts returns
// what the dispatch delivered), each the other's backward: the graph's moe_dispatch and
// moe_combine move no bytes of their own. Their small kernels (moe_kernels) stay, for
// HybridEP's own routing-map preprocessing.
bool permuted_in_dispatch(const models::Op& op, const Layout& l) {
  return l.ep > 1 && l.moe_dispatcher == MoeDispatcher::kHybridEp &&
         (op.name == "moe_dispatch" || op.name == "moe_combine");
}

// FP8 training (Transformer Engine, delayed or current scaling) runs only the GEMMs of its
// Linear modules in fp8: activations, norms, residuals, the loss and the TP/PP/CP traffic
// stay bf16, and dot-product attention runs in bf16 (TE's `fp8_dpa` is off by default; NeMo
// and Megatron-Bridge recipes leave it off). The op graph stores elements in the workload
// precision's size, so under fp8 these bytes scale by bf16 / fp8.
Precision attention_precision(Precision p) {
  return p == Precision::kFp8 ? Precision::kBf16 : p;
}

// The key length whose causal calls run at a windowed call's rate (the profile's attention
// rates are measured on causal calls over their key length): a causal call of twice the
// window, whose queries see as many keys on average as the band's do. FlashAttention and
// cuDNN visit only the key tiles a query block's band touches, so a narrow band pays a
// short call's prologue and diagonal tiles per query block, as that call does. Without a
// window: `seq_kv`.
int64_t rate_seq_kv(int64_t seq_kv, bool windowed, int64_t window) {
  return windowed ? std::min(seq_kv, 2 * window) : seq_kv;
}

// All-gather CP: Transformer Engine's AttnFuncWithCPAndKVAllGather calls each of a rank's two
// local chunks (s / (2 cp) queries) against the gathered keys it sees
// (get_kv_seq_info_after_all_gather): causal, from `window` before the chunk (the sequence's
// start without one) to the chunk's end, bottom-right aligned; bidirectional, all of them.
// The key lengths of the two calls of the busiest rank, cp - 1 (chunks cp - 1 and cp, which
// no sequence start clips while a window is under half the sequence): load balancing evens
// the causal prefixes out (without a window every rank scores the mean), not the windows,
// which rank 0's first chunk cannot fill.
std::array<int64_t, 2> gather_keys(const models::AttentionShape& a, int64_t cp) {
  if (!a.causal) return {a.seq_kv, a.seq_kv};
  const int64_t chunk = a.seq_q / (2 * cp);
  auto keys = [&](int64_t k) {
    return a.windowed() ? std::min((k + 1) * chunk, chunk + a.window) : (k + 1) * chunk;
  };
  return {keys(cp - 1), keys(cp)};
}
int activation_bytes(const models::OpGraph& g, Precision p) {
  return p == Precision::kFp8 ? std::max(2, g.dtype_bytes) : g.dtype_bytes;
}

// Megatron's output layer is its own ColumnParallelLinear, not a TE module, so FP8 autocast
// does not reach it: the logits GEMM runs in bf16.
Precision gemm_precision(const models::Op& op, Precision p) {
  return p == Precision::kFp8 && is_output_layer(op) ? Precision::kBf16 : p;
}

// Megatron's unfused vocab-parallel cross-entropy (megatron/core/tensor_parallel/
// cross_entropy.py, called on logits.float()): HBM bytes per logit element. Forward: bf16 ->
// fp32 copy (2 + 4), max (4), subtract in place (4 + 4), exp (4 + 4), sum (4), divide in
// place for the saved softmax (4 + 4). Backward: grad = softmax * dloss in place (4 + 4),
// cast back to bf16 (4 + 2).
constexpr int64_t kCrossEntropyForwardBytes = 38;
constexpr int64_t kCrossEntropyBackwardBytes = 14;

// HBM bytes per logit element of the loss, forward and backward, by Layout::
// cross_entropy_fusion. Unfused: the above. Megatron-Core's fused_vocab_parallel_cross_entropy
// (megatron/core/fusions/fused_cross_entropy.py): the fp32 copy (2 + 4) and its max (4), one
// jit-fused pass for the shifted exp and its sum (4 + 4), the softmax divided in place and
// saved (4 + 4) = 26; backward the gradient times dloss in place (4 + 4) and cast back
// (4 + 2) = 14. Transformer Engine's parallel_cross_entropy (transformer_engine/pytorch/
// triton/cross_entropy.py): an online-softmax pass reading the bf16 logits (2), then a pass
// writing the gradient in place in the logits' dtype (2 + 2) = 6; backward the in-place
// multiply by dloss (2 + 2) = 4. torch.compile'd F.cross_entropy(pred.float()) (torchtitan's
// compile.components "loss"): Inductor fuses the cast into the log-softmax's reductions, and
// its online softmax takes the max and the sum in one loop (test/inductor/
// test_online_softmax.py: one reduction loop for the max and sum), so the forward reads the
// bf16 logits once (2); the partitioner saves the logits (an input of the compiled graph) and
// the per-row statistics, and the backward is one pointwise kernel reading the logits and
// writing their gradient in bf16 (2 + 2) = 4.
struct LossBytes {
  int64_t forward, backward;
};
LossBytes loss_bytes(CrossEntropy c) {
  switch (c) {
    case CrossEntropy::kUnfused:
      return {kCrossEntropyForwardBytes, kCrossEntropyBackwardBytes};
    case CrossEntropy::kNative:
      return {26, 14};
    case CrossEntropy::kTe:
      return {6, 4};
    case CrossEntropy::kCompiled:
      return {2, 4};
  }
  return {kCrossEntropyForwardBytes, kCrossEntropyBackwardBytes};
}

// Transformer Engine FP8 Linear (transformer_engine/pytorch/module/linear.py): a forward
// fused cast + transpose of the bf16 input to fp8 (read 2, write 1 + 1 bytes per element)
// unless a preceding LayerNorm writes fp8 itself (LayerNormLinear: qkv, fc1); backward a
// cast + transpose of the bf16 output gradient (fp8_cast_transpose_bgrad_fused).
constexpr int64_t kFp8CastTransposeBytes = 4;
// Current scaling's scale kernel: the amax read, the scale and its inverse written.
constexpr int64_t kFp8ScaleBytes = 12;

// The TP width an op's GEMM is split over: the routed experts' own (Layout::expert_tp()).
int gemm_tp(const models::Op& op, const Layout& l) {
  return is_expert(op) ? l.expert_tp() : l.tp;
}

// Latent attention's down projections (Transformer Engine Linears in "duplicated" mode):
// every TP rank holds the whole weight and runs it on the tokens it holds.
bool is_latent_down_projection(const models::Op& op) {
  return op.name == "q_down" || op.name == "kv_down";
}

// A GEMM every TP rank runs whole on its own tokens: the MoE router and latent attention's
// down projections, on this rank's sequence slice under SP (Megatron-Core's MoELayer and
// MLASelfAttention take their input as [s/tp, b, h]).
bool runs_on_sequence_slice(const models::Op& op, const Layout& l) {
  return (op.name == "router" || is_latent_down_projection(op)) && l.sequence_parallel && l.tp > 1;
}

// One rank's shares of an op's GEMMs: rows split by CP (and by TP for those that run on
// the sequence slice), columns (rows of the weight) by the op's TP width for column- (row-)
// parallel linears. Experts: E / ep local experts
// sharing the tokens the ep group routes to them, of the TP group's whole sequence when the
// experts are split over it (gathered, module_cost), of this rank's slice with whole
// experts (expert_tp 1).
std::vector<models::GemmShape> rank_gemms(const models::Op& op, const models::OpGraph& g,
                                          const Layout& l, int64_t cp) {
  std::vector<models::GemmShape> shapes = op.gemms;
  if (is_expert(op)) {
    int64_t rows = 0, experts = 0;
    for (const auto& s : op.gemms) {
      rows += s.m * s.batch;
      experts += s.batch;
    }
    const int64_t slices = l.tp / l.expert_tp();
    shapes = {{ceil_div(ceil_div(rows, experts) * l.ep, slices), op.gemms[0].n, op.gemms[0].k,
               experts / l.ep}};
  }
  const Split split = gemm_split(op, g);
  const bool slice = runs_on_sequence_slice(op, l);
  for (models::GemmShape& s : shapes) {
    s.m = ceil_div(s.m, cp * (slice ? l.tp : 1));
    if (split == Split::kColumn) s.n = ceil_div(s.n, gemm_tp(op, l));
    if (split == Split::kRow) s.k = ceil_div(s.k, gemm_tp(op, l));
  }
  return shapes;
}

// Whether a Linear's FP8 input comes from the norm in front of it: Transformer Engine's
// LayerNormLinear (qkv) and Megatron's TELayerNormColumnParallelLinear fc1 of a dense MLP
// write the norm's output in FP8 themselves. A MoE layer's pre-MLP norm is a module of its
// own (Megatron's layer spec: pre_mlp_layernorm = TENorm with experts), and the routed and
// shared experts' fc1 take the permuted or normed bf16 tokens, which they quantise.
bool norm_writes_fp8_input(const models::Op& op) {
  return op.name == "qkv" || op.name == "mlp_fc1";
}

// The quantise kernels Transformer Engine runs around one FP8 Linear GEMM group `s` of
// a layer (its s.batch local experts for a grouped linear), forward and backward.
// Delayed scaling: one fused cast + transpose (read 2, write 1 + 1 bytes per element) of
// the bf16 input unless the norm writes it (norm_writes_fp8_input), and one of the output
// gradient; a grouped linear's experts share one multi-tensor kernel
// (nvte_multi_cast_transpose, transformer_engine/pytorch/csrc/extensions/cast.cpp:
// "only have fused kernel for FP8 delayed scaling").
// Current scaling (Fp8Recipe::kTensorwise, Float8CurrentScalingQuantizer, csrc/quantizer.cpp)
// quantises each tensor with four calls: its amax zeroed (a memset, a host call alone), its
// amax (a pass of its own, read 2 bytes per element), the scale from it (a few bytes), the
// cast + transpose; and a grouped linear quantises each expert's tensor on its own
// (split_quantize, csrc/extensions/cast.cpp: the fused multi-tensor kernel takes delayed
// scaling only), so its experts pay four calls each. Forward: the norm in front of qkv / a dense
// fc1 can no longer write fp8 itself; it writes bf16 (its amax fused, TE >= 2.7) and a cast +
// transpose follows on its local input, which sequence parallelism shards by tp before the fp8
// all-gather; a dense fc2's amax comes fused with the activation kernel. Backward: the
// output gradient's amax, scale and cast + transpose.
struct Fp8Kernels {
  std::vector<sim::Kernel> forward, backward;
};
Fp8Kernels fp8_quantize_kernels(const models::Op& op, const models::GemmShape& s, const Layout& l) {
  Fp8Kernels q;
  const bool current = l.fp8_recipe == Fp8Recipe::kTensorwise;
  const int64_t tensors = current && is_expert(op) ? s.batch : 1;
  // One quantisation of `elements` (all tensors together): each tensor's kernels in turn.
  auto quantise = [&](std::vector<sim::Kernel>& out, int64_t elements, bool amax_pass) {
    const int64_t each = elements / tensors;
    for (int64_t i = 0; i < tensors; ++i) {
      if (current && amax_pass) {
        out.push_back(sim::memory_kernel(0));  // the amax zeroed (cudaMemsetAsync): a host call
        out.push_back(sim::memory_kernel(2 * each));
      }
      if (current) out.push_back(sim::memory_kernel(kFp8ScaleBytes));
      out.push_back(sim::memory_kernel(kFp8CastTransposeBytes * each));
    }
  };
  const int64_t input = s.m * s.k * s.batch, grad = s.m * s.n * s.batch;
  if (!norm_writes_fp8_input(op))
    quantise(q.forward, input, op.name != "mlp_fc2");
  else if (current)  // the norm's output, cast after it (its amax fused in the norm)
    quantise(q.forward, input / (l.sequence_parallel ? l.tp : 1), false);
  quantise(q.backward, grad, true);
  return q;
}

// The small kernels of Megatron-Core's MoE layer beyond the op graph's traffic, per rank and
// micro-batch, as Megatron-Bridge's performance configurations run it (the all-to-all
// dispatcher, moe_router_fusion, moe_permute_fusion, aux-loss load balancing), counted
// from megatron/core/transformer/moe/ (router.py, token_dispatcher.py, moe_utils.py,
// Megatron-Core 0.15) and Transformer Engine's fused router and permutation ops:
// - router: forward the fused top-k with its score function, the aux loss's fused scores,
//   the tokens-per-expert sum, the fused aux loss and its two logging ops; backward the aux
//   loss scaler's two, the three fused ops' gradients and the sum of the two branches into
//   the logits. Each reads and writes this rank's T x E scores in fp32.
// - moe_dispatch: forward the tokens-per-expert sum, under EP the five sums of the splits
//   and, for the host, four asynchronous copies of the counts (one without EP: the experts'
//   split sizes), host calls alone; the fused permute's three row-id-map passes (a score's
//   routing flag read, its int32 index written). Backward: the MoE input's two gradient
//   branches (router, tokens) added. With token dropping (Layout::moe_capacity_factor, the
//   dispatcher's drop_and_pad preprocess) the tokens-per-expert sum alone precedes the
//   permute.
// - moe_sort / moe_unsort, where they run (expert_reorder_elements): the chunk map; the
//   combine's transposed split sizes copied and their map.
struct MoeKernels {
  std::vector<sim::Kernel> forward, backward;
};
MoeKernels moe_kernels(const models::Op& op, const models::OpGraph& g, const Layout& l, int64_t cp,
                       Precision p) {
  MoeKernels m;
  const bool router = op.name == "router", dispatch = op.name == "moe_dispatch";
  if (!router && !dispatch && !is_expert_reorder(op)) return m;
  const int64_t experts = routed_experts(g, op.layer);
  if (experts == 0) return m;
  if (is_expert_reorder(op)) {
    if (expert_reorder_elements(op, g, l, cp) == 0) return m;
    const int64_t map = 8 * experts;  // one int64 per (source rank, local expert) chunk
    m.forward.assign(op.name == "moe_sort" ? 1 : 2, sim::memory_kernel(map));
    return m;
  }
  const int64_t slice = l.sequence_parallel ? l.tp : 1;
  const int64_t tokens = g.layer_tokens / cp / slice, scores = tokens * experts;
  if (router) {
    m.forward.assign(6, sim::memory_kernel(8 * scores));
    m.backward.assign(6, sim::memory_kernel(8 * scores));
    return m;
  }
  // Token dropping (drop_and_pad): the tokens-per-expert sum alone; the split sizes are
  // static, so neither the splits' sums nor the copies to the host run.
  const bool ep = l.ep > 1, dropless = l.moe_capacity_factor <= 0;
  m.forward.assign(ep && dropless ? 6 : 1, sim::memory_kernel(scores));
  if (dropless) m.forward.insert(m.forward.end(), ep ? 4 : 1, sim::memory_kernel(0));
  m.forward.insert(m.forward.end(), 3, sim::memory_kernel(5 * scores));
  m.backward.push_back(sim::memory_kernel(3 * tokens * g.hidden * activation_bytes(g, p)));
  return m;
}

// The memory-bound work Transformer Engine's P2P ring attention (AttnFuncWithCPAndKVP2P,
// transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py, TE 2.x)
// runs around its cp attention calls, per rank and micro-batch, averaged over the ring's
// ranks (rank r runs r + 1 full and cp - 1 - r half steps). Counted in element reads +
// writes, Nq = b·(s/cp)·h_q·d and Nkv the same with h_kv (heads / tp) in the activation
// dtype, L = b·(s/cp)·h_q softmax statistics in fp32. Forward: K,V packed into the send
// buffer (4 Nkv); the first step's LSE cloned (2 L); the cp - 1 later steps' LSE
// corrections (3 L full, 1.5 L half); the output initialised from the first step (2 Nq +
// 2 L) and corrected after each later step (3 Nq + 2 L full, half that for half steps).
// Backward: K,V copied into the ring buffer (4 Nkv); the second-half LSE made contiguous
// (L); dq copied or accumulated per step (2 Nq, then 2.25 Nq on average per later step);
// dK,dV the same (4 Nkv, then 4.5 Nkv). In bf16 nothing is accumulated in fp32.
// The memory-bound work of Transformer Engine's a2a CP (AttnFuncWithCPAndQKVOA2A, same
// file), per rank and micro-batch: each tensor that crosses an all-to-all is laid out for
// it before (a contiguous movedim, 2 N) and put back in sequence or head order after (one
// compiled reorder, 2 N); N = b·(s/cp)·width, the same before and after. Forward: Q, K, V
// and the output; backward: the output and its gradient (the output is saved in sequence
// order), then dQ, dK, dV.
// The memory-bound work of Transformer Engine's all-gather CP (AttnFuncWithCPAndKVAllGather,
// same file), per rank and micro-batch, in element reads + writes. Nkv = b·s·h_kv·d, one
// gathered K (or V), Nq = b·(s/cp)·h_q·d local queries. Forward: the gathered K and V put
// back in sequence order (index_select: 4 Nkv), the two calls' outputs copied into place
// (2 Nq). Backward: K,V gathered and reordered again (4 Nkv), the bf16 dK,dV buffers
// zero-filled (2 Nkv) and accumulated over the two calls' key ranges (gather_keys: causal,
// (2 cp + 1) / (2 cp) of the sequence, 4 (1 + 1/(2 cp)) Nkv; under a window the busiest
// rank's ranges), put back in load-balanced order before the reduce-scatter (4 Nkv), dq
// copied into place (2 Nq).
struct CpBytes {
  int64_t forward = 0, backward = 0;
};
// The above for the layout's cp_comm (l.cp > 1), e bytes per activation element.
CpBytes cp_attention_bytes(const models::AttentionShape& a, const Layout& l, int64_t e) {
  const double cp = l.cp, later = l.cp_ring() - 1, ed = static_cast<double>(e);
  const double tokens = static_cast<double>(a.batch) * static_cast<double>(a.seq_q);
  const double q_width = static_cast<double>(ceil_div(a.heads, l.tp) * a.head_dim);
  // (A key and a value of different widths, latent attention's: their mean.)
  const double kv_width =
      static_cast<double>(ceil_div(a.kv_heads, l.tp) * (a.head_dim + a.value_dim())) / 2;
  auto out = [](double f, double b) {
    return CpBytes{static_cast<int64_t>(f), static_cast<int64_t>(b)};
  };
  if (l.cp_comm == CpComm::kAllGather) {
    const double nkv = tokens * kv_width, nq = tokens / cp * q_width;  // nkv: gathered
    // The two calls' key ranges as a share of the sequence (gather_keys): causal
    // (2 cp + 1) / (2 cp), under a window the busiest rank's.
    const std::array<int64_t, 2> keys = gather_keys(a, l.cp);
    const double ranges = static_cast<double>(keys[0] + keys[1]) / static_cast<double>(a.seq_kv);
    return out(ed * (4 * nkv + 2 * nq), ed * ((10 + 4 * ranges) * nkv + 2 * nq));
  }
  // Per rank the same element counts before and after an all-to-all over the heads, so the
  // ring's below take the rank's b·(s/cp) tokens at the TP rank's widths either way.
  const double local = tokens / cp;
  CpBytes x;
  if (l.cp_heads_split() > 1) {
    const double qkv = local * (q_width + 2 * kv_width);
    const double o = local * static_cast<double>(ceil_div(a.heads, l.tp) * a.value_dim());
    x = out(ed * 4 * (qkv + o), ed * 4 * (2 * o + qkv));
  }
  if (l.cp_ring() == 1) return x;
  const double nq = local * q_width, nkv = local * kv_width;
  const double lse = local * static_cast<double>(ceil_div(a.heads, l.tp)) * 4;
  const CpBytes r = out(ed * (4 * nkv + (2 + 2.25 * later) * nq) + lse * (4 + 3.75 * later),
                        ed * ((8 + 4.5 * later) * nkv + (2 + 2.25 * later) * nq) + lse);
  return {x.forward + r.forward, x.backward + r.backward};
}

// moe_kernels' time on `dev`, added to the forward and the dgrad of `c`.
void add_moe_time(PassCost& c, const MoeKernels& m, const hardware::DeviceProfile& dev) {
  for (const sim::Kernel& k : m.forward) c.forward += dev.memory_kernel_time(Bytes(k.bytes));
  for (const sim::Kernel& k : m.backward) c.dgrad += dev.memory_kernel_time(Bytes(k.bytes));
}

// Whether a wgrad GEMM adds into an fp32 main_grad (Layout::gradient_accumulation_fusion
// with a 4-byte gradient buffer); a 16-bit buffer's accumulation is timed as a plain GEMM.
bool accumulates_fp32(const Layout& l, Precision p) {
  return l.gradient_accumulation_fusion && gradient_bytes(p, l.grad_reduce_dtype) == 4;
}

// Megatron's unfused gradient accumulation (Layout::gradient_accumulation_fusion off, not
// torch FSDP2): the wgrad GEMM writes the weight's gradient in the parameter dtype and the
// parameter's backward hook adds it into main_grad (main_grad.add_(grad); Megatron-LM's
// DistributedDataParallel, megatron/model/distributed.py in 2021, Megatron-Core's
// _make_backward_post_hook): per weight element the gradient read, main_grad read and
// written, every micro-batch. 0 with the fusion on (the GEMM adds into main_grad itself)
// and under FSDP2 (no main_grad: autograd's own accumulation, not modelled).
int64_t unfused_accumulation_bytes(const models::GemmShape& s, const models::OpGraph& g,
                                   const Layout& l, Precision p) {
  if (l.gradient_accumulation_fusion || l.torch_fsdp2()) return 0;
  const int64_t weights = s.k * s.n * s.batch;
  return weights * (activation_bytes(g, p) + 2 * gradient_bytes(p, l.grad_reduce_dtype));
}

// The embedding's weight gradient beyond its scatter, per micro-batch: F.embedding's backward
// (embedding_dense_backward, PyTorch's ATen) returns a dense gradient of the whole local
// table, zero-filled before the token rows are added into it (`fill`: its bytes written), and
// Megatron's DDP hook then adds that gradient into main_grad (`add`: the gradient read,
// main_grad read and written; the embedding never fuses its accumulation, whatever
// gradient_accumulation_fusion says). torch FSDP2 has no main_grad (autograd's own
// accumulation, not modelled): the fill alone. The table: op.params / tp (vocab-parallel;
// a learned position table, replicated, counts 1 / tp of it too: 4% of GPT-3's 51200 x h).
struct EmbeddingGradient {
  int64_t fill = 0, add = 0;
};
EmbeddingGradient embedding_gradient_bytes(const models::Op& op, const Layout& l, Precision p) {
  if (op.kind != models::OpKind::kEmbedding || op.params == 0) return {};
  const int64_t table = op.params / l.tp, wb = weight_bytes(p);
  EmbeddingGradient e{table * wb, 0};
  if (!l.torch_fsdp2()) e.add = table * (wb + 2 * int64_t{gradient_bytes(p, l.grad_reduce_dtype)});
  return e;
}

// Whether the policy re-runs single ops before their backward (the step's cost.recompute),
// not whole layers (full recompute, which lower() replays).
bool reruns_ops(models::Recompute r) {
  return r == models::Recompute::kSelective || r == models::Recompute::kSelectiveOp;
}

// selective_op re-running part of a fused GEMM (the k of qkv, the up of a gated fc1): the
// output columns of one rank's re-run product (it re-casts the input under FP8 too); 0 when
// the op is re-run whole or not at all. selective_op needs tp 1 (infeasibility), so the
// columns are the op's own.
int64_t partial_rerun_columns(const models::Op& op, const Layout& l) {
  if (l.recompute != models::Recompute::kSelectiveOp || op.gemms.empty()) return 0;
  const double share = models::recompute_share(op, l.recompute);
  if (share <= 0 || share >= 1) return 0;
  return static_cast<int64_t>(std::llround(static_cast<double>(op.output_width()) * share));
}

// What the i-th of a GEMM op's rank shapes (rank_gemms) runs beside its three products:
// whether it quantises the op's input under FP8 (separate parts share one input, cast once:
// torch.compile's common-subexpression pass merges the casts), and the output columns
// selective_op re-runs of it (`rerun_n`, partial_rerun_columns: of each fused shape; of
// separate parts, the second part whole).
struct ShapeRole {
  bool casts_input = true;
  int64_t rerun_n = 0;
};
ShapeRole shape_role(const models::Op& op, const models::GemmShape& s, size_t i, int64_t rerun_n) {
  if (!op.separate_parts) return {true, rerun_n};
  return {i == 0, rerun_n > 0 && i == 1 ? s.n : 0};
}

// Separate parts (models::Op::separate_parts): autograd adds the input gradients of the
// parts' GEMMs. Under torch.compile the sum is fused into the consumer (the norm's backward),
// which reads the parts' gradients instead of one: the extra ones' bytes (a kernel of its
// own, to count its launch).
int64_t partial_gradient_bytes(const models::Op& op, const std::vector<models::GemmShape>& shapes,
                               int64_t element_bytes) {
  if (!op.separate_parts || shapes.size() < 2) return 0;
  const models::GemmShape& s = shapes.front();
  return static_cast<int64_t>(shapes.size() - 1) * s.m * s.k * s.batch * element_bytes;
}

// A pointwise op's backward traffic against its forward's: a copy's gradient is one pass
// (repeat_kv's sum back over the repeated heads), the others read their input too.
int64_t backward_passes(const models::Op& op) {
  return op.name == "repeat_kv" ? 1 : 2;
}

// An activation run as separate PyTorch ops (Layout::fused_activation false): the traffic of
// each kernel eager autograd launches, in element passes over the op's output (its written
// bytes), forward and backward. SwiGLU as Megatron's glu (torch.chunk, F.silu(x0) * x1):
// silu (read 1, write 1), mul (2, 1); backward the mul's two gradients (2, 1 each),
// silu_backward (2, 1) and the chunk's backward concatenating both halves (2, 2); GeGLU
// the same kernels with a GELU (Megatron-Bridge's Gemma runs a jit-scripted tanh GELU,
// one kernel each way). Quick GeGLU, quick_gelu(x0) = x0 * sigmoid(1.702 x0): the scale,
// the sigmoid (1, 1 each) and the product (2, 1) for the one GELU kernel; backward the
// product's two gradients, sigmoid_backward (2, 1 each), the scale's (1, 1) and the sum
// of x0's two gradients (2, 1). Megatron-Core's GLU extras: each clamp (of the gate and of
// the linear half) a kernel (1, 1) and its backward (2, 1), the offset a kernel (1, 1)
// whose backward is the gradient itself. Squared ReLU, torch.pow(relu(x), 2): relu (1, 1),
// pow (1, 1); backward PyTorch's pow_backward, grad * (2 * r.pow(1)) (a copy, a scalar mul,
// a mul: 1 + 1, 1 + 1, 2 + 1), and relu's threshold_backward (2, 1)
// (torch/csrc/autograd/FunctionsManual.cpp pow_backward, aten/src/ATen/native/Pow.cpp: pow
// to the scalar 1 copies). GELU (F.gelu, gelu_backward) is one kernel each way as fused;
// the fused ones keep the generic pointwise charge.
struct ActivationPasses {
  std::vector<int64_t> forward, backward;
};
std::optional<ActivationPasses> unfused_activation(const models::Op& op, const Layout& l) {
  if (l.fused_activation || !op.activation) return std::nullopt;
  const models::MlpActivation& a = *op.activation;
  ActivationPasses p;
  switch (a.kind) {
    case models::Activation::kSwiglu:
    case models::Activation::kGeglu:
      p = {{2, 3}, {3, 3, 3, 4}};
      break;
    case models::Activation::kQuickGeglu:
      p = {{2, 2, 3, 3}, {3, 3, 3, 3, 3, 2, 3, 4}};
      break;
    case models::Activation::kSquaredRelu:
      return ActivationPasses{{2, 2}, {2, 2, 3, 3}};
    case models::Activation::kGelu:
      return std::nullopt;
  }
  if (a.clamped) {
    p.forward.insert(p.forward.end(), {2, 2});
    p.backward.insert(p.backward.end(), {3, 3});
  }
  if (a.offset) p.forward.push_back(2);
  return p;
}

// RoPE run as Megatron-Core's _apply_rotary_pos_emb_bshd (rope_utils.py), eager PyTorch ops
// on each tensor (queries, then keys; models::Op::parts): cos and sin of the rank's fp32
// frequencies, each scaled and cast (cos, mul, to: six small kernels); then, over the
// rotated share f of the tensor, t * cos (read 1, write 1), _rotate_half's negation of one
// half (0.5, 0.5) and concatenation (1, 1), the product with sin (1, 1) and the sum (2, 1),
// and the concatenation with the channels passed through (1, 1 over the whole tensor).
// Backward: the two products' gradients (2f each), the negation's (f) and the chunk's
// (a concatenation, 2f), their sum (3f); then each slice's gradient, zeros over the whole
// tensor (1) and a copy of its part (2f; 2(1 - f)), and the two summed (3). The fused kernel
// (Layout::fused_rope) is one pass each way per tensor, charged as the op's generic one.
struct EagerKernels {
  std::vector<int64_t> forward, backward;  // bytes
};
std::optional<EagerKernels> unfused_rope(const models::Op& op, const models::OpGraph& g,
                                         const Layout& l, Bytes written, int64_t cp) {
  if (!op.rope || (l.fused_rope && !op.rope->scaled) || op.parts.empty()) return std::nullopt;
  const double f = op.rope->rotated;
  int64_t width = 0;
  for (int64_t w : op.parts) width += w;
  // The frequencies: the rank's tokens x the rotated channels of a head, fp32 in and out.
  const double tokens =
      static_cast<double>(op.written.count()) / static_cast<double>(width * g.dtype_bytes * cp);
  const int64_t freqs = 8 * std::llround(tokens * f * static_cast<double>(op.rope->head_dim));
  EagerKernels k;
  for (int64_t w : op.parts) {
    const double t =
        static_cast<double>(written.count()) * static_cast<double>(w) / static_cast<double>(width);
    auto bytes = [&](double passes) { return static_cast<int64_t>(std::llround(t * passes)); };
    for (int i = 0; i < 6; ++i) k.forward.push_back(freqs);
    for (double x : {2 * f, f, 2 * f, 2 * f, 3 * f, 2.0}) k.forward.push_back(bytes(x));
    for (double x : {2 * f, 2 * f, f, 2 * f, 3 * f, 1.0, 2 * f, 1.0})
      k.backward.push_back(bytes(x));
    if (f < 1) k.backward.push_back(bytes(2 * (1 - f)));
    k.backward.push_back(bytes(3));
  }
  return k;
}

// Megatron-Core's moe_apply_probs_on_input (Llama 4's top-1 routing) in its expert MLP:
// (probs.unsqueeze(-1) * x).to(x.dtype), a product in fp32 (the probabilities are), then
// the probabilities reset by ones_like. Backward (autograd): the cast's (to fp32), the
// input's gradient (times the probabilities in fp32, cast back to the input's dtype) and
// the probabilities' (times the input in fp32, summed over the width). Bytes per kernel over
// the copies this rank's experts receive: after the EP all-to-all, this rank's sequence
// slice under SP with whole experts, its TP group's when the experts split over TP.
// `written`: the copies' bytes as the generic pointwise path shards them (SP: / tp).
std::optional<EagerKernels> probs_on_input(const models::Op& op, const models::OpGraph& g,
                                           const Layout& l, Bytes written, int64_t cp) {
  const int64_t slice = l.sequence_parallel && l.expert_tp() == 1 ? l.tp : 1;
  const int64_t n = op.written.count() / g.dtype_bytes / (cp * slice);  // elements
  if (n == 0) return EagerKernels{};
  const int64_t x = written.count() * (l.sequence_parallel ? l.tp : 1) / slice;  // n·e
  const int64_t f32 = 4 * n, rows = 4 * (n / g.hidden);                          // bytes
  return EagerKernels{.forward = {x + rows + f32, f32 + x, rows},
                      .backward = {x + f32, 2 * f32 + rows, f32 + x, 2 * f32 + x, f32 + rows}};
}

// The kernels a pointwise op runs as eager PyTorch ops instead of its one fused kernel each
// way (an unfused activation or RoPE, the product of moe_apply_probs_on_input), as bytes on
// this rank (`written`: its output's), or none where it runs fused.
std::optional<EagerKernels> eager_kernels(const models::Op& op, const models::OpGraph& g,
                                          const Layout& l, Bytes written, int64_t cp) {
  if (const auto a = unfused_activation(op, l)) {
    EagerKernels k;
    for (int64_t x : a->forward) k.forward.push_back((written * x).count());
    for (int64_t x : a->backward) k.backward.push_back((written * x).count());
    return k;
  }
  if (op.name == "moe_probs_in") return probs_on_input(op, g, l, written, cp);
  return unfused_rope(op, g, l, written, cp);
}

// Transformer Engine's GroupedLinear, which Megatron-Core's grouped experts run, issues one
// cuBLAS GEMM per local expert, round-robin on its compute streams
// (transformer_engine/common/gemm/cublaslt_gemm.cu multi_stream_cublas_gemm, GEMM i on
// stream i % nvte_get_num_compute_streams(); util/multi_stream.cpp: 4 streams), so at most
// that many run at once, each filling only its own tiles of the GPU.
constexpr int64_t kGroupedGemmStreams = 4;

// Calls f(b) for each round of a GEMM group of `batch` equal problems, b its batch: an
// expert group in rounds of up to kGroupedGemmStreams concurrent GEMMs, any other group as
// one batched GEMM. op_cost() and op_kernels() both time a group this way.
template <class F>
void for_each_gemm_round(bool experts, int64_t batch, F&& f) {
  if (!experts) return f(batch);
  for (int64_t done = 0; done < batch; done += kGroupedGemmStreams)
    f(std::min(kGroupedGemmStreams, batch - done));
}

}  // namespace

PassCost op_cost(const models::Op& op, const models::OpGraph& g, const Layout& l,
                 bool context_parallel, const hardware::DeviceProfile& dev, hardware::Precision p,
                 GemmChunks chunks) {
  const int64_t cp = context_parallel ? l.cp : 1;
  PassCost c;
  switch (op.kind) {
    case models::OpKind::kGemm: {
      const Split split = gemm_split(op, g);
      const Precision gp = gemm_precision(op, p);
      double shard = split == Split::kNone && !runs_on_sequence_slice(op, l) ? 1.0 : l.tp;
      // Experts: a rank runs E / ep experts on the tokens its ep group routes to them, as
      // many as its own micro-batch routes in all: the op's FLOPs, not 1 / ep of them.
      const int64_t rerun_n = partial_rerun_columns(op, l);
      const std::vector<models::GemmShape> shapes = rank_gemms(op, g, l, cp);
      const bool grouped = is_expert(op);
      for (size_t i = 0; i < shapes.size(); ++i) {
        const models::GemmShape& s = shapes[i];
        const ShapeRole role = shape_role(op, s, i, rerun_n);
        for_each_gemm_round(grouped, s.batch, [&](int64_t b) {
          c.forward +=
              dev.gemm_time(ceil_div(s.m, chunks.forward), s.n, s.k, b, gp) * chunks.forward;
          c.dgrad += dev.gemm_time(ceil_div(s.m, chunks.dgrad), s.k, s.n, b, gp) * chunks.dgrad;
          c.wgrad += dev.gemm_time(s.k, s.n, s.m, b, gp, accumulates_fp32(l, p));
        });
        if (const int64_t b = unfused_accumulation_bytes(s, g, l, p); b > 0)
          c.wgrad += dev.memory_kernel_time(Bytes(b));
        if (role.rerun_n > 0)
          for_each_gemm_round(grouped, s.batch, [&](int64_t b) {
            c.recompute += dev.gemm_time(s.m, role.rerun_n, s.k, b, gp);
          });
        if (gp == Precision::kFp8 && is_fp8_linear(op)) {
          const Fp8Kernels q = fp8_quantize_kernels(op, s, l);
          if (role.casts_input) {
            for (const sim::Kernel& k : q.forward) {
              c.forward += dev.memory_kernel_time(Bytes(k.bytes));
              if (rerun_n > 0) c.recompute += dev.memory_kernel_time(Bytes(k.bytes));
            }
          }
          for (const sim::Kernel& k : q.backward) c.dgrad += dev.memory_kernel_time(Bytes(k.bytes));
        }
      }
      c.dgrad +=
          dev.memory_kernel_time(Bytes(partial_gradient_bytes(op, shapes, activation_bytes(g, p))));
      const double per_rank = shard * static_cast<double>(cp);
      c.forward_flops = op.forward / per_rank;
      c.dgrad_flops = op.dgrad / per_rank;
      c.wgrad_flops = op.wgrad / per_rank;
      break;
    }
    case models::OpKind::kAttention: {
      const double per_rank = static_cast<double>(l.tp * cp);
      const Precision ap = attention_precision(p);
      c.forward_flops = op.forward / per_rank;
      c.dgrad_flops = op.dgrad / per_rank;
      const models::AttentionShape& a = *op.attention;
      const int64_t qkv = a.qkv_elements();
      if (op.read.count() <= qkv * g.dtype_bytes) {  // flash attention: one fused kernel
        // The kernel's rate depends on the key/value length of one call. Ring CP: each of
        // the cp ring steps is its own call, against this rank's s_kv / cp chunk. All-gather
        // CP: one call per local chunk (two, load-balanced), its queries against the keys it
        // sees (gather_keys). A2A CP: one call over the whole sequence with heads / cp.
        // A2A+P2P: the ring's steps over cp / cp_a2a ranks, each with heads / cp_a2a.
        const bool gather = cp > 1 && l.cp_comm == CpComm::kAllGather;
        const int64_t calls = cp > 1 ? l.cp_ring() : 1;
        const int64_t seq_kv = ceil_div(a.seq_kv, calls);
        const double per_call = static_cast<double>(calls);
        const hardware::AttentionRates* rates = dev.attention_rates(l.attention_kernel);
        if (gather) {
          // All-gather CP: the busiest rank's two calls (gather_keys), each at the rate of
          // its own keys (under a window, the window's), their FLOPs its share of the
          // sequence's pairs.
          const std::array<int64_t, 2> keys = gather_keys(a, cp);
          const int64_t chunk = a.seq_q / (2 * cp);
          auto pairs = [&](int64_t q, int64_t kv) {
            return a.causal ? causal_score_pairs(q, kv, a.window)
                            : static_cast<double>(q) * static_cast<double>(kv);
          };
          const double all = pairs(a.seq_q, a.seq_kv);
          c.forward_flops = c.dgrad_flops = Flops(0);
          for (int64_t kv : keys) {
            const double share = pairs(chunk, kv) / all / static_cast<double>(l.tp);
            const Flops f = op.forward * share, d = op.dgrad * share;
            const int64_t rate_kv = rate_seq_kv(kv, a.windowed(), a.window);
            c.forward +=
                dev.attention_time(f, ap, false, rate_kv, rates, a.causal, a.score_width());
            c.dgrad += dev.attention_time(d, ap, true, rate_kv, rates, a.causal, a.score_width());
            c.forward_flops += f;
            c.dgrad_flops += d;
          }
        } else {
          // A call's mask sets its rate. The ring's causal attention (Transformer Engine's
          // load-balanced AttnFuncWithCPAndKVP2P) masks only its diagonal step; each other
          // step, of as many FLOPs, runs unmasked: the local queries against the first half
          // of the chunk arrived (from a rank before) or the later half of the queries
          // against all of it (from a rank after). The last rank's are all of the first
          // kind, half the keys per call, the slowest; the ring, whose next layer waits for
          // each rank's keys, runs at its pace.
          const bool ring = calls > 1 && a.causal;
          // (Sliding windows run under CP with a2a, whose call sees the whole window, or with
          // all_gather, above.)
          const int64_t rate_kv = rate_seq_kv(seq_kv, a.windowed(), a.window);
          auto time = [&](Flops f, bool backward, Time& diagonal_extra) {
            const Flops one = f / per_call;
            if (!ring)
              return dev.attention_time(one, ap, backward, rate_kv, rates, a.causal,
                                        a.score_width()) *
                     calls;
            const Time masked =
                dev.attention_time(one, ap, backward, seq_kv, rates, true, a.score_width());
            const Time unmasked = dev.attention_time(one, ap, backward, ceil_div(seq_kv, 2), rates,
                                                     false, a.score_width());
            diagonal_extra = masked - unmasked;
            return masked + unmasked * (calls - 1);
          };
          c.forward = time(c.forward_flops, false, c.ring_diagonal_forward);
          c.dgrad = time(c.dgrad_flops, true, c.ring_diagonal_dgrad);
        }
        if (cp > 1) {
          // The ring runs its memory passes once per step (lower() splits them into its
          // steps, each a kernel of its own); all-gather and a2a CP once.
          const CpBytes x = cp_attention_bytes(a, l, activation_bytes(g, p));
          c.forward += dev.memory_kernel_time(Bytes(x.forward / calls)) * calls;
          c.dgrad += dev.memory_kernel_time(Bytes(x.backward / calls)) * calls;
        }
        break;
      }
      // Without flash attention (Megatron-LM before its flash integration, e.g. Narayanan et
      // al. 2021, Korthikanti et al. 2022: baddbmm, fused scale-mask-softmax, dropout, bmm):
      // batched GEMMs over (micro-batch x local heads) that compute the full s_q x s_kv
      // scores (the causal mask is applied afterwards, nothing is skipped), and
      // memory-bound passes over the materialized scores. Forward: softmax reads and writes
      // them; dropout reads them and writes its output and a 1-byte mask. Backward: dropout
      // reads the gradient and the mask and writes a gradient; softmax reads the gradient
      // and its output and writes a gradient.
      const int64_t bh = a.batch * ceil_div(a.heads, l.tp);
      const int64_t sq = ceil_div(a.seq_q, cp), skv = a.seq_kv, d = a.head_dim, dv = a.value_dim();
      // QK^T (d wide) and PV (dv wide); backward dS, dQ, dK (d) and dP, dV (dv).
      c.forward = dev.gemm_time(sq, skv, d, bh, ap) + dev.gemm_time(sq, dv, skv, bh, ap);
      c.dgrad = dev.gemm_time(sq, skv, dv, bh, ap) + dev.gemm_time(skv, dv, sq, bh, ap) +
                dev.gemm_time(sq, d, skv, bh, ap) + dev.gemm_time(skv, d, sq, bh, ap);
      const int64_t e = activation_bytes(g, p);
      const int64_t scores = a.batch * a.heads * a.seq_q * a.seq_kv;
      const bool dropout = op.saved.count() > (qkv + 2 * scores) * g.dtype_bytes;
      const int64_t dropout_bytes = dropout ? 2 * e + 1 : 0;
      const auto local = [&](int64_t bytes_per_score) {
        return Bytes(static_cast<int64_t>(static_cast<double>(scores) *
                                          static_cast<double>(bytes_per_score) / per_rank));
      };
      c.forward += dev.memory_kernel_time(local(2 * e + dropout_bytes));
      c.dgrad += dev.memory_kernel_time(local(3 * e + dropout_bytes));
      break;
    }
    case models::OpKind::kLoss: {
      // Vocab-parallel cross-entropy in fp32 over this rank's logits (T x V / (tp·cp)).
      const int64_t logits = op.read.count() / g.dtype_bytes / (cp * l.tp);
      const LossBytes b = loss_bytes(l.cross_entropy_fusion);
      c.forward = dev.memory_kernel_time(Bytes(b.forward * logits));
      c.dgrad = dev.memory_kernel_time(Bytes(b.backward * logits));
      break;
    }
    default: {
      if (is_expert_reorder(op)) {
        const Bytes copy =
            Bytes(2 * expert_reorder_elements(op, g, l, cp) * activation_bytes(g, p));
        c.forward = c.dgrad = dev.memory_kernel_time(copy);
        break;
      }
      if (permuted_in_dispatch(op, l)) break;
      int64_t shard = cp;
      if (pointwise_tp_sharded(op, l, g.kind)) shard *= l.tp;
      const int64_t scale = activation_bytes(g, p) / g.dtype_bytes;
      if (const auto eager = eager_kernels(op, g, l, op.written * scale / shard, cp)) {
        for (int64_t b : eager->forward) c.forward += dev.memory_kernel_time(Bytes(b));
        for (int64_t b : eager->backward) c.dgrad += dev.memory_kernel_time(Bytes(b));
        break;
      }
      const Bytes traffic = (op.read + op.written) * scale / shard;
      c.forward = dev.memory_kernel_time(traffic);
      (op.kind == models::OpKind::kEmbedding ? c.wgrad : c.dgrad) =
          dev.memory_kernel_time(traffic * backward_passes(op));
      const EmbeddingGradient e = embedding_gradient_bytes(op, l, p);
      for (int64_t bytes : {e.fill, e.add})
        if (bytes > 0) c.wgrad += dev.memory_kernel_time(Bytes(bytes));
      break;
    }
  }
  add_moe_time(c, moe_kernels(op, g, l, cp, p), dev);  // none for other ops
  if (reruns_ops(l.recompute)) {
    const double share = models::recompute_share(op, l.recompute_policy());
    if (share >= 1) c.recompute = c.forward;
    c.recompute_flops = c.forward_flops * share;
  }
  return c;
}

namespace {

class BlockBuilder {
 public:
  // `beside`: the op's steps are WorkStep::beside_all_to_all ones; `fresh`: its compute
  // starts a step of its own (where a run beside an all-to-all splits).
  explicit BlockBuilder(Block& b, bool beside = false, bool fresh = false)
      : b_(b), beside_(beside), fresh_(fresh) {}
  void compute(const PassCost& c, int32_t op) {
    const bool fresh = std::exchange(fresh_, false);
    if (fresh || b_.steps.empty() || b_.steps.back().kind != StepKind::kCompute ||
        b_.steps.back().overlaps_tp_entry || b_.steps.back().overlaps_tp_exit ||
        b_.steps.back().beside_all_to_all != beside_) {
      b_.steps.push_back({StepKind::kCompute, {}, {}, {}, {}});
      b_.steps.back().beside_all_to_all = beside_;
    }
    b_.steps.back().cost += c;
    b_.steps.back().ops.push_back(op);
  }
  // A column-parallel linear right after a TP entry: its own step (WorkStep::overlaps_tp_entry).
  bool after_tp_entry() const {
    return !b_.steps.empty() && b_.steps.back().kind == StepKind::kTpEntry;
  }
  void linear_after_tp_entry(const PassCost& c, int32_t op, bool ring_exchange) {
    b_.steps.push_back({StepKind::kCompute, c, {}, {}, {op}});
    b_.steps.back().overlaps_tp_entry = true;
    b_.steps.back().ring_exchange = ring_exchange;
  }
  // A row-parallel linear right before a TP exit, its reduce-scatter in `chunks` beside it.
  void linear_before_tp_exit(const PassCost& c, int32_t op, int32_t chunks) {
    b_.steps.push_back({StepKind::kCompute, c, {}, {}, {op}});
    b_.steps.back().overlaps_tp_exit = true;
    b_.steps.back().ring_exchange = true;
    b_.steps.back().exit_chunks = chunks;
  }
  void comm(StepKind kind, Bytes bytes, const PassCost& cost = {}, int32_t op = -1) {
    b_.steps.push_back({kind, cost, bytes, bytes, {}});
    b_.steps.back().beside_all_to_all = beside_;
    if (op >= 0) b_.steps.back().ops.push_back(op);
  }
  // The last step (a TP entry) gathers `bytes` instead of its own size.
  void gather_as(Bytes bytes) { b_.steps.back().gather_bytes = bytes; }
  // The step just added, for flags of its own.
  WorkStep& last() { return b_.steps.back(); }
  // The last step (the dispatch's all-to-all) also sends the routing probabilities, after
  // the expert counts' all-gather.
  void dispatch_calls(Bytes probs, Bytes counts) {
    b_.steps.back().probs_bytes = probs;
    b_.steps.back().expert_counts_bytes = counts;
  }

 private:
  Block& b_;
  bool beside_, fresh_;
};

// Layout::moe_shared_expert_overlap: the layer's shared-experts steps (WorkStep::
// beside_all_to_all, in op order after the combine) moved to where Megatron-Core's
// all-to-all dispatcher issues them on their own stream (token_dispatcher.py: the first
// linear and activation after the dispatch's all-to-all, the second linear after the
// combine's; shared_experts.py), each part right after its all-to-all.
void place_beside_all_to_alls(const models::OpGraph& g, std::vector<WorkStep>& steps) {
  std::vector<WorkStep> first, second, rest;
  for (WorkStep& st : steps) {
    if (!st.beside_all_to_all) {
      rest.push_back(std::move(st));
      continue;
    }
    (st.holds(g, "shared_expert_fc2") || !second.empty() ? second : first).push_back(std::move(st));
  }
  steps.clear();
  int a2a = 0;
  for (WorkStep& st : rest) {
    const bool exchange = st.kind == StepKind::kEpAllToAll;
    steps.push_back(std::move(st));
    if (exchange) {
      std::vector<WorkStep>& run = a2a++ == 0 ? first : second;
      std::move(run.begin(), run.end(), std::back_inserter(steps));
    }
  }
  HETPAR_CHECK(a2a == 2 && !first.empty() && !second.empty(),
               "a MoE layer's shared experts beside {} all-to-alls (dispatch, combine)", a2a);
}

// The vocab-parallel loss's collectives over TP (forward only, each blocking the kernel after
// it), on `rows` tokens' fp32 statistics. Megatron's unfused VocabParallelCrossEntropy
// (megatron/core/tensor_parallel/cross_entropy.py): all-reduces of the logits' max, the
// target logit and the sum of exponentials. Megatron-Core's fused version (megatron/core/
// fusions/fused_cross_entropy.py): the max, then the other two concatenated in one call.
// Transformer Engine's parallel_cross_entropy (transformer_engine/pytorch/triton/
// cross_entropy.py): one all-gather of each rank's (max, sum, target logit) per token.
// PyTorch's loss_parallel under DTensor (torch/distributed/tensor/parallel/loss.py,
// torchtitan with TP): _log_softmax's max and sum of exponentials, _nll_loss_forward's
// target logit; its backward avoids communication.
void loss_collectives(BlockBuilder& b, CrossEntropy c, int64_t rows, int tp) {
  const Bytes row(rows * 4);
  switch (c) {
    case CrossEntropy::kUnfused:
    case CrossEntropy::kCompiled:
      for (int i = 0; i < 3; ++i) b.comm(StepKind::kTpLossAllReduce, row);
      return;
    case CrossEntropy::kNative:
      b.comm(StepKind::kTpLossAllReduce, row);
      b.comm(StepKind::kTpLossAllReduce, row * 2);
      return;
    case CrossEntropy::kTe:
      b.comm(StepKind::kTpLossAllGather, row * 3 * tp);
      return;
  }
}

int64_t local_params(const models::Op& op, const models::OpGraph& g, const Layout& l) {
  if (op.kind == models::OpKind::kEmbedding) return op.params / l.tp;  // vocab-parallel
  if (op.kind == models::OpKind::kAttention) return op.params / l.tp;  // sinks: per local head
  if (op.kind != models::OpKind::kGemm || gemm_split(op, g) == Split::kNone) return op.params;
  return op.params / gemm_tp(op, l) / (is_expert(op) ? l.ep : 1);
}

}  // namespace

ModuleCost module_cost(const models::OpGraph& g, const Layout& l, bool context_parallel,
                       const hardware::DeviceProfile& dev, hardware::Precision p) {
  const int64_t cp = context_parallel ? l.cp : 1;
  ModuleCost m;
  m.layers = g.layers;
  m.kinds = g.kinds;
  // The layers built: the first of each kind (dense or MoE, windowed or not); every other
  // layer is like one of them. Multi-token-prediction depths (after the layers) each.
  int first_moe = 0;  // the first MoE layer (of an MoE LLM; 0 otherwise)
  while (first_moe < g.layers && g.kinds.dense(first_moe)) ++first_moe;
  std::array<int, 4> first_of_kind;
  first_of_kind.fill(-1);
  for (int i = static_cast<int>(g.layers) - 1; i >= 0; --i) first_of_kind[m.layer_kind(i)] = i;
  auto built = [&](int layer) {
    return layer >= g.layers || first_of_kind[m.layer_kind(layer)] == layer;
  };
  // Tokens a module's activations span: layers see layer_tokens; a projector its output.
  int64_t tokens = g.layer_tokens;
  if (g.kind == models::ModuleKind::kProjector) {
    const models::Op& last = g.ops.back();
    tokens = last.gemms.front().m * last.gemms.front().batch;
  }
  const int64_t e = activation_bytes(g, p);  // bf16 activations under fp8
  const Bytes activation = Bytes(tokens / cp * g.hidden * e);
  const bool tp = l.tp > 1;
  // Between pipeline stages each TP rank sends the hidden states it holds: under sequence
  // parallelism its s/tp slice (Megatron core's p2p tensor shape divides the sequence by
  // the TP size), with scatter/gather its 1/tp piece of the replicated tensor (gathered
  // again on arrival), otherwise the whole, replicated tensor.
  const bool pieces = tp && !l.sequence_parallel && l.pp_scatter_gather;
  m.boundary_bytes = tp && (l.sequence_parallel || pieces) ? activation / l.tp : activation;
  if (pieces) m.boundary_gather_bytes = activation;

  // A MoE layer under TP with SP (Megatron-Core's token dispatchers): the router and the
  // permutation run on this rank's sequence slice, the permuted tokens are all-gathered
  // over the TP group for the TP-split experts and reduce-scattered back before the
  // combine (moe/token_dispatcher.py: gather_from_sequence_parallel_region over the TP
  // group, after the EP all-to-all), in place of the MLP's all-gather / reduce-scatter of
  // the hidden states: top_k times their tokens. Not overlapped with the expert GEMMs.
  // With whole experts (expert_tp 1) nothing is gathered: each rank's own slice is routed.
  const bool moe_sp = tp && l.sequence_parallel &&
                      std::any_of(g.ops.begin(), g.ops.end(),
                                  [](const models::Op& o) { return o.name == "moe_dispatch"; });
  // Latent attention (models::MlaSpec): what its up projections gather over TP, per layer.
  const bool latent = std::any_of(g.ops.begin(), g.ops.end(),
                                  [](const models::Op& o) { return o.name == "kv_down"; });
  auto latent_gather = [&](int layer) {
    int64_t width = g.hidden;  // without a query latent q_proj reads the hidden states
    int64_t kv = 0;
    for (const models::Op& o : g.ops)
      if (o.layer == layer && o.name == "q_down")
        width = o.gemms.front().n;
      else if (o.layer == layer && o.name == "kv_down")
        kv = o.gemms.front().n;
    return Bytes(tokens / cp * (width + kv) * e);
  };
  // Whether `op` is in a MoE layer under moe_sp (an MoE LLM's dense layers are not).
  auto in_moe_sp = [&](const models::Op& op) { return moe_sp && !g.kinds.dense(op.layer); };
  const bool gather_routed = moe_sp && l.expert_tp() > 1;
  // A MoE permutation's routed token copies (top_k per token, or every expert's capacity
  // under token dropping) in bytes: of the CP rank's whole sequence, or with `slice` of its
  // TP rank's share under SP; as the hottest EP rank receives them (Layout::
  // moe_load_imbalance): the all-to-alls end when it has.
  auto routed_bytes = [&](const models::Op& op, bool slice) {
    const int64_t routed =
        (op.name == "moe_dispatch" ? op.written : op.read).count() / g.dtype_bytes / g.hidden;
    const int64_t mean = routed / cp / (slice && l.sequence_parallel ? l.tp : 1) * g.hidden * e;
    return Bytes(std::llround(static_cast<double>(mean) * l.moe_rank_load()));
  };
  // Userbuffers (Layout::tp_comm_overlap): the layer linears next to the SP collectives.
  const bool userbuffers = tp && l.sequence_parallel && l.tp_comm_overlap;
  // FP8 current scaling with SP: tensors gathered in FP8 reduce their amax over TP first.
  const bool current_sp =
      tp && l.sequence_parallel && p == Precision::kFp8 && l.fp8_recipe == Fp8Recipe::kTensorwise;
  // Megatron-Core's shared experts (moe/shared_experts.py, SharedExpertMLP: an MLP on the MoE
  // layer's input) under SP: their first linear all-gathers the sequence slices (a TP entry
  // before it) and their second reduce-scatters (the TP exit before the residual add).
  // Every MoE layer is alike: the first one's ops tell, without a look at the others.
  bool shared = false;
  for (const models::Op& op : g.ops)
    if (op.layer == first_moe) shared = shared || op.name == "shared_expert_fc1";
  const bool shared_sp = moe_sp && shared;
  // Layout::moe_shared_expert_overlap (with all-to-alls to hide behind): the shared experts'
  // steps beside the all-to-alls (place_beside_all_to_alls), their linears in Transformer
  // Engine's Linear with parallel_mode None: no userbuffers, no overlap of their own; the SP
  // all-gather and reduce-scatter are Megatron's mappings, in 16 bits.
  const bool shared_beside = l.overlaps_shared_experts() && shared;
  // Whether the layer's TP exit comes right before `op` (the residual add after attention,
  // and after a dense MLP or shared experts; with post-norms the norm before that add,
  // which runs on the reduced output), and so right after the op before it.
  auto exit_at = [&](const models::Op& op, std::string_view attn, std::string_view mlp) {
    return op.name == attn || (op.name == mlp && (!in_moe_sp(op) || shared_sp));
  };
  auto exit_before = [&](const models::Op& op) {
    const auto i = &op - g.ops.data();
    const bool after_post_norm = i > 0 && g.ops[i - 1].name.ends_with("_post_norm");
    return exit_at(op, "attn_post_norm", "mlp_post_norm") ||
           (!after_post_norm && exit_at(op, "attn_residual", "mlp_residual"));
  };
  auto exit_follows = [&](int32_t i) {
    return static_cast<size_t>(i) + 1 < g.ops.size() && exit_before(g.ops[i + 1]);
  };
  bool seen_layer = false;
  for (const models::Op& op : g.ops) {
    const auto op_index = static_cast<int32_t>(&op - g.ops.data());
    if (op.layer >= 0 && !built(op.layer)) continue;
    if (op.layer >= 0) seen_layer = true;
    Block& block = op.mtp         ? m.mtp
                   : op.layer < 0 ? (seen_layer ? m.post : m.pre)
                                  : m.layer_block(op.layer);
    const bool beside = shared_beside && models::is_shared_expert_op(op);
    BlockBuilder b(block, beside, beside && op.name == "shared_expert_fc2");
    const bool expert = op.kind == models::OpKind::kGemm && is_expert(op);
    const int64_t params = local_params(op, g, l);
    (expert ? block.expert : block.dense) += {params, is_fp8_linear(op) ? params : 0};
    const bool sp_replicated = op.kind == models::OpKind::kNorm || op.name == "router" ||
                               op.name == "shared_expert_gate" || is_latent_down_projection(op);
    if (tp && (op.name == "qk_norm" || (l.sequence_parallel && sp_replicated)))
      block.tp_synced += params;

    if (tp && exit_before(op)) {
      b.comm(StepKind::kTpExit, activation);
      // Its backward gathers the output gradient of the linear before it (proj, a dense fc2)
      // in FP8: under current scaling, after an amax all-reduce.
      int32_t k = op_index - 1;
      while (k >= 0 && g.ops[k].kind != models::OpKind::kGemm) --k;
      const bool after_shared = k >= 0 && models::is_shared_expert_op(g.ops[k]);
      if (shared_beside && after_shared)
        b.last().beside_all_to_all = true;
      else if (current_sp && k >= 0 && is_fp8_linear(g.ops[k]) && !is_expert(g.ops[k]))
        b.last().amax_reduce = true;
    }
    if (tp && is_output_layer(op)) b.comm(StepKind::kTpEntry, activation);
    if (shared_sp && op.name == "shared_expert_fc1") {
      b.comm(StepKind::kTpEntry, activation);
      // FP8: Transformer Engine's Linear quantises its input before the SP all-gather, as
      // LayerNormLinear does (below).
      if (p == Precision::kFp8 && !beside) b.gather_as(Bytes(tokens / cp * g.hidden));
      if (current_sp && !beside) b.last().amax_reduce = true;
    }
    if (gather_routed && op.name == "moe_combine")  // the permuted tokens of all TP ranks
      b.comm(StepKind::kTpExit, routed_bytes(op, false));
    if (l.ep > 1 && op.name == "moe_combine") b.comm(StepKind::kEpAllToAll, routed_bytes(op, true));

    const PassCost c = op_cost(op, g, l, context_parallel, dev, p);
    if (op.kind == models::OpKind::kAttention && cp > 1) {
      const auto& s = *op.attention;
      const int64_t local = s.batch * s.seq_q / cp;
      const int64_t kv = local * (s.kv_heads / l.tp) * (s.head_dim + s.value_dim());
      b.comm(StepKind::kCpAttention, Bytes(kv * e), c, op_index);
      if (l.cp_heads_split() > 1) {  // all-to-alls of Q, K, V before the attention, O after
        b.last().query_bytes = Bytes(local * (s.heads / l.tp) * s.head_dim * e);
        b.last().out_bytes = Bytes(local * (s.heads / l.tp) * s.value_dim() * e);
      }
    } else if (tp && (l.tp_backward_overlap || userbuffers) && op.kind == models::OpKind::kGemm &&
               gemm_split(op, g) == Split::kColumn && b.after_tp_entry() && !expert && !beside) {
      const bool ring = userbuffers && is_fp8_linear(op);  // a TE layer linear, not logits
      b.linear_after_tp_entry(ring ? op_cost(op, g, l, context_parallel, dev, p, {l.tp, 1}) : c,
                              op_index, ring);
      b.last().output_layer = is_output_layer(op);
    } else if (userbuffers && is_fp8_linear(op) && !expert && gemm_split(op, g) == Split::kRow &&
               exit_follows(op_index) && !beside) {
      if (p == Precision::kFp8) {
        // FP8 (Megatron-Bridge's userbuffers_fp8_* configurations): a ring exchange, whose
        // reduce-scatter sums the tp partial chunks each rank receives (userbuffers' reduce
        // kernel): the whole activation read, its 1/tp slice written.
        PassCost ring = op_cost(op, g, l, context_parallel, dev, p, {l.tp, l.tp});
        ring.forward += dev.memory_kernel_time(activation + activation / l.tp);
        b.linear_before_tp_exit(ring, op_index, static_cast<int32_t>(l.tp));
      } else {
        // 16-bit (userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192): the "pipeline" method,
        // the GEMM in 4 splits on the SMs the reduce-scatter's kernels leave it (24 for
        // proj, 16 for fc2: set_sm_margin), each split's reduce-scatter beside the next.
        constexpr int64_t kSplits = 4;
        const int comm_sms = op.name == "attn_out" ? 24 : 16;
        PassCost piped = op_cost(op, g, l, context_parallel, dev, p, {kSplits, l.tp});
        if (dev.sm_count > comm_sms)
          piped.forward =
              Time::ps(static_cast<int64_t>(static_cast<double>(piped.forward.count_ps()) *
                                            dev.sm_count / (dev.sm_count - comm_sms)));
        b.linear_before_tp_exit(piped, op_index, kSplits);
      }
    } else {
      b.compute(c, op_index);
    }
    if (tp && op.kind == models::OpKind::kLoss)
      loss_collectives(b, l.cross_entropy_fusion, tokens / cp, l.tp);

    // Latent attention (Megatron-Core's MLASelfAttention): the down projections run on this
    // rank's tokens, and the up projections gather what they read over TP: the query's
    // latent (or, without one, the hidden states), the key / value latent and the shared
    // rope key (k_pos_emb, gathered on its own). In 16 bits.
    if (tp && op.name == "kv_norm") b.comm(StepKind::kTpEntry, latent_gather(op.layer));
    if (tp && ((op.name == "attn_norm" && !latent) || (op.name == "mlp_norm" && !in_moe_sp(op)))) {
      b.comm(StepKind::kTpEntry, activation);
      // FP8: the norm's output reaches qkv / fc1 (TE LayerNormLinear / LayerNormMLP) as FP8,
      // quantised before the SP all-gather (layernorm_linear.py, layernorm_mlp.py:
      // with_quantized_norm, gather_along_first_dim(..., quantizer=...)); backward's
      // re-gather of the saved input likewise. The reduce-scatter of its gradient stays bf16.
      if (p == Precision::kFp8 && l.sequence_parallel) b.gather_as(Bytes(tokens / cp * g.hidden));
      if (current_sp) b.last().amax_reduce = true;  // one scale for the gathered input
    }
    if (tp && op.kind == models::OpKind::kEmbedding) b.comm(StepKind::kTpExit, activation);
    // A multi-token-prediction depth's eh_proj (Megatron-Core's MultiTokenPredictionLayer):
    // its input, the two normalised halves (2h), gathered over TP (under SP: all-gathered),
    // its output gathered over TP and scattered back to SP slices: a TP exit's traffic under
    // SP (without SP an all-gather forward and nothing backward, where the exit charges an
    // all-reduce forward: over-counted).
    if (tp && op.name == "mtp_hnorm") b.comm(StepKind::kTpEntry, activation * 2);
    if (tp && op.name == "mtp_eh_proj") b.comm(StepKind::kTpExit, activation);
    if (tp && g.kind == models::ModuleKind::kProjector && op.name == "fc2")
      b.comm(StepKind::kTpExit, activation);
    if (l.ep > 1 && op.name == "moe_dispatch") {
      const Bytes tokens_a2a = routed_bytes(op, true);
      b.comm(StepKind::kEpAllToAll, tokens_a2a);
      // Dropless: the expert counts' all-gather first; token dropping pads to static sizes.
      b.dispatch_calls(Bytes(tokens_a2a.count() / (g.hidden * e) * 4),
                       Bytes(l.moe_capacity_factor > 0 ? 0 : routed_experts(g, op.layer) * 8));
    }
    if (gather_routed && op.name == "moe_dispatch")
      b.comm(StepKind::kTpEntry, routed_bytes(op, false));
  }
  HETPAR_CHECK(m.layers == 0 || seen_layer, "module graph without its layer 0");
  if (shared_beside)
    for (Block* b : {&m.layer, &m.window_layer})
      if (!b->steps.empty()) place_beside_all_to_alls(g, b->steps);
  return m;
}

// The kernels of op_cost()'s terms (kernels.h): the same shards, term by term.
OpKernels op_kernels(const models::Op& op, const models::OpGraph& g, const Layout& l,
                     bool context_parallel, hardware::Precision p) {
  const int64_t cp = context_parallel ? l.cp : 1;
  const auto elem = [](Precision q) { return static_cast<int>(hardware::bytes_per_element(q)); };
  OpKernels k;
  switch (op.kind) {
    case models::OpKind::kGemm: {
      const Precision gp = gemm_precision(op, p);
      // A grouped linear (Transformer Engine's GroupedLinear) launches one cuBLAS GEMM per
      // local expert (nvte_multi_stream_cublas_gemm): a batched product per round of
      // concurrent ones (for_each_gemm_round), each expert a launch.
      const bool grouped = is_expert(op);
      const auto gemms = [&](std::vector<sim::Kernel>& out, int64_t m, int64_t n, int64_t kk,
                             int64_t batch, bool accumulate = false) {
        for_each_gemm_round(grouped, batch, [&](int64_t b) {
          sim::Kernel x = sim::gemm_kernel(m, n, kk, b, elem(gp));
          if (grouped) x.launches = b;
          x.accumulate_fp32 = accumulate;
          out.push_back(x);
        });
      };
      const int64_t rerun_n = partial_rerun_columns(op, l);
      const std::vector<models::GemmShape> shapes = rank_gemms(op, g, l, cp);
      for (size_t i = 0; i < shapes.size(); ++i) {
        const models::GemmShape& s = shapes[i];
        const ShapeRole role = shape_role(op, s, i, rerun_n);
        gemms(k.forward, s.m, s.n, s.k, s.batch);
        gemms(k.dgrad, s.m, s.k, s.n, s.batch);
        gemms(k.wgrad, s.k, s.n, s.m, s.batch, accumulates_fp32(l, p));
        if (const int64_t b = unfused_accumulation_bytes(s, g, l, p); b > 0)
          k.wgrad.push_back(sim::memory_kernel(b));
        if (role.rerun_n > 0) gemms(k.recompute, s.m, role.rerun_n, s.k, s.batch);
        if (gp == Precision::kFp8 && is_fp8_linear(op)) {
          const Fp8Kernels q = fp8_quantize_kernels(op, s, l);
          if (role.casts_input) {
            k.forward.insert(k.forward.end(), q.forward.begin(), q.forward.end());
            if (rerun_n > 0)
              k.recompute.insert(k.recompute.end(), q.forward.begin(), q.forward.end());
          }
          k.dgrad.insert(k.dgrad.end(), q.backward.begin(), q.backward.end());
        }
      }
      if (const int64_t b = partial_gradient_bytes(op, shapes, activation_bytes(g, p)); b > 0)
        k.dgrad.push_back(sim::memory_kernel(b));
      break;
    }
    case models::OpKind::kAttention: {
      const Precision ap = attention_precision(p);
      const models::AttentionShape& a = *op.attention;
      const int64_t qkv = a.qkv_elements();
      if (op.read.count() <= qkv * g.dtype_bytes) {  // flash attention: one fused kernel
        // Ring CP: one kernel of the rank's whole work (lower() splits it into the cp ring
        // steps). All-gather CP: the busiest rank's two calls, one per local chunk, a chunk's
        // s / (2 cp) queries against the keys it sees (gather_keys), bottom-right aligned.
        // A2A CP: one call over the whole sequence with the rank's heads / cp; A2A+P2P: the
        // ring's kernel over cp / cp_a2a ranks with heads / cp_a2a.
        const bool gather = cp > 1 && l.cp_comm == CpComm::kAllGather;
        const int64_t heads_over = l.tp * (cp > 1 ? l.cp_heads_split() : 1);
        const int64_t q_split = gather ? 2 * cp : cp > 1 ? l.cp_ring() : 1;
        sim::Kernel f{.kind = sim::KernelKind::kAttentionForward,
                      .batch = a.batch,
                      .heads = ceil_div(a.heads, heads_over),
                      .kv_heads = ceil_div(a.kv_heads, heads_over),
                      .seq_q = ceil_div(a.seq_q, q_split),
                      .seq_kv = a.seq_kv,
                      .head_dim = a.head_dim,
                      .causal = a.causal,
                      .element_bytes = elem(ap),
                      .v_head_dim = a.v_head_dim,
                      .window = a.window,
                      .sinks = a.sinks};
        k.forward.assign(gather ? 2 : 1, f);
        if (gather) {
          const std::array<int64_t, 2> keys = gather_keys(a, cp);
          for (size_t i = 0; i < keys.size(); ++i) k.forward[i].seq_kv = keys[i];
        }
        k.dgrad = k.forward;
        for (sim::Kernel& b : k.dgrad) b.kind = sim::KernelKind::kAttentionBackward;
        if (cp > 1) {
          const CpBytes x = cp_attention_bytes(a, l, activation_bytes(g, p));
          k.forward.push_back(sim::memory_kernel(x.forward));
          k.dgrad.push_back(sim::memory_kernel(x.backward));
        }
        break;
      }
      const int64_t bh = a.batch * ceil_div(a.heads, l.tp);
      const int64_t sq = ceil_div(a.seq_q, cp), skv = a.seq_kv, d = a.head_dim, dv = a.value_dim();
      const int e = elem(ap);
      k.forward = {sim::gemm_kernel(sq, skv, d, bh, e), sim::gemm_kernel(sq, dv, skv, bh, e)};
      k.dgrad = {sim::gemm_kernel(sq, skv, dv, bh, e), sim::gemm_kernel(skv, dv, sq, bh, e),
                 sim::gemm_kernel(sq, d, skv, bh, e), sim::gemm_kernel(skv, d, sq, bh, e)};
      const int64_t ab = activation_bytes(g, p);
      const int64_t scores = a.batch * a.heads * a.seq_q * a.seq_kv;
      const bool dropout = op.saved.count() > (qkv + 2 * scores) * g.dtype_bytes;
      const int64_t dropout_bytes = dropout ? 2 * ab + 1 : 0;
      const double per_rank = static_cast<double>(l.tp * cp);
      const auto local = [&](int64_t bytes_per_score) {
        return static_cast<int64_t>(static_cast<double>(scores) *
                                    static_cast<double>(bytes_per_score) / per_rank);
      };
      k.forward.push_back(sim::memory_kernel(local(2 * ab + dropout_bytes)));
      k.dgrad.push_back(sim::memory_kernel(local(3 * ab + dropout_bytes)));
      break;
    }
    case models::OpKind::kLoss: {
      const int64_t logits = op.read.count() / g.dtype_bytes / (cp * l.tp);
      const LossBytes b = loss_bytes(l.cross_entropy_fusion);
      k.forward.push_back(sim::memory_kernel(b.forward * logits));
      k.dgrad.push_back(sim::memory_kernel(b.backward * logits));
      break;
    }
    default: {
      if (is_expert_reorder(op)) {
        const int64_t copy = 2 * expert_reorder_elements(op, g, l, cp) * activation_bytes(g, p);
        if (copy > 0) k.forward = k.dgrad = {sim::memory_kernel(copy)};
        break;
      }
      if (permuted_in_dispatch(op, l)) break;
      int64_t shard = cp;
      if (pointwise_tp_sharded(op, l, g.kind)) shard *= l.tp;
      const int64_t scale = activation_bytes(g, p) / g.dtype_bytes;
      if (const auto eager = eager_kernels(op, g, l, op.written * scale / shard, cp)) {
        for (int64_t b : eager->forward) k.forward.push_back(sim::memory_kernel(b));
        for (int64_t b : eager->backward) k.dgrad.push_back(sim::memory_kernel(b));
        break;
      }
      const int64_t traffic = ((op.read + op.written) * scale / shard).count();
      k.forward.push_back(sim::memory_kernel(traffic));
      (op.kind == models::OpKind::kEmbedding ? k.wgrad : k.dgrad)
          .push_back(sim::memory_kernel(backward_passes(op) * traffic));
      const EmbeddingGradient e = embedding_gradient_bytes(op, l, p);
      for (int64_t bytes : {e.fill, e.add})
        if (bytes > 0) k.wgrad.push_back(sim::memory_kernel(bytes));
      break;
    }
  }
  const MoeKernels moe = moe_kernels(op, g, l, cp, p);  // none for other ops
  k.forward.insert(k.forward.end(), moe.forward.begin(), moe.forward.end());
  k.dgrad.insert(k.dgrad.end(), moe.backward.begin(), moe.backward.end());
  if (reruns_ops(l.recompute) && models::recompute_share(op, l.recompute_policy()) >= 1)
    k.recompute = k.forward;
  return k;
}

Time kernel_time(const sim::Kernel& k, const hardware::DeviceProfile& dev, Precision p,
                 hardware::AttentionKernel attention) {
  Precision kp = p;
  if (k.element_bytes == 1) kp = Precision::kFp8;
  if (k.element_bytes == 2) kp = p == Precision::kFp16 ? Precision::kFp16 : Precision::kBf16;
  if (k.element_bytes == 4) kp = p == Precision::kTf32 ? Precision::kTf32 : Precision::kFp32;
  switch (k.kind) {
    case sim::KernelKind::kGemm:
      if (k.m <= 0 || k.n <= 0 || k.k <= 0 || k.batch <= 0) return Time::zero();
      return dev.gemm_time(k.m, k.n, k.k, k.batch, kp, k.accumulate_fp32);
    case sim::KernelKind::kAttentionForward:
    case sim::KernelKind::kAttentionBackward:
      return dev.attention_time(Flops(k.flops()), kp, k.kind == sim::KernelKind::kAttentionBackward,
                                rate_seq_kv(k.seq_kv, k.windowed(), k.window),
                                dev.attention_rates(attention), k.causal, k.score_width());
    case sim::KernelKind::kMemory:
      return dev.memory_kernel_time(Bytes(k.bytes));
  }
  return Time::zero();
}

std::vector<sim::Kernel> distinct_gemms(const sim::TaskGraph& g) {
  // (m, n, k, adds into fp32) -> (flops, element bytes)
  std::map<std::tuple<int64_t, int64_t, int64_t, bool>, std::pair<double, int>> seen;
  for (int t = 0; t < g.num_tasks(); ++t) {
    const sim::Task& task = g.task(TaskId(t));
    if (task.kind != sim::TaskKind::kCompute || !task.kernels.valid()) continue;
    for (const sim::Kernel& k : g.kernels(task.kernels)) {
      if (k.kind != sim::KernelKind::kGemm || k.m <= 0 || k.n <= 0 || k.k <= 0) continue;
      auto& [flops, bytes] = seen[{k.m, k.n, k.k, k.accumulate_fp32}];
      flops += k.flops();
      bytes = k.element_bytes;
    }
  }
  std::vector<std::pair<double, sim::Kernel>> order;
  for (const auto& [shape, use] : seen) {
    const auto [m, n, k, accumulate] = shape;
    order.push_back({use.first, sim::gemm_kernel(m, n, k, 1, use.second)});
    order.back().second.accumulate_fp32 = accumulate;
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<sim::Kernel> out;
  for (const auto& [flops, k] : order) out.push_back(k);
  return out;
}

}  // namespace hetpar::planner

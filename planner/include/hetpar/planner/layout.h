// Layout: how one module is parallelised — tensor (tp, with optional sequence parallel),
// context (cp), pipeline (pp stages, vpp virtual stages per rank), data (dp) and expert
// (ep) parallelism, the micro-batch size, activation recompute, the distributed optimizer
// and communication overlap. A Plan is a scenario's layout plus the pipeline schedule.
// Ranks follow Megatron-LM's order: tp fastest, then cp, then dp, then pp
// (rank = tp_i + tp*(cp_i + cp*(dp_i + dp*pp_i))); EP reuses the dp x cp ranks of a stage.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hetpar/core/status.h"
#include "hetpar/hardware/device_profile.h"
#include "hetpar/hardware/precision.h"
#include "hetpar/models/op_graph.h"

namespace hetpar::planner {

enum class Schedule {
  kGpipe,        // all forwards, then all backwards
  k1F1B,         // PipeDream-flush one-forward-one-backward (Megatron's default)
  kInterleaved,  // 1F1B over vpp virtual stages per rank (Megatron's interleaved schedule)
  kZeroBubble,   // ZB-H1: 1F1B with weight-gradient work deferred into the bubbles
};
std::string_view to_string(Schedule s);  // "gpipe", "1f1b", "interleaved", "zb-h1"

std::string_view to_string(models::Recompute r);  // "none", "selective", "full", ...
/// The modules set in `modules` by Megatron-Core's --recompute-modules names, in the order
/// core_attn, layernorm, moe_act.
std::vector<std::string_view> recompute_module_names(uint8_t modules);
/// The same joined: "layernorm, moe_act".
std::string recompute_modules_names(uint8_t modules);
/// The models::RecomputeModule bit of a --recompute-modules name hetpar models; 0 if none.
uint8_t recompute_module(std::string_view name);

/// How Transformer Engine scales FP8 tensors (fp8 workloads; Megatron-LM's --fp8-recipe).
enum class Fp8Recipe {
  kDelayed,     // scale from the amax history of earlier steps, found inside the cast kernel;
                // each chunk's forward and backward all-reduce their amaxes over the stage
                // (Transformer Engine's reduce_amax; planner/lower.h)
  kTensorwise,  // current scaling: each tensor's own amax, a separate pass before its cast
};
std::string_view to_string(Fp8Recipe r);  // "delayed", "tensorwise"

/// How context parallelism exchanges K,V (Megatron-LM's --cp-comm-type).
enum class CpComm {
  kP2P,        // a ring: cp attention steps, each overlapping the next chunk's transfer
  kAllGather,  // K,V all-gathered before one attention over every key (exposed), dK,dV
               // reduce-scattered after the backward (Meta's Llama 3 CP)
  kA2A,        // DeepSpeed Ulysses: all-to-alls trade the sequence split for a split of the
               // heads, one attention over the whole sequence with heads / cp each, and
               // back (exposed; Transformer Engine's AttnFuncWithCPAndQKVOA2A)
  kA2AP2P,     // hierarchical: a2a over groups of Layout::cp_a2a adjacent cp ranks (heads /
               // cp_a2a each), then a ring over cp / cp_a2a of them (Transformer Engine's
               // AttnFuncWithCPAndKVP2P with two groups; Megatron's
               // --hierarchical-context-parallel-sizes cp_a2a cp/cp_a2a)
};
std::string_view to_string(CpComm c);  // "p2p", "all_gather", "a2a", "a2a+p2p"

/// The dtype of the gradient buffer the backward accumulates into and the data-parallel
/// reduction runs in (Megatron's main_grad buffer). The trainers' default keeps fp32 for
/// bf16 / fp8 training (Megatron-LM forces --accumulate-allreduce-grads-in-fp32 unless
/// --grad-reduce-in-bf16; Megatron-Bridge ddp.grad_reduce_in_fp32 true; torchtitan
/// mixed_precision_reduce float32) and the weights' fp16 for fp16 training (Megatron-LM's
/// default without --accumulate-allreduce-grads-in-fp32).
enum class GradReduceDtype {
  kDefault,  // the trainers' default for the workload precision, as above
  kFp32,
  kBf16,  // bf16 / fp8 training only: the weights' dtype
  kFp16,  // fp16 training only
};
std::string_view to_string(GradReduceDtype d);  // "default", "fp32", "bf16", "fp16"

/// How the LLM's vocabulary-parallel cross-entropy runs (Megatron-LM's
/// --cross-entropy-loss-fusion and --cross-entropy-fusion-impl; Megatron-Bridge
/// model.cross_entropy_loss_fusion / cross_entropy_fusion_impl; torchtitan's
/// compile.components "loss").
enum class CrossEntropy {
  kUnfused,   // Megatron's VocabParallelCrossEntropy on logits.float(): fp32 passes (PyTorch's
              // eager F.cross_entropy on pred.float() makes about as many)
  kNative,    // Megatron-Core's fused_vocab_parallel_cross_entropy: fewer fp32 passes
  kTe,        // Transformer Engine's parallel_cross_entropy: two Triton passes over the bf16
              // logits, the gradient written in place in the forward
  kCompiled,  // F.cross_entropy(pred.float()) under torch.compile (torchtitan): one online-
              // softmax pass over the bf16 logits forward, one pass writing the gradient back
};
std::string_view to_string(CrossEntropy c);  // "none", "native", "te", "compiled"

/// How a MoE layer's tokens reach their experts' EP ranks and come back (Megatron-Core's
/// --moe-token-dispatcher-type; Megatron-Bridge model.moe_token_dispatcher_type).
enum class MoeDispatcher {
  /// alltoall: NCCL all-to-alls over the EP group, every routed copy of a token sent to its
  /// expert's rank, so a token with several experts on one remote node crosses the network
  /// once per expert.
  kAllToAll,
  /// flex with DeepEP (--moe-flex-dispatcher-backend deepep): across nodes each token goes
  /// once to every node that holds one of its experts, to the GPU of the sender's local
  /// index there (RDMA), which forwards it over NVLink to the node's GPUs that need it;
  /// combine the reverse. Inside one node a plain NVLink all-to-all.
  kDeepEp,
  /// flex with HybridEP (--moe-flex-dispatcher-backend hybridep; DeepEP's hybrid-ep
  /// branch): the same routes (RDMA to the same local index, then NVLink; each token once
  /// per node and rank that holds one of its experts), with the permutation into expert
  /// order fused into its dispatch kernel and the unpermutation into its combine
  /// (dispatch_with_permute / combine_with_unpermute): no reorder passes of their own.
  kHybridEp,
};
std::string_view to_string(MoeDispatcher d);  // "alltoall", "deepep", "hybridep"
/// The dispatcher's (or its backend's) own name for messages: "all-to-all", "DeepEP",
/// "HybridEP".
std::string_view display_name(MoeDispatcher d);

/// Which FSDP runs a plan with Layout::fsdp (Megatron-LM --use-megatron-fsdp /
/// --use-torch-fsdp2; torchtitan always runs PyTorch's FSDP2).
enum class FsdpImplementation {
  /// Megatron-FSDP (and the generic model): each block all-gathers into the buffer its
  /// parameters live in and reduce-scatters from its gradient buffer; no copies around the
  /// collectives.
  kMegatron,
  /// PyTorch FSDP2 (fully_shard), wrapped as torchtitan wraps it: each all-gather lands in a
  /// flat buffer that a copy-out kernel on the compute stream splits into the block's
  /// parameters before the block runs (foreach_all_gather_copy_out: the gathered bytes read
  /// and written once); before each reduce-scatter a copy-in kernel on the compute stream
  /// (foreach_reduce_scatter_copy_in) reads the unit's gradients in the parameters' dtype and
  /// writes them into the flat reduce buffer in the reduce dtype; the final norm and output
  /// layer are one unit kept gathered from their forward to their backward (torchtitan's
  /// apply_fsdp, reshard_after_forward false for [norm, output]).
  kTorchFsdp2,
};
std::string_view to_string(FsdpImplementation f);  // "megatron_fsdp", "torch_fsdp2"

struct Layout {
  int tp = 1;
  bool sequence_parallel = false;  // SP: all-gather + reduce-scatter instead of all-reduce
  int cp = 1;
  CpComm cp_comm = CpComm::kP2P;  // meaningful when cp > 1
  /// cp_comm a2a+p2p: the ranks of the a2a level (adjacent in the cp group), a divisor of cp
  /// between 2 and cp / 2; 0 otherwise.
  int cp_a2a = 0;
  int pp = 1;
  int vpp = 1;  // virtual pipeline stages per rank (interleaved schedule); 1 = none
  /// Interleaved schedule: the contiguous micro-batches each virtual stage runs before the
  /// next one takes over (Megatron-Core's microbatch_group_size_per_vp_stage, Llama 3's
  /// flexible N); 0 = pp, Megatron's default. Between pp and the micro-batches per replica;
  /// the last group's remainder 0 or at least pp, as Megatron-Core checks.
  int microbatch_group = 0;
  int dp = 1;
  int ep = 1;  // expert parallel size (MoE only); divides dp * cp x tp / expert_tp()
  /// Expert tensor parallel size (Megatron-Core's --expert-tensor-parallel-size): the TP
  /// width of the routed experts, tp (0, the default) or 1. With 1 ("MoE parallel
  /// folding") each rank runs whole experts on its own sequence slice and the EP groups span
  /// the TP ranks too: the stage's ranks in the experts' order, etp fastest, then ep, then
  /// expert-DP (rank = a + etp * (e + ep * d)).
  int etp = 0;
  int expert_tp() const { return etp > 0 ? etp : tp; }
  /// Context parallelism's two exchanges: the ranks an all-to-all over the heads spans (a2a:
  /// cp; a2a+p2p: cp_a2a; otherwise 1) and the K,V ring's length (p2p: cp; a2a+p2p:
  /// cp / cp_a2a; otherwise 1). Their product is cp wherever a ring or all-to-all runs.
  int cp_heads_split() const {
    if (cp_comm == CpComm::kA2AP2P) return cp_a2a > 0 ? cp_a2a : 1;
    return cp_comm == CpComm::kA2A ? cp : 1;
  }
  int cp_ring() const {
    if (cp_comm == CpComm::kA2AP2P) return cp / cp_heads_split();
    return cp_comm == CpComm::kP2P ? cp : 1;
  }
  /// The ranks of a pipeline stage the experts' EP x expert-DP groups tile: tp / expert_tp()
  /// x dp x cp (with ep: expert-DP = expert_ranks() / ep).
  int expert_ranks() const { return tp / expert_tp() * dp * cp; }
  int micro_batch = 1;  // samples per micro-batch
  models::Recompute recompute = models::Recompute::kNone;
  /// Under recompute selective, what it re-runs (models::RecomputeModule bits; Megatron-Core's
  /// --recompute-modules, default the attention core).
  uint8_t recompute_modules = models::kRecomputeCoreAttn;
  models::RecomputePolicy recompute_policy() const { return {recompute, recompute_modules}; }
  /// Whether selective recompute re-runs other modules than its default (what the plan
  /// file and the exports then name).
  bool names_recompute_modules() const {
    return recompute == models::Recompute::kSelective &&
           recompute_modules != models::kRecomputeCoreAttn;
  }
  bool distributed_optimizer = false;  // ZeRO-1: optimizer state sharded over dp
  /// Fully sharded data parallelism (torch FSDP / FSDP2, Megatron-FSDP, DeepSpeed ZeRO-3):
  /// parameters, gradients and optimizer state sharded over the dp x cp ranks (routed
  /// experts with ep > 1 over their expert-DP group, dp x cp / ep ranks). Each block
  /// (a transformer layer, the work before or after the layers) all-gathers its parameters
  /// before its forward, one block ahead, and again before its backward; after each
  /// micro-batch's backward it reduce-scatters its gradients into the rank's shard.
  bool fsdp = false;
  /// With fsdp: the forward's gathered parameters are freed after it, so the backward
  /// gathers them again (FSDP2's default, ZeRO-3). Off: they stay gathered until the
  /// block's backward (FSDP's SHARD_GRAD_OP, ZeRO-2 style; Meta's Llama 3 FSDP).
  bool fsdp_reshard_after_forward = true;
  FsdpImplementation fsdp_implementation = FsdpImplementation::kMegatron;  // with fsdp
  /// FSDP2 only: the work before and after the layers (embedding, final norm, output layer)
  /// stays in FSDP2's root unit, as torchtitan wrapped it until July 2025 (pytorch/torchtitan
  /// PR 1094): gathered once at the start of each chunk's forward, kept through its
  /// backward, reduce-scattered after the chunk's whole backward (the root's post-backward
  /// runs in FSDP2's final callback); the model's last layer is kept gathered from its
  /// forward to its backward too. Off: the embedding is a unit of its own, resharded as the
  /// layers are, and [final norm, output] one unit kept gathered (today's torchtitan).
  bool fsdp_root_unit = false;
  bool torch_fsdp2() const {
    return fsdp && fsdp_implementation == FsdpImplementation::kTorchFsdp2;
  }
  /// The optimizer state is sharded over dp x cp: the distributed optimizer or FSDP.
  bool shards_optimizer_state() const { return distributed_optimizer || fsdp; }
  bool overlap_grad_reduce = true;   // DP gradient reduction overlapped with backward
  bool overlap_param_gather = true;  // distributed optimizer all-gather overlapped with forward
  /// With a pipeline and overlap_grad_reduce, Megatron-Core's align_grad_reduce (default on in
  /// Megatron-LM, NeMo and Megatron-Bridge): the schedule launches a chunk's gradient
  /// reductions itself (config.grad_sync_func) rather than as its buckets become ready.
  /// Interleaved: chunk c's after the backward pp_rank places after its last (virtual
  /// micro-batch k - pp_rank), those left after the schedule; 1F1B: the first stage's as
  /// ready, the other stages' after the schedule, in its bubble. Off: every bucket as ready.
  bool align_grad_reduce = true;
  /// Fused flash attention (default). Off: attention as batched GEMMs with the s x s
  /// scores materialised, softmax and dropout as separate kernels (Megatron-LM before
  /// flash attention, e.g. Narayanan et al. 2021).
  bool flash_attention = true;
  /// Which fused attention kernel (with flash_attention): the profile's own (default: the one
  /// its trainers pick, cuDNN's under Transformer Engine on Hopper), or one the profile has
  /// rates for (gpu.attention.alternatives): FlashAttention-2 is PyTorch SDPA's flash backend
  /// (torchtitan with torch up to 2.8), FlashAttention-3 and cuDNN Transformer Engine's.
  hardware::AttentionKernel attention_kernel = hardware::AttentionKernel::kDefault;
  /// How the trainer's model code runs a layer (models::ModuleInput): the q, k, v projections
  /// and a gated MLP's gate and up as one GEMM each (default, Megatron's linear_qkv and
  /// linear_fc1), or false a GEMM per projection (torchtitan's and Hugging Face's wq, wk, wv,
  /// w1, w3; dense layers); and K, V copied to every query head before attention
  /// (repeat_kv: torchtitan, Hugging Face) rather than read grouped by the kernel.
  bool fused_projections = true;
  bool repeat_kv = false;
  /// The MLP activation as one fused kernel each way (default: Megatron-Core's jit-fused
  /// bias_swiglu / bias_gelu / squared_relu, torch.compile's) or false as the separate
  /// PyTorch ops autograd runs eagerly (NeMo's and Megatron-Bridge's Nemotron squared ReLU,
  /// torch.pow(relu(x), 2); Megatron's --no-bias-swiglu-fusion glu; torchtitan without
  /// compile). GELU is one kernel each way either way.
  bool fused_activation = true;
  /// RoPE as Transformer Engine's fused kernel, one each way per query and key tensor
  /// (default: Megatron-Core's apply_rope_fusion), or false as Megatron-Core's unfused
  /// _apply_rotary_pos_emb_bshd, eager PyTorch ops (Megatron-LM's --no-rope-fusion). A
  /// model whose YaRN scales cos and sin runs the unfused ops either way
  /// (models::RopeApply::scaled).
  bool fused_rope = true;
  /// The backward of a column-parallel linear overlaps the TP collective of its input
  /// gradient with its wgrad GEMM (and, under SP, re-gathers its input beside the dgrad
  /// GEMM), as Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication and
  /// Transformer Engine do (cost_model.h, WorkStep::overlaps_tp_entry). Off: the all-reduce
  /// runs after the linear's whole backward (Megatron-LM before late 2021, e.g. Narayanan
  /// et al. 2021). Every trainer hetpar exports to overlaps.
  bool tp_backward_overlap = true;
  /// Megatron-LM's scatter/gather pipeline transfers (--scatter-gather-tensors-in-pipeline,
  /// on by default in its own p2p_communication from 2021; Narayanan et al. 2021, sec. 4.1):
  /// without SP each TP rank sends only its 1/tp piece of the replicated hidden state to the
  /// next (previous) stage, over its own NIC, and the receiving stage all-gathers the pieces
  /// over its TP group before the chunk's forward (backward) runs. Ignored with SP, which
  /// sends the sequence slice anyway, or tp 1. Off: every TP rank sends the whole tensor
  /// (Megatron-Core's pipeline communication, and the other trainers).
  bool pp_scatter_gather = false;
  /// Pipeline transfers in blocking calls, as Megatron-LM's p2p_communication runs them: it
  /// waits on every request and synchronises the device (batch_p2p_sync) in its
  /// non-interleaved schedule, and did so in the interleaved one too until overlap_p2p_comm
  /// (2023). Each stage sends and receives at the calls its schedule makes
  /// (schedule.h, blocking_calls: interleaved, a steady forward's output leaves only after
  /// the backward paired with it); a transfer moves once both ends have issued their calls,
  /// and the op after a call starts only when all it moved has arrived. Zero-bubble schedules,
  /// custom stage programs and the EP all-to-all overlap keep only the sender's wait: a call
  /// after every op, whose next op waits for its sends.
  /// Off: a transfer overlaps both ends' compute and only its consumer waits for it.
  bool pp_blocking_p2p = false;
  /// Transformer Engine's userbuffers TP overlap (Megatron-LM --tp-comm-overlap,
  /// Megatron-Bridge comm_overlap.tp_comm_overlap), as its ring-exchange configurations run
  /// it: the SP all-gather before qkv / fc1 and the reduce-scatter after proj / fc2 move
  /// chunk by chunk over the copy engines while the GEMM computes, split into tp chunks of
  /// its rows (16-bit: the reduce-scatter as the bf16 configurations' "pipeline" method, 4
  /// splits beside a GEMM on fewer SMs); likewise the gradient all-gather before proj / fc2's
  /// dgrad. The backward of
  /// qkv / fc1 overlaps as tp_backward_overlap does (bulk). Needs tp > 1 with SP; dense
  /// layer linears only (not the MoE experts, not the output layer).
  bool tp_comm_overlap = false;
  /// Megatron-Core's EP all-to-all overlap (--overlap-moe-expert-parallel-comm with
  /// --delay-wgrad-compute; Megatron-Bridge comm_overlap.overlap_moe_expert_parallel_comm):
  /// each steady-state forward runs merged with the backward beside it in the schedule (of
  /// another micro-batch), layer by layer, so one's dispatch / combine all-to-all moves
  /// while the other computes: the backward's combine beside the forward's attention, the
  /// forward's dispatch beside the backward's experts, the backward's dispatch beside the
  /// forward's experts, the forward's combine beside the backward's attention. The
  /// all-to-alls then run on a stream of their own. Needs ep > 1, the 1F1B schedule with pp
  /// 1 or the interleaved one, no full recompute (Megatron-Core's checks), and no colocated
  /// encoders (not modelled together). With userbuffers (tp_comm_overlap) too: their ring
  /// collectives never span an all-to-all, so the merged ops interleave as without them.
  bool ep_comm_overlap = false;
  /// Megatron-Core's shared-expert overlap (--moe-shared-expert-overlap; Megatron-Bridge
  /// model.moe_shared_expert_overlap): a MoE layer's shared experts run on a stream of their
  /// own beside the all-to-all dispatcher's exchanges: their SP all-gather, first linear and
  /// activation beside the dispatch, their second linear and reduce-scatter beside the combine
  /// (token_dispatcher.py, shared_experts.py); their backward likewise beside the same
  /// exchanges' backward. Their linears then do no TP communication of their own (no
  /// userbuffers). Needs a MoE LLM with shared experts; not with ep_comm_overlap or the
  /// shared_experts recompute module (Megatron-Core refuses the one and skips the other);
  /// with ep 1 there is no exchange to hide behind and nothing changes. The shared experts'
  /// re-runs under recompute (moe, full) are not overlapped.
  bool moe_shared_expert_overlap = false;
  /// Whether the shared experts do run beside all-to-alls: the overlap, with EP.
  bool overlaps_shared_experts() const { return moe_shared_expert_overlap && ep > 1; }
  /// MoE token dropping (Megatron --moe-expert-capacity-factor with
  /// --moe-pad-expert-input-to-capacity; Megatron-Bridge's token-drop presets): each expert
  /// takes at most ceil(factor x tokens x top_k / experts) of a rank's routed tokens and is
  /// padded to exactly that, so the split sizes are static: no expert counts are gathered
  /// and the host never waits for them. 0: dropless (the default).
  double moe_capacity_factor = 0;
  /// Dropless routing's hottest expert-parallel rank: its routed tokens over the group's
  /// mean (>= 1). Every rank of a MoE layer waits for that rank at the combine, so each is
  /// timed at its load: the experts' GEMMs and reorders, and the all-to-alls, whose transfers
  /// end when the hottest rank has received (and sent back) its tokens. Memory holds the
  /// mean load (ExpertLoad::kMean: the hottest rank moves from layer to layer). 1 (the
  /// default): every expert the same load, as Megatron's --moe-router-force-load-balancing
  /// makes it for benchmarks. A property of the router and the data, not a trainer flag, so
  /// nothing is exported; the same at every EP size (no measurement of how it grows with
  /// fewer experts per rank); no effect without EP (one rank holds every expert). Not with
  /// token dropping, which pads every expert to its capacity.
  double moe_load_imbalance = 1;
  /// The load the hottest EP rank's experts and all-to-alls run at, over the mean.
  double moe_rank_load() const { return ep > 1 ? std::max(1.0, moe_load_imbalance) : 1.0; }
  MoeDispatcher moe_dispatcher = MoeDispatcher::kAllToAll;
  /// Megatron-Core's flex dispatcher (DeepEP or HybridEP): each token once per node and rank
  /// of its experts, over NVLink and, across nodes, the GPUs of one local index.
  bool flex_dispatcher() const { return moe_dispatcher != MoeDispatcher::kAllToAll; }
  Fp8Recipe fp8_recipe = Fp8Recipe::kDelayed;  // meaningful for fp8 workloads only
  GradReduceDtype grad_reduce_dtype = GradReduceDtype::kDefault;
  CrossEntropy cross_entropy_fusion = CrossEntropy::kUnfused;
  /// FP8 training: the weights of the Transformer Engine Linear layers (every GEMM of the
  /// layers but the MoE router) are held in FP8, so the distributed optimizer's and FSDP's
  /// parameter all-gathers move 1 byte each instead of 2 (Megatron-LM --fp8-param-gather;
  /// Megatron-Bridge mixed_precision.fp8_param_gather, on in its FP8 recipes). The optimizer
  /// keeps its fp32 master copy. Off: bf16 weights, cast to FP8 for the GEMMs.
  bool fp8_param_gather = false;
  /// NCCL user-buffer registration of the data-parallel buffers (Megatron-LM
  /// --use-nccl-ub, Megatron-Bridge ddp.nccl_ub, which its performance scripts set with
  /// Megatron-FSDP): the DP gradient reductions and the distributed optimizer's and FSDP's
  /// parameter gathers run NCCL's SM-efficient kernels, so compute beside them slows by
  /// the few SMs those hold (the profile's intra_node / inter_node
  /// registered_collective_sms) rather than by an ordinary collective's share. Megatron's
  /// buffers only: infeasible with torch FSDP2.
  bool nccl_ub = false;
  /// Megatron's gradient-accumulation fusion (--gradient-accumulation-fusion, on by
  /// default; Megatron-Bridge model.gradient_accumulation_fusion): each wgrad GEMM adds its
  /// product into the fp32 main_grad (beta 1), reading and writing 4 bytes per weight
  /// element every micro-batch. Timed apart only where the profile measured such GEMMs
  /// (gpu.gemm.measured_accumulate, from `hetpar calibrate --shapes-from`); otherwise the
  /// roofline counts the traffic inside the GEMM's compute time. Off: the GEMM writes the
  /// gradient in the parameter dtype, and Megatron's backward hook adds it into main_grad
  /// in a pass of its own (per weight element the gradient and main_grad read, main_grad
  /// written, every micro-batch; --no-gradient-accumulation-fusion, and Megatron-LM before
  /// the fusion existed, 2021); under torch FSDP2 (torchtitan) there is no main_grad and
  /// nothing more is charged.
  bool gradient_accumulation_fusion = true;
  /// Megatron-Core's defer_embedding_wgrad_compute (--defer-embedding-wgrad-compute with
  /// --wgrad-deferral-limit; NeMo's Nemotron-4 340B recipe): the output layer's
  /// weight-gradient GEMM of the first wgrad_deferral_limit micro-batches (0: all) is put off
  /// to the pipeline's flush, where the last stage runs the deferred ones (under SP each
  /// after re-gathering its saved input, the next all-gather beside the GEMM:
  /// drain_embedding_wgrad_compute) before its gradients are reduced. Needs pp > 1 and
  /// gradient_accumulation_fusion, as Megatron-Core checks; modelled with tp > 1, where the
  /// output layer's backward is a task of its own.
  bool defer_embedding_wgrad = false;
  int wgrad_deferral_limit = 0;
  // Uneven pipeline splits of the LLM's layers (Megatron-LM; schedule.h's
  // layers_per_virtual_stage). first/last_stage_layers: --decoder-first/last-pipeline-
  // num-layers, the layers of pipeline stage 0 / pp-1 (0 = not set), the rest split evenly
  // over the other stages. account_for_embedding / _loss: --account-for-embedding/loss-in-
  // pipeline-split, the embedding / the output layer and loss count as one layer of the
  // first / last virtual stage in an even split.
  int first_stage_layers = 0;
  int last_stage_layers = 0;
  bool account_for_embedding = false;
  bool account_for_loss = false;
  /// Megatron-Core's --pipeline-model-parallel-layout over the decoder layers: the layers of
  /// each virtual stage in its order (virtual stage c·pp + s is chunk c of pipeline stage s),
  /// pp·vpp entries summing to the LLM's layers; the embedding is on the first, the output
  /// layer and loss on the last. Empty: not set. Lets a stage on slower GPUs (a cluster of
  /// several node types) hold fewer layers; excludes the four fields above.
  std::vector<int> pipeline_layout = {};

  int world() const { return tp * cp * pp * dp; }
  bool operator==(const Layout&) const = default;
};

/// The layout in words, every switch that departs from the defaults: "tp 8 (sp) cp 2 (p2p)
/// pp 8 vpp 8 dp 8, micro-batch 1, recompute none, distributed optimizer on, fp8 parameters,
/// ..."; an fp8 workload's adds its FP8 recipe. What `hetpar simulate` and the exports'
/// headers print.
std::string describe_in_words(const Layout& l, hardware::Precision workload);
/// Layout::pipeline_layout as "8|24" ("" when not set).
std::string pipeline_layout_text(const Layout& l);

/// Where the modules of a multimodal model run (research/paper-heteropar.md).
enum class Placement {
  /// Megatron's LLaVA-style baseline: every module inherits the LLM's layout and the
  /// encoders run on the LLM's first pipeline stage.
  kHomogeneous,
  /// Every module spans all ranks with its own factorisation (enc tp·dp = world); each GPU
  /// runs encoder work then LLM work.
  kColocated,
  /// Modules own disjoint rank ranges that tile the world; the encoder acts as leading
  /// pipeline stage(s) of the LLM.
  kNonColocated,
};
std::string_view to_string(Placement p);  // "homogeneous", "colocated", "non_colocated"

/// The layout of one encoder (with the projector it feeds) under a heterogeneous placement.
/// Its micro_batch counts samples, a multiple of the LLM's (the encoder micro-batch scale).
struct ModulePlan {
  std::string module;  // the encoder's module name; its projector goes with it
  Layout layout;
  int first_rank = 0;  // non-colocated: the first rank of its range
  bool operator==(const ModulePlan&) const = default;
};

struct Plan {
  Layout layout;  // the LLM's (and, homogeneous, every module's)
  Schedule schedule = Schedule::k1F1B;
  Placement placement = Placement::kHomogeneous;
  int llm_first_rank = 0;           // non-colocated: the first rank of the LLM's range
  std::vector<ModulePlan> modules;  // colocated / non-colocated: one per encoder
  bool operator==(const Plan&) const = default;
};

/// Micro-batches per iteration per DP replica: global_batch / (dp * micro_batch).
int64_t num_micro_batches(const Layout& l, int64_t global_batch);

}  // namespace hetpar::planner

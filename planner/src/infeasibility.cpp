// Why a plan cannot run: the checks infeasibility() applies before lowering (lower.h), each
// naming the field and the rule, from the layouts' divisibility rules to the trainers'
// limits (DeepEP's group sizes, FSDP's variants, the tensor sizes counters can hold).
#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "hetpar/planner/boundary.h"
#include "hetpar/planner/deepep.h"
#include "hetpar/planner/lower.h"
#include "hetpar/planner/memory.h"
#include "hetpar/planner/schedule.h"

namespace hetpar::planner {

namespace {

std::string check_module(const models::TransformerSpec& t, std::string_view name, const Layout& l) {
  if (t.heads % l.tp != 0)
    return fmt::format("tp {} does not divide {} heads {}", l.tp, name, t.heads);
  if (t.kv_heads % l.tp != 0)
    return fmt::format("tp {} does not divide {} kv_heads {}", l.tp, name, t.kv_heads);
  if (t.ffn_hidden % l.tp != 0)
    return fmt::format("tp {} does not divide {} ffn_hidden {}", l.tp, name, t.ffn_hidden);
  if (l.recompute == models::Recompute::kSelectiveOp && l.tp > 1)
    return fmt::format(
        "recompute selective_op with tp {} ({}) is not modelled: re-running the output "
        "projection would re-run its TP collective",
        l.tp, name);
  return {};
}

// The attention kernel a layout names: rates in every node group's profile, flash attention.
// `who` names the layout in the message ("" for the LLM's).
std::string attention_kernel_infeasibility(const Scenario& s, const Layout& l,
                                           std::string_view who) {
  if (l.attention_kernel == hardware::AttentionKernel::kDefault) return {};
  const std::string_view kernel = hardware::to_string(l.attention_kernel);
  if (!l.flash_attention)
    return fmt::format("{}attention_kernel {} needs flash_attention", who, kernel);
  for (const hardware::NodeGroup& g : s.cluster.groups())
    if (!g.profile.gpu.has_attention_kernel(l.attention_kernel))
      return fmt::format("{}attention_kernel {}: profile {} has no rates for it (gpu.attention)",
                         who, kernel, g.profile.name);
  return {};
}

bool power_of_two_tp(int tp) {
  return tp == 1 || tp == 2 || tp == 4 || tp == 8;
}

// How a layout shards its parameters, for messages.
std::string fsdp_setting(const Layout& l) {
  if (!l.fsdp) return "off";
  return fmt::format("on ({}{}{})", l.torch_fsdp2() ? "torch_fsdp2, " : "",
                     l.fsdp_reshard_after_forward ? "resharded after the forward" : "kept gathered",
                     l.fsdp_root_unit ? ", root unit" : "");
}

// Whether two layouts shard their parameters alike (fsdp_setting's fields).
bool same_sharding(const Layout& a, const Layout& b) {
  if (a.fsdp != b.fsdp) return false;
  return !a.fsdp ||
         (a.fsdp_reshard_after_forward == b.fsdp_reshard_after_forward &&
          a.fsdp_implementation == b.fsdp_implementation && a.fsdp_root_unit == b.fsdp_root_unit);
}

// The FSDP variant fields against fsdp itself; `who` prefixes the message.
std::string fsdp_infeasibility(const Layout& l, std::string_view who) {
  if (!l.fsdp && l.fsdp_implementation != FsdpImplementation::kMegatron)
    return fmt::format("{}fsdp_implementation {} needs fsdp", who,
                       to_string(l.fsdp_implementation));
  if (l.torch_fsdp2() && l.gradient_accumulation_fusion)
    return fmt::format(
        "{}gradient_accumulation_fusion with torch FSDP2: there is no fp32 main_grad to add "
        "into (FSDP2 writes each gradient in the parameter dtype); set it false",
        who);
  if (l.fsdp_root_unit && !l.torch_fsdp2())
    return fmt::format(
        "{}fsdp_root_unit needs fsdp with fsdp_implementation torch_fsdp2 (it is FSDP2's root "
        "unit)",
        who);
  return {};
}

// The checks of a colocated / non-colocated plan beyond the LLM's own layout.
std::string heterogeneous_infeasibility(const Scenario& s, const Plan& p) {
  const Layout& l = p.layout;
  const int gpus = s.cluster.total_gpus();
  const bool colocated = p.placement == Placement::kColocated;
  const std::string_view where = to_string(p.placement);
  if (!power_of_two_tp(l.tp))
    return fmt::format("{} placement: llm tp {} must be 1, 2, 4 or 8 (Megatron's MIMO path)", where,
                       l.tp);
  if (!colocated && l.cp > 1)
    return fmt::format(
        "non-colocated placement: llm cp {} > 1 is not supported at the encoder boundary", l.cp);
  if (!colocated && p.llm_first_rank % l.tp != 0)
    return fmt::format("non-colocated placement: llm_first_rank {} is not a multiple of llm tp {}",
                       p.llm_first_rank, l.tp);
  std::vector<std::pair<int, int>> ranges;  // [first, end) per module, llm last
  std::vector<bool> planned(s.model.modules.size(), false);
  for (size_t k = 0; k < p.modules.size(); ++k) {
    const ModulePlan& mp = p.modules[k];
    const Layout& e = mp.layout;
    const std::optional<size_t> idx = s.model.find(mp.module);
    if (!idx)
      return fmt::format("plan.modules[{}]: no module named \"{}\" in the model", k, mp.module);
    const models::ModuleSpec& spec = s.model.modules[*idx].spec;
    if (!models::is_encoder(models::kind_of(spec)))
      return fmt::format("plan.modules[{}]: module \"{}\" is a {}, not an encoder", k, mp.module,
                         models::to_string(models::kind_of(spec)));
    if (planned[*idx])
      return fmt::format("plan.modules[{}]: module \"{}\" is planned twice", k, mp.module);
    planned[*idx] = true;
    if (e.tp < 1 || e.dp < 1 || e.pp < 1 || e.cp < 1 || e.micro_batch < 1)
      return fmt::format(
          "module \"{}\": parallel sizes must be >= 1 (tp {}, cp {}, pp {}, dp {}, "
          "micro_batch {})",
          mp.module, e.tp, e.cp, e.pp, e.dp, e.micro_batch);
    if (e.cp != 1)
      return fmt::format("module \"{}\": cp {} must be 1 for an encoder", mp.module, e.cp);
    if (e.pp != 1 && colocated)
      return fmt::format(
          "module \"{}\": pp {} > 1 for a colocated encoder (colocated encoders keep pp 1 and "
          "run on every GPU; non-colocated encoders may be pipelined)",
          mp.module, e.pp);
    if (e.pp > 1 && models::transformer_of(spec)->layers < e.pp)
      return fmt::format("module \"{}\": pp {} exceeds its {} layers", mp.module, e.pp,
                         models::transformer_of(spec)->layers);
    if (e.vpp != 1 || e.ep != 1)
      return fmt::format("module \"{}\": vpp {} and ep {} must be 1 for an encoder", mp.module,
                         e.vpp, e.ep);
    if (e.microbatch_group != 0)
      return fmt::format(
          "module \"{}\": microbatch_group {} needs the interleaved schedule, "
          "which an encoder does not run",
          mp.module, e.microbatch_group);
    if (e.moe_dispatcher != MoeDispatcher::kAllToAll)
      return fmt::format("module \"{}\": moe_dispatcher {} needs a mixture-of-experts llm",
                         mp.module, to_string(e.moe_dispatcher));
    if (!power_of_two_tp(e.tp))
      return fmt::format("module \"{}\": tp {} must be 1, 2, 4 or 8 (Megatron's MIMO path)",
                         mp.module, e.tp);
    if (!e.pipeline_layout.empty())
      return fmt::format(
          "module \"{}\": pipeline_layout places the llm's layers; an encoder's split evenly",
          mp.module);
    if (e.sequence_parallel && e.tp == 1)
      return fmt::format("module \"{}\": sequence parallelism needs tp > 1", mp.module);
    if (e.tp_comm_overlap && !e.sequence_parallel)
      return fmt::format(
          "module \"{}\": tp_comm_overlap needs tp > 1 with sequence parallelism (sp)", mp.module);
    if (e.ep_comm_overlap)
      return fmt::format("module \"{}\": ep_comm_overlap needs ep > 1, and an encoder has ep 1",
                         mp.module);
    if (e.moe_shared_expert_overlap)
      return fmt::format(
          "module \"{}\": moe_shared_expert_overlap needs shared experts, and an encoder has none",
          mp.module);
    for (const hardware::NodeGroup& g : s.cluster.groups())
      if (g.profile.gpus_per_node % e.tp != 0)
        return fmt::format("module \"{}\": tp {} does not fit nodes of {} GPUs", mp.module, e.tp,
                           g.profile.gpus_per_node);
    if (std::string why = check_module(*models::transformer_of(spec), mp.module, e); !why.empty())
      return why;
    if (std::string why =
            attention_kernel_infeasibility(s, e, fmt::format("module \"{}\": ", mp.module));
        !why.empty())
      return why;
    for (const models::Edge& ed : s.model.edges)
      if (ed.from == *idx &&
          models::kind_of(s.model.modules[ed.to].spec) == models::ModuleKind::kProjector) {
        if (const models::TransformerSpec* t =
                models::transformer_of(s.model.modules[ed.to].spec)) {
          if (std::string why = check_module(*t, s.model.modules[ed.to].name, e); !why.empty())
            return why;
        }
      }
    // One memory model per rank (memory.cpp merges a colocated encoder's tallies into the
    // LLM's ranks and holds them as the LLM's layout does): one FSDP setting for both.
    if (std::string why = fsdp_infeasibility(e, fmt::format("module \"{}\": ", mp.module));
        !why.empty())
      return why;
    if (colocated && !same_sharding(e, l))
      return fmt::format(
          "module \"{}\": fsdp {} differs from the llm's {}: a colocated encoder shares the "
          "LLM's ranks and must shard its parameters as the LLM does",
          mp.module, fsdp_setting(e), fsdp_setting(l));
    if (colocated && e.tp * e.dp != gpus)
      return fmt::format(
          "colocated placement: module \"{}\" tp {} x dp {} = {} GPUs, must span the world of {}",
          mp.module, e.tp, e.dp, e.tp * e.dp, gpus);
    if (!colocated && mp.first_rank % e.tp != 0)
      return fmt::format("module \"{}\": first_rank {} is not a multiple of its tp {}", mp.module,
                         mp.first_rank, e.tp);
    if (std::string why = boundary_infeasibility(s, p, mp); !why.empty()) return why;
    ranges.emplace_back(mp.first_rank, mp.first_rank + e.world());
  }
  for (size_t i = 0; i < s.model.modules.size(); ++i)
    if (models::is_encoder(models::kind_of(s.model.modules[i].spec)) && !planned[i] &&
        module_input(s, i, 1).items_per_sample >= 1)
      return fmt::format("{} placement: encoder \"{}\" has no entry in plan.modules", where,
                         s.model.modules[i].name);
  if (colocated) return {};
  ranges.emplace_back(p.llm_first_rank, p.llm_first_rank + l.world());
  auto name = [&](size_t k) {
    return k < p.modules.size() ? fmt::format("plan.modules[{}] (\"{}\", first_rank {})", k,
                                              p.modules[k].module, p.modules[k].first_rank)
                                : fmt::format("the llm (llm_first_rank {})", p.llm_first_rank);
  };
  int covered = 0;
  for (size_t a = 0; a < ranges.size(); ++a) {
    if (ranges[a].first < 0 || ranges[a].second > gpus)
      return fmt::format("non-colocated placement: {} ranks [{}, {}) fall outside the {} GPUs",
                         name(a), ranges[a].first, ranges[a].second, gpus);
    covered += ranges[a].second - ranges[a].first;
    for (size_t b = 0; b < a; ++b)
      if (ranges[a].first < ranges[b].second && ranges[b].first < ranges[a].second)
        return fmt::format("non-colocated placement: {} ranks [{}, {}) overlap {} ranks [{}, {})",
                           name(a), ranges[a].first, ranges[a].second, name(b), ranges[b].first,
                           ranges[b].second);
  }
  if (covered != gpus)
    return fmt::format(
        "non-colocated placement: modules and llm cover {} of the {} GPUs; their rank ranges "
        "(first_rank, llm_first_rank and each world tp x cp x pp x dp) must tile the cluster",
        covered, gpus);
  return {};
}

// The gradient buffer's dtype against the training precision: Megatron keeps a 16-bit
// buffer in the weights' dtype (bf16 for bf16 / fp8 training, fp16 for fp16), and fp32
// training has fp32 gradients.
std::string grad_reduce_dtype_infeasibility(const Layout& l, hardware::Precision p) {
  const GradReduceDtype d = l.grad_reduce_dtype;
  const bool fp32 = p == hardware::Precision::kFp32 || p == hardware::Precision::kTf32;
  const bool bf16 = p == hardware::Precision::kBf16 || p == hardware::Precision::kFp8;
  if ((d == GradReduceDtype::kBf16 && !bf16) || (d == GradReduceDtype::kFp16 && (fp32 || bf16)))
    return fmt::format(
        "grad_reduce_dtype {} with workload precision {}: a 16-bit gradient buffer has the "
        "weights' dtype ({})",
        to_string(d), hardware::to_string(p),
        fp32   ? "fp32 here"
        : bf16 ? "bf16"
               : "fp16");
  return {};
}

// The largest tensor one micro-batch of any module makes, against kMaxTensorElements: tokens
// times the widest per-token width (hidden, the MLP's, the routed experts' top_k x width,
// Q/K/V, the vocabulary; a projector's input after downsampling), and without a fused
// attention kernel the scores (heads x sequence^2 per item). Counted in double: the op
// graphs count bytes in int64, which sizes each within their bounds can pass together.
std::string tensor_size_infeasibility(const Scenario& s, const Plan& p) {
  auto layout_of = [&](size_t i) -> const Layout& {
    std::string name = s.model.modules[i].name;
    for (const models::Edge& e : s.model.edges)  // a projector goes with its encoder
      if (e.to == i && models::kind_of(s.model.modules[i].spec) == models::ModuleKind::kProjector)
        name = s.model.modules[e.from].name;
    for (const ModulePlan& mp : p.modules)
      if (mp.module == name) return mp.layout;
    return p.layout;
  };
  for (size_t i = 0; i < s.model.modules.size(); ++i) {
    const Layout& l = layout_of(i);
    const models::ModuleInput in = module_input(s, i, l.micro_batch);
    const models::ModuleSpec& spec = s.model.modules[i].spec;
    auto d = [](int64_t v) { return static_cast<double>(v); };
    double per_item = d(in.seq_len), width = 0, scores = 0;
    if (const auto* proj = std::get_if<models::ProjectorSpec>(&spec)) {
      width = std::max({d(proj->input_hidden) * d(proj->downsample * proj->downsample),
                        d(proj->ffn_hidden), d(proj->output_hidden)});
    } else {
      const models::TransformerSpec& t = *models::transformer_of(spec);
      if (const auto* v = std::get_if<models::VisionEncoderSpec>(&spec)) per_item = d(v->seq_len());
      if (const auto* a = std::get_if<models::AudioEncoderSpec>(&spec))
        per_item = d(a->frames), width = d(a->mel_bins);
      width = std::max(
          {width, d(t.hidden), d(t.ffn_hidden), d(t.head_dim() * (t.heads + 2 * t.kv_heads))});
      if (const auto* llm = std::get_if<models::LlmSpec>(&spec)) {
        width = std::max(width, d(llm->vocab));
        if (llm->moe) width = std::max(width, d(llm->moe->top_k * llm->moe->expert_ffn_hidden));
      }
      if (!l.flash_attention) scores = d(t.heads) * per_item * per_item;
    }
    const bool by_scores = scores > per_item * width;
    const double elements =
        d(l.micro_batch) * d(in.items_per_sample) * (by_scores ? scores : per_item * width);
    if (elements > static_cast<double>(kMaxTensorElements))
      return fmt::format(
          "out of memory: one micro-batch of module \"{}\" (micro_batch {}) makes a tensor of "
          "about {:.3g} elements ({}), over {:.3g} (4 TiB in fp32), more than any GPU holds",
          s.model.modules[i].name, l.micro_batch, elements,
          by_scores ? "attention scores: heads x sequence^2, no flash_attention" : "tokens x width",
          static_cast<double>(kMaxTensorElements));
  }
  return {};
}

}  // namespace

bool heads_split(const models::TransformerSpec& block, int tp, int ranks) {
  const int64_t over = int64_t{tp} * ranks;
  return block.heads % over == 0 && (block.mla ? block.heads : block.kv_heads) % over == 0;
}

std::string infeasibility(const Scenario& s, const Plan& p) {
  const Layout& l = p.layout;
  if (l.tp < 1 || l.cp < 1 || l.pp < 1 || l.vpp < 1 || l.dp < 1 || l.ep < 1 || l.micro_batch < 1)
    return fmt::format(
        "parallel sizes must be >= 1 (tp {}, cp {}, pp {}, vpp {}, dp {}, ep {}, "
        "micro_batch {})",
        l.tp, l.cp, l.pp, l.vpp, l.dp, l.ep, l.micro_batch);
  const int gpus = s.cluster.total_gpus();
  const bool hetero = p.placement != Placement::kHomogeneous;
  if (p.placement != Placement::kNonColocated && l.world() != gpus)
    return fmt::format("tp {} x cp {} x pp {} x dp {} = {} GPUs, the cluster has {}", l.tp, l.cp,
                       l.pp, l.dp, l.world(), gpus);
  for (const hardware::NodeGroup& g : s.cluster.groups()) {
    // A TP group is part of a node or whole nodes (cross-node TP: its collectives then
    // cross the scale-out network, which the simulator prices; the search enumerates it
    // only with search.allow_cross_node_tp).
    if (g.profile.gpus_per_node % l.tp != 0 && l.tp % g.profile.gpus_per_node != 0)
      return fmt::format(
          "tp {} does not fit nodes of {} GPUs ({}): a TP group must be part of a node or "
          "whole nodes",
          l.tp, g.profile.gpus_per_node, g.profile.name);
    if (!g.profile.gpu.supports(s.workload.precision))
      return fmt::format("{} does not support {}", g.profile.gpu.model,
                         hardware::to_string(s.workload.precision));
  }
  if (std::string why = attention_kernel_infeasibility(s, l, ""); !why.empty()) return why;
  if (std::string why = fsdp_infeasibility(l, ""); !why.empty()) return why;
  if (l.sequence_parallel && l.tp == 1) return "sequence parallelism needs tp > 1";
  if (l.tp_comm_overlap && !l.sequence_parallel)
    return "tp_comm_overlap needs tp > 1 with sequence parallelism (sp): userbuffers overlap the "
           "SP all-gathers and reduce-scatters with the GEMMs";
  if (l.defer_embedding_wgrad && (l.pp == 1 || !l.gradient_accumulation_fusion))
    return "defer_embedding_wgrad needs pp > 1 and gradient_accumulation_fusion (Megatron-Core "
           "defers the output layer's wgrad to the pipeline's flush, into the fused main_grad)";
  if (l.defer_embedding_wgrad &&
      (l.tp == 1 || !l.tp_backward_overlap || l.fsdp || splits_weight_gradient(p.schedule)))
    return "defer_embedding_wgrad is modelled with tp > 1, tp_backward_overlap, no fsdp and a "
           "schedule without a split weight gradient (the output layer's wgrad a task of its "
           "own)";
  const auto& llm = std::get<models::LlmSpec>(s.model.modules[s.model.llm_index()].spec);
  for (const models::Module& m : s.model.modules) {
    if (hetero && !std::holds_alternative<models::LlmSpec>(m.spec)) continue;
    if (const models::TransformerSpec* t = models::transformer_of(m.spec)) {
      std::string why = check_module(*t, m.name, l);
      if (!why.empty()) return why;
    }
  }
  if (l.etp < 0 || (l.etp > 0 && l.etp != 1 && l.etp != l.tp))
    return fmt::format("etp {} must be 1 or tp {} (other expert TP widths are not modelled)", l.etp,
                       l.tp);
  if (l.expert_tp() != l.tp && !llm.moe)
    return fmt::format("etp {} needs a mixture-of-experts llm", l.etp);
  if (l.recompute == models::Recompute::kSelectiveOp && llm.moe)
    return "recompute selective_op with a mixture-of-experts llm is not modelled: its "
           "grouped expert matmuls fall outside the per-block mm count";
  if (l.recompute == models::Recompute::kSelective && !llm.moe &&
      (l.recompute_modules &
       (models::kRecomputeLayernorm | models::kRecomputeMoeAct | models::kRecomputeMoe)) != 0)
    return fmt::format(
        "recompute_modules {} needs a mixture-of-experts llm (layernorm re-runs a MoE layer's "
        "pre-MLP norm, Transformer Engine fuses a dense layer's; moe_act the experts' "
        "activation; moe the whole MoE layer)",
        recompute_modules_names(l.recompute_modules));
  if (l.recompute_policy().selects(models::kRecomputeSharedExperts) &&
      (!llm.moe || llm.moe->shared_experts == 0))
    return "recompute_modules shared_experts needs a mixture-of-experts llm with shared experts "
           "(moe.shared_experts)";
  if (l.recompute_policy().selects(models::kRecomputeMlp) && llm.moe &&
      llm.moe->dense_layer_count(llm.block.layers) == 0)
    return "recompute_modules mlp needs dense MLP layers (a dense llm, or moe.dense_layers or a "
           "0 in moe.layer_pattern): "
           "Megatron-Core re-runs only dense MLPs with it (a MoE layer's is the \"moe\" module)";
  if (l.recompute_policy().selects(models::kRecomputeMlaUpProj) && !llm.block.mla)
    return "recompute_modules mla_up_proj needs an llm with multi-head latent attention (mla)";
  // Transformer Engine takes a learnable softmax offset in cuDNN's fused attention (or its
  // unfused one), never in FlashAttention, and under CP only with its a2a communication.
  if (llm.block.attention_sinks && (l.attention_kernel == hardware::AttentionKernel::kFlash2 ||
                                    l.attention_kernel == hardware::AttentionKernel::kFlash3))
    return fmt::format(
        "attention_kernel {} with attention_sinks: FlashAttention has no learnable "
        "softmax offset (Transformer Engine runs it in cuDNN's fused attention)",
        hardware::to_string(l.attention_kernel));
  if (llm.block.attention_sinks && l.cp > 1 && l.cp_comm != CpComm::kA2A)
    return fmt::format(
        "cp {} with attention_sinks needs cp_comm a2a, not {}: Transformer Engine takes a "
        "learnable softmax offset under CP only with its a2a communication",
        l.cp, to_string(l.cp_comm));
  // Transformer Engine's ring (AttnFuncWithCPAndKVP2P, also a2a+p2p's) refuses a window;
  // its all_gather path calls each chunk against the keys of its window, and a2a runs each
  // head's attention over the whole sequence, the window as without CP.
  if (llm.block.sliding_window && l.cp > 1 && l.cp_comm != CpComm::kA2A &&
      l.cp_comm != CpComm::kAllGather)
    return fmt::format(
        "cp {} with sliding_window needs cp_comm a2a or all_gather, not {}: Transformer "
        "Engine's p2p ring refuses a window",
        l.cp, to_string(l.cp_comm));
  // Megatron-Core's TransformerConfig refuses it: the MoE layer's re-run dispatches again,
  // which the overlap's split schedule of that layer cannot hold.
  if (l.recompute_policy().selects(models::kRecomputeMoe) && l.ep_comm_overlap)
    return "recompute_modules moe with ep_comm_overlap: Megatron-Core refuses the MoE layer's "
           "recompute beside the EP all-to-all overlap";
  if (l.moe_shared_expert_overlap) {  // Megatron-Core's TransformerConfig checks
    if (!llm.moe || llm.moe->shared_experts == 0)
      return "moe_shared_expert_overlap needs a mixture-of-experts llm with shared experts "
             "(moe.shared_experts)";
    if (l.ep_comm_overlap)
      return "moe_shared_expert_overlap with ep_comm_overlap: Megatron-Core refuses the "
             "shared-expert overlap beside the EP all-to-all overlap";
    // MoELayer checkpoints the shared experts only where they are not overlapped.
    if (l.recompute_policy().checkpoints_shared_experts())
      return "recompute_modules shared_experts with moe_shared_expert_overlap: Megatron-Core "
             "checkpoints the shared experts only when they are not overlapped";
  }
  if (l.moe_capacity_factor > 0 && !llm.moe)
    return fmt::format("moe_capacity_factor {} needs a mixture-of-experts llm",
                       l.moe_capacity_factor);
  if (l.moe_load_imbalance > 1 && !llm.moe)
    return fmt::format("moe_load_imbalance {} needs a mixture-of-experts llm",
                       l.moe_load_imbalance);
  if (l.moe_load_imbalance > 1 && l.moe_capacity_factor > 0)
    return fmt::format(
        "moe_load_imbalance {} with moe_capacity_factor {}: token dropping pads every expert to "
        "its capacity, so no rank is hotter than another; drop one of the two",
        l.moe_load_imbalance, l.moe_capacity_factor);
  if (l.flex_dispatcher()) {
    const std::string_view name = to_string(l.moe_dispatcher);
    if (!llm.moe || l.ep < 2)
      return fmt::format(
          "moe_dispatcher {} needs a mixture-of-experts llm with ep > 1 (Megatron-Core's flex "
          "dispatcher requires EP > 1)",
          name);
    if (l.expert_tp() != 1)
      return fmt::format(
          "moe_dispatcher {} with expert tensor parallelism {} is not modelled (the flex "
          "dispatcher then spans TP x EP); set etp 1",
          name, l.expert_tp());
    // HybridEP takes token dropping (its drop-and-pad mode: static sizes, no sync); DeepEP
    // does not.
    if (l.moe_dispatcher == MoeDispatcher::kDeepEp && l.moe_capacity_factor > 0)
      return fmt::format(
          "moe_dispatcher deepep with moe_capacity_factor {}: Megatron-Core's flex dispatcher "
          "with DeepEP does not support --moe-pad-expert-input-to-capacity",
          l.moe_capacity_factor);
    if (l.moe_dispatcher == MoeDispatcher::kDeepEp && !deepep_supports(l.ep))
      return fmt::format(
          "moe_dispatcher deepep with ep {}: DeepEP configures EP groups of 2, 4, 8, 16, 24, "
          "32, 64, 128, 144 or 160 ranks only (Buffer.get_dispatch_config)",
          l.ep);
    // With etp 1 an EP group is ep consecutive ranks of a stage. Across nodes both pair each
    // GPU with the GPUs of its local index on the other nodes, NVLink reaching
    // kDeepEpNvlPeers of them (DeepEP's NUM_MAX_NVL_PEERS; HybridEP's ranks per NVLink
    // domain, one DGX): a group that leaves its node must take whole nodes of that many GPUs.
    const int first = p.placement == Placement::kNonColocated ? p.llm_first_rank : 0;
    const int stage_ranks = l.tp * l.cp * l.dp;
    for (int st = 0; st < l.pp; ++st)
      for (int r0 = first + st * stage_ranks; r0 < first + (st + 1) * stage_ranks; r0 += l.ep) {
        const int r1 = r0 + l.ep - 1;
        if (r1 >= s.cluster.total_gpus()) break;  // the world's size is checked elsewhere
        if (s.cluster.node_of_gpu(r0) == s.cluster.node_of_gpu(r1)) continue;
        constexpr int gpn = kDeepEpNvlPeers;
        bool whole = s.cluster.local_index(r0) == 0 && l.ep % gpn == 0;
        for (int r = r0; whole && r <= r1; r += gpn) whole = s.cluster.gpus_per_node_of(r) == gpn;
        if (!whole)
          return fmt::format(
              "moe_dispatcher {}: the EP group of ranks {}-{} spans nodes without taking "
              "whole nodes of {} GPUs (it pairs each GPU with those of its local index on "
              "the other nodes, {} NVLink peers per node)",
              name, r0, r1, gpn, gpn);
      }
  }
  if (l.expert_tp() != l.tp && !l.sequence_parallel)
    return fmt::format(
        "etp {} with tp {} needs sequence parallelism (sp): whole experts run "
        "on each rank's own sequence slice",
        l.etp, l.tp);
  if (llm.moe && llm.moe->expert_ffn_hidden % l.expert_tp() != 0)
    return fmt::format("{} {} does not divide expert_ffn_hidden {}", l.etp > 0 ? "etp" : "tp",
                       l.expert_tp(), llm.moe->expert_ffn_hidden);
  if (l.first_stage_layers < 0 || l.last_stage_layers < 0)
    return fmt::format("first_stage_layers {} and last_stage_layers {} must be >= 0",
                       l.first_stage_layers, l.last_stage_layers);
  if (std::string why; layers_per_virtual_stage(l, llm.block.layers, &why).empty()) return why;
  const int64_t gb = s.workload.global_batch;
  if (gb % (static_cast<int64_t>(l.micro_batch) * l.dp) != 0)
    return fmt::format("micro_batch {} x dp {} does not divide global_batch {}", l.micro_batch,
                       l.dp, gb);
  const int64_t m = gb / (static_cast<int64_t>(l.micro_batch) * l.dp);
  if (p.schedule == Schedule::kInterleaved) {
    if (l.vpp < 2) return "the interleaved schedule needs vpp > 1";
    if (l.pp < 2) return "the interleaved schedule needs pp > 1";
    if (l.microbatch_group == 0 && m % l.pp != 0)
      return fmt::format(
          "interleaved schedule: {} micro-batches per replica not divisible by pp {}", m, l.pp);
    const int64_t g = l.microbatch_group;
    if (g > 0 && g < l.pp)
      return fmt::format("microbatch_group {} must be at least pp {}", g, l.pp);
    if (g > m)
      return fmt::format("microbatch_group {} exceeds the {} micro-batches per replica", g, m);
    if (g > 0 && m % g != 0 && m % g < l.pp)
      return fmt::format(
          "microbatch_group {}: the last group's {} micro-batches ({} % {}) must be none or at "
          "least pp {}, as Megatron-Core checks",
          g, m % g, m, g, l.pp);
  } else if (l.vpp > 1) {
    return fmt::format("vpp {} needs the interleaved schedule", l.vpp);
  } else if (l.microbatch_group > 0) {
    return fmt::format("microbatch_group {} needs the interleaved schedule", l.microbatch_group);
  }
  if (l.fp8_recipe != Fp8Recipe::kDelayed && s.workload.precision != hardware::Precision::kFp8)
    return fmt::format("fp8_recipe {} needs workload precision fp8, not {}",
                       to_string(l.fp8_recipe), hardware::to_string(s.workload.precision));
  if (l.fp8_param_gather && s.workload.precision != hardware::Precision::kFp8)
    return fmt::format("fp8_param_gather needs workload precision fp8, not {}",
                       hardware::to_string(s.workload.precision));
  if (std::string why = grad_reduce_dtype_infeasibility(l, s.workload.precision); !why.empty())
    return why;
  if (l.nccl_ub && l.torch_fsdp2())
    return "nccl_ub registers Megatron's data-parallel and Megatron-FSDP buffers with NCCL; "
           "torch FSDP2 (fsdp_implementation torch_fsdp2) has none";
  if (l.cp_comm != CpComm::kP2P && l.cp == 1)
    return fmt::format("cp_comm {} needs cp > 1", to_string(l.cp_comm));
  if (l.cp_a2a != 0 && l.cp_comm != CpComm::kA2AP2P)
    return fmt::format("cp_a2a {} needs cp_comm a2a+p2p, not {}", l.cp_a2a, to_string(l.cp_comm));
  if (l.cp > 1 && l.cp_comm == CpComm::kA2AP2P &&
      (l.cp_a2a < 2 || l.cp_a2a >= l.cp || l.cp % l.cp_a2a != 0))
    return fmt::format(
        "cp_comm a2a+p2p needs cp_a2a, the ranks of its a2a level: a divisor of cp {} "
        "between 2 and cp / 2 (Megatron's --hierarchical-context-parallel-sizes cp_a2a "
        "cp/cp_a2a), not {}",
        l.cp, l.cp_a2a);
  if (l.cp > 1 && l.cp_heads_split() > 1) {
    // Transformer Engine's all-to-alls split each TP rank's query and key / value heads over
    // the ranks of the a2a level, in its fused or flash attention only.
    const int split = l.cp_heads_split();
    const std::string level =
        l.cp_comm == CpComm::kA2A ? fmt::format("cp {}", l.cp) : fmt::format("cp_a2a {}", split);
    if (!heads_split(llm.block, l.tp, split))
      return fmt::format(
          "cp_comm {}: the {} query and {} key/value heads per tp rank (tp {}) must each "
          "divide by {}",
          to_string(l.cp_comm), llm.block.heads / l.tp,
          (llm.block.mla ? llm.block.heads : llm.block.kv_heads) / l.tp, l.tp, level);
    if (!l.flash_attention)
      return fmt::format(
          "cp_comm {} needs flash_attention (Transformer Engine runs context parallelism in "
          "its fused or flash attention only)",
          to_string(l.cp_comm));
  }
  const int64_t seq = s.workload.seq_len;
  if (l.cp > 1 && seq % (2 * l.cp) != 0)
    return fmt::format("seq_len {} not divisible by 2 x cp {}", seq, l.cp);
  if (l.sequence_parallel && (seq / l.cp) % l.tp != 0)
    return fmt::format("sequence parallel: {} tokens per cp rank not divisible by tp {}",
                       seq / l.cp, l.tp);
  if (l.ep > 1) {
    if (!llm.moe) return fmt::format("ep {} needs a mixture-of-experts llm", l.ep);
    if (llm.moe->experts % l.ep != 0)
      return fmt::format("ep {} does not divide experts {}", l.ep, llm.moe->experts);
    if (l.expert_ranks() % l.ep != 0)
      return l.expert_tp() == l.tp
                 ? fmt::format("ep {} does not divide dp {} x cp {}", l.ep, l.dp, l.cp)
                 : fmt::format("ep {} does not divide tp {} / etp {} x dp {} x cp {}", l.ep, l.tp,
                               l.expert_tp(), l.dp, l.cp);
    if (l.tp > 1 && !l.sequence_parallel)  // Megatron-Core's TransformerConfig raises
      return fmt::format("ep {} with tp {} needs sequence parallelism (sp)", l.ep, l.tp);
  }
  if (l.ep_comm_overlap) {  // Megatron-Core's TransformerConfig checks, then what hetpar models
    if (l.ep < 2)
      return "ep_comm_overlap needs ep > 1: it overlaps the expert-parallel all-to-alls";
    if (!merges_passes(p.schedule, l.pp))
      return fmt::format(
          "ep_comm_overlap needs the interleaved schedule, or 1f1b with pp 1 (Megatron-Core "
          "merges forward and backward passes only there), not {} with pp {}",
          to_string(p.schedule), l.pp);
    // Megatron-Core recomputes a whole model chunk at its backward's start instead
    // (TransformerModelChunkSchedulePlan's recompute_vpp_stage); earlier versions refused it.
    if (l.recompute == models::Recompute::kFull && l.fsdp)
      return "ep_comm_overlap with recompute full and fsdp is not modelled: the chunk's "
             "re-run needs every layer's parameters gathered at once";
    if (p.placement == Placement::kColocated)
      return "ep_comm_overlap in a colocated placement is not modelled: the encoders' passes "
             "run between the LLM's on the same GPUs";
  }
  if (hetero) {
    if (std::string why = heterogeneous_infeasibility(s, p); !why.empty()) return why;
  }
  return tensor_size_infeasibility(s, p);
}

}  // namespace hetpar::planner

#include "hetpar/planner/layout.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace hetpar::planner {

std::string_view to_string(Schedule s) {
  switch (s) {
    case Schedule::kGpipe:
      return "gpipe";
    case Schedule::k1F1B:
      return "1f1b";
    case Schedule::kInterleaved:
      return "interleaved";
    case Schedule::kZeroBubble:
      return "zb-h1";
  }
  return "?";
}

std::string_view to_string(models::Recompute r) {
  switch (r) {
    case models::Recompute::kNone:
      return "none";
    case models::Recompute::kSelective:
      return "selective";
    case models::Recompute::kFull:
      return "full";
    case models::Recompute::kSelectiveOp:
      return "selective_op";
  }
  return "?";
}

namespace {
constexpr std::pair<models::RecomputeModule, std::string_view> kRecomputeModuleNames[] = {
    {models::kRecomputeCoreAttn, "core_attn"},
    {models::kRecomputeLayernorm, "layernorm"},
    {models::kRecomputeMoeAct, "moe_act"},
    {models::kRecomputeMoe, "moe"},
    {models::kRecomputeMlp, "mlp"},
    {models::kRecomputeSharedExperts, "shared_experts"},
    {models::kRecomputeMlaUpProj, "mla_up_proj"}};
}  // namespace

std::vector<std::string_view> recompute_module_names(uint8_t modules) {
  std::vector<std::string_view> out;
  for (auto [bit, name] : kRecomputeModuleNames)
    if (modules & bit) out.push_back(name);
  return out;
}

uint8_t recompute_module(std::string_view name) {
  for (auto [bit, n] : kRecomputeModuleNames)
    if (n == name) return bit;
  return 0;
}

std::string recompute_modules_names(uint8_t modules) {
  return fmt::format("{}", fmt::join(recompute_module_names(modules), ", "));
}

std::string_view to_string(Fp8Recipe r) {
  switch (r) {
    case Fp8Recipe::kDelayed:
      return "delayed";
    case Fp8Recipe::kTensorwise:
      return "tensorwise";
  }
  return "?";
}

std::string_view to_string(MoeDispatcher d) {
  switch (d) {
    case MoeDispatcher::kAllToAll:
      return "alltoall";
    case MoeDispatcher::kDeepEp:
      return "deepep";
    case MoeDispatcher::kHybridEp:
      return "hybridep";
  }
  return "?";
}

std::string_view display_name(MoeDispatcher d) {
  switch (d) {
    case MoeDispatcher::kAllToAll:
      return "all-to-all";
    case MoeDispatcher::kDeepEp:
      return "DeepEP";
    case MoeDispatcher::kHybridEp:
      return "HybridEP";
  }
  return "?";
}

std::string_view to_string(CrossEntropy c) {
  switch (c) {
    case CrossEntropy::kUnfused:
      return "none";
    case CrossEntropy::kNative:
      return "native";
    case CrossEntropy::kTe:
      return "te";
    case CrossEntropy::kCompiled:
      return "compiled";
  }
  return "?";
}

std::string_view to_string(FsdpImplementation f) {
  switch (f) {
    case FsdpImplementation::kMegatron:
      return "megatron_fsdp";
    case FsdpImplementation::kTorchFsdp2:
      return "torch_fsdp2";
  }
  return "?";
}

std::string_view to_string(GradReduceDtype d) {
  switch (d) {
    case GradReduceDtype::kDefault:
      return "default";
    case GradReduceDtype::kFp32:
      return "fp32";
    case GradReduceDtype::kBf16:
      return "bf16";
    case GradReduceDtype::kFp16:
      return "fp16";
  }
  return "?";
}

std::string_view to_string(CpComm c) {
  switch (c) {
    case CpComm::kP2P:
      return "p2p";
    case CpComm::kAllGather:
      return "all_gather";
    case CpComm::kA2A:
      return "a2a";
    case CpComm::kA2AP2P:
      return "a2a+p2p";
  }
  return "?";
}

std::string_view to_string(Placement p) {
  switch (p) {
    case Placement::kHomogeneous:
      return "homogeneous";
    case Placement::kColocated:
      return "colocated";
    case Placement::kNonColocated:
      return "non_colocated";
  }
  return "?";
}

int64_t num_micro_batches(const Layout& l, int64_t global_batch) {
  return global_batch / (static_cast<int64_t>(l.dp) * l.micro_batch);
}

std::string pipeline_layout_text(const Layout& l) {
  std::string out;
  for (size_t i = 0; i < l.pipeline_layout.size(); ++i)
    out += fmt::format("{}{}", i > 0 ? "|" : "", l.pipeline_layout[i]);
  return out;
}

std::string describe_in_words(const Layout& l, hardware::Precision workload) {
  std::string out = fmt::format("tp {}{} cp {}", l.tp, l.sequence_parallel ? " (sp)" : "", l.cp);
  if (l.cp > 1 && l.cp_comm == CpComm::kA2AP2P)
    out += fmt::format(" (a2a {} x p2p {})", l.cp_a2a, l.cp_ring());
  else if (l.cp > 1)
    out += fmt::format(" ({})", to_string(l.cp_comm));
  out += fmt::format(" pp {} vpp {} dp {}", l.pp, l.vpp, l.dp);
  if (l.microbatch_group > 0) out += fmt::format(" (micro-batch groups of {})", l.microbatch_group);
  if (l.ep > 1) out += fmt::format(" ep {}", l.ep);
  if (l.expert_tp() != l.tp) out += fmt::format(" etp {}", l.expert_tp());
  out += fmt::format(", micro-batch {}, recompute {}", l.micro_batch, to_string(l.recompute));
  if (l.names_recompute_modules())
    out += fmt::format(" ({})", recompute_modules_names(l.recompute_modules));
  out += ", ";
  if (l.fsdp) {
    out += l.fsdp_reshard_after_forward ? "fsdp (parameters gathered for forward and backward"
                                        : "fsdp (parameters kept from forward to backward";
    if (l.torch_fsdp2()) out += l.fsdp_root_unit ? "; torch fsdp2, root unit" : "; torch fsdp2";
    out += ")";
  } else
    out += l.distributed_optimizer ? "distributed optimizer on" : "distributed optimizer off";
  if (workload == hardware::Precision::kFp8)
    out += fmt::format(", fp8 recipe {}", to_string(l.fp8_recipe));
  if (l.grad_reduce_dtype != GradReduceDtype::kDefault)
    out += fmt::format(", {} gradients", to_string(l.grad_reduce_dtype));
  if (l.fp8_param_gather) out += ", fp8 parameters";
  if (l.nccl_ub) out += ", nccl user buffers";
  if (!l.gradient_accumulation_fusion) out += ", unfused gradient accumulation";
  if (l.tp_comm_overlap) out += ", userbuffers TP overlap";
  if (l.ep_comm_overlap) out += ", EP all-to-all overlap";
  if (l.moe_shared_expert_overlap) out += ", shared experts beside the all-to-alls";
  if (l.moe_capacity_factor > 0)
    out += fmt::format(", token dropping (capacity factor {})", l.moe_capacity_factor);
  if (l.moe_load_imbalance > 1)
    out += fmt::format(", hottest EP rank at {}x the mean load", l.moe_load_imbalance);
  if (l.moe_dispatcher != MoeDispatcher::kAllToAll)
    out += fmt::format(", {} dispatcher", to_string(l.moe_dispatcher));
  if (l.cross_entropy_fusion != CrossEntropy::kUnfused)
    out += fmt::format(", {} cross-entropy", to_string(l.cross_entropy_fusion));
  if (!l.fused_projections) out += ", separate projections";
  if (l.repeat_kv) out += ", repeat_kv";
  if (!l.fused_activation) out += ", unfused activation";
  if (!l.fused_rope) out += ", unfused RoPE";
  if (!l.align_grad_reduce) out += ", unaligned gradient reduction";
  if (l.defer_embedding_wgrad)
    out += l.wgrad_deferral_limit > 0
               ? fmt::format(", output-layer wgrad deferred ({} micro-batches)",
                             l.wgrad_deferral_limit)
               : ", output-layer wgrad deferred";
  if (!l.pipeline_layout.empty())
    out += (l.vpp > 1 ? ", layers per virtual stage " : ", layers per stage ") +
           pipeline_layout_text(l);
  if (!l.flash_attention)
    out += ", unfused attention";
  else if (l.attention_kernel != hardware::AttentionKernel::kDefault)
    out += fmt::format(", {} attention", hardware::to_string(l.attention_kernel));
  return out;
}

}  // namespace hetpar::planner

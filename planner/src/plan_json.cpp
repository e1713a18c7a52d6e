// Plan JSON: the "plan" section of a scenario file (schema: docs/scenario.md).
#include "hetpar/planner/plan_json.h"

#include "hetpar/core/json_reader.h"
#include "hetpar/hardware/cluster.h"

namespace hetpar::planner {

std::optional<Schedule> parse_schedule(std::string_view s) {
  for (Schedule sch :
       {Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved, Schedule::kZeroBubble})
    if (to_string(sch) == s) return sch;
  return std::nullopt;
}

std::optional<models::Recompute> parse_recompute(std::string_view s) {
  for (models::Recompute r : {models::Recompute::kNone, models::Recompute::kSelective,
                              models::Recompute::kFull, models::Recompute::kSelectiveOp})
    if (to_string(r) == s) return r;
  return std::nullopt;
}

std::optional<Placement> parse_placement(std::string_view s) {
  for (Placement p : {Placement::kHomogeneous, Placement::kColocated, Placement::kNonColocated})
    if (to_string(p) == s) return p;
  return std::nullopt;
}

std::optional<Fp8Recipe> parse_fp8_recipe(std::string_view s) {
  for (Fp8Recipe r : {Fp8Recipe::kDelayed, Fp8Recipe::kTensorwise})
    if (to_string(r) == s) return r;
  return std::nullopt;
}

std::optional<CpComm> parse_cp_comm(std::string_view s) {
  for (CpComm c : {CpComm::kP2P, CpComm::kAllGather, CpComm::kA2A, CpComm::kA2AP2P})
    if (to_string(c) == s) return c;
  return std::nullopt;
}

std::optional<CrossEntropy> parse_cross_entropy(std::string_view s) {
  for (CrossEntropy c :
       {CrossEntropy::kUnfused, CrossEntropy::kNative, CrossEntropy::kTe, CrossEntropy::kCompiled})
    if (to_string(c) == s) return c;
  return std::nullopt;
}

std::optional<MoeDispatcher> parse_moe_dispatcher(std::string_view s) {
  for (MoeDispatcher d :
       {MoeDispatcher::kAllToAll, MoeDispatcher::kDeepEp, MoeDispatcher::kHybridEp})
    if (to_string(d) == s) return d;
  return std::nullopt;
}

std::optional<FsdpImplementation> parse_fsdp_implementation(std::string_view s) {
  for (FsdpImplementation f : {FsdpImplementation::kMegatron, FsdpImplementation::kTorchFsdp2})
    if (to_string(f) == s) return f;
  return std::nullopt;
}

std::optional<GradReduceDtype> parse_grad_reduce_dtype(std::string_view s) {
  for (GradReduceDtype d : {GradReduceDtype::kDefault, GradReduceDtype::kFp32,
                            GradReduceDtype::kBf16, GradReduceDtype::kFp16})
    if (to_string(d) == s) return d;
  return std::nullopt;
}

std::optional<uint8_t> read_recompute_modules(JsonReader& r,
                                              std::optional<models::Recompute> kind) {
  if (!r.has("recompute_modules")) return std::nullopt;
  const nlohmann::json& modules = r.array("recompute_modules", false);
  if (kind != models::Recompute::kSelective)
    r.fail("recompute_modules", "needs \"recompute\": \"selective\"");
  else if (modules.empty())
    r.fail("recompute_modules",
           fmt::format("must name at least one of {}", recompute_modules_names(0xff)));
  uint8_t bits = 0;
  for (size_t i = 0; i < modules.size() && r.ok(); ++i) {
    const nlohmann::json& m = modules[i];
    const uint8_t bit = m.is_string() ? recompute_module(m.get<std::string>()) : 0;
    bits |= bit;
    if (bit == 0)
      r.fail("recompute_modules", fmt::format("element {}: {} is not one of {}", i, m.dump(),
                                              recompute_modules_names(0xff)));
  }
  return bits;
}

namespace {

// A layout uses at most the GPUs a cluster may hold; each degree alone as well.
constexpr int64_t kMaxDegree = hardware::kMaxClusterGpus;

// The layout fields shared by the LLM's plan and each module's; `micro_batch` required.
Layout parse_layout(JsonReader& r) {
  Layout l;
  l.tp = static_cast<int>(r.optional_int("tp", 1, 1, kMaxDegree));
  l.sequence_parallel = r.optional_bool("sp", false);
  l.cp = static_cast<int>(r.optional_int("cp", 1, 1, kMaxDegree));
  l.cp_comm =
      *parse_cp_comm(r.optional_enum("cp_comm", "p2p", {"p2p", "all_gather", "a2a", "a2a+p2p"}));
  l.cp_a2a = static_cast<int>(r.optional_int("cp_a2a", 0, 0, kMaxDegree));
  l.pp = static_cast<int>(r.optional_int("pp", 1, 1, kMaxDegree));
  l.vpp = static_cast<int>(r.optional_int("vpp", 1, 1, kMaxDegree));
  l.dp = static_cast<int>(r.optional_int("dp", 1, 1, kMaxDegree));
  l.ep = static_cast<int>(r.optional_int("ep", 1, 1, kMaxDegree));
  l.etp = static_cast<int>(r.optional_int("etp", 0, 0, kMaxDegree));
  l.micro_batch = static_cast<int>(r.required_int("micro_batch", 1, kMaxDegree));
  l.recompute = *parse_recompute(
      r.optional_enum("recompute", "none", {"none", "selective", "full", "selective_op"}));
  if (const std::optional<uint8_t> m = read_recompute_modules(r, l.recompute))
    l.recompute_modules = *m;
  l.distributed_optimizer = r.optional_bool("distributed_optimizer", false);
  l.fsdp = r.optional_bool("fsdp", false);
  l.fsdp_reshard_after_forward = r.optional_bool("fsdp_reshard_after_forward", true);
  l.fsdp_implementation = *parse_fsdp_implementation(
      r.optional_enum("fsdp_implementation", "megatron_fsdp", {"megatron_fsdp", "torch_fsdp2"}));
  l.fsdp_root_unit = r.optional_bool("fsdp_root_unit", false);
  l.overlap_grad_reduce = r.optional_bool("overlap_grad_reduce", true);
  l.overlap_param_gather = r.optional_bool("overlap_param_gather", true);
  l.align_grad_reduce = r.optional_bool("align_grad_reduce", true);
  l.flash_attention = r.optional_bool("flash_attention", true);
  l.attention_kernel = *hardware::parse_attention_kernel(
      r.optional_enum("attention_kernel", "default", {"default", "cudnn", "flash2", "flash3"}));
  l.fused_projections = r.optional_bool("fused_projections", true);
  l.repeat_kv = r.optional_bool("repeat_kv", false);
  l.fused_activation = r.optional_bool("fused_activation", true);
  l.fused_rope = r.optional_bool("fused_rope", true);
  l.tp_backward_overlap = r.optional_bool("tp_backward_overlap", true);
  l.pp_scatter_gather = r.optional_bool("pp_scatter_gather", false);
  l.pp_blocking_p2p = r.optional_bool("pp_blocking_p2p", false);
  l.microbatch_group = static_cast<int>(r.optional_int("microbatch_group", 0, 0, kMaxDegree));
  l.tp_comm_overlap = r.optional_bool("tp_comm_overlap", false);
  l.ep_comm_overlap = r.optional_bool("ep_comm_overlap", false);
  l.moe_shared_expert_overlap = r.optional_bool("moe_shared_expert_overlap", false);
  l.moe_capacity_factor = r.optional_double("moe_capacity_factor", 0, 0, 64);
  l.moe_load_imbalance = r.optional_double("moe_load_imbalance", 1, 1, 64);
  l.moe_dispatcher = *parse_moe_dispatcher(
      r.optional_enum("moe_dispatcher", "alltoall", {"alltoall", "deepep", "hybridep"}));
  l.fp8_recipe =
      *parse_fp8_recipe(r.optional_enum("fp8_recipe", "delayed", {"delayed", "tensorwise"}));
  l.fp8_param_gather = r.optional_bool("fp8_param_gather", false);
  l.nccl_ub = r.optional_bool("nccl_ub", false);
  l.gradient_accumulation_fusion = r.optional_bool("gradient_accumulation_fusion", true);
  l.defer_embedding_wgrad = r.optional_bool("defer_embedding_wgrad", false);
  l.wgrad_deferral_limit =
      static_cast<int>(r.optional_int("wgrad_deferral_limit", 0, 0, 1'000'000'000));
  l.grad_reduce_dtype = *parse_grad_reduce_dtype(
      r.optional_enum("grad_reduce_dtype", "default", {"default", "fp32", "bf16", "fp16"}));
  l.cross_entropy_fusion = *parse_cross_entropy(
      r.optional_enum("cross_entropy_fusion", "none", {"none", "native", "te", "compiled"}));
  l.first_stage_layers = static_cast<int>(r.optional_int("first_stage_layers", 0, 0, kMaxDegree));
  l.last_stage_layers = static_cast<int>(r.optional_int("last_stage_layers", 0, 0, kMaxDegree));
  l.account_for_embedding = r.optional_bool("account_for_embedding", false);
  l.account_for_loss = r.optional_bool("account_for_loss", false);
  const nlohmann::json& layout = r.array("pipeline_layout", false);
  for (size_t i = 0; i < layout.size(); ++i) {
    const nlohmann::json& n = layout[i];
    if (!n.is_number_integer() || n.get<int64_t>() < 0 || n.get<int64_t>() > kMaxDegree) {
      r.fail("pipeline_layout",
             fmt::format("entry {} must be a whole number of layers, 0 to {}", i, kMaxDegree));
      break;
    }
    l.pipeline_layout.push_back(n.get<int>());
  }
  // Each degree is bounded alone; their product is the layout's GPU count, an int
  // (Layout::world()), and the virtual stages' count likewise.
  if (r.ok()) {
    const double world = static_cast<double>(l.tp) * l.cp * l.pp * l.dp;  // up to 2^80
    const int64_t chunks = int64_t{l.pp} * l.vpp;
    if (world > static_cast<double>(kMaxDegree))
      r.fail("dp", fmt::format("tp {} x cp {} x pp {} x dp {} = {:.0f} GPUs, over the bound of {}",
                               l.tp, l.cp, l.pp, l.dp, world, kMaxDegree));
    else if (chunks > kMaxDegree)
      r.fail("vpp", fmt::format("pp {} x vpp {} = {} model chunks, over the bound of {}", l.pp,
                                l.vpp, chunks, kMaxDegree));
  }
  return l;
}

nlohmann::json layout_to_json(const Layout& l) {
  nlohmann::json j = {{"tp", l.tp},
                      {"sp", l.sequence_parallel},
                      {"cp", l.cp},
                      {"pp", l.pp},
                      {"vpp", l.vpp},
                      {"dp", l.dp},
                      {"ep", l.ep},
                      {"micro_batch", l.micro_batch},
                      {"recompute", to_string(l.recompute)},
                      {"distributed_optimizer", l.distributed_optimizer},
                      {"overlap_grad_reduce", l.overlap_grad_reduce},
                      {"overlap_param_gather", l.overlap_param_gather},
                      {"flash_attention", l.flash_attention}};
  if (l.names_recompute_modules()) {
    nlohmann::json modules = nlohmann::json::array();
    for (std::string_view name : recompute_module_names(l.recompute_modules))
      modules.push_back(name);
    j["recompute_modules"] = modules;
  }
  if (l.attention_kernel != hardware::AttentionKernel::kDefault)
    j["attention_kernel"] = hardware::to_string(l.attention_kernel);
  // Uneven pipeline splits only when set, so even plans read as before.
  if (l.first_stage_layers > 0) j["first_stage_layers"] = l.first_stage_layers;
  if (l.last_stage_layers > 0) j["last_stage_layers"] = l.last_stage_layers;
  if (l.account_for_embedding) j["account_for_embedding"] = true;
  if (l.account_for_loss) j["account_for_loss"] = true;
  if (!l.pipeline_layout.empty()) j["pipeline_layout"] = l.pipeline_layout;
  if (l.fp8_recipe != Fp8Recipe::kDelayed) j["fp8_recipe"] = to_string(l.fp8_recipe);
  if (l.cp_comm != CpComm::kP2P) j["cp_comm"] = to_string(l.cp_comm);
  if (l.cp_a2a > 0) j["cp_a2a"] = l.cp_a2a;
  if (l.fp8_param_gather) j["fp8_param_gather"] = true;
  if (l.nccl_ub) j["nccl_ub"] = true;
  if (!l.gradient_accumulation_fusion) j["gradient_accumulation_fusion"] = false;
  if (l.defer_embedding_wgrad) j["defer_embedding_wgrad"] = true;
  if (l.wgrad_deferral_limit > 0) j["wgrad_deferral_limit"] = l.wgrad_deferral_limit;
  if (l.etp > 0) j["etp"] = l.etp;
  if (l.grad_reduce_dtype != GradReduceDtype::kDefault)
    j["grad_reduce_dtype"] = to_string(l.grad_reduce_dtype);
  if (l.cross_entropy_fusion != CrossEntropy::kUnfused)
    j["cross_entropy_fusion"] = to_string(l.cross_entropy_fusion);
  if (!l.fused_projections) j["fused_projections"] = false;
  if (l.repeat_kv) j["repeat_kv"] = true;
  if (!l.fused_activation) j["fused_activation"] = false;
  if (!l.fused_rope) j["fused_rope"] = false;
  if (!l.align_grad_reduce) j["align_grad_reduce"] = false;
  if (!l.tp_backward_overlap) j["tp_backward_overlap"] = false;
  if (l.pp_scatter_gather) j["pp_scatter_gather"] = true;
  if (l.pp_blocking_p2p) j["pp_blocking_p2p"] = true;
  if (l.microbatch_group > 0) j["microbatch_group"] = l.microbatch_group;
  if (l.tp_comm_overlap) j["tp_comm_overlap"] = true;
  if (l.ep_comm_overlap) j["ep_comm_overlap"] = true;
  if (l.moe_shared_expert_overlap) j["moe_shared_expert_overlap"] = true;
  if (l.moe_capacity_factor > 0) j["moe_capacity_factor"] = l.moe_capacity_factor;
  if (l.moe_load_imbalance > 1) j["moe_load_imbalance"] = l.moe_load_imbalance;
  if (l.moe_dispatcher != MoeDispatcher::kAllToAll)
    j["moe_dispatcher"] = to_string(l.moe_dispatcher);
  if (l.fsdp) {
    j["fsdp"] = true;
    j["fsdp_reshard_after_forward"] = l.fsdp_reshard_after_forward;
    if (l.fsdp_implementation != FsdpImplementation::kMegatron)
      j["fsdp_implementation"] = to_string(l.fsdp_implementation);
    if (l.fsdp_root_unit) j["fsdp_root_unit"] = true;
  }
  return j;
}

}  // namespace

Result<Plan> parse_plan(const nlohmann::json& j, const std::string& path) {
  JsonReader r(j, path);
  Plan p;
  p.layout = parse_layout(r);
  const Layout& l = p.layout;
  std::string schedule = r.optional_enum("schedule", l.vpp > 1 ? "interleaved" : "1f1b",
                                         {"gpipe", "1f1b", "interleaved", "zb-h1"});
  if (r.ok()) p.schedule = *parse_schedule(schedule);
  std::string placement =
      r.optional_enum("placement", "homogeneous", {"homogeneous", "colocated", "non_colocated"});
  if (r.ok()) p.placement = *parse_placement(placement);
  p.llm_first_rank = static_cast<int>(r.optional_int("llm_first_rank", 0, 0, kMaxDegree));
  if (const nlohmann::json* modules = r.raw("modules"); modules && r.ok()) {
    if (!modules->is_object()) {
      r.fail("modules", fmt::format("expected an object of module name -> layout, got {}",
                                    modules->type_name()));
    } else {
      for (auto it = modules->begin(); it != modules->end() && r.ok(); ++it) {
        JsonReader m(it.value(), r.path_of("modules") + "." + it.key());
        ModulePlan mp;
        mp.module = it.key();
        mp.layout = parse_layout(m);
        mp.first_rank = static_cast<int>(m.optional_int("first_rank", 0, 0, kMaxDegree));
        m.finish();
        r.merge(m.status());
        p.modules.push_back(std::move(mp));
      }
    }
  }
  r.finish();
  if (!r.ok()) return r.status();
  if (l.vpp > 1 && p.schedule != Schedule::kInterleaved)
    return Status::invalid_argument(
        fmt::format("{}.vpp: {} virtual stages need the interleaved schedule, got \"{}\"", path,
                    l.vpp, schedule));
  if (p.schedule == Schedule::kInterleaved && l.vpp < 2)
    return Status::invalid_argument(
        fmt::format("{}.schedule: \"interleaved\" needs vpp >= 2, got {}", path, l.vpp));
  if (p.placement == Placement::kHomogeneous && !p.modules.empty())
    return Status::invalid_argument(
        fmt::format("{}.modules: per-module layouts need \"placement\": \"colocated\" or "
                    "\"non_colocated\"",
                    path));
  return p;
}

nlohmann::json plan_to_json(const Plan& p) {
  nlohmann::json j = layout_to_json(p.layout);
  j["schedule"] = to_string(p.schedule);
  if (p.placement == Placement::kHomogeneous) return j;
  j["placement"] = to_string(p.placement);
  if (p.placement == Placement::kNonColocated) j["llm_first_rank"] = p.llm_first_rank;
  nlohmann::json modules = nlohmann::json::object();
  for (const ModulePlan& m : p.modules) {
    nlohmann::json mj = layout_to_json(m.layout);
    if (p.placement == Placement::kNonColocated) mj["first_rank"] = m.first_rank;
    modules[m.module] = std::move(mj);
  }
  j["modules"] = std::move(modules);
  return j;
}

}  // namespace hetpar::planner

// Scenario JSON parsing (schema: docs/scenario.md).
#include "hetpar/planner/scenario_json.h"

#include <cmath>
#include <filesystem>

#include "hetpar/core/file_io.h"
#include "hetpar/core/json_reader.h"
#include "hetpar/hardware/hardware_json.h"
#include "hetpar/models/model_json.h"
#include "hetpar/planner/plan_json.h"
#include "hetpar/planner/scenario.h"

namespace hetpar::planner {

namespace {

Workload parse_workload(JsonReader& r) {
  Workload w;
  w.seq_len = r.required_int("seq_len", 1, int64_t{1} << 24);
  w.global_batch = r.required_int("global_batch", 1, int64_t{1} << 30);
  w.images_per_sample = r.optional_int("images_per_sample", 0, 0, 4096);
  w.audio_clips_per_sample = r.optional_int("audio_clips_per_sample", 0, 0, 4096);
  if (r.has("image_size")) w.image_size = r.optional_int("image_size", 0, 1, 1 << 16);
  if (r.has("tokens_per_image"))
    w.tokens_per_image = r.optional_int("tokens_per_image", 0, 1, int64_t{1} << 24);
  std::string precision = r.optional_enum("precision", "bf16", {"bf16", "fp16", "fp8"});
  if (r.ok()) w.precision = *hardware::parse_precision(precision);
  w.frozen_encoders = r.optional_bool("frozen_encoders", false);
  r.finish();
  return w;
}

// Downsampling of the projector fed by module `encoder` (1 when there is none).
int64_t downsample_after(const models::ModelSpec& model, size_t encoder) {
  for (const auto& e : model.edges)
    if (e.from == encoder)
      if (const auto* p = std::get_if<models::ProjectorSpec>(&model.modules[e.to].spec))
        return p->downsample;
  return 1;
}

// Resolves workload.tokens_per_image into the image size that produces it (ViTs see
// (image/patch)^2 patches, a projector merges downsample^2 of them into one token) and
// applies workload.image_size to every vision encoder, so the model is self-consistent.
Status apply_image_size(models::ModelSpec& model, Workload& w) {
  if (!w.image_size && !w.tokens_per_image) return Status::ok();
  for (size_t i = 0; i < model.modules.size(); ++i) {
    auto* v = std::get_if<models::VisionEncoderSpec>(&model.modules[i].spec);
    if (!v) continue;
    int64_t size = w.image_size.value_or(0);
    if (w.tokens_per_image) {
      int64_t d = downsample_after(model, i);
      int64_t patches = *w.tokens_per_image * d * d;
      auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(patches))));
      if (side * side != patches)
        return Status::invalid_argument(fmt::format(
            "workload.tokens_per_image: {} tokens need {} patches per image, not a square "
            "grid for module \"{}\"",
            *w.tokens_per_image, patches, model.modules[i].name));
      if (w.image_size && *w.image_size != side * v->patch_size)
        return Status::invalid_argument(fmt::format(
            "workload.tokens_per_image: {} tokens mean {}px images, but workload.image_size "
            "is {}",
            *w.tokens_per_image, side * v->patch_size, *w.image_size));
      size = side * v->patch_size;
    }
    if (size % v->patch_size != 0)
      return Status::invalid_argument(
          fmt::format("workload.image_size: {} is not divisible by the patch size {} of "
                      "module \"{}\"",
                      size, v->patch_size, model.modules[i].name));
    v->image_size = size;
  }
  return models::validate_model(model, "model");
}

// A partial layout ("search.llm", "search.modules.<name>"): every field optional.
// A search switch that takes true, false or "any" (both): `value` or `any` when present.
void bool_or_any(JsonReader& r, std::string_view key, std::optional<bool>& value, bool& any) {
  if (!r.has(key)) return;
  const nlohmann::json* v = r.raw(key);
  if (v && v->is_string())
    any = r.optional_enum(key, "any", {"any"}) == "any";
  else
    value = r.optional_bool(key, false);
}

LayoutFix parse_layout_fix(JsonReader& r) {
  LayoutFix f;
  auto degree = [&](std::string_view key, std::optional<int>& out) {
    if (r.has(key)) out = static_cast<int>(r.optional_int(key, 1, 1, 1 << 20));
  };
  degree("tp", f.tp);
  degree("cp", f.cp);
  degree("pp", f.pp);
  degree("vpp", f.vpp);
  degree("dp", f.dp);
  degree("ep", f.ep);
  degree("etp", f.etp);
  degree("micro_batch", f.micro_batch);
  if (r.has("sp")) f.sequence_parallel = r.optional_bool("sp", false);
  if (r.has("distributed_optimizer"))
    f.distributed_optimizer = r.optional_bool("distributed_optimizer", false);
  if (r.has("recompute"))
    f.recompute = parse_recompute(
        r.optional_enum("recompute", "none", {"none", "selective", "full", "selective_op"}));
  f.recompute_modules = read_recompute_modules(r, f.recompute);
  if (r.has("attention_kernel"))
    f.attention_kernel = hardware::parse_attention_kernel(
        r.optional_enum("attention_kernel", "default", {"default", "cudnn", "flash2", "flash3"}));
  if (r.has("cp_comm")) {
    const std::string c =
        r.optional_enum("cp_comm", "p2p", {"p2p", "all_gather", "a2a", "a2a+p2p", "any"});
    f.any_cp_comm = c == "any";
    if (!f.any_cp_comm) f.cp_comm = parse_cp_comm(c);
  }
  if (r.has("cp_a2a")) f.cp_a2a = static_cast<int>(r.optional_int("cp_a2a", 2, 2, 1 << 20));
  bool_or_any(r, "fsdp", f.fsdp, f.any_fsdp);
  if (r.has("fsdp_implementation")) {
    const std::string impl = r.optional_enum("fsdp_implementation", "megatron_fsdp",
                                             {"megatron_fsdp", "torch_fsdp2", "any"});
    f.any_fsdp_implementation = impl == "any";
    if (!f.any_fsdp_implementation) f.fsdp_implementation = parse_fsdp_implementation(impl);
  }
  if (r.has("fp8_recipe"))
    f.fp8_recipe =
        parse_fp8_recipe(r.optional_enum("fp8_recipe", "delayed", {"delayed", "tensorwise"}));
  if (r.has("fp8_param_gather")) f.fp8_param_gather = r.optional_bool("fp8_param_gather", false);
  if (r.has("nccl_ub")) f.nccl_ub = r.optional_bool("nccl_ub", false);
  if (r.has("fused_projections")) f.fused_projections = r.optional_bool("fused_projections", true);
  if (r.has("repeat_kv")) f.repeat_kv = r.optional_bool("repeat_kv", false);
  if (r.has("fused_activation")) f.fused_activation = r.optional_bool("fused_activation", true);
  if (r.has("fused_rope")) f.fused_rope = r.optional_bool("fused_rope", true);
  if (r.has("moe_capacity_factor"))
    f.moe_capacity_factor = r.optional_double("moe_capacity_factor", 0, 0, 64);
  if (r.has("moe_load_imbalance"))
    f.moe_load_imbalance = r.optional_double("moe_load_imbalance", 1, 1, 64);
  if (r.has("moe_dispatcher")) {
    const std::string d =
        r.optional_enum("moe_dispatcher", "alltoall", {"alltoall", "deepep", "hybridep", "any"});
    f.any_moe_dispatcher = d == "any";
    if (!f.any_moe_dispatcher) f.moe_dispatcher = parse_moe_dispatcher(d);
  }
  bool_or_any(r, "tp_comm_overlap", f.tp_comm_overlap, f.any_tp_comm_overlap);
  bool_or_any(r, "ep_comm_overlap", f.ep_comm_overlap, f.any_ep_comm_overlap);
  bool_or_any(r, "moe_shared_expert_overlap", f.moe_shared_expert_overlap,
              f.any_moe_shared_expert_overlap);
  if (r.has("grad_reduce_dtype"))
    f.grad_reduce_dtype = parse_grad_reduce_dtype(
        r.optional_enum("grad_reduce_dtype", "default", {"default", "fp32", "bf16", "fp16"}));
  if (r.has("cross_entropy_fusion"))
    f.cross_entropy_fusion = parse_cross_entropy(
        r.optional_enum("cross_entropy_fusion", "none", {"none", "native", "te", "compiled"}));
  f.sized_stages = r.optional_bool("sized_stages", true);
  r.finish();
  return f;
}

SearchSpec parse_search(JsonReader& r) {
  SearchSpec spec;
  if (r.has("llm")) {
    JsonReader llm = r.object("llm");
    spec.llm = parse_layout_fix(llm);
    r.merge(llm.status());
  }
  if (const nlohmann::json* modules = r.raw("modules"); modules && r.ok()) {
    if (!modules->is_object()) {
      r.fail("modules", fmt::format("expected an object of module name -> layout, got {}",
                                    modules->type_name()));
    } else {
      for (auto it = modules->begin(); it != modules->end() && r.ok(); ++it) {
        JsonReader m(it.value(), r.path_of("modules") + "." + it.key());
        spec.modules.emplace_back(it.key(), parse_layout_fix(m));
        r.merge(m.status());
      }
    }
  }
  const nlohmann::json& forbid = r.array("forbid_placements", false);
  for (size_t i = 0; i < forbid.size() && r.ok(); ++i) {
    const std::string path = json_index_path(r.path(), "forbid_placements", i);
    std::optional<Placement> p =
        forbid[i].is_string() ? parse_placement(forbid[i].get<std::string>()) : std::nullopt;
    if (!p)
      r.merge(Status::invalid_argument(fmt::format(
          "{}: expected one of \"homogeneous\", \"colocated\", \"non_colocated\", got {}", path,
          forbid[i].dump())));
    else
      spec.forbidden_placements.push_back(*p);
  }
  if (r.has("max_memory_GiB"))
    spec.max_memory =
        Bytes(static_cast<int64_t>(r.optional_double("max_memory_GiB", 0, 0.001, 1e6) *
                                   static_cast<double>(Bytes::GiB(1).count())));
  if (r.has("schedule"))
    spec.schedule = parse_schedule(
        r.optional_enum("schedule", "1f1b", {"gpipe", "1f1b", "interleaved", "zb-h1"}));
  spec.allow_cross_node_tp = r.optional_bool("allow_cross_node_tp", false);
  spec.top_k = static_cast<int>(r.optional_int("top_k", 5, 1, 1000));
  spec.max_sim_tasks = r.optional_int("max_sim_tasks", 3'000'000, 1000, 1'000'000'000);
  r.finish();
  return spec;
}

}  // namespace

Result<Scenario> parse_scenario_text(std::string_view text, std::string_view source,
                                     std::string_view base_dir) {
  HETPAR_ASSIGN_OR_RETURN(nlohmann::json j, parse_json(text, source));
  return parse_scenario(j, source, base_dir);
}

Result<Scenario> parse_scenario(const nlohmann::json& j, std::string_view source,
                                std::string_view base_dir) {
  JsonReader root(j, "");
  Scenario s;
  s.source = std::string(source);
  s.name = root.optional_string("name", "");

  const nlohmann::json* model = root.raw("model");
  if (!model && root.ok()) root.fail("model", "missing required field (a zoo name or an object)");
  if (model && root.ok()) {
    auto parsed = models::parse_model(*model, "model");
    root.merge(parsed.status());
    if (parsed.is_ok()) s.model = std::move(parsed).value();
  }

  JsonReader workload = root.object("workload");
  if (root.ok()) {
    s.workload = parse_workload(workload);
    root.merge(workload.status());
  }

  const nlohmann::json* cluster = root.raw("cluster");
  if (!cluster && root.ok()) root.fail("cluster", "missing required object");
  if (cluster && root.ok()) {
    auto parsed = hardware::parse_cluster(*cluster, "cluster", base_dir);
    root.merge(parsed.status());
    if (parsed.is_ok()) s.cluster = std::move(parsed).value();
  }
  if (const nlohmann::json* plan = root.raw("plan"); plan && root.ok()) {
    auto parsed = parse_plan(*plan, "plan");
    root.merge(parsed.status());
    if (parsed.is_ok()) s.plan = *parsed;
  }
  if (const nlohmann::json* plans = root.raw("plans"); plans && root.ok()) {
    if (!plans->is_object()) {
      root.fail("plans",
                fmt::format("expected an object of plan name -> plan, got {}", plans->type_name()));
    } else {
      for (auto it = plans->begin(); it != plans->end() && root.ok(); ++it) {
        auto parsed = parse_plan(it.value(), "plans." + it.key());
        root.merge(parsed.status());
        if (parsed.is_ok()) s.plans.emplace_back(it.key(), *parsed);
      }
    }
  }
  // A validation run's published measurement (validation/README.md): read by
  // load_published_run(), carried along here so every command takes a run file.
  if (const nlohmann::json* measured = root.raw("measured"); measured && !measured->is_object())
    root.fail("measured", fmt::format("expected an object (a published measurement), got {}",
                                      measured->type_name()));
  if (root.has("search") && root.ok()) {
    JsonReader search = root.object("search");
    s.search = parse_search(search);
    root.merge(search.status());
  }
  root.finish();
  if (!root.ok()) return root.status().with_context(source);

  for (const auto& [name, fix] : s.search.modules) {
    std::optional<size_t> idx = s.model.find(name);
    if (!idx || !models::is_encoder(models::kind_of(s.model.modules[*idx].spec)))
      return Status::invalid_argument(
                 fmt::format("search.modules.{}: the model has no encoder named \"{}\"", name,
                             name))
          .with_context(source);
  }
  if (s.name.empty()) s.name = s.model.name;
  Status st = apply_image_size(s.model, s.workload);
  if (st.is_ok()) st = validate_workload(s.model, s.workload);
  if (!st.is_ok()) return st.with_context(source);
  return s;
}

Result<Scenario> load_scenario(const std::string& path) {
  HETPAR_ASSIGN_OR_RETURN(std::string text, read_file(path));
  std::string dir = std::filesystem::path(path).parent_path().string();
  return parse_scenario_text(text, path, dir);
}

}  // namespace hetpar::planner

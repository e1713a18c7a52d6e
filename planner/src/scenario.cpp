#include "hetpar/planner/scenario.h"

#include <fmt/format.h>

#include "hetpar/core/check.h"
#include "hetpar/models/totals.h"
#include "hetpar/planner/memory.h"

namespace hetpar::planner {

namespace {
int64_t items_per_sample(const models::ModuleSpec& encoder, const Workload& w) {
  return models::kind_of(encoder) == models::ModuleKind::kAudioEncoder ? w.audio_clips_per_sample
                                                                       : w.images_per_sample;
}
}  // namespace

int64_t modality_tokens_per_item(const models::ModelSpec& model, size_t encoder_index) {
  return models::llm_tokens_per_item(model, encoder_index);
}

Status replace_profile(Scenario& s, hardware::SystemProfile profile, std::string ref) {
  std::vector<hardware::NodeGroup> groups = s.cluster.groups();
  if (groups.size() != 1)
    return Status::invalid_argument(fmt::format(
        "the cluster has {} node groups; a profile replaces that of a single-group cluster "
        "(name calibrated files in cluster.node_groups instead)",
        groups.size()));
  groups[0].profile = std::move(profile);
  groups[0].profile_ref = std::move(ref);
  auto cluster = hardware::ClusterSpec::create(std::move(groups), s.cluster.overrides());
  if (!cluster.is_ok()) return cluster.status();
  s.cluster = *std::move(cluster);
  return Status::ok();
}

Status validate_workload(const models::ModelSpec& model, const Workload& w) {
  bool has_vision = false, has_audio = false;
  int64_t modality_tokens = 0;
  for (size_t i = 0; i < model.modules.size(); ++i) {
    models::ModuleKind kind = models::kind_of(model.modules[i].spec);
    if (!models::is_encoder(kind)) continue;
    (kind == models::ModuleKind::kAudioEncoder ? has_audio : has_vision) = true;
    modality_tokens +=
        items_per_sample(model.modules[i].spec, w) * modality_tokens_per_item(model, i);
  }
  if (w.images_per_sample > 0 && !has_vision)
    return Status::invalid_argument(fmt::format(
        "workload.images_per_sample: {} images per sample, but model \"{}\" has no vision encoder",
        w.images_per_sample, model.name));
  if (w.audio_clips_per_sample > 0 && !has_audio)
    return Status::invalid_argument(fmt::format(
        "workload.audio_clips_per_sample: {} clips per sample, but model \"{}\" has no audio "
        "encoder",
        w.audio_clips_per_sample, model.name));
  // An encoder with nothing to encode has no op graph: the workload must feed it.
  if (has_vision && w.images_per_sample == 0)
    return Status::invalid_argument(fmt::format(
        "workload.images_per_sample: model \"{}\" has a vision encoder, which needs >= 1 "
        "image per sample (default 0)",
        model.name));
  if (has_audio && w.audio_clips_per_sample == 0)
    return Status::invalid_argument(fmt::format(
        "workload.audio_clips_per_sample: model \"{}\" has an audio encoder, which needs >= 1 "
        "clip per sample (default 0)",
        model.name));
  if ((w.tokens_per_image || w.image_size) && !has_vision)
    return Status::invalid_argument(
        w.tokens_per_image ? "workload.tokens_per_image: the model has no vision encoder"
                           : "workload.image_size: the model has no vision encoder");
  if (modality_tokens > w.seq_len)
    return Status::invalid_argument(fmt::format(
        "workload.seq_len: {} modality tokens per sample do not fit in a fused sequence of {}",
        modality_tokens, w.seq_len));
  return Status::ok();
}

models::ModuleInput module_input(const Scenario& s, size_t index, int64_t micro_batch) {
  const auto& spec = s.model.modules[index].spec;
  models::ModuleInput in;
  in.micro_batch = micro_batch;
  in.seq_len = s.workload.seq_len;
  // Activations stay 16-bit under fp8 training: Transformer Engine casts only GEMM inputs.
  in.dtype_bytes = 2;
  switch (models::kind_of(spec)) {
    case models::ModuleKind::kVisionEncoder:
    case models::ModuleKind::kAudioEncoder:
      in.items_per_sample = items_per_sample(spec, s.workload);
      return in;
    case models::ModuleKind::kProjector: {
      // A projector processes the tokens of the encoder feeding it.
      for (const auto& e : s.model.edges) {
        if (e.to != index) continue;
        in.items_per_sample = items_per_sample(s.model.modules[e.from].spec, s.workload);
        return models::module_input(s.model, index, in);
      }
      return models::module_input(s.model, index, in);
    }
    case models::ModuleKind::kLlm:
      return in;
  }
  return in;
}

namespace {

models::ModuleInput graph_input(const Scenario& s, size_t index, const Layout& l, ExpertLoad load) {
  models::ModuleInput in = module_input(s, index, l.micro_batch);
  in.flash_attention = l.flash_attention;
  in.fused_projections = l.fused_projections;
  in.repeat_kv = l.repeat_kv;
  in.moe_capacity_factor = load == ExpertLoad::kRouted ? 0 : l.moe_capacity_factor;
  in.moe_load_imbalance = load == ExpertLoad::kTimed ? l.moe_rank_load() : 1;
  return in;
}

}  // namespace

models::OpGraph module_graph(const Scenario& s, size_t index, const Layout& l, ExpertLoad load) {
  return models::build_op_graph(s.model.modules[index].spec, graph_input(s, index, l, load));
}

namespace {
// What the memory model reads of each op's name (OpNameTraits), in op order.
std::vector<OpNameTraits> op_name_traits(const models::OpGraph& g) {
  std::vector<OpNameTraits> out;
  out.reserve(g.ops.size());
  for (const models::Op& op : g.ops) {
    OpNameTraits t;
    t.routed_expert = op.name.starts_with("expert_");
    t.router = op.name == "router";
    t.moe_dispatch = op.name == "moe_dispatch";
    t.fp8_linear = is_fp8_linear(op);
    t.inside_tp = op.kind == models::OpKind::kAttention || op.kind == models::OpKind::kLoss ||
                  op.name == "attn_out" || op.name == "qk_norm" || op.name.ends_with("act") ||
                  op.name.ends_with("fc2");
    t.routed_fc1 = t.routed_expert && op.name.ends_with("fc1");
    t.shared_expert_fc1 = op.name == "shared_expert_fc1";
    out.push_back(t);
  }
  return out;
}
}  // namespace

ModuleGraphCache::Entry& ModuleGraphCache::entry(const Scenario& s, size_t index, const Layout& l,
                                                 ExpertLoad load) {
  HETPAR_CHECK(scenario_ == nullptr || scenario_ == &s, "a ModuleGraphCache serves one scenario");
  scenario_ = &s;
  const models::ModuleInput in = graph_input(s, index, l, load);
  for (Entry& e : entries_)
    if (e.index == index && e.input == in) return e;
  auto graph = std::make_unique<const models::OpGraph>(
      models::build_op_graph(s.model.modules[index].spec, in));
  std::vector<OpNameTraits> traits = op_name_traits(*graph);
  entries_.push_back({index, in, std::move(graph), std::move(traits)});
  return entries_.back();
}

const models::OpGraph& ModuleGraphCache::get(const Scenario& s, size_t index, const Layout& l,
                                             ExpertLoad load) {
  return *entry(s, index, l, load).graph;
}

ModuleGraphCache::WithTraits ModuleGraphCache::get_with_traits(const Scenario& s, size_t index,
                                                               const Layout& l, ExpertLoad load) {
  const Entry& e = entry(s, index, l, load);
  return {*e.graph, e.traits};
}

}  // namespace hetpar::planner

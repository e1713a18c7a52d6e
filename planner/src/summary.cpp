#include "hetpar/planner/summary.h"

#include "hetpar/models/op_graph.h"

namespace hetpar::planner {

namespace {

ModuleSummary summarize_module(const Scenario& s, size_t i) {
  const models::Module& m = s.model.modules[i];
  const models::ModuleInput in = module_input(s, i, /*micro_batch=*/1);
  const models::OpGraph g = models::build_op_graph(m.spec, in);
  ModuleSummary out;
  out.name = m.name;
  out.kind = models::kind_of(m.spec);
  out.params = models::count_params(m.spec);
  out.layers = g.layers;
  out.items_per_sample = in.items_per_sample;
  // Layers see layer_tokens; a projector (no layers) sees its encoder's tokens.
  out.tokens_per_sample = out.kind == models::ModuleKind::kProjector
                              ? in.seq_len * in.items_per_sample
                              : g.layer_tokens;
  out.forward_per_sample = models::forward_flops(g);
  out.backward_per_sample = models::backward_flops(g);
  out.activations_per_sample = models::activation_bytes(g, models::Recompute::kNone);
  for (const models::Op& op : g.ops)  // the last layer: an MoE LLM's dense ones come first
    if (op.layer == g.layers - 1) out.activations_per_layer += op.saved;
  if (out.kind == models::ModuleKind::kLlm) out.items_per_sample = 0;
  return out;
}

}  // namespace

ScenarioSummary summarize(const Scenario& s) {
  ScenarioSummary out;
  out.name = s.name;
  out.model_name = s.model.name;
  out.workload = s.workload;
  out.total_params = models::count_params(s.model);
  for (size_t i = 0; i < s.model.modules.size(); ++i) {
    out.modules.push_back(summarize_module(s, i));
    out.model_flops_per_sample += out.modules.back().forward_per_sample;
    out.model_flops_per_sample += out.modules.back().backward_per_sample;
  }
  out.model_flops_per_iteration =
      out.model_flops_per_sample * static_cast<double>(s.workload.global_batch);
  out.llm_tokens_per_iteration = s.workload.seq_len * s.workload.global_batch;

  const hardware::ClusterSpec& c = s.cluster;
  out.total_gpus = c.total_gpus();
  double peak = 0;
  for (const hardware::NodeGroup& g : c.groups()) {
    const hardware::SystemProfile& p = g.profile;
    NodeGroupSummary gs;
    gs.profile = g.profile_ref;
    gs.gpu_model = p.gpu.model;
    gs.nodes = g.nodes;
    gs.gpus_per_node = p.gpus_per_node;
    gs.peak_per_gpu = p.gpu.peak(s.workload.precision);
    gs.slowest_gpu_rate = p.gpu.compute_scale;
    gs.clock_spread = p.gpu.clock_spread;
    gs.gpus_of_model = s.cluster.gpus_of_model(p.gpu.model);
    gs.memory_per_gpu = p.gpu.memory_capacity;
    gs.memory_bandwidth_per_gpu = p.gpu.memory_bandwidth;
    gs.intra_node_per_gpu = p.intra_node.bandwidth;
    gs.nvls = p.intra_node.nvls;
    gs.nics_per_node = p.inter_node.nics_per_node;
    gs.nic_bandwidth = p.inter_node.nic_bandwidth;
    gs.wan = p.wan;
    peak += gs.peak_per_gpu.per_second() * g.nodes * p.gpus_per_node;
    out.groups.push_back(gs);
  }
  out.cluster_peak = FlopRate::per_second(peak);
  if (peak > 0) out.ideal_iteration_time = out.model_flops_per_iteration / out.cluster_peak;
  return out;
}

}  // namespace hetpar::planner

// `hetpar simulate FILE [--json] [--trace OUT] [--profile P]`: FILE is a scenario with a "plan"
// section; --profile replaces the cluster's hardware profile (e.g. a calibrated one).
#include <fmt/format.h>

#include <algorithm>
#include <sstream>

#include "commands.h"
#include "hetpar/core/file_io.h"
#include "hetpar/core/format.h"
#include "hetpar/hardware/cluster.h"
#include "hetpar/hardware/system_profile.h"
#include "hetpar/planner/cost_model.h"
#include "hetpar/planner/deepep.h"
#include "hetpar/planner/evaluate.h"
#include "hetpar/planner/lower.h"
#include "hetpar/sim/trace.h"
#include "render.h"

namespace hetpar::cli {

namespace {

// Each stage's total against its GPUs' memory, then its breakdown; a run of alike stages
// (the middle of a pipeline) prints once.
void print_stages_memory(const planner::MemoryReport& mem) {
  const size_t n = mem.per_stage.size();
  for (size_t first = 0, last = 0; first < n; first = last + 1) {
    last = first;
    while (last + 1 < n && mem.per_stage[last + 1] == mem.per_stage[first] &&
           mem.stage_capacity[last + 1] == mem.stage_capacity[first])
      ++last;
    const Bytes total = mem.per_stage[first].total();
    const Bytes capacity = mem.stage_capacity[first];
    const std::string stages =
        first == last ? fmt::format("stage {}", first) : fmt::format("stages {}-{}", first, last);
    fmt::print("  {:<13} {} of {}{}\n", stages, total, capacity,
               total > capacity ? fmt::format(", over by {}", total - capacity) : "");
    fmt::print("                {}\n", memory_breakdown_text(mem.per_stage[first]));
  }
}

void print_text(const planner::Scenario& s, const planner::Plan& p, const planner::PlanMetrics& m) {
  const planner::Layout& l = p.layout;
  fmt::print("Scenario   {} on {} GPUs\n", s.name, s.cluster.total_gpus());
  fmt::print("Plan       {}, {} schedule\n", planner::describe_in_words(l, s.workload.precision),
             planner::to_string(p.schedule));
  // Why a plan that fuses RoPE is timed unfused (models::RopeApply::scaled).
  const auto& llm = std::get<models::LlmSpec>(s.model.modules[s.model.llm_index()].spec);
  if (l.fused_rope && llm.yarn_scales_rope())
    fmt::print(
        "RoPE       unfused: the model's YaRN scales cos and sin by {:.3g}, which Transformer "
        "Engine's fused kernel cannot (Megatron-Core falls back)\n",
        llm.yarn->concentration());
  // Where the flex dispatcher's EP group spans nodes: how many a token reaches
  // (planner/deepep.h), which grouped routing bounds.
  const int per_node = std::min(l.ep, s.cluster.gpus_per_node_of(0) / std::max(l.expert_tp(), 1));
  if (llm.moe && l.flex_dispatcher() && per_node > 0 && l.ep > per_node && l.ep % per_node == 0) {
    const int64_t nodes = l.ep / per_node;
    const double reached = planner::deepep_rail_share(*llm.moe, nodes) * llm.moe->top_k;
    fmt::print(
        "{:<10} each token to {:.2f} of the EP group's {} nodes on average (once per "
        "node, for its {} routed copies){}\n",
        planner::display_name(l.moe_dispatcher), reached, nodes, llm.moe->top_k,
        llm.moe->groups > 0
            ? fmt::format(": its experts in {} of {} groups", llm.moe->group_topk, llm.moe->groups)
            : "");
  }
  if (!m.feasible) {
    fmt::print("Infeasible: {}\n", m.infeasible_reason);
    // A plan the memory model refuses: every stage's breakdown, and by how much it is over.
    if (!m.memory.fits()) {
      fmt::print("\nMemory per GPU by pipeline stage\n");
      print_stages_memory(m.memory);
    }
    return;
  }
  fmt::print("Micro-batches per replica {}, {} tasks simulated\n\n", m.micro_batches, m.tasks);
  fmt::print("Iteration time     {}\n", m.iteration_time);
  fmt::print("Tokens/s           {}\n", format_count(m.tokens_per_s));
  fmt::print(
      "TFLOPS/GPU         {:.1f} (model FLOPs: 3x forward, causal attention as half, "
      "no recompute)\n",
      m.tflops_per_gpu);
  fmt::print("MFU                {:.1f}%\n", 100 * m.mfu);
  fmt::print("Peak memory        {} on pipeline stage {} (of {} per GPU)\n", m.memory.peak,
             m.memory.peak_stage,
             m.memory.stage_capacity[static_cast<size_t>(m.memory.peak_stage)]);
  fmt::print("                   {}\n",
             memory_breakdown_text(m.memory.per_stage[m.memory.peak_stage]));
  fmt::print("Bubble             {:.1f}% of rank time idle\n", 100 * m.bubble_fraction);
  fmt::print("Exposed comm       {} per rank", m.exposed_comm);
  for (const auto& e : m.exposed_by_kind) fmt::print(", {} {}", e.kind, e.per_rank);
  if (m.host_busy > Time::zero()) {
    fmt::print(
        "\nHost               {} per rank issuing kernels and calls ({:.0f}% of the iteration)",
        m.host_busy, 100 * (m.host_busy / m.iteration_time));
    if (m.host_wait > Time::zero()) fmt::print(", {} waiting for the GPU", m.host_wait);
    if (m.launch_wait > Time::zero())
      fmt::print("; compute waited {} for its launches", m.launch_wait);
  }
  fmt::print("\n\nTime by phase (stream time per rank)\n");
  for (const auto& ph : m.phases) fmt::print("  {:<12} {:>10}\n", ph.phase, ph.per_rank);
}

// --ops: each op of the LLM's first layer (and the work before and after the layers) as one
// rank of the plan's layout runs it for one micro-batch, on the first node group's GPUs:
// time and achieved rate per pass. The same op_cost() the lowering sums into its tasks.
void print_ops(const planner::Scenario& s, const planner::Plan& p) {
  const models::ModelSpec& model = s.model;
  const size_t llm = model.llm_index();
  const models::OpGraph g = planner::module_graph(s, llm, p.layout);
  const hardware::DeviceProfile& dev = s.cluster.groups()[0].profile.gpu;
  fmt::print("\nOps of one rank, one micro-batch ({} module; layer 0 of {})\n",
             model.modules[llm].name, g.layers);
  fmt::print("  {:<16} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9}\n", "op", "forward", "dgrad",
             "wgrad", "recompute", "fwd TF/s", "bwd TF/s");
  planner::PassCost layer;
  auto rate = [](Flops f, Time t) {
    return t > Time::zero() ? f.count() / t.to_seconds() / 1e12 : 0.0;
  };
  for (const models::Op& op : g.ops) {
    if (op.layer > 0) continue;
    const planner::PassCost c = planner::op_cost(op, g, p.layout, true, dev, s.workload.precision);
    if (op.layer == 0) layer += c;
    const std::string name = op.layer == 0 ? op.name : fmt::format("({})", op.name);
    fmt::print("  {:<16} {:>10} {:>10} {:>10} {:>10} {:>9.0f} {:>9.0f}\n", name, c.forward, c.dgrad,
               c.wgrad, c.recompute, rate(c.forward_flops, c.forward),
               rate(c.dgrad_flops + c.wgrad_flops, c.dgrad + c.wgrad));
  }
  fmt::print("  {:<16} {:>10} {:>10} {:>10} {:>10} {:>9.0f} {:>9.0f}\n", "layer total",
             layer.forward, layer.dgrad, layer.wgrad, layer.recompute,
             rate(layer.forward_flops, layer.forward),
             rate(layer.dgrad_flops + layer.wgrad_flops, layer.dgrad + layer.wgrad));
  fmt::print("  (parenthesised: outside the layers)\n");
}

}  // namespace

int run_simulate(const SimulateOptions& opts) {
  auto scenario = planner::load_scenario(opts.path);
  if (!scenario.is_ok()) return report_error(scenario.status());
  if (!opts.profile.empty()) {
    auto profile = hardware::load_profile(opts.profile);
    Status st = profile.is_ok()
                    ? planner::replace_profile(*scenario, *std::move(profile), opts.profile)
                    : profile.status();
    if (!st.is_ok()) return report_error(st.with_context("--profile"));
  }
  if (!scenario->plan)
    return report_error(Status::invalid_argument(
        fmt::format("{}: plan: missing required object (simulate needs a \"plan\" section, see "
                    "docs/scenario.md)",
                    opts.path)));
  const planner::Plan& plan = *scenario->plan;

  std::ostringstream trace_text;
  std::optional<sim::ChromeTraceWriter> trace;
  planner::EvaluateOptions eo;
  eo.full_ranks = opts.every_rank;
  if (!opts.trace_path.empty()) {
    trace.emplace(trace_text);
    eo.trace = &*trace;
  }
  auto metrics = planner::evaluate(*scenario, plan, eo);
  if (!metrics.is_ok()) return report_error(metrics.status());
  if (trace) trace->finish();
  if (metrics->feasible && !opts.trace_path.empty()) {
    Status st = write_file_atomically(opts.trace_path, trace_text.str());
    if (!st.is_ok()) return report_error(st);
  }
  if (opts.json)
    fmt::print("{}\n", metrics_to_json(*scenario, plan, *metrics));
  else
    print_text(*scenario, plan, *metrics);
  // Also for a plan only the memory model rejects: its ops are what would not fit.
  if (opts.ops && !opts.json && planner::infeasibility(*scenario, plan).empty())
    print_ops(*scenario, plan);
  if (!metrics->feasible) {
    fmt::print(stderr, "hetpar: plan is infeasible: {}\n", metrics->infeasible_reason);
    return 3;
  }
  return 0;
}

}  // namespace hetpar::cli

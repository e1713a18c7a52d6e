// ScenarioSummary: the numbers `hetpar inspect` prints — per module parameters, model
// FLOPs per sample (forward, backward), activation bytes per layer, and the cluster's
// peak compute and memory — computed from a Scenario without choosing any layout.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "hetpar/core/units.h"
#include "hetpar/models/totals.h"
#include "hetpar/planner/scenario.h"

namespace hetpar::planner {

struct ModuleSummary {
  std::string name;
  models::ModuleKind kind = models::ModuleKind::kLlm;
  models::ParamCounts params;
  int64_t layers = 0;
  int64_t items_per_sample = 0;   // images or clips (encoders and projectors)
  int64_t tokens_per_sample = 0;  // tokens one sample puts through the module's layers
  Flops forward_per_sample;       // model FLOPs (GEMMs + attention core)
  Flops backward_per_sample;
  Bytes activations_per_layer;   // one sample, no recompute (Korthikanti et al.); the last layer
  Bytes activations_per_sample;  // whole module, one sample, no recompute
};

struct NodeGroupSummary {
  std::string profile;
  std::string gpu_model;
  int nodes = 0;
  int gpus_per_node = 0;
  FlopRate peak_per_gpu;  // at the workload's precision
  /// The share of one GPU's tensor-core rate the slowest of the cluster's GPUs of this
  /// model sustains (DeviceProfile::compute_scale, from gpu.clock_spread; 1: no spread).
  double slowest_gpu_rate = 1.0;
  double clock_spread = 0;
  int gpus_of_model = 0;  // the cluster's GPUs of this model, of which that is the slowest
  Bytes memory_per_gpu;
  Bandwidth memory_bandwidth_per_gpu;
  Bandwidth intra_node_per_gpu;  // one direction
  bool nvls = false;             // intra-node all-reduces in the NVSwitch (cluster `nvls`)
  int nics_per_node = 0;
  Bandwidth nic_bandwidth;  // per NIC, one direction
  std::optional<hardware::WanLink> wan;
};

struct ScenarioSummary {
  std::string name;
  std::string model_name;
  Workload workload;
  std::vector<ModuleSummary> modules;
  models::ParamCounts total_params;
  Flops model_flops_per_sample;     // forward + backward, every module
  Flops model_flops_per_iteration;  // times global_batch
  int64_t llm_tokens_per_iteration = 0;
  std::vector<NodeGroupSummary> groups;
  int total_gpus = 0;
  FlopRate cluster_peak;  // sum over GPUs at the workload's precision
  /// model_flops_per_iteration / cluster_peak: the iteration time at 100% MFU.
  Time ideal_iteration_time;
};

ScenarioSummary summarize(const Scenario& s);

}  // namespace hetpar::planner

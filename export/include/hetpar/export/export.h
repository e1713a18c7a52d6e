// Export: turns a Plan into what a real trainer needs to run it — Megatron-LM launch flags
// (plain or its MIMO example), a Megatron-Bridge config, torchtitan overrides, a DeepSpeed
// config or a nanotron config, each with a launch script for the scenario's cluster
// (docs/export.md). A target that cannot express some part of the plan refuses with a
// message naming every such part; it never writes a silently different plan. The names
// each writer emits are checked against the trainer's own vocabulary (export/vocabulary/).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hetpar/core/status.h"
#include "hetpar/planner/layout.h"
#include "hetpar/planner/scenario.h"

namespace hetpar::exporter {

enum class Target {
  kMegatron,        // Megatron-LM pretrain_gpt.py / pretrain_vlm.py flags (one layout)
  kMegatronMimo,    // Megatron-LM examples/mimo (non-colocated encoder + LLM grids)
  kMegatronBridge,  // Megatron-Bridge ConfigContainer overrides (MIMO per-module config)
  kTorchtitan,      // torchtitan --section.field overrides
  kDeepspeed,       // DeepSpeed ds_config JSON + launcher
  kNanotron,        // nanotron YAML config
};

/// Every target, in the order `hetpar export --help` lists them.
std::span<const Target> all_targets();
/// "megatron", "megatron-mimo", "megatron-bridge", "torchtitan", "deepspeed", "nanotron".
std::string_view to_string(Target t);
std::optional<Target> parse_target(std::string_view name);
/// "megatron, megatron-mimo, ..." (for error messages).
std::string target_list();

/// One file of an export: where it goes under the output directory, and its text.
struct ExportFile {
  std::string path;  // relative, '/'-separated, e.g. "launch.sh"
  std::string contents;
};

/// The files `target` needs to run plan `p` of scenario `s`.
/// Errors (invalid argument): the plan is infeasible for the scenario (the message of
/// planner::infeasibility(), prefixed "plan is infeasible: "); or the target cannot
/// express it ("<target> cannot express this plan: <part>; <part>"). Memory is not
/// checked (hetpar simulate does).
Result<std::vector<ExportFile>> export_plan(const planner::Scenario& s, const planner::Plan& p,
                                            Target target);

}  // namespace hetpar::exporter

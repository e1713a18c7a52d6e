// Test helpers for the exporters: scenarios and plans built in code, readers of what the
// writers emit (bash flag arrays, the YAML subset they write, JSON key paths), and the
// trainers' vocabularies (export/vocabulary/*.txt) with the matching rules of
// research/trainer-formats.md ("A verifier should: ...").
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "hetpar/export/export.h"

namespace hetpar::exporter::testing {

/// `model` (a zoo name) on `nodes` DGX H100 nodes (or `profile`); images > 0 feeds the
/// vision encoder, audio > 0 the audio encoder.
planner::Scenario scenario(const std::string& model, int nodes, int64_t seq, int64_t global_batch,
                           int64_t images = 0, const std::string& precision = "bf16",
                           const std::string& profile = "dgx-h100", bool frozen = false);
planner::Layout layout(int tp, int pp, int dp, int mb = 1);
/// Mixtral 8x7B's plan on 8 nodes: TP2 PP4 DP8 with EP 8 (and SP, which Megatron-Core needs
/// for EP with TP).
planner::Plan mixtral_ep8_plan();
/// GLM-4.5 on 32 DGX H100 (its 3 dense layers first, one MTP depth): TP 2 with SP, PP 4,
/// DP 32, EP 32 with whole experts, full recompute.
planner::Plan glm45_ep32_plan();
/// gpt-oss-120b on 64 GPUs as Megatron-Bridge's H100 recipe lays it out: PP 4, EP 8.
planner::Plan gpt_oss_ep8_plan();
/// DeepSeek-V3 on 128 DGX nodes: TP 2 with SP, PP 8 (8|8|8|8|8|8|8|5), EP 64, etp 1, full
/// recompute.
planner::Plan deepseek_v3_plan();
/// Llama 4 Maverick on 128 GPUs: TP 4 with SP, PP 4, EP 32 folded, full recompute.
planner::Plan maverick_plan();
/// `p` with the LLM's gradient buffer in `d`.
planner::Plan with_grads(planner::Plan p, planner::GradReduceDtype d);
/// The first encoder module's name.
std::string encoder_name(const planner::Scenario& s);

/// export_plan() that must succeed; its files by path.
std::map<std::string, std::string> exported(const planner::Scenario& s, const planner::Plan& p,
                                            Target t);
/// export_plan()'s error message ("" when it succeeded).
std::string refusal(const planner::Scenario& s, const planner::Plan& p, Target t);

/// A flag in a bash array: name and value ("" for a switch).
using Flags = std::vector<std::pair<std::string, std::string>>;
/// Every `NAME=( ... )` array of a script, by name.
std::map<std::string, Flags> bash_arrays(const std::string& script);
/// The flags of all arrays, as name -> value (a flag given twice fails the test).
std::map<std::string, std::string> all_flags(const std::string& script);
/// Dotted key -> scalar of the block YAML the writers emit (comments skipped).
std::map<std::string, std::string> yaml_settings(const std::string& yaml);
/// Every key path of a JSON document ("a.b", lists as "a[].b").
std::vector<std::string> json_paths(const std::string& json);

/// A trainer's list of names (export/vocabulary/<name>.txt).
class Vocabulary {
 public:
  explicit Vocabulary(const std::string& name);
  /// Whether `key` is one of the trainer's names: entries without their trailing
  /// " [tag]" and their "[ClassName]" segments; "<module>" matches any one segment.
  bool contains(const std::string& key) const;
  size_t size() const { return exact_.size() + patterns_.size(); }

 private:
  std::set<std::string> exact_;
  std::vector<std::vector<std::string>> patterns_;  // entries with "<module>", by segment
};

}  // namespace hetpar::exporter::testing

// Robustness of the planner against hardware profiles at their extremes: every number of a
// built-in profile set to 0, -1 or a huge value is either refused by the parser (naming the
// file) or simulated to a finite result. Before, a collective latency of 1e12 us overflowed
// integer-picosecond time and aborted the process on a CHECK.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hetpar/hardware/hardware_json.h"
#include "hetpar/hardware/system_profile.h"
#include "hetpar/planner/evaluate.h"
#include "hetpar/planner/scenario.h"

namespace hetpar::planner {
namespace {

// Every numeric leaf of `j` (provenance notes aside) as a JSON pointer.
void numeric_leaves(const nlohmann::json& j, const std::string& at, std::vector<std::string>& out) {
  if (j.is_number()) {
    out.push_back(at);
  } else if (j.is_object()) {
    for (const auto& [k, v] : j.items())
      if (k != "provenance") numeric_leaves(v, at + "/" + k, out);
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) numeric_leaves(j[i], at + "/" + std::to_string(i), out);
  }
}

TEST(Robustness, EveryProfileNumberAtAnExtremeIsRefusedOrSimulated) {
  auto s = parse_scenario_text(
      R"({"model": {"name": "tiny", "modules": [{"name": "llm", "kind": "llm", "spec": {
          "layers": 4, "hidden": 1024, "ffn_hidden": 4096, "heads": 16, "kv_heads": 8,
          "vocab": 1024, "activation": "swiglu", "norm": "rmsnorm"}}]},
        "workload": {"seq_len": 2048, "global_batch": 16},
        "cluster": {"profile": "dgx-h100", "nodes": 2}})",
      "tiny.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  Plan p;  // tp 4 with sp, pp 2, dp 2: TP, pipeline and DP collectives, inside and across nodes
  p.layout.tp = 4;
  p.layout.sequence_parallel = true;
  p.layout.pp = 2;
  p.layout.dp = 2;

  auto base_profile = hardware::load_profile("dgx-h100");
  ASSERT_TRUE(base_profile.is_ok());
  const nlohmann::json base = hardware::profile_to_json(*base_profile);
  std::vector<std::string> leaves;
  numeric_leaves(base, "", leaves);
  ASSERT_GT(leaves.size(), 50u);

  int refused = 0, simulated = 0;
  for (const std::string& leaf : leaves)
    for (double v : {0.0, -1.0, 1e12}) {
      SCOPED_TRACE(leaf + " = " + std::to_string(v));
      nlohmann::json j = base;
      j[nlohmann::json::json_pointer(leaf)] = v;
      auto profile = hardware::parse_profile_text(j.dump(), "p.json");
      if (!profile.is_ok()) {
        EXPECT_EQ(profile.status().message().rfind("p.json: ", 0), 0u)
            << profile.status().message();
        ++refused;
        continue;
      }
      Scenario with = *s;
      if (!replace_profile(with, *std::move(profile), "p.json").is_ok()) {
        ++refused;
        continue;
      }
      auto m = evaluate(with, p);
      ASSERT_TRUE(m.is_ok()) << m.status().to_string();
      if (m->feasible) {
        EXPECT_GT(m->iteration_time, Time::zero());
        EXPECT_TRUE(std::isfinite(m->tokens_per_s));
      }
      ++simulated;
    }
  // Both outcomes occur: the parser is not refusing everything.
  EXPECT_GT(refused, 0);
  EXPECT_GT(simulated, 0);
}

}  // namespace
}  // namespace hetpar::planner

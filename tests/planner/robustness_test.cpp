// Robustness of the planner against malformed hardware profiles: every node of a built-in
// profile set to a value of the wrong size, sign or type, or deleted
// (tests/common/json_mutations.h), is either refused by the parser (naming the file) or
// simulated to a finite result. Before, a collective latency of 1e12 us overflowed
// integer-picosecond time and aborted the process on a CHECK.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "../common/json_mutations.h"
#include "hetpar/hardware/hardware_json.h"
#include "hetpar/hardware/system_profile.h"
#include "hetpar/planner/evaluate.h"
#include "hetpar/planner/scenario.h"

namespace hetpar::planner {
namespace {

TEST(Robustness, EverySingleEditOfAProfileIsRefusedOrSimulated) {
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

  int refused = 0, simulated = 0;
  hetpar::testing::for_each_mutation(base, [&](const std::string& what, const nlohmann::json& j) {
    if (what.find("/provenance") != std::string::npos) return;  // notes, read by nothing
    SCOPED_TRACE(what);
    auto profile = hardware::parse_profile_text(j.dump(), "p.json");
    if (!profile.is_ok()) {
      EXPECT_EQ(profile.status().message().rfind("p.json: ", 0), 0u) << profile.status().message();
      ++refused;
      return;
    }
    Scenario with = *s;
    if (!replace_profile(with, *std::move(profile), "p.json").is_ok()) {
      ++refused;
      return;
    }
    auto m = evaluate(with, p);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    if (m->feasible) {
      EXPECT_GT(m->iteration_time, Time::zero());
      EXPECT_TRUE(std::isfinite(m->tokens_per_s));
    }
    ++simulated;
  });
  // Both outcomes occur: the parser is not refusing everything.
  EXPECT_GT(refused, 0);
  EXPECT_GT(simulated, 0);
}

}  // namespace
}  // namespace hetpar::planner

// Robustness of every exporter against malformed plans: each single-edit mutation
// (tests/common/json_mutations.h) of the plans of two shipped examples, a heterogeneous
// LLaVA and an MoE with EP overlap, that still parses and fits its scenario is exported to
// every target. Each export must refuse as export.h says a fitting plan is refused ("<target>
// cannot express this plan: ..."), or write files with a path and contents. A crash or an uncaught
// exception fails.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "../common/json_mutations.h"
#include "hetpar/export/export.h"
#include "hetpar/planner/lower.h"
#include "hetpar/planner/scenario.h"

namespace hetpar::exporter {
namespace {

class PlanMutationTest : public ::testing::TestWithParam<const char*> {};

TEST_P(PlanMutationTest, EveryExportOfAMutatedPlanRefusesOrWritesFiles) {
  const std::filesystem::path file = std::filesystem::path(HETPAR_SOURCE_DIR) / GetParam();
  const nlohmann::json doc = hetpar::testing::read_json_file(file.string());
  ASSERT_TRUE(doc.contains("plans"));

  int exported = 0, refused = 0;
  // Only the plans are mutated: the scenario reader's own robustness is planner_test's.
  hetpar::testing::for_each_mutation(
      doc["plans"], [&](const std::string& what, const nlohmann::json& plans) {
        SCOPED_TRACE("/plans" + what);
        nlohmann::json m = doc;
        m["plans"] = plans;
        auto s = planner::parse_scenario_text(m.dump(), "m.json", file.parent_path().string());
        if (!s.is_ok()) return;
        for (const auto& [name, p] : s->plans) {
          if (!planner::infeasibility(*s, p).empty()) continue;
          for (Target t : all_targets()) {
            auto files = export_plan(*s, p, t);
            if (!files.is_ok()) {  // the plan fits: only the trainer can refuse (export.h)
              EXPECT_EQ(files.status().message().find(
                            fmt::format("{} cannot express this plan: ", to_string(t))),
                        0u)
                  << files.status().message();
              ++refused;
              continue;
            }
            EXPECT_FALSE(files->empty()) << to_string(t);
            for (const ExportFile& f : *files) {
              EXPECT_FALSE(f.path.empty()) << to_string(t);
              EXPECT_FALSE(f.contents.empty()) << to_string(t) << " " << f.path;
            }
            ++exported;
          }
        }
      });
  EXPECT_GT(exported, 0);
  EXPECT_GT(refused, 0);
}

INSTANTIATE_TEST_SUITE_P(Shipped, PlanMutationTest,
                         ::testing::Values("examples/llava-7b-8xh100-compare.json",
                                           "examples/qwen3-30b-16xh100-ep-overlap-compare.json"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return info.index == 0 ? std::string("llava") : std::string("qwen3");
                         });

}  // namespace
}  // namespace hetpar::exporter

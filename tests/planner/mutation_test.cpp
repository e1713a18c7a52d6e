// Robustness of the scenario reader and evaluate() against malformed input: every node of a
// few shipped scenarios (an inline vision-language model, an inline MoE with EP overlap, the
// three placements of a LLaVA example, a CP example, a published FP8 run) is set to a value
// of the wrong size or type, or deleted (tests/common/json_mutations.h). Each mutation must
// be refused with a message, or parse and then have every plan evaluated to an error with a
// message, an infeasible result with a reason, or a finite prediction. A crash, a CHECK or an
// uncaught exception fails the binary. A throwaway fuzzer of the same kind found the
// encoder-without-images abort (validate_workload) and the profile latency overflow.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "../common/json_mutations.h"
#include "hetpar/planner/evaluate.h"
#include "hetpar/planner/scenario.h"

namespace hetpar::planner {
namespace {

struct Outcomes {
  int refused = 0;      // the reader said no
  int plan_errors = 0;  // evaluate() returned an error
  int infeasible = 0;   // a result with a reason
  int predicted = 0;    // a finite prediction
};

void check_plan(const Scenario& s, const Plan& p, Outcomes& out) {
  auto m = evaluate(s, p);
  if (!m.is_ok()) {
    EXPECT_FALSE(m.status().message().empty());
    ++out.plan_errors;
    return;
  }
  if (!m->feasible) {
    EXPECT_FALSE(m->infeasible_reason.empty());
    ++out.infeasible;
    return;
  }
  EXPECT_GT(m->iteration_time, Time::zero());
  EXPECT_TRUE(std::isfinite(m->tokens_per_s) && m->tokens_per_s > 0) << m->tokens_per_s;
  EXPECT_TRUE(std::isfinite(m->tflops_per_gpu)) << m->tflops_per_gpu;
  EXPECT_TRUE(std::isfinite(m->bubble_fraction) && m->bubble_fraction >= 0 &&
              m->bubble_fraction <= 1)
      << m->bubble_fraction;
  ++out.predicted;
}

class ScenarioMutationTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ScenarioMutationTest, EverySingleEditIsRefusedOrEvaluated) {
  const std::filesystem::path file = std::filesystem::path(HETPAR_SOURCE_DIR) / GetParam();
  const nlohmann::json doc = hetpar::testing::read_json_file(file.string());
  const std::string dir = file.parent_path().string();

  Outcomes out;
  hetpar::testing::for_each_mutation(doc, [&](const std::string& what, const nlohmann::json& m) {
    SCOPED_TRACE(what);
    auto s = parse_scenario_text(m.dump(), "m.json", dir);
    if (!s.is_ok()) {
      // The message names where: the file, or the profile file the scenario points at.
      EXPECT_NE(s.status().message().find(".json"), std::string::npos) << s.status().message();
      ++out.refused;
      return;
    }
    if (s->plan) check_plan(*s, *s->plan, out);
    for (const auto& [name, p] : s->plans) check_plan(*s, p, out);
  });
  // The mutations reach every outcome the contract allows, not only the reader's refusals.
  EXPECT_GT(out.refused, 0);
  EXPECT_GT(out.predicted, 0);
  EXPECT_GT(out.infeasible + out.plan_errors, 0);
  RecordProperty("refused", out.refused);
  RecordProperty("predicted", out.predicted);
}

INSTANTIATE_TEST_SUITE_P(Shipped, ScenarioMutationTest,
                         ::testing::Values("tests/data/executor/tiny-vlm-2.json",
                                           "tests/data/executor/tiny-moe-ep-overlap-2.json",
                                           "examples/llava-7b-8xh100-compare.json",
                                           "examples/long-context-16xh100-compare.json",
                                           "validation/runs/nemo-24.07-llama3-8b-8xh100-fp8.json"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string n = std::filesystem::path(info.param).stem().string();
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

}  // namespace
}  // namespace hetpar::planner

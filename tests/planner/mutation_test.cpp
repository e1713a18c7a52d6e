// Robustness of the scenario reader and evaluate() against malformed input: every node of a
// few shipped scenarios (an inline vision-language model, an inline MoE with EP overlap, the
// three placements of a LLaVA example, a CP example, a published FP8 run) is set to a value
// of the wrong size or type, or deleted (tests/common/json_mutations.h). Each mutation must
// be refused with a message, or parse and then have every plan evaluated to an error with a
// message, an infeasible result with a reason, or a finite prediction. A crash, a CHECK or an
// uncaught exception fails the binary. A throwaway fuzzer of the same kind found the
// encoder-without-images abort (validate_workload) and the profile latency overflow. Then
// the same with two or three numbers edited at once, and the search section mutated and
// searched.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "../common/json_mutations.h"
#include "hetpar/planner/evaluate.h"
#include "hetpar/planner/lower.h"
#include "hetpar/planner/scenario.h"
#include "hetpar/planner/search.h"

namespace hetpar::planner {
namespace {

struct Outcomes {
  int refused = 0;      // the reader said no
  int plan_errors = 0;  // evaluate() returned an error
  int infeasible = 0;   // a result with a reason
  int predicted = 0;    // a finite prediction
  int skipped = 0;      // over the test's task cap: legal, but seconds to simulate
};

// `max_tasks`: a feasible plan whose task graph evaluate() would estimate above it is
// counted as skipped, not simulated (the simulator's own limit is tested in lower_test).
void check_plan(const Scenario& s, const Plan& p, Outcomes& out, double max_tasks) {
  if (max_tasks < std::numeric_limits<double>::infinity() && infeasibility(s, p).empty() &&
      estimated_tasks(s, p, ranks_share_compute(s)) > max_tasks) {
    ++out.skipped;
    return;
  }
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

// Parses mutated scenario `m` (files it names resolve against `dir`) and evaluates every
// plan it holds, counting the outcome; plans over `max_tasks` are skipped (check_plan()).
void check_scenario(const std::string& what, const nlohmann::json& m, const std::string& dir,
                    Outcomes& out, double max_tasks) {
  SCOPED_TRACE(what);
  auto s = parse_scenario_text(m.dump(), "m.json", dir);
  if (!s.is_ok()) {
    // The message names where: the file, or the profile file the scenario points at.
    EXPECT_NE(s.status().message().find(".json"), std::string::npos) << s.status().message();
    ++out.refused;
    return;
  }
  if (s->plan) check_plan(*s, *s->plan, out, max_tasks);
  for (const auto& [name, p] : s->plans) check_plan(*s, p, out, max_tasks);
}

class ScenarioMutationTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::filesystem::path file = std::filesystem::path(HETPAR_SOURCE_DIR) / GetParam();
    doc_ = hetpar::testing::read_json_file(file.string());
    dir_ = file.parent_path().string();
  }
  nlohmann::json doc_;
  std::string dir_;
};

TEST_P(ScenarioMutationTest, EverySingleEditIsRefusedOrEvaluated) {
  Outcomes out;
  hetpar::testing::for_each_mutation(doc_, [&](const std::string& what, const nlohmann::json& m) {
    check_scenario(what, m, dir_, out, std::numeric_limits<double>::infinity());
  });
  // The mutations reach every outcome the contract allows, not only the reader's refusals.
  EXPECT_GT(out.refused, 0);
  EXPECT_GT(out.predicted, 0);
  EXPECT_GT(out.infeasible + out.plan_errors, 0);
  RecordProperty("refused", out.refused);
  RecordProperty("predicted", out.predicted);
}

// Several numbers at once: the overflows of stop 39 needed two or three sizes that each
// passed their own bound. Each case sets 2 or 3 numeric leaves, drawn by a fixed-seed
// generator, to sizes large together (or small and fractional); plans of more than a
// million tasks are skipped (a legal 19M-task graph simulates in 11 s).
// HETPAR_MUTATION_CASES overrides the number of cases per file (a longer fuzz by hand).
TEST_P(ScenarioMutationTest, SeveralLargeSizesAtOnceAreRefusedOrEvaluated) {
  int cases = 1000;
  if (const char* env = std::getenv("HETPAR_MUTATION_CASES")) cases = std::atoi(env);
  Outcomes out;
  hetpar::testing::for_each_multi_edit(doc_, cases, /*seed=*/20261205,
                                       [&](const std::string& what, const nlohmann::json& m) {
                                         check_scenario(what, m, dir_, out, /*max_tasks=*/1e6);
                                       });
  EXPECT_GT(out.refused, 0);
  EXPECT_GT(out.predicted, 0);
  EXPECT_GT(out.infeasible + out.plan_errors, 0);
  RecordProperty("refused", out.refused);
  RecordProperty("predicted", out.predicted);
  RecordProperty("infeasible", out.infeasible);
  RecordProperty("skipped", out.skipped);
}

INSTANTIATE_TEST_SUITE_P(Shipped, ScenarioMutationTest,
                         ::testing::Values("tests/data/executor/tiny-vlm-2.json",
                                           "tests/data/executor/tiny-moe-ep-overlap-2.json",
                                           "tests/data/executor/tiny-moe-shared-overlap-2.json",
                                           "tests/data/executor/tiny-deepseek-2.json",
                                           "tests/data/executor/tiny-oss-2.json",
                                           "tests/data/executor/tiny-oss-cp-2.json",
                                           "tests/data/executor/tiny-oss-ag-2.json",
                                           "tests/data/executor/tiny-hcp-4.json",
                                           "examples/llava-7b-8xh100-compare.json",
                                           "examples/long-context-16xh100-compare.json",
                                           "validation/runs/nemo-24.07-llama3-8b-8xh100-fp8.json"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string n = std::filesystem::path(info.param).stem().string();
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

// What the multi-edit cases found, pinned. A billion-sample batch made a heterogeneous
// plan's memory estimate walk its schedule micro-batch by micro-batch (68 s, 12 GB) before
// the task count refused it; now the count comes first.
TEST(FoundByMutation, AHeterogeneousPlanTooLargeToSimulateIsRefusedBeforeItsMemory) {
  const std::filesystem::path file =
      std::filesystem::path(HETPAR_SOURCE_DIR) / "examples/llava-7b-8xh100-compare.json";
  nlohmann::json doc = hetpar::testing::read_json_file(file.string());
  doc["workload"]["global_batch"] = 960'000'000;
  auto s = parse_scenario_text(doc.dump(), "m.json", file.parent_path().string());
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  for (const auto& [name, plan] : s->plans) {
    if (plan.placement == Placement::kHomogeneous) continue;
    SCOPED_TRACE(name);
    auto m = evaluate(*s, plan);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    EXPECT_FALSE(m->feasible);
    EXPECT_EQ(m->infeasible_reason.rfind("too large to simulate: about ", 0), 0u)
        << m->infeasible_reason;
    EXPECT_EQ(m->memory.peak, Bytes(0));  // refused before the memory estimate ran
  }
}

// tp 10000 x dp 2^20, each within its bound, made Layout::world() overflow an int (the
// message said 1895825408 GPUs).
TEST(FoundByMutation, ALayoutOfMoreGPUsThanTheBoundIsRefusedByTheReader) {
  const std::filesystem::path file =
      std::filesystem::path(HETPAR_SOURCE_DIR) / "examples/llava-7b-8xh100-compare.json";
  nlohmann::json doc = hetpar::testing::read_json_file(file.string());
  doc["plans"]["colocated"]["tp"] = 10000;
  doc["plans"]["colocated"]["dp"] = 1 << 20;
  auto s = parse_scenario_text(doc.dump(), "m.json", file.parent_path().string());
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.status().message(),
            "m.json: plans.colocated.dp: tp 10000 x cp 1 x pp 1 x dp 1048576 = 10485760000 GPUs, "
            "over the bound of 1048576");
  doc["plans"]["colocated"]["tp"] = 1 << 20;
  doc["plans"]["colocated"]["pp"] = 1 << 20;
  doc["plans"]["colocated"]["cp"] = 1 << 20;
  s = parse_scenario_text(doc.dump(), "m.json", file.parent_path().string());
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find("= 1208925819614629174706176 GPUs"), std::string::npos)
      << s.status().message();  // 2^80, not a wrapped int64
}

// The search section: every single edit of a search over the tiny VLM that sets every
// field, each refused with a message or searched to a result whose families each hold a
// best plan or say why none (a crash, a hang or an empty explanation fails); then 100 cases
// of its numbers edited two or three at once. The stop-38 fuzzer ran 50 such cases by hand.
TEST(SearchMutation, EverySingleEditOfTheSearchSectionIsRefusedOrSearched) {
  const std::filesystem::path file =
      std::filesystem::path(HETPAR_SOURCE_DIR) / "tests/data/executor/tiny-vlm-2.json";
  nlohmann::json doc = hetpar::testing::read_json_file(file.string());
  doc.erase("plan");
  doc["search"] = {{"llm", {{"tp", 2}, {"recompute", "selective"}, {"fsdp", "any"}}},
                   {"modules", {{"vision", {{"tp", 1}}}}},
                   {"forbid_placements", {"non_colocated"}},
                   {"max_memory_GiB", 70},
                   {"schedule", "1f1b"},
                   {"allow_cross_node_tp", false},
                   {"top_k", 3},
                   {"max_sim_tasks", 3000000}};
  const std::string dir = file.parent_path().string();
  // Only the search section is mutated; the rest of the file is covered above.
  nlohmann::json section = {{"search", doc["search"]}};
  int refused = 0, errors = 0, searched = 0;
  auto check = [&](const std::string& what, const nlohmann::json& m) {
    SCOPED_TRACE(what);
    nlohmann::json full = doc;
    if (m.contains("search"))
      full["search"] = m["search"];
    else
      full.erase("search");
    auto s = parse_scenario_text(full.dump(), "m.json", dir);
    if (!s.is_ok()) {
      EXPECT_NE(s.status().message().find("m.json"), std::string::npos) << s.status().message();
      ++refused;
      return;
    }
    SearchOptions o;
    o.threads = 1;
    auto r = search(*s, o);
    if (!r.is_ok()) {
      EXPECT_FALSE(r.status().message().empty());
      ++errors;
      return;
    }
    ASSERT_EQ(r->families.size(), 3u);
    for (const FamilyResult& f : r->families) EXPECT_TRUE(f.best || !f.why_none.empty());
    for (const RankedPlan& rp : r->top)
      EXPECT_TRUE(rp.metrics.feasible && rp.metrics.iteration_time > Time::zero());
    ++searched;
  };
  hetpar::testing::for_each_mutation(section, check);
  hetpar::testing::for_each_multi_edit(section, 100, /*seed=*/20261205, check);
  EXPECT_GT(refused, 0);
  EXPECT_GT(searched, 0);
  RecordProperty("refused", refused);
  RecordProperty("errors", errors);
  RecordProperty("searched", searched);
}

}  // namespace
}  // namespace hetpar::planner

#include "hetpar/planner/published_run.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace hetpar::planner {
namespace {

// A run file with `measured` as its measured block, loaded and removed again.
Result<PublishedRun> load_run(const std::string& measured) {
  const std::string path = fmt::format("{}/run_{}.json", ::testing::TempDir(), ::getpid());
  std::ofstream(path) << R"({"name": "r", "model": "gpt3-175b",
    "workload": {"seq_len": 2048, "global_batch": 1536},
    "cluster": {"profile": "dgx-a100-80gb", "nodes": 128},
    "plan": {"tp": 8, "pp": 8, "dp": 16, "micro_batch": 1},
    "measured": )" << measured
                      << "}";
  Result<PublishedRun> run = load_published_run(path);
  std::filesystem::remove(path);
  return run;
}

TEST(PublishedRun, TokensPerSecondGivesIterationTime) {
  auto run = load_run(
      R"({"metric": "tokens_per_s_per_gpu", "value": 100, "convention": "tokens", "source": "x"})");
  ASSERT_TRUE(run.is_ok()) << run.status().to_string();
  // 2048 * 1536 tokens at 100 tokens/s on each of 1024 GPUs.
  EXPECT_EQ(measured_iteration_time(*run), Time::seconds(2048.0 * 1536 / (100.0 * 1024)));
}

TEST(PublishedRun, MegatronTflopsUseTheRecomputeFormula) {
  auto run = load_run(
      R"({"metric": "tflops_per_gpu", "value": 138, "convention": "megatron-2021", "source": "x"})");
  ASSERT_TRUE(run.is_ok()) << run.status().to_string();
  const double B = 1536, s = 2048, l = 96, h = 12288, V = 51200;
  double f = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
  EXPECT_DOUBLE_EQ(convention_flops(run->scenario, FlopConvention::kMegatron2021).count(), f);
  EXPECT_NEAR(measured_iteration_time(*run).to_seconds(), f / (138e12 * 1024), 1e-9);
  // Korthikanti's model FLOPs are 3/4 of the recompute count up to the logits term.
  double k = convention_flops(run->scenario, FlopConvention::kKorthikanti2022).count();
  EXPECT_NEAR(k / f, 0.75, 0.01);
}

TEST(PublishedRun, MfuNeedsAConventionAndNamesTheField) {
  auto run = load_run(R"({"metric": "mfu", "value": 0.4, "source": "x"})");
  ASSERT_FALSE(run.is_ok());
  EXPECT_NE(run.status().message().find("measured.convention"), std::string::npos)
      << run.status().message();
  auto bad = load_run(R"({"metric": "speed", "value": 1, "source": "x"})");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("measured.metric: unknown value \"speed\""),
            std::string::npos)
      << bad.status().message();
}

TEST(PublishedRun, ShippedRunsLoad) {
  int n = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(std::string(HETPAR_SOURCE_DIR) + "/validation/runs")) {
    auto run = load_published_run(e.path().string());
    EXPECT_TRUE(run.is_ok()) << run.status().to_string();
    if (run.is_ok()) {
      EXPECT_EQ(run->scenario.plan->layout.world(), run->scenario.cluster.total_gpus()) << e.path();
      EXPECT_GT(measured_iteration_time(*run), Time::zero());
    }
    ++n;
  }
  EXPECT_GE(n, 15);
}

// Runs group by source document; an unpredicted run counts as a run but not in the errors.
TEST(PublishedRun, SummarizesBySource) {
  auto row = [](std::string source, bool feasible, double error) {
    RunComparison r;
    r.source = std::move(source);
    r.predicted.feasible = feasible;
    r.error = error;
    return r;
  };
  auto s = summarize_by_source(
      {row("a", true, 0.10), row("b", true, -0.30), row("a", true, -0.20), row("a", false, 9.0)});
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].source, "a");
  EXPECT_EQ(s[0].runs, 3);
  EXPECT_EQ(s[0].predicted, 2);
  EXPECT_NEAR(s[0].mean_abs_error, 0.15, 1e-12);
  EXPECT_NEAR(s[0].max_abs_error, 0.20, 1e-12);
  EXPECT_EQ(s[1].source, "b");
  EXPECT_NEAR(s[1].mean_abs_error, 0.30, 1e-12);
}

// compare() names the source document without its rendered-page link.
TEST(PublishedRun, ComparisonCarriesTheSourceDocument) {
  auto run = load_published_run(std::string(HETPAR_SOURCE_DIR) +
                                "/validation/runs/nemo-24.07-llama3-8b-8xh100-fp8.json");
  ASSERT_TRUE(run.is_ok()) << run.status().to_string();
  auto c = compare(*run);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->source.find("https://github.com/NVIDIA/NeMo/blob/"), 0u) << c->source;
  EXPECT_EQ(c->source.find("rendered"), std::string::npos) << c->source;
}

}  // namespace
}  // namespace hetpar::planner

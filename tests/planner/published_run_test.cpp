#include "hetpar/planner/published_run.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace hetpar::planner {
namespace {

// GPT-3 175B on 1024 A100: a run file's fields but `measured`, without braces.
constexpr const char* kGpt3Run = R"("name": "r", "model": "gpt3-175b",
    "workload": {"seq_len": 2048, "global_batch": 1536},
    "cluster": {"profile": "dgx-a100-80gb", "nodes": 128},
    "plan": {"tp": 8, "pp": 8, "dp": 16, "micro_batch": 1})";

// A run file of `run_fields` with `measured` as its measured block, loaded and removed again.
Result<PublishedRun> load_run(const std::string& measured,
                              const std::string& run_fields = kGpt3Run) {
  const std::string path = fmt::format("{}/run_{}.json", ::testing::TempDir(), ::getpid());
  std::ofstream(path) << "{" << run_fields << R"(, "measured": )" << measured << "}";
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

// Megatron-Core's count (what Megatron-LM logs as TFLOP/s/GPU): for a dense GPT it is
// Korthikanti's with causal attention as half (s/12h for s/6h); for Qwen3-30B-A3B it counts
// the 8 routed experts' gated MLPs, grouped-query attention with its 128-wide heads (32 x 128
// = 2h) and the untied logits: 23.0 GFLOP a token.
TEST(PublishedRun, MegatronCoreCountsRoutedExpertsGqaAndCausalAttention) {
  auto gpt = load_run(
      R"({"metric": "tflops_per_gpu", "value": 150, "convention": "megatron-core", "source": "x"})");
  ASSERT_TRUE(gpt.is_ok()) << gpt.status().to_string();
  const double B = 1536, s = 2048, l = 96, h = 12288, V = 51200;
  EXPECT_NEAR(convention_flops(gpt->scenario, FlopConvention::kMegatronCore).count() /
                  (72 * B * s * l * h * h * (1 + s / (12 * h) + V / (12 * l * h))),
              1.0, 1e-12);
  auto qwen = load_run(
      R"({"metric": "tflops_per_gpu", "value": 234.1, "convention": "megatron-core",
          "source": "x"})",
      R"("name": "q", "model": "qwen3-30b-a3b", "workload": {"seq_len": 4096,
         "global_batch": 256, "precision": "bf16"}, "cluster": {"profile": "dgx-h100",
         "nodes": 4}, "plan": {"tp": 1, "pp": 1, "dp": 32, "ep": 8, "micro_batch": 1})");
  ASSERT_TRUE(qwen.is_ok()) << qwen.status().to_string();
  const double per_token = 12.0 * 48 * 2048 * (768 * 8 * 1.5) +
                           12.0 * 48 * 2048 * 2048 * (1 + 4.0 / 32 + 4096.0 / 2048 / 2) * 2 +
                           6.0 * 2048 * 151936;
  EXPECT_NEAR(convention_flops(qwen->scenario, FlopConvention::kMegatronCore).count() /
                  (256.0 * 4096 * per_token),
              1.0, 1e-12);
  EXPECT_NEAR(per_token, 23.0e9, 0.05e9);
  // Not for latent attention, whose projections Megatron counts otherwise.
  auto mla = load_run(
      R"({"metric": "tflops_per_gpu", "value": 300, "convention": "megatron-core", "source": "x"})",
      R"("name": "d", "model": "deepseek-v3", "workload": {"seq_len": 4096,
         "global_batch": 1024}, "cluster": {"profile": "dgx-h100", "nodes": 128},
         "plan": {"tp": 1, "pp": 16, "dp": 64, "ep": 64, "micro_batch": 1})");
  ASSERT_FALSE(mla.is_ok());
  EXPECT_NE(mla.status().message().find("measured.convention: megatron-core"), std::string::npos)
      << mla.status().message();
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

// compare_all() runs the comparisons on threads: each slot holds its own run's comparison,
// as compare() alone gives it, at any thread count.
TEST(PublishedRun, CompareAllGivesEachRunItsOwnComparison) {
  std::vector<PublishedRun> runs;
  for (const char* name :
       {"nemo-24.07-llama3-8b-8xh100-fp8", "megatron-2022-gpt-22b-8xa100-full",
        "torchtitan-2025.06-llama3-8b-32xh200-fp8", "megatron-2022-gpt-22b-8xa100-selective",
        "dgxc-25.04-llama31-8b-8xh100-bf16"}) {
    auto run =
        load_published_run(fmt::format("{}/validation/runs/{}.json", HETPAR_SOURCE_DIR, name));
    ASSERT_TRUE(run.is_ok()) << run.status().to_string();
    runs.push_back(std::move(run).value());
  }
  for (int threads : {1, 2, 3}) {
    const auto all = compare_all(runs, threads);
    ASSERT_EQ(all.size(), runs.size());
    for (size_t i = 0; i < runs.size(); ++i) {
      const auto alone = compare(runs[i]);
      ASSERT_TRUE(alone.is_ok() && all[i].is_ok()) << runs[i].scenario.name;
      EXPECT_EQ(all[i]->name, runs[i].scenario.name) << threads;
      EXPECT_EQ(all[i]->predicted.iteration_time, alone->predicted.iteration_time) << i;
      EXPECT_EQ(all[i]->error, alone->error) << i;
    }
  }
}

}  // namespace
}  // namespace hetpar::planner

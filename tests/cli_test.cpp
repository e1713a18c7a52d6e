// End-to-end tests of the `hetpar` binary: the shipped examples work, --json output is
// JSON, and a corpus of bad scenarios each fails with exit code 2 and a message naming
// the JSON path of the problem.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

namespace {

struct CliRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// This process's scratch directory: ctest runs tests in parallel processes, so each keeps
// its files apart, and removes them when its tests end (ScratchCleanup).
std::string scratch(const std::string& name) {
  static const std::filesystem::path dir = [] {
    std::filesystem::path d =
        std::filesystem::path(::testing::TempDir()) / fmt::format("hetpar_cli_test.{}", ::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return (dir / name).string();
}

class ScratchCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(std::filesystem::path(scratch("x")).parent_path(), ignored);
  }
};
const auto* const kScratchCleanup = ::testing::AddGlobalTestEnvironment(new ScratchCleanup);

CliRun run(const std::string& args) {
  std::string out = scratch("cli_out.txt");
  std::string err = scratch("cli_err.txt");
  std::string cmd = fmt::format("{} {} >{} 2>{}", HETPAR_BINARY, args, out, err);
  int status = std::system(cmd.c_str());
  CliRun r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

std::string write_temp(const std::string& name, const std::string& text) {
  std::string path = scratch(name);
  std::ofstream(path) << text;
  return path;
}

std::string example(const std::string& name) {
  return std::string(HETPAR_SOURCE_DIR) + "/examples/" + name;
}

TEST(Cli, InspectsEveryShippedExample) {
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(HETPAR_SOURCE_DIR) + "/examples")) {
    if (entry.path().extension() != ".json") continue;
    CliRun r = run("inspect " + entry.path().string());
    EXPECT_EQ(r.exit_code, 0) << entry.path() << ": " << r.err;
    EXPECT_NE(r.out.find("Model FLOPs per iteration"), std::string::npos) << entry.path();
  }
}

TEST(Cli, InspectJsonHasTheDefaultModelNumbers) {
  CliRun r = run("inspect --json " + example("default.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["model"], "llava-1.5-7b");
  ASSERT_EQ(j["modules"].size(), 3u);
  // LLaVA-1.5-7B: 7.06B parameters (CLIP ViT-L/14-336 304M + projector 21M + Vicuna 6.74B).
  EXPECT_NEAR(j["params"]["total"].get<double>(), 7.06e9, 0.5e-2 * 7.06e9);
  EXPECT_EQ(j["modules"][0]["tokens_per_sample"], 577);  // 24x24 patches + class token
  EXPECT_EQ(j["cluster"]["gpus"], 64);
  EXPECT_DOUBLE_EQ(j["cluster"]["peak_flops"].get<double>(), 64 * 989.4e12);
  // Ideal iteration time = model FLOPs / cluster peak.
  EXPECT_NEAR(j["cluster"]["ideal_iteration_time_s"].get<double>(),
              j["model_flops_per_iteration"].get<double>() / (64 * 989.4e12), 1e-9);
  EXPECT_EQ(j["cluster"]["groups"][0]["nvls"], true);  // the DGX H100's
}

// A cluster with NVLS switched off says so (the DGX Cloud Benchmarking rows set it).
TEST(Cli, InspectSaysWhereNvlsIsOff) {
  const std::string row =
      std::string(HETPAR_SOURCE_DIR) + "/validation/runs/dgxc-25.04-llama31-8b-8xh100-bf16.json";
  CliRun r = run("inspect --json " + row);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["cluster"]["groups"][0]["nvls"], false);
  r = run("inspect " + row);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("(NVLS)"), std::string::npos) << r.out;
  r = run("inspect " + example("default.json"));
  EXPECT_NE(r.out.find("per GPU (NVLS),"), std::string::npos) << r.out;
}

TEST(Cli, ListsModelsAndHardware) {
  CliRun models = run("models --json");
  ASSERT_EQ(models.exit_code, 0) << models.err;
  auto zoo = nlohmann::json::parse(models.out);
  std::set<std::string> names;
  for (const auto& e : zoo) names.insert(e["name"]);
  for (const char* want :
       {"clip-vit-l-14-336", "siglip-so400m-patch14-384", "internvit-6b",
        "whisper-large-v3-encoder", "llama-2-7b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b",
        "qwen2.5-7b", "qwen2.5-72b", "mixtral-8x7b", "gpt3-175b", "llava-1.5-7b"})
    EXPECT_TRUE(names.count(want)) << want;
  CliRun hw = run("hardware --json");
  ASSERT_EQ(hw.exit_code, 0) << hw.err;
  auto profiles = nlohmann::json::parse(hw.out);
  std::set<std::string> pnames;
  for (const auto& p : profiles) pnames.insert(p["name"]);
  for (const char* want : {"dgx-a100-80gb", "dgx-h100", "dgx-h200", "dgx-b200", "rtx4090-node"})
    EXPECT_TRUE(pnames.count(want)) << want;
  EXPECT_EQ(run("models").exit_code, 0);
  EXPECT_EQ(run("hardware").exit_code, 0);
}

TEST(Cli, UsageErrorsExitTwo) {
  EXPECT_EQ(run("").exit_code, 2);
  EXPECT_EQ(run("frobnicate").exit_code, 2);
  EXPECT_EQ(run("inspect").exit_code, 2);
  EXPECT_EQ(run("--help").exit_code, 0);
  CliRun missing = run("inspect /nonexistent/scenario.json");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("/nonexistent/scenario.json: cannot open file"), std::string::npos);
}

const char* kSmallPlan = R"({"model": "gpt3-1.3b",
  "workload": {"seq_len": 1024, "global_batch": 16},
  "cluster": {"profile": "dgx-a100-80gb", "nodes": 1},
  "plan": {"tp": 2, "sp": true, "pp": 2, "dp": 2, "micro_batch": 1}})";

TEST(Cli, SimulateJsonHasTheDocumentedKeysAndWritesATrace) {
  std::string path = write_temp("small_plan.json", kSmallPlan);
  std::string trace = scratch("trace.json");
  CliRun r = run(fmt::format("simulate --json --trace {} {}", trace, path));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  for (const char* key : {"iteration_time_s", "tokens_per_s", "tflops_per_gpu", "mfu",
                          "peak_memory_bytes", "bubble_fraction", "feasible"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_TRUE(j["feasible"].get<bool>());
  double t = j["iteration_time_s"];
  EXPECT_GT(t, 0);
  EXPECT_NEAR(j["tokens_per_s"].get<double>(), 1024.0 * 16 / t, 1e-6 * 1024 * 16 / t);
  EXPECT_GT(j["mfu"].get<double>(), 0);
  EXPECT_LT(j["mfu"].get<double>(), 1);
  auto events = nlohmann::json::parse(slurp(trace));
  EXPECT_GT(events["traceEvents"].size(), 100u);
  CliRun text = run("simulate " + path);
  EXPECT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("Iteration time"), std::string::npos);
  EXPECT_EQ(text.out.find("Ops of one rank"), std::string::npos);
  // --ops adds one row per op of layer 0 and the layer's total.
  CliRun ops = run("simulate --ops " + path);
  EXPECT_EQ(ops.exit_code, 0) << ops.err;
  EXPECT_NE(ops.out.find("Ops of one rank, one micro-batch"), std::string::npos) << ops.out;
  for (const char* op : {"qkv", "attention", "attn_out", "mlp_fc1", "mlp_fc2", "layer total"})
    EXPECT_NE(ops.out.find(fmt::format("\n  {} ", op)), std::string::npos) << op;
  // --every-rank: every rank runs its own tasks (more of them, a process per rank in the
  // trace), the same iteration where the symmetry holds.
  std::string every_trace = scratch("every.json");
  CliRun every = run(fmt::format("simulate --json --every-rank --trace {} {}", every_trace, path));
  ASSERT_EQ(every.exit_code, 0) << every.err;
  auto e = nlohmann::json::parse(every.out);
  EXPECT_GT(e["tasks"].get<int64_t>(), j["tasks"].get<int64_t>());
  EXPECT_DOUBLE_EQ(e["iteration_time_s"].get<double>(), t);
  auto pids = [](const nlohmann::json& trace) {
    std::set<int> out;
    for (const auto& ev : trace["traceEvents"])
      if (ev.value("ph", "") == "X") out.insert(ev["pid"].get<int>());
    return out.size();
  };
  EXPECT_GT(pids(nlohmann::json::parse(slurp(every_trace))), pids(events));
}

// A validation run file is a scenario with a `measured` object: simulate takes it as is; a
// `measured` that is not an object is an error naming it.
TEST(Cli, SimulateTakesAValidationRunFile) {
  const std::string run_file = std::string(HETPAR_SOURCE_DIR) +
                               "/validation/runs/megatron-2022-gpt-22b-8xa100-selective.json";
  CliRun r = run("simulate --json " + run_file);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(nlohmann::json::parse(r.out)["feasible"].get<bool>());
  std::string bad = kSmallPlan;
  bad.insert(bad.rfind('}'), R"(, "measured": 3)");
  CliRun b = run("simulate " + write_temp("measured_not_object.json", bad));
  EXPECT_EQ(b.exit_code, 2);
  EXPECT_NE(b.err.find("measured: expected an object"), std::string::npos) << b.err;
}

// A model whose YaRN scales cos and sin is timed with unfused RoPE even where the plan fuses
// it: the text summary says why; a plain RoPE model's says nothing.
TEST(Cli, SimulateSaysWhyYarnRunsUnfusedRope) {
  CliRun r =
      run("simulate " + std::string(HETPAR_SOURCE_DIR) + "/tests/data/executor/tiny-oss-2.json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("RoPE       unfused: the model's YaRN scales cos and sin by 1.14"),
            std::string::npos)
      << r.out;
  CliRun plain = run("simulate " + write_temp("plain_rope.json", kSmallPlan));
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(plain.out.find("RoPE "), std::string::npos) << plain.out;
}

// DeepEP over two nodes: the summary says how many nodes a token reaches, 2 (1 - C(8, 2) /
// C(16, 2)) = 1.53 for 16 experts top-2 drawn evenly, exactly one when grouped routing keeps
// its experts in 1 of 2 groups (a node each); no line for the plain all-to-all.
TEST(Cli, SimulateSaysHowManyNodesDeepEpReaches) {
  const std::string file =
      std::string(HETPAR_SOURCE_DIR) + "/tests/data/executor/tiny-moe-deepep-16.json";
  CliRun r = run("simulate " + file);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("DeepEP     each token to 1.53 of the EP group's 2 nodes on average"),
            std::string::npos)
      << r.out;
  std::string text = slurp(file);
  // The copies sit elsewhere: the profile by its full path.
  const std::string profile = R"("cpu-host-8.json")";
  ASSERT_NE(text.find(profile), std::string::npos);
  text.replace(text.find(profile), profile.size(),
               "\"" + std::string(HETPAR_SOURCE_DIR) + "/tests/data/executor/cpu-host-8.json\"");
  const std::string moe = R"("expert_ffn_hidden": 128)";
  ASSERT_NE(text.find(moe), std::string::npos);
  std::string grouped = text;
  grouped.replace(grouped.find(moe), moe.size(), moe + R"(, "groups": 2, "group_topk": 1)");
  CliRun g = run("simulate " + write_temp("deepep_grouped.json", grouped));
  EXPECT_EQ(g.exit_code, 0) << g.err;
  EXPECT_NE(g.out.find("each token to 1.00 of the EP group's 2 nodes on average (once per node, "
                       "for its 2 routed copies): its experts in 1 of 2 groups"),
            std::string::npos)
      << g.out;
  std::string hybrid = text;  // HybridEP takes the same routes
  hybrid.replace(hybrid.find(R"("deepep")"), 8, R"("hybridep")");
  CliRun h = run("simulate " + write_temp("deepep_hybrid.json", hybrid));
  EXPECT_EQ(h.exit_code, 0) << h.err;
  EXPECT_NE(h.out.find("HybridEP   each token to 1.53 of the EP group's 2 nodes"),
            std::string::npos)
      << h.out;
  std::string plain = text;
  plain.replace(plain.find(R"("deepep")"), 8, R"("alltoall")");
  CliRun a = run("simulate " + write_temp("deepep_plain.json", plain));
  EXPECT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out.find("DeepEP "), std::string::npos) << a.out;
}

// `validation` summarises per source document: two runs of one paper, one of another.
TEST(Cli, ValidationSummarisesEachSource) {
  const std::string runs = std::string(HETPAR_SOURCE_DIR) + "/validation/runs/";
  const std::string dir = scratch("validation_runs");
  std::filesystem::create_directories(dir);
  for (const char* f :
       {"megatron-2022-gpt-22b-8xa100-selective.json",
        "megatron-2022-gpt-175b-64xa100-selective.json", "megatron-2021-gpt-1.7b-32xa100.json"})
    std::filesystem::copy_file(runs + f, dir + "/" + f,
                               std::filesystem::copy_options::overwrite_existing);
  CliRun r = run("validation --json " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["sources"].size(), 2u) << r.out;
  for (const auto& s : j["sources"]) {
    const int n = s["source"] == "https://arxiv.org/abs/2205.05198" ? 2 : 1;
    EXPECT_EQ(s["runs"].get<int>(), n) << s;
    EXPECT_LE(s["mean_abs_error"].get<double>(), s["max_abs_error"].get<double>()) << s;
  }
  // The runs within 10%: the count of the listed runs' |error| <= 0.10.
  int within = 0;
  for (const auto& row : j["runs"]) within += std::fabs(row["error"].get<double>()) <= 0.10;
  EXPECT_EQ(j["within_10_percent"].get<int>(), within);
  CliRun text = run("validation " + dir);
  EXPECT_NE(text.out.find("By source"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find(fmt::format(", {} within 10%", within)), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("%  https://arxiv.org/abs/2104.04473"), std::string::npos) << text.out;
}

TEST(Cli, SimulateInfeasiblePlanExitsThreeAndWritesNoTrace) {
  std::string bad = kSmallPlan;
  bad.replace(bad.find(R"("tp": 2)"), 7, R"("tp": 3)");
  std::string path = write_temp("infeasible_plan.json", bad);
  std::string trace = scratch("none.json");
  CliRun r = run(fmt::format("simulate --trace {} {}", trace, path));
  EXPECT_EQ(r.exit_code, 3);
  CliRun ops = run("simulate --ops " + path);  // no ops for a layout that cannot run
  EXPECT_EQ(ops.exit_code, 3);
  EXPECT_EQ(ops.out.find("Ops of one rank"), std::string::npos);
  EXPECT_NE(r.err.find("infeasible"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(trace));
  std::string no_plan = write_temp("no_plan.json", R"({"model": "gpt3-1.3b",
    "workload": {"seq_len": 1024, "global_batch": 16},
    "cluster": {"profile": "dgx-a100-80gb", "nodes": 1}})");
  CliRun missing = run("simulate " + no_plan);
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("plan: missing required object"), std::string::npos) << missing.err;
}

// A plan the memory model refuses says what does not fit: each stage's breakdown, in text and
// JSON, and exit 3; compare gives each such plan's tightest stage.
TEST(Cli, SimulateAPlanOutOfMemoryShowsEachStagesBreakdown) {
  std::string path = write_temp("oom_plan.json", R"({"model": "llama-3.1-70b",
    "workload": {"seq_len": 4096, "global_batch": 8},
    "cluster": {"profile": "dgx-a100-80gb", "nodes": 1},
    "plan": {"tp": 4, "sp": true, "pp": 2, "dp": 1, "micro_batch": 1}})");
  CliRun text = run("simulate " + path);
  EXPECT_EQ(text.exit_code, 3);
  EXPECT_NE(text.out.find("Infeasible: out of memory"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("Memory per GPU by pipeline stage"), std::string::npos) << text.out;
  for (const char* stage : {"\n  stage 0 ", "\n  stage 1 "})
    EXPECT_NE(text.out.find(stage), std::string::npos) << stage << text.out;
  EXPECT_NE(text.out.find("of 80 GiB, over by"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("optimizer"), std::string::npos) << text.out;
  CliRun json = run("simulate --json " + path);
  EXPECT_EQ(json.exit_code, 3);
  auto j = nlohmann::json::parse(json.out);
  EXPECT_FALSE(j["feasible"].get<bool>());
  ASSERT_EQ(j["memory_per_stage"].size(), 2u) << j;
  int64_t peak = 0;
  for (const auto& st : j["memory_per_stage"]) {
    int64_t sum = 0;
    for (const char* k : {"weights", "gradients", "optimizer_state", "activations",
                          "communication_buffers", "workspace"})
      sum += st[k].get<int64_t>();
    EXPECT_NEAR(static_cast<double>(sum), st["total"].get<double>(), 8) << st;
    EXPECT_EQ(st["capacity"].get<int64_t>(), int64_t{80} << 30);
    peak = std::max(peak, st["total"].get<int64_t>());
  }
  EXPECT_EQ(j["peak_memory_bytes"].get<int64_t>(), peak);
  EXPECT_GT(peak, j["memory_capacity_bytes"].get<int64_t>());
  // compare: under each plan that does not fit, its tightest stage's breakdown.
  std::string plans = write_temp("oom_plans.json", R"({"model": "llama-3.1-70b",
    "workload": {"seq_len": 4096, "global_batch": 8},
    "cluster": {"profile": "dgx-a100-80gb", "nodes": 1},
    "plans": {"tp4-pp2": {"tp": 4, "sp": true, "pp": 2, "dp": 1, "micro_batch": 1},
              "tp8": {"tp": 8, "sp": true, "dp": 1, "micro_batch": 1}}})");
  CliRun compare = run("compare " + plans);
  EXPECT_EQ(compare.exit_code, 3);
  EXPECT_NE(compare.out.find("tp4-pp2          infeasible: out of memory"), std::string::npos)
      << compare.out;
  int breakdowns = 0;  // one under each of the two plans
  for (size_t at = compare.out.find("\n                 stage 0: weights ");
       at != std::string::npos;
       at = compare.out.find("\n                 stage 0: weights ", at + 1))
    ++breakdowns;
  EXPECT_EQ(breakdowns, 2) << compare.out;
  // A plan refused before its memory is estimated has no breakdown to show.
  std::string bad = kSmallPlan;
  bad.replace(bad.find(R"("tp": 2)"), 7, R"("tp": 3)");
  CliRun layout = run("simulate --json " + write_temp("bad_layout.json", bad));
  EXPECT_EQ(layout.exit_code, 3);
  EXPECT_FALSE(nlohmann::json::parse(layout.out).contains("memory_per_stage")) << layout.out;
}

TEST(Cli, SimulateProfileReplacesTheClustersProfile) {
  std::string path = write_temp("small_plan_profile.json", kSmallPlan);
  CliRun a100 = run("simulate --json " + path);
  CliRun h100 = run("simulate --json --profile dgx-h100 " + path);
  ASSERT_EQ(a100.exit_code, 0) << a100.err;
  ASSERT_EQ(h100.exit_code, 0) << h100.err;
  EXPECT_LT(nlohmann::json::parse(h100.out)["iteration_time_s"].get<double>(),
            0.8 * nlohmann::json::parse(a100.out)["iteration_time_s"].get<double>());
  // A profile file (here: the built-in written out) works the same as its name.
  std::string file = write_temp("h100_profile.json", run("hardware --json").out);
  auto all = nlohmann::json::parse(slurp(file));
  for (const auto& p : all)
    if (p["name"] == "dgx-h100") std::ofstream(file) << p.dump();
  CliRun from_file = run(fmt::format("simulate --json --profile {} {}", file, path));
  ASSERT_EQ(from_file.exit_code, 0) << from_file.err;
  EXPECT_EQ(nlohmann::json::parse(from_file.out)["iteration_time_s"],
            nlohmann::json::parse(h100.out)["iteration_time_s"]);

  CliRun unknown = run("simulate --profile no-such-profile " + path);
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.err.find("--profile: unknown profile \"no-such-profile\""), std::string::npos)
      << unknown.err;
  std::string two_groups = kSmallPlan;
  two_groups.replace(two_groups.find(R"({"profile": "dgx-a100-80gb", "nodes": 1})"), 40,
                     R"({"node_groups": [{"profile": "dgx-a100-80gb", "nodes": 1},
                                         {"profile": "dgx-h100", "nodes": 1}]})");
  CliRun hetero = run("simulate --profile dgx-h100 " + write_temp("two_groups.json", two_groups));
  EXPECT_EQ(hetero.exit_code, 2);
  EXPECT_NE(hetero.err.find("--profile: the cluster has 2 node groups"), std::string::npos)
      << hetero.err;
}

TEST(Cli, CalibrateRejectsAnUnknownBackend) {
  CliRun r = run("calibrate --backend tpu");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("tpu"), std::string::npos) << r.err;
}

TEST(Cli, CompareNamesAWinnerAndExplainsIt) {
  CliRun r = run("compare --json " + example("llava-7b-8xh100-compare.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j["plans"].contains("homogeneous"));
  std::string winner = j["winner"];
  ASSERT_TRUE(j["plans"].contains(winner));
  double best = j["plans"][winner]["iteration_time_s"];
  for (const auto& [name, p] : j["plans"].items()) {
    if (p["feasible"].get<bool>()) {
      EXPECT_LE(best, p["iteration_time_s"].get<double>()) << name;
    }
  }
  CliRun text = run("compare " + example("llava-7b-8xh100-compare.json"));
  EXPECT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("Winner: " + winner), std::string::npos) << text.out;
  // A plan name longer than the column widens it: every row's iteration ends under the
  // header's "iteration".
  CliRun fsdp = run("compare " + example("llama3-8b-8xh100-fsdp-compare.json"));
  ASSERT_EQ(fsdp.exit_code, 0) << fsdp.err;
  std::string renamed = slurp(example("llama3-8b-8xh100-fsdp-compare.json"));
  renamed.replace(renamed.find("\"fsdp_kept\""), 11, "\"fsdp_kept_gathered_until_backward\"");
  CliRun wide = run("compare " + write_temp("wide_names.json", renamed));
  ASSERT_EQ(wide.exit_code, 0) << wide.err;
  const size_t header = wide.out.find("plan ");
  const size_t header_end = wide.out.find("iteration", header) + std::string("iteration").size();
  const size_t column = header_end - header;
  const size_t row = wide.out.find("fsdp_kept_gathered_until_backward ");
  ASSERT_NE(row, std::string::npos) << wide.out;
  const size_t line_end = wide.out.find('\n', row);
  ASSERT_GT(line_end - row, column);
  EXPECT_EQ(wide.out.substr(row + column - 2, 2), " s") << wide.out;
  // The per-phase table names it in full too.
  const size_t phases = wide.out.find("Time by phase");
  ASSERT_NE(phases, std::string::npos) << wide.out;
  EXPECT_NE(wide.out.find(" fsdp_kept_gathered_until_backward", phases), std::string::npos)
      << wide.out;
  CliRun no_plans = run("compare " + example("default.json"));
  EXPECT_EQ(no_plans.exit_code, 2);
  EXPECT_NE(no_plans.err.find("plans: missing required object"), std::string::npos);
}

// A small scenario for `plan` (one node, a short batch): searched in well under a second.
std::string small_plan_scenario(const std::string& name, const std::string& search = "") {
  return write_temp(name, fmt::format(R"({{"name": "small", "model": "llava-1.5-7b",
      "workload": {{"seq_len": 2048, "global_batch": 16, "images_per_sample": 1}},
      "cluster": {{"profile": "dgx-h100", "nodes": 1}},
      "plans": {{"h": {{"tp": 8, "micro_batch": 1}}}}{}}})",
                                      search.empty() ? "" : ", \"search\": " + search));
}

// The mixed-cluster example (4 DGX A100 + 4 DGX H100): homogeneous and colocated plans run
// at the A100s' pace, so the planner gives the LLM the H100s (ranks 32-63) and the vision
// encoder the A100s, and the written plan simulates to the reported time.
// Golden: on 4 DGX A100 + 4 DGX H100 the search sizes the LLM's two pipeline stages to their
// GPUs (8 layers on the A100s, 24 on the H100s, over their virtual stages), which beats
// giving the A100s to the vision encoder alone (non-colocated) and an even split.
TEST(Cli, PlansTheMixedClusterExampleWithStagesSizedToTheirGpus) {
  const std::string out = scratch("mixed.plan.json");
  CliRun r = run(fmt::format("plan --json --threads 2 --out {} {}", out,
                             example("llava-7b-a100-h100-mixed.json")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  const auto& plan = j["best"]["plan"];
  EXPECT_FALSE(plan.contains("placement"));  // homogeneous: the plain plan section
  ASSERT_EQ(plan["pp"], 2);
  int stage[2] = {0, 0};  // layers per stage over its virtual stages (c·pp + s)
  for (size_t v = 0; v < plan["pipeline_layout"].size(); ++v)
    stage[v % 2] += plan["pipeline_layout"][v].get<int>();
  EXPECT_EQ(stage[0], 8);
  EXPECT_EQ(stage[1], 24);
  const double best = j["best"]["metrics"]["iteration_time_s"];
  EXPECT_LT(best, j["families"]["non_colocated"]["metrics"]["iteration_time_s"].get<double>());
  CliRun sim = run("simulate --json " + out);
  ASSERT_EQ(sim.exit_code, 0) << sim.err;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(sim.out)["iteration_time_s"].get<double>(), best);
  // The same plan split evenly (16 | 16) runs at the A100s' pace.
  auto even = nlohmann::json::parse(slurp(out));
  even["plan"].erase("pipeline_layout");
  CliRun slow = run("simulate --json " + write_temp("mixed.even.json", even.dump()));
  ASSERT_EQ(slow.exit_code, 0) << slow.err;
  EXPECT_GT(nlohmann::json::parse(slow.out)["iteration_time_s"].get<double>(), 1.2 * best);
  // The text says which node types each stage got, with its layers.
  CliRun text = run(
      fmt::format("plan --threads 2 --out {} {}", out, example("llava-7b-a100-h100-mixed.json")));
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("node types: llm stage 0 (the encoders and 8 layers) on dgx-a100-80gb "
                          "(ranks 0-31), stage 1 (24 layers) on dgx-h100 (ranks 32-63)"),
            std::string::npos)
      << text.out;
}

TEST(Cli, PlanJsonHasTheDocumentedKeysAndTheWrittenPlanSimulates) {
  const std::string scenario = small_plan_scenario("plan.json");
  const std::string out = scratch("best.plan.json");
  std::filesystem::remove(out);
  CliRun r = run(fmt::format("plan --json --threads 2 --top 3 --out {} {}", out, scenario));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  for (const char* key : {"best", "families", "top", "counts", "rejections", "search_time_s"})
    EXPECT_TRUE(j.contains(key)) << key;
  for (const char* family : {"homogeneous", "colocated", "non_colocated"}) {
    ASSERT_TRUE(j["families"].contains(family)) << family;
    const auto& f = j["families"][family];
    EXPECT_TRUE(f.contains("plan"));
    EXPECT_TRUE(f.contains("metrics") || f.contains("reason")) << family;
  }
  EXPECT_LE(j["top"].size(), 3u);
  const auto& c = j["counts"];
  EXPECT_EQ(c["considered"].get<int64_t>(),
            c["rejected"].get<int64_t>() + c["pruned_dominated"].get<int64_t>() +
                c["pruned_bound"].get<int64_t>() + c["pruned_encoder"].get<int64_t>() +
                c["simulated"].get<int64_t>());
  const double best = j["best"]["metrics"]["iteration_time_s"];
  for (const auto& t : j["top"]) EXPECT_LE(best, t["metrics"]["iteration_time_s"].get<double>());

  // The plan file: the scenario with the winner as "plan", no "plans" or "search".
  ASSERT_TRUE(std::filesystem::exists(out));
  auto written = nlohmann::json::parse(slurp(out));
  EXPECT_TRUE(written.contains("plan"));
  EXPECT_FALSE(written.contains("plans"));
  EXPECT_EQ(written["plan"], j["best"]["plan"]);
  CliRun sim = run("simulate --json " + out);
  ASSERT_EQ(sim.exit_code, 0) << sim.err;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(sim.out)["iteration_time_s"].get<double>(), best);

  CliRun text = run(fmt::format("plan --out {} {}", out, scenario));
  EXPECT_EQ(text.exit_code, 0) << text.err;
  for (const char* part : {"Winner", "Best of each placement", "Top 5", "rejected by a constraint"})
    EXPECT_NE(text.out.find(part), std::string::npos) << part << "\n" << text.out;
}

TEST(Cli, PlanFileElsewhereStillFindsAProfileFileNamedRelatively) {
  // The scenario names its profile file relative to its own directory; the plan file goes
  // to another directory and must still find it.
  namespace fs = std::filesystem;
  const fs::path root = scratch("relprofile");
  fs::remove_all(root);
  fs::create_directories(root / "scenarios" / "profiles");
  fs::create_directories(root / "plans");
  for (const auto& p : nlohmann::json::parse(run("hardware --json").out))
    if (p["name"] == "dgx-h100")
      std::ofstream(root / "scenarios" / "profiles" / "h100.json") << p.dump();
  const fs::path scenario = root / "scenarios" / "s.json";
  std::ofstream(scenario) << R"({"name": "small", "model": "llava-1.5-7b",
      "workload": {"seq_len": 2048, "global_batch": 16, "images_per_sample": 1},
      "cluster": {"profile": "profiles/h100.json", "nodes": 1},
      "search": {"forbid_placements": ["colocated", "non_colocated"]}})";
  const fs::path out = root / "plans" / "best.plan.json";
  CliRun r = run(fmt::format("plan --out {} {}", out.string(), scenario.string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto written = nlohmann::json::parse(slurp(out.string()));
  EXPECT_EQ(written["cluster"]["profile"], "../scenarios/profiles/h100.json");
  CliRun sim = run("simulate --json " + out.string());
  EXPECT_EQ(sim.exit_code, 0) << sim.err;
  // Built-in profile names are left alone.
  const std::string builtin = small_plan_scenario("builtin.json");
  const fs::path out2 = root / "plans" / "builtin.plan.json";
  ASSERT_EQ(run(fmt::format("plan --out {} {}", out2.string(), builtin)).exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(slurp(out2.string()))["cluster"]["profile"], "dgx-h100");
  fs::remove_all(root);
}

TEST(Cli, PlanRejectsABadSearchSectionAndReportsNoFeasiblePlan) {
  const std::string out = scratch("never.plan.json");
  std::filesystem::remove(out);
  CliRun bad = run(fmt::format("plan --out {} {}", out,
                               small_plan_scenario("bad-search.json", R"({"llm": {"tpp": 2}})")));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("search.llm.tpp"), std::string::npos) << bad.err;
  CliRun none = run(fmt::format("plan --out {} {}", out,
                                small_plan_scenario("cap.json", R"({"max_memory_GiB": 1})")));
  EXPECT_EQ(none.exit_code, 3);
  EXPECT_NE(none.err.find("no feasible plan"), std::string::npos) << none.err;
  EXPECT_NE(none.err.find("memory cap"), std::string::npos) << none.err;
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(Cli, ExportPrintsEachFileAfterAHeader) {
  CliRun r = run("export " + example("gpt3-175b-1024xa100.json") + " --to megatron");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("==> launch.sh <==\n#!/bin/bash\n", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("--num-layers-per-virtual-pipeline-stage 6"), std::string::npos);
  CliRun bridge = run("export " + example("large-encoder-72xh100-compare.json") +
                      " --plan non_colocated --to megatron-bridge");
  ASSERT_EQ(bridge.exit_code, 0) << bridge.err;
  EXPECT_NE(bridge.out.find("==> megatron_bridge.yaml <=="), std::string::npos);
  EXPECT_NE(bridge.out.find("rank_offset: 8"), std::string::npos) << bridge.out;
}

TEST(Cli, ExportWritesFilesIntoOut) {
  const std::string dir = scratch("export_out");
  std::filesystem::remove_all(dir);
  CliRun r = run(fmt::format("export {} --plan non_colocated --to megatron-mimo --out {}",
                             example("llava-7b-8xh100-compare.json"), dir));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string launch = dir + "/launch.sh";
  ASSERT_TRUE(std::filesystem::exists(launch));
  EXPECT_NE(slurp(launch).find("--llm-offset 2"), std::string::npos);
  EXPECT_NE(std::filesystem::status(launch).permissions() & std::filesystem::perms::owner_exec,
            std::filesystem::perms::none);
  EXPECT_NE(r.out.find("wrote " + launch), std::string::npos) << r.out;
  // Missing parent directories are created; a file in the way is an error (exit 2).
  CliRun nested = run(fmt::format("export {} --to nanotron --out {}/a/b",
                                  example("gpt3-175b-1024xa100.json"), dir));
  EXPECT_EQ(nested.exit_code, 2);  // gpt3 is not a Llama: nanotron refuses, writes nothing
  EXPECT_FALSE(std::filesystem::exists(dir + "/a"));
  CliRun in_the_way = run(
      fmt::format("export {} --to megatron --out {}", example("gpt3-175b-1024xa100.json"), launch));
  EXPECT_EQ(in_the_way.exit_code, 2);
  EXPECT_NE(in_the_way.err.find("cannot create directory"), std::string::npos) << in_the_way.err;
  CliRun deep = run(fmt::format("export {} --to megatron --out {}/a/b",
                                example("gpt3-175b-1024xa100.json"), dir));
  EXPECT_EQ(deep.exit_code, 0) << deep.err;
  EXPECT_TRUE(std::filesystem::exists(dir + "/a/b/launch.sh"));
  std::filesystem::remove_all(dir);
}

TEST(Cli, ExportRefusalsWriteNothing) {
  const std::string dir = scratch("export_refused");
  std::filesystem::remove_all(dir);
  // A target that cannot express the plan: exit 2 with what it cannot express.
  CliRun r = run(
      fmt::format("export {} --to deepspeed --out {}", example("gpt3-175b-1024xa100.json"), dir));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("deepspeed cannot express this plan: virtual pipeline stages (vpp 2"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir));
  // An unknown target: exit 2 listing the valid ones.
  CliRun unknown = run("export " + example("gpt3-175b-1024xa100.json") + " --to alpa");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.err.find("unknown target \"alpa\" (valid: megatron, megatron-mimo, "
                             "megatron-bridge, torchtitan, deepspeed, nanotron)"),
            std::string::npos)
      << unknown.err;
  // An infeasible plan: exit 3, before anything is written.
  std::string bad = kSmallPlan;
  bad.replace(bad.find(R"("tp": 2)"), 7, R"("tp": 3)");
  CliRun infeasible =
      run(fmt::format("export {} --to megatron --out {}", write_temp("export_bad.json", bad), dir));
  EXPECT_EQ(infeasible.exit_code, 3);
  EXPECT_NE(infeasible.err.find("plan is infeasible"), std::string::npos) << infeasible.err;
  EXPECT_FALSE(std::filesystem::exists(dir));
  // No plan, or no plan of that name.
  CliRun no_plan = run("export " + example("default.json") + " --to megatron");
  EXPECT_EQ(no_plan.exit_code, 2);
  EXPECT_NE(no_plan.err.find("plan: missing required object"), std::string::npos);
  CliRun no_name =
      run("export " + example("llava-7b-8xh100-compare.json") + " --plan best --to megatron");
  EXPECT_EQ(no_name.exit_code, 2);
  EXPECT_NE(no_name.err.find("no plan named \"best\" (the section has: colocated, homogeneous, "
                             "non_colocated)"),
            std::string::npos)
      << no_name.err;
}

struct BadScenario {
  const char* name;
  const char* text;
  const char* expect;  // substring of the error message
};

const std::string kWorkload = R"("workload": {"seq_len": 4096, "global_batch": 64})";
const std::string kCluster = R"("cluster": {"profile": "dgx-h100", "nodes": 1})";

class BadScenarioTest : public ::testing::TestWithParam<BadScenario> {};

TEST_P(BadScenarioTest, FailsWithExitTwoAndNamesThePath) {
  const BadScenario& c = GetParam();
  std::string path = write_temp(std::string(c.name) + ".json", c.text);
  CliRun r = run("inspect " + path);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find(c.expect), std::string::npos) << "stderr: " << r.err;
  EXPECT_TRUE(r.out.empty()) << "stdout must stay empty on error: " << r.out;
}

const std::string kLlm = R"("model": "llama-3.1-8b", )";

// Texts are built once; the params keep pointers into these strings.
const std::vector<std::string>& bad_texts() {
  static const std::vector<std::string> texts = {
      "{\"model\": \"llama-3.1-8b\", ",  // 0: truncated, malformed
      R"({"model": "llama-9", )" + kWorkload + ", " + kCluster + "}",
      R"({"model": {"name": "m", "modules": [{"name": "llm", "kind": "llm", "spec": {"layers": 2, "hidden": 4096, "ffn_hidden": 11008, "heads": 30, "kv_heads": 30, "vocab": 32000, "activation": "swiglu", "norm": "rmsnorm"}}]}, )" +
          kWorkload + ", " + kCluster + "}",
      kLlm.substr(0, 0) +
          R"({"model": "llama-3.1-8b", "workload": {"seq_len": -5, "global_batch": 64}, )" +
          kCluster + "}",
      R"({"model": "llama-3.1-8b", "workload": {"global_batch": 64}, )" + kCluster + "}",
      R"({"model": "llama-3.1-8b", )" + kWorkload +
          R"(, "cluster": {"profile": "h300", "nodes": 1}})",
      R"({"model": "llama-3.1-8b", )" + kWorkload +
          R"(, "cluster": {"profile": "dgx-h100", "nodes": 0}})",
      R"({"model": "llama-3.1-8b", "workload": {"seq_len": 4096, "global_batch": 64, "precision": "fp4"}, )" +
          kCluster + "}",
      R"({"model": "llama-3.1-8b", "workload": {"seq_len": 4096, "global_batch": 64, "images_per_sample": 2}, )" +
          kCluster + "}",
      R"({"model": "llava-1.5-7b", "workload": {"seq_len": 1000, "global_batch": 64, "images_per_sample": 2}, )" +
          kCluster + "}",
      R"({"model": "llava-1.5-7b", "workload": {"seq_len": 4096, "global_batch": 64, "images_per_sample": 1, "image_size": 300}, )" +
          kCluster + "}",
      R"({"model": "llama-3.1-8b", )" + kWorkload + ", " + kCluster + R"(, "extra": 1})",
      R"({"model": "llama-3.1-8b", "workload": {"seq_len": "long", "global_batch": 64}, )" +
          kCluster + "}",
      R"({"model": "llama-3.1-8b", )" + kWorkload + "}",
      R"({"model": "llava-1.5-7b", "workload": {"seq_len": 4096, "global_batch": 64, "images_per_sample": 1, "tokens_per_image": 500}, )" +
          kCluster + "}",
      R"([1, 2, 3])",
      R"({"model": "llama-3.1-8b", )" + kWorkload + ", " + kCluster +
          R"(, "plan": {"micro_batch": 1, "dp": 8, "fp8_recipe": "current"}})",
      R"({"model": "llama-3.1-8b", )" + kWorkload + ", " + kCluster +
          R"(, "plan": {"micro_batch": 1, "dp": 8, "grad_reduce_dtype": "bfloat16"}})",
      R"({"model": "llama-3.1-8b", )" + kWorkload + ", " + kCluster +
          R"(, "plan": {"micro_batch": 1, "tp": 8, "sp": true, "tp_comm_overlap": "yes"}})",
      R"({"model": "llama-3.1-8b", )" + kWorkload + ", " + kCluster +
          R"(, "search": {"llm": {"tp_comm_overlap": "some"}}})",
      R"({"model": "qwen3-30b-a3b", )" + kWorkload + ", " + kCluster +
          R"(, "plan": {"micro_batch": 1, "dp": 8, "ep": 8, "ep_comm_overlap": 1}})",
      R"({"model": "qwen3-30b-a3b", )" + kWorkload + ", " + kCluster +
          R"(, "search": {"llm": {"ep_comm_overlap": "all"}}})",
      R"({"model": "llama-3.1-8b", )" + kWorkload + ", " + kCluster +
          R"(, "plan": {"micro_batch": 1, "dp": 8, "cross_entropy_fusion": "fused"}})",
      R"({"model": "llama-3.1-8b", )" + kWorkload + ", " + kCluster +
          R"(, "plan": {"micro_batch": 1, "dp": 8, "attention_kernel": "sdpa"}})",
      R"({"model": "llama-3.1-8b", )" + kWorkload + ", " + kCluster +
          R"(, "search": {"llm": {"attention_kernel": "fa2"}}})",
      R"({"model": "llama-3.1-8b", )" + kWorkload + ", " + kCluster +
          R"(, "plan": {"micro_batch": 1, "dp": 8, "repeat_kv": "yes"}})",
      R"({"model": "llama-3.1-8b", )" + kWorkload + ", " + kCluster +
          R"(, "search": {"llm": {"fused_projections": 0}}})",
      // A vision encoder with no images to encode (it aborted every command).
      R"({"model": "llava-1.5-7b", "workload": {"seq_len": 4096, "global_batch": 64}, )" +
          kCluster + "}",
  };
  return texts;
}

INSTANTIATE_TEST_SUITE_P(
    Corpus, BadScenarioTest,
    ::testing::Values(
        BadScenario{"malformed", bad_texts()[0].c_str(), "malformed JSON at byte"},
        BadScenario{"unknown_zoo", bad_texts()[1].c_str(), "model: unknown zoo entry \"llama-9\""},
        BadScenario{"heads_not_dividing", bad_texts()[2].c_str(), "model.modules[0].spec.heads"},
        BadScenario{"negative_seq", bad_texts()[3].c_str(),
                    "workload.seq_len: must be >= 1, got -5"},
        BadScenario{"missing_seq", bad_texts()[4].c_str(),
                    "workload.seq_len: missing required field"},
        BadScenario{"unknown_profile", bad_texts()[5].c_str(),
                    "cluster.profile: unknown profile \"h300\""},
        BadScenario{"zero_nodes", bad_texts()[6].c_str(), "cluster.nodes"},
        BadScenario{"bad_precision", bad_texts()[7].c_str(),
                    "workload.precision: unknown value \"fp4\""},
        BadScenario{"images_without_encoder", bad_texts()[8].c_str(), "workload.images_per_sample"},
        BadScenario{"tokens_exceed_seq", bad_texts()[9].c_str(),
                    "workload.seq_len: 1152 modality tokens"},
        BadScenario{"image_size_not_patch_multiple", bad_texts()[10].c_str(),
                    "workload.image_size: 300"},
        BadScenario{"unknown_top_level_field", bad_texts()[11].c_str(), "extra: unknown field"},
        BadScenario{"wrong_type", bad_texts()[12].c_str(), "workload.seq_len: expected an integer"},
        BadScenario{"missing_cluster", bad_texts()[13].c_str(), "cluster: missing required object"},
        BadScenario{"tokens_not_square", bad_texts()[14].c_str(), "workload.tokens_per_image: 500"},
        BadScenario{"not_an_object", bad_texts()[15].c_str(), "expected an object"},
        BadScenario{"unknown_fp8_recipe", bad_texts()[16].c_str(),
                    "plan.fp8_recipe: unknown value \"current\""},
        BadScenario{"unknown_grad_reduce_dtype", bad_texts()[17].c_str(),
                    "plan.grad_reduce_dtype: unknown value \"bfloat16\""},
        BadScenario{"tp_comm_overlap_not_bool", bad_texts()[18].c_str(),
                    "plan.tp_comm_overlap: expected"},
        BadScenario{"search_tp_comm_overlap_unknown", bad_texts()[19].c_str(),
                    "search.llm.tp_comm_overlap: unknown value \"some\""},
        BadScenario{"ep_comm_overlap_not_bool", bad_texts()[20].c_str(),
                    "plan.ep_comm_overlap: expected"},
        BadScenario{"search_ep_comm_overlap_unknown", bad_texts()[21].c_str(),
                    "search.llm.ep_comm_overlap: unknown value \"all\""},
        BadScenario{"unknown_cross_entropy_fusion", bad_texts()[22].c_str(),
                    "plan.cross_entropy_fusion: unknown value \"fused\""},
        BadScenario{"unknown_attention_kernel", bad_texts()[23].c_str(),
                    "plan.attention_kernel: unknown value \"sdpa\""},
        BadScenario{"search_unknown_attention_kernel", bad_texts()[24].c_str(),
                    "search.llm.attention_kernel: unknown value \"fa2\""},
        BadScenario{"repeat_kv_not_bool", bad_texts()[25].c_str(), "plan.repeat_kv: expected"},
        BadScenario{"search_fused_projections_not_bool", bad_texts()[26].c_str(),
                    "search.llm.fused_projections: expected"},
        BadScenario{"encoder_without_images", bad_texts()[27].c_str(),
                    "workload.images_per_sample: model \"llava-1.5-7b\" has a vision encoder, "
                    "which needs >= 1 image per sample"}),
    [](const ::testing::TestParamInfo<BadScenario>& info) { return std::string(info.param.name); });

}  // namespace

// CI check of a real cpu calibration (ctest runs `mpirun -np N hetpar calibrate --backend
// cpu --quick --out FILE` first, then this binary on FILE): the profile is valid and fully
// attributed, its GEMM samples agree with Eigen's speed measured here, its collective fits
// reproduce their own samples within the residual they report, and `hetpar simulate
// --profile FILE` accepts it.
// Usage: calibrate_cpu_check PROFILE.json HETPAR_BINARY
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "hetpar/hardware/system_profile.h"

namespace {

std::string g_profile;
std::string g_binary;

nlohmann::json calibration() {
  std::ifstream in(g_profile);
  return nlohmann::json::parse(in)["$calibration"];
}

// Fastest of 7 runs of an fp32 Eigen GEMM (column-major, as the cpu backend stores
// matrices), the cache flushed before each run as the calibration does.
double eigen_gemm_s(int64_t m, int64_t n, int64_t k) {
  Eigen::MatrixXf a = Eigen::MatrixXf::Random(m, k), b = Eigen::MatrixXf::Random(k, n);
  Eigen::MatrixXf c(m, n);
  std::vector<char> flush(64 << 20);  // larger than the CI machine's 32 MiB L3
  std::vector<double> t;
  for (int r = 0; r < 7; ++r) {
    std::fill(flush.begin(), flush.end(), static_cast<char>(r));
    const auto t0 = std::chrono::steady_clock::now();
    c.noalias() = a * b;
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  EXPECT_TRUE(std::isfinite(c(0, 0)));  // keeps the product observable
  return *std::min_element(t.begin(), t.end());
}

TEST(CalibratedCpuProfile, LoadsValidatesAndIsFullyAttributed) {
  auto p = hetpar::hardware::load_profile(g_profile);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_TRUE(hetpar::hardware::missing_provenance(*p).empty());
  const nlohmann::json c = calibration();
  EXPECT_EQ(c["backend"], "cpu");
  EXPECT_EQ(c["mode"], "quick");
  EXPECT_EQ(p->gpus_per_node, c["world"].get<int>());
  EXPECT_FALSE(c["samples"]["gemm"].empty());
  EXPECT_FALSE(c["samples"]["collectives"].empty());
  // Every length timed causal and unmasked gives a point of the unmasked factor. (The cpu
  // backend computes the whole score matrix either way, about 2; not asserted, since a
  // shared host's slow window can fall between the two timings.)
  std::set<int64_t> lengths;
  for (const auto& a : c["samples"]["attention"]) lengths.insert(a["seq"].get<int64_t>());
  EXPECT_EQ(p->gpu.attention_noncausal_scale.size(), lengths.size());
}

TEST(CalibratedCpuProfile, GemmSamplesAgreeWithEigensMeasuredSpeed) {
  std::vector<double> ratios;
  const nlohmann::json c = calibration();
  for (const auto& g : c["samples"]["gemm"]) {
    const int64_t m = g["m"], n = g["n"], k = g["k"];
    if (2.0 * m * n * k < 4e6) continue;  // call overhead dominates below a few MFLOP
    // Fastest repetitions on both sides: other processes on a shared 2-core machine only
    // ever slow a run down, so the minimum is the estimate least disturbed by them.
    const double ratio = eigen_gemm_s(m, n, k) / (g["min_us"].get<double>() * 1e-6);
    fmt::print("{}x{}x{}: calibrated / Eigen speed {:.2f}\n", m, n, k, ratio);
    // Loose per shape (on a loaded 2-core machine single shapes were seen 8x slow while
    // the others agreed): catches unit errors; the median below is the real check.
    EXPECT_GT(ratio, 1.0 / 10);
    EXPECT_LT(ratio, 10.0);
    ratios.push_back(ratio);
  }
  ASSERT_GE(ratios.size(), 4u);
  std::sort(ratios.begin(), ratios.end());
  const double median = ratios[ratios.size() / 2];
  EXPECT_GT(median, 1.0 / 2.5);
  EXPECT_LT(median, 2.5);
}

TEST(CalibratedCpuProfile, CollectiveFitsReproduceTheirSamplesWithinTheReportedResidual) {
  const nlohmann::json c = calibration();
  int checked = 0;
  for (const auto& f : c["fits"]["collectives"]) {
    const double alpha = f["alpha_us"].get<double>() * 1e-6;
    const double beta = f["beta_GBps"].get<double>() * 1e9;
    const double bound = f["max_rel_residual"].get<double>() + 1e-6;
    const bool p2p = f["op"] == "send_recv";
    for (const auto& s : c["samples"][p2p ? "p2p" : "collectives"]) {
      if (s["scope"] != f["scope"]) continue;
      if (!p2p && (s["op"] != f["op"] || s["ranks"] != f["ranks"] || s["nodes"] != f["nodes"]))
        continue;
      const double t = s["median_us"].get<double>() * 1e-6;
      const double pred = alpha + s["bytes"].get<double>() / beta;
      EXPECT_LE(std::fabs(pred - t) / t, bound) << f.dump() << "\n" << s.dump();
      ++checked;
    }
    EXPECT_LE(f["r2"].get<double>(), 1.0) << f.dump();
  }
  EXPECT_GT(checked, 10);
}

TEST(CalibratedCpuProfile, SimulateAcceptsTheProfile) {
  auto p = hetpar::hardware::load_profile(g_profile);
  ASSERT_TRUE(p.is_ok());
  const std::string scenario =
      fmt::format("{}/{}.calibrated-scenario.json", ::testing::TempDir(), ::getpid());
  std::ofstream(scenario) << fmt::format(R"({{
  "name": "tiny-gpt-on-calibrated-cpu",
  "model": {{"name": "tiny-gpt", "modules": [{{"name": "llm", "kind": "llm", "spec": {{
    "layers": 4, "hidden": 512, "ffn_hidden": 2048, "heads": 8, "vocab": 32000,
    "activation": "gelu", "norm": "layernorm", "position_embedding": "learned",
    "max_positions": 1024}}}}], "edges": []}},
  "workload": {{"seq_len": 1024, "global_batch": 8, "precision": "bf16"}},
  "cluster": {{"profile": "dgx-a100-80gb", "nodes": 1}},
  "plan": {{"tp": {}, "micro_batch": 1}}
}})",
                                         p->gpus_per_node);
  const std::string cmd = fmt::format("{} simulate {} --profile {} --json > {}.out 2>&1", g_binary,
                                      scenario, g_profile, scenario);
  const int status = std::system(cmd.c_str());
  std::ifstream out(scenario + ".out");
  const std::string text(std::istreambuf_iterator<char>(out), {});
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << text;
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_TRUE(j.dump().find("iteration") != std::string::npos) << text;
  std::filesystem::remove(scenario);
  std::filesystem::remove(scenario + ".out");
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 3) {
    fmt::print(stderr, "usage: calibrate_cpu_check PROFILE.json HETPAR_BINARY\n");
    return 2;
  }
  g_profile = argv[1];
  g_binary = argv[2];
  return RUN_ALL_TESTS();
}

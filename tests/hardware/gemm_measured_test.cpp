// The measured GEMM table of DeviceProfile (filled by `hetpar calibrate`): exact at a
// measured shape, interpolated in log space between shapes, absent = the plain model,
// and carried through the profile JSON.
#include <gtest/gtest.h>

#include <cmath>

#include "hetpar/hardware/hardware_json.h"
#include "hetpar/hardware/system_profile.h"

namespace hetpar::hardware {
namespace {

SystemProfile h100() {
  Result<SystemProfile> p = load_profile("dgx-h100");
  EXPECT_TRUE(p.is_ok()) << p.status().to_string();
  return *p;
}

double measured_s(const GemmMeasurement& g) {
  return 2.0 * static_cast<double>(g.m) * g.n * g.k / g.rate.per_second();
}

TEST(GemmMeasured, ExactAtAMeasuredShapeAndModelWithoutMeasurements) {
  const DeviceProfile plain = h100().gpu;
  DeviceProfile gpu = plain;
  const GemmMeasurement a{4096, 4096, 4096, FlopRate::tflops(500)};
  const GemmMeasurement b{64, 4096, 4096, FlopRate::tflops(60)};
  gpu.gemm_measured[precision_index(Precision::kBf16)] = {a, b};
  EXPECT_NEAR(gpu.gemm_time(4096, 4096, 4096, 1, Precision::kBf16).to_seconds(), measured_s(a),
              1e-11);
  EXPECT_NEAR(gpu.gemm_time(64, 4096, 4096, 1, Precision::kBf16).to_seconds(), measured_s(b),
              1e-11);
  // Other precisions keep the model.
  EXPECT_EQ(gpu.gemm_time(4096, 4096, 4096, 1, Precision::kFp8),
            plain.gemm_time(4096, 4096, 4096, 1, Precision::kFp8));
}

TEST(GemmMeasured, InterpolatesTheCorrectionBetweenShapesInLogSpace) {
  const DeviceProfile plain = h100().gpu;
  DeviceProfile gpu = plain;
  // Both measured shapes run at 0.5x the model's speed: every shape in between does too.
  auto half_speed = [&](int64_t m, int64_t n, int64_t k) {
    const double t = plain.gemm_time(m, n, k, 1, Precision::kBf16).to_seconds();
    return GemmMeasurement{m, n, k, FlopRate::per_second(2.0 * m * n * k / (2 * t))};
  };
  gpu.gemm_measured[precision_index(Precision::kBf16)] = {half_speed(1024, 1024, 1024),
                                                          half_speed(8192, 8192, 8192)};
  for (int64_t s : {2048, 3000, 4096}) {
    SCOPED_TRACE(s);
    EXPECT_NEAR(
        gpu.gemm_time(s, s, s, 1, Precision::kBf16) / plain.gemm_time(s, s, s, 1, Precision::kBf16),
        2.0, 1e-6);
  }
  // Batched GEMMs keep the model's batch scaling under the same correction.
  EXPECT_NEAR(gpu.gemm_time(2048, 2048, 2048, 4, Precision::kBf16) /
                  plain.gemm_time(2048, 2048, 2048, 4, Precision::kBf16),
              2.0, 1e-6);

  // Different corrections: the midpoint (in log space) takes their geometric mean.
  DeviceProfile mixed = plain;
  GemmMeasurement slow = half_speed(1024, 1024, 1024);
  GemmMeasurement fast = half_speed(4096, 4096, 4096);
  fast.rate = fast.rate * 4.0;  // 2x faster than the model
  mixed.gemm_measured[precision_index(Precision::kBf16)] = {slow, fast};
  EXPECT_NEAR(mixed.gemm_time(2048, 2048, 2048, 1, Precision::kBf16) /
                  plain.gemm_time(2048, 2048, 2048, 1, Precision::kBf16),
              1.0, 1e-6);
}

TEST(GemmMeasured, UsesTheNearestFourShapes) {
  const DeviceProfile plain = h100().gpu;
  DeviceProfile gpu = plain;
  std::vector<GemmMeasurement>& pts = gpu.gemm_measured[precision_index(Precision::kBf16)];
  for (int64_t s = 256; s <= 4096; s *= 2) {
    const double t = plain.gemm_time(s, s, s, 1, Precision::kBf16).to_seconds();
    pts.push_back({s, s, s, FlopRate::per_second(2.0 * s * s * s / (3 * t))});
  }
  // A far-away measurement with a wild ratio does not reach a shape among the others.
  pts.push_back({16, 65536, 16, FlopRate::tflops(1e-3)});
  EXPECT_NEAR(gpu.gemm_time(1500, 1500, 1500, 1, Precision::kBf16) /
                  plain.gemm_time(1500, 1500, 1500, 1, Precision::kBf16),
              3.0, 1e-6);
}

// An fp32-accumulating GEMM pays the exposed fraction of its output's read and write
// (8 bytes per element at the streaming bandwidth) on top of the plain GEMM; 0 hides it all.
TEST(GemmMeasured, AccumulatingGemmsPayTheirExposedOutputTraffic) {
  DeviceProfile gpu = h100().gpu;
  EXPECT_EQ(gpu.gemm_accumulate_exposed, 0.48);  // the built-in H100's, measured on an H200
  const double bps = gpu.memory_bandwidth.bytes_per_s() * gpu.memory_efficiency;
  for (double exposed : {0.0, 0.48, 1.0}) {
    gpu.gemm_accumulate_exposed = exposed;
    const Time plain = gpu.gemm_time(16384, 13312, 4096, 2, Precision::kFp8);
    const Time into_fp32 = gpu.gemm_time(16384, 13312, 4096, 2, Precision::kFp8, true);
    EXPECT_NEAR((into_fp32 - plain).to_seconds(), exposed * 8.0 * 16384 * 13312 * 2 / bps, 1e-11);
  }
  SystemProfile p = h100();
  nlohmann::json j = profile_to_json(p);
  EXPECT_EQ(j["gpu"]["gemm"]["accumulate_exposed"], 0.48);
  p.provenance.erase("gpu.gemm.accumulate_exposed");
  EXPECT_EQ(missing_provenance(p), std::vector<std::string>{"gpu.gemm.accumulate_exposed"});
  j["gpu"]["gemm"]["accumulate_exposed"] = 1.5;
  Result<SystemProfile> bad = parse_profile(j, "");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("gpu.gemm.accumulate_exposed"), std::string::npos)
      << bad.status().message();
}

// GEMMs adding into an fp32 output (a wgrad into Megatron's fp32 main_grad) read their own
// table; plain GEMMs never do, and without the table both are timed alike (with nothing
// of the output's traffic exposed).
TEST(GemmMeasured, AccumulatingGemmsHaveTheirOwnTable) {
  DeviceProfile plain = h100().gpu;
  plain.gemm_accumulate_exposed = 0;
  DeviceProfile gpu = plain;
  const GemmMeasurement into_fp32{4096, 6144, 4096, FlopRate::tflops(900)};
  const GemmMeasurement into_bf16{4096, 6144, 4096, FlopRate::tflops(1200)};
  EXPECT_EQ(gpu.gemm_time(4096, 6144, 4096, 1, Precision::kFp8, true),
            gpu.gemm_time(4096, 6144, 4096, 1, Precision::kFp8));
  gpu.gemm_measured[precision_index(Precision::kFp8)] = {into_bf16};
  EXPECT_NEAR(gpu.gemm_time(4096, 6144, 4096, 1, Precision::kFp8, true).to_seconds(),
              measured_s(into_bf16), 1e-11);  // no table of its own: the plain one
  gpu.gemm_accumulate_measured[precision_index(Precision::kFp8)] = {into_fp32};
  EXPECT_NEAR(gpu.gemm_time(4096, 6144, 4096, 1, Precision::kFp8, true).to_seconds(),
              measured_s(into_fp32), 1e-11);
  EXPECT_NEAR(gpu.gemm_time(4096, 6144, 4096, 1, Precision::kFp8).to_seconds(),
              measured_s(into_bf16), 1e-11);
  // Through the profile JSON, validated like the plain table.
  SystemProfile p = h100();
  p.gpu = gpu;
  p.provenance["gpu.gemm.measured"] = "test";
  p.provenance["gpu.gemm.measured_accumulate"] = "test";
  EXPECT_TRUE(missing_provenance(p).empty());
  Result<SystemProfile> back = parse_profile(profile_to_json(p), "");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(*back, p);
  p.provenance.erase("gpu.gemm.measured_accumulate");
  EXPECT_EQ(missing_provenance(p), std::vector<std::string>{"gpu.gemm.measured_accumulate.fp8"});
  nlohmann::json j = profile_to_json(p);
  j["gpu"]["gemm"]["measured_accumulate"]["fp8"][0][3] = 0;
  Result<SystemProfile> bad = parse_profile(j, "");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("gpu.gemm.measured_accumulate.fp8[0][3]: must be > 0"),
            std::string::npos)
      << bad.status().message();
}

TEST(GemmMeasured, RoundTripsThroughJsonAndIsValidated) {
  SystemProfile p = h100();
  p.gpu.gemm_measured[precision_index(Precision::kBf16)] = {
      {4096, 4096, 4096, FlopRate::tflops(700.5)}, {16, 8192, 8192, FlopRate::tflops(41.25)}};
  p.provenance["gpu.gemm.measured"] = "test";
  EXPECT_TRUE(missing_provenance(p).empty());
  Result<SystemProfile> back = parse_profile(profile_to_json(p), "");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(*back, p);
  EXPECT_EQ(profile_to_json(p)["gpu"]["gemm"]["measured"]["bf16"][1][3].get<double>(), 41.25);

  SystemProfile no_prov = p;
  no_prov.provenance.erase("gpu.gemm.measured");
  EXPECT_EQ(missing_provenance(no_prov), std::vector<std::string>{"gpu.gemm.measured.bf16"});

  auto error_of = [&](auto mutate) {
    nlohmann::json j = profile_to_json(p);
    mutate(j);
    Result<SystemProfile> r = parse_profile(j, "");
    return r.is_ok() ? std::string("ok") : r.status().message();
  };
  EXPECT_NE(error_of([](nlohmann::json& j) {
              j["gpu"]["gemm"]["measured"]["bf16"][0][3] = -1;
            }).find("gpu.gemm.measured.bf16[0][3]: must be > 0"),
            std::string::npos);
  EXPECT_NE(error_of([](nlohmann::json& j) {
              j["gpu"]["gemm"]["measured"]["bf16"][0][0] = 1.5;
            }).find("gpu.gemm.measured.bf16: GEMM sizes must be integers"),
            std::string::npos);
  EXPECT_NE(error_of([](nlohmann::json& j) {
              j["gpu"]["gemm"]["measured"]["bf16"][0] = {1, 2};
            }).find("gpu.gemm.measured.bf16[0]: expected [m, n, k, tflops]"),
            std::string::npos);
  EXPECT_NE(error_of([](nlohmann::json& j) {
              j["gpu"]["gemm"]["measured"]["fp9"] = nullptr;
            }).find("gpu.gemm.measured.fp9: unknown precision"),
            std::string::npos);
  EXPECT_NE(error_of([](nlohmann::json& j) {
              j["gpu"]["compute"].erase("fp16");
              j["gpu"]["gemm"]["measured"]["fp16"] = {{8, 8, 8, 1.0}};
            }).find("gpu.gemm.measured.fp16: measured rates for fp16"),
            std::string::npos);
}

}  // namespace
}  // namespace hetpar::hardware

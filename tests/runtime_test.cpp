// runtime/: dtype conversions, the random fill, buffers and argument checks. The cpu
// backend's kernels are tested in tests/runtime/, its MPI collectives in runtime_mpi_test.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <set>

#include "runtime/test_util.h"

namespace hetpar::runtime {
namespace {

using testing::download;
using testing::must_make;
using testing::upload;

TEST(DType, NamesAndSizesRoundTrip) {
  for (DType t : {DType::kF32, DType::kBf16, DType::kF16, DType::kF8E4M3}) {
    auto parsed = parse_dtype(to_string(t));
    ASSERT_TRUE(parsed.is_ok());
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_EQ(dtype_bytes(DType::kBf16), 2);
  EXPECT_EQ(dtype_bytes(DType::kF8E4M3), 1);
  EXPECT_FALSE(parse_dtype("int8").is_ok());
}

TEST(HostData, Bf16IsTheTopHalfOfFloatRoundedToNearestEven) {
  uint16_t v = 0;
  from_float(DType::kBf16, 1.0f, &v);
  EXPECT_EQ(v, 0x3F80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(round_to(DType::kBf16, 1.0f + 1.0f / 256), 1.0f);
  EXPECT_EQ(round_to(DType::kBf16, 1.0f + 3.0f / 256), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(round_to(DType::kBf16, std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(round_to(DType::kBf16, std::numeric_limits<float>::max()),
            std::numeric_limits<float>::infinity());
}

TEST(HostData, Fp16RoundsAndOverflows) {
  uint16_t v = 0;
  from_float(DType::kF16, 1.0f, &v);
  EXPECT_EQ(v, 0x3C00);
  from_float(DType::kF16, -2.0f, &v);
  EXPECT_EQ(v, 0xC000);
  EXPECT_EQ(round_to(DType::kF16, 65504.0f), 65504.0f);
  EXPECT_EQ(round_to(DType::kF16, 1e6f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(round_to(DType::kF16, 1.0f + 1.0f / 2048), 1.0f);                      // tie to even
  EXPECT_EQ(round_to(DType::kF16, std::ldexp(1.0f, -24)), std::ldexp(1.0f, -24));  // subnormal
}

TEST(HostData, EveryFp16AndFp8CodeRoundTrips) {
  for (uint32_t code = 0; code < 65536; ++code) {
    auto c = static_cast<uint16_t>(code);
    float f = to_float(DType::kF16, &c);
    if (std::isnan(f)) continue;
    uint16_t back = 0;
    from_float(DType::kF16, f, &back);
    ASSERT_EQ(back, c) << code;
  }
  for (uint32_t code = 0; code < 256; ++code) {
    auto c = static_cast<uint8_t>(code);
    float f = to_float(DType::kF8E4M3, &c);
    if ((code & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(f)) << code;
      continue;
    }
    uint8_t back = 0;
    from_float(DType::kF8E4M3, f, &back);
    ASSERT_EQ(back, c) << code << " " << f;
  }
}

TEST(HostData, Fp8E4M3ValuesRoundingAndSaturation) {
  EXPECT_EQ(round_to(DType::kF8E4M3, 448.0f), 448.0f);
  EXPECT_EQ(round_to(DType::kF8E4M3, 1e9f), 448.0f);  // saturates, no infinity
  EXPECT_EQ(round_to(DType::kF8E4M3, -std::numeric_limits<float>::infinity()), -448.0f);
  EXPECT_EQ(round_to(DType::kF8E4M3, std::ldexp(1.0f, -9)), std::ldexp(1.0f, -9));  // min
  EXPECT_EQ(round_to(DType::kF8E4M3, std::ldexp(1.0f, -11)), 0.0f);
  EXPECT_EQ(round_to(DType::kF8E4M3, 1.0625f), 1.0f);             // halfway 1 and 1.125: even
  EXPECT_EQ(round_to(DType::kF8E4M3, 1.1875f), 1.25f);            // halfway 1.125 and 1.25: even
  EXPECT_EQ(round_to(DType::kF8E4M3, 0.0146484375f), 0.015625f);  // 7.5 * 2^-9 -> 8 * 2^-9
  uint8_t v = 0;
  from_float(DType::kF8E4M3, 1.0f, &v);
  EXPECT_EQ(v, 0x38);
  // Nearest of a fine sweep agrees with a brute-force search over the codes.
  for (float x = -500; x <= 500; x += 0.173f) {
    float best = 0, best_err = std::numeric_limits<float>::infinity();
    for (uint32_t c = 0; c < 256; ++c) {
      auto b = static_cast<uint8_t>(c);
      float y = to_float(DType::kF8E4M3, &b);
      if (!std::isnan(y) && std::fabs(y - x) < best_err) best = y, best_err = std::fabs(y - x);
    }
    float got = round_to(DType::kF8E4M3, x);
    EXPECT_NEAR(std::fabs(got - x), best_err, 1e-6f * std::fabs(x))
        << x << " -> " << got << " best " << best;
  }
}

TEST(HostData, RandomUniformIsDeterministicBoundedAndSpread) {
  std::set<float> seen;
  double sum = 0;
  for (uint64_t i = 0; i < 10000; ++i) {
    float v = random_uniform(7, i, 0.5f);
    EXPECT_EQ(v, random_uniform(7, i, 0.5f));
    EXPECT_GE(v, -0.5f);
    EXPECT_LT(v, 0.5f);
    seen.insert(v);
    sum += v;
  }
  EXPECT_GT(seen.size(), 9900u);
  EXPECT_NEAR(sum / 10000, 0.0, 0.02);
  EXPECT_NE(random_uniform(7, 0, 1.0f), random_uniform(8, 0, 1.0f));
}

TEST(CpuBackend, InfoNamesTheBackendAndAWorldOfOne) {
  auto be = must_make("cpu");
  ASSERT_NE(be, nullptr);
  EXPECT_EQ(be->info().backend, "cpu");
  EXPECT_EQ(be->info().world, 1);
  EXPECT_EQ(be->info().rank, 0);
  EXPECT_EQ(be->info().hosts, 1);
  EXPECT_GT(be->info().memory.count(), 0);
  EXPECT_NE(be->info().versions.find("Eigen"), std::string::npos);
}

TEST(CpuBackend, UnknownBackendsAreErrors) {
  auto r = make_backend("tpu");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
  auto names = available_backends();
  EXPECT_EQ(names.front(), "cpu");
}

TEST(CpuBackend, FillRandomMatchesTheHostValuesForEveryDtypeAndSlice) {
  auto be = must_make("cpu");
  for (DType t : {DType::kF32, DType::kBf16, DType::kF16, DType::kF8E4M3}) {
    auto buf = be->allocate(Bytes(1000 * dtype_bytes(t)));
    ASSERT_TRUE(buf.is_ok());
    ASSERT_TRUE(be->fill_random(kComputeStream, *buf, t, 1000, 42, 2.0f).is_ok());
    auto got = download(*be, *buf, t, 1000);
    EXPECT_EQ(got, testing::random_values(t, 1000, 42, 2.0f)) << to_string(t);
    // Elements 600.. of the tensor are the host's values from index 600 on.
    std::vector<float> tail(got.begin() + 600, got.end());
    EXPECT_EQ(tail, testing::random_values(t, 400, 42, 2.0f, 600));
  }
}

TEST(CpuBackend, SlicesViewTheParentsBytes) {
  auto be = must_make("cpu");
  std::vector<float> v = {1, 2, 3, 4, 5, 6};
  Buffer buf = upload(*be, DType::kF32, v);
  Buffer mid = buf.slice(Bytes(8), Bytes(12));
  EXPECT_EQ(mid.size().count(), 12);
  EXPECT_EQ(download(*be, mid, DType::kF32, 3), (std::vector<float>{3, 4, 5}));
  ASSERT_TRUE(
      be->copy_from_host(kComputeStream, from_floats(DType::kF32, std::vector<float>{9}), mid)
          .is_ok());
  EXPECT_EQ(download(*be, buf, DType::kF32, 6), (std::vector<float>{1, 2, 9, 4, 5, 6}));
  // The view does not free the parent's memory when it goes.
  { Buffer gone = buf.slice(Bytes(0), Bytes(4)); }
  EXPECT_EQ(download(*be, buf, DType::kF32, 1), (std::vector<float>{1}));
}

TEST(CpuBackend, UndersizedBuffersAndBadShapesAreInvalidArguments) {
  auto be = must_make("cpu");
  Buffer small = testing::zeros(*be, DType::kBf16, 4);
  Buffer big = testing::zeros(*be, DType::kBf16, 64);
  GemmDesc g{.m = 4, .n = 4, .k = 4};
  Status st = be->gemm(kComputeStream, g, small, big, big);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("gemm A"), std::string::npos) << st.message();
  AttentionDesc a{.heads = 3, .kv_heads = 2, .seq_q = 2, .seq_kv = 2, .head_dim = 2};
  st = be->attention_forward(kComputeStream, a, big, big, big, nullptr, big, big);
  EXPECT_NE(st.message().find("kv_heads 2 must divide heads 3"), std::string::npos);
  ElementwiseDesc e{.op = ElementwiseOp::kAdd, .elements = 4};
  const Buffer* one[] = {&big};
  EXPECT_EQ(be->elementwise(kComputeStream, e, one, big).code(), Status::Code::kInvalidArgument);
  EXPECT_FALSE(be->record(Stream{-1}).is_ok());
}

TEST(CpuBackend, EventsMeasureTheWorkBetweenThem) {
  auto be = must_make("cpu");
  auto e0 = be->record(kComputeStream);
  ASSERT_TRUE(e0.is_ok());
  Buffer a = testing::zeros(*be, DType::kF32, 256 * 256);
  Buffer c = testing::zeros(*be, DType::kF32, 256 * 256);
  GemmDesc g{.m = 256, .n = 256, .k = 256, .dtype = DType::kF32};
  ASSERT_TRUE(be->gemm(kComputeStream, g, a, a, c).is_ok());
  auto e1 = be->record(kCommStream);
  ASSERT_TRUE(e1.is_ok());
  ASSERT_TRUE(be->wait(kComputeStream, *e1).is_ok());
  ASSERT_TRUE(be->synchronize().is_ok());
  auto t = be->elapsed(*e0, *e1);
  ASSERT_TRUE(t.is_ok());
  EXPECT_GT(*t, Time::zero());
  EXPECT_FALSE(be->elapsed(*e0, Event{99}).is_ok());
  EXPECT_TRUE(be->flush_cache(kComputeStream).is_ok());
}

}  // namespace
}  // namespace hetpar::runtime

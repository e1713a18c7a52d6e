#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "hetpar/core/attention_mask.h"
#include "hetpar/core/check.h"
#include "hetpar/core/file_io.h"
#include "hetpar/core/format.h"
#include "hetpar/core/huge_pages.h"
#include "hetpar/core/ids.h"
#include "hetpar/core/json_reader.h"
#include "hetpar/core/status.h"
#include "hetpar/core/units.h"

namespace hetpar {
namespace {

// A rectangular causal call's continuous pair count: the square one where it is square,
// q·d + q²/2 without a window, q·w when every query sees a whole window, and a midpoint sum
// of min(x + d, w) over the queries otherwise; with more queries than keys, the square call
// of the queries that see any.
TEST(AttentionMask, RectangularCallsCountTheirBand) {
  EXPECT_EQ(causal_score_pairs(512, 512, 64), causal_score_pairs(512, 64));
  EXPECT_EQ(causal_score_pairs(512, 512, 0), causal_score_pairs(512));
  EXPECT_DOUBLE_EQ(causal_score_pairs(64, 192, 0), 64.0 * 128 + 64.0 * 64 / 2);
  EXPECT_DOUBLE_EQ(causal_score_pairs(64, 192, 500), causal_score_pairs(64, 192, 0));
  EXPECT_DOUBLE_EQ(causal_score_pairs(64, 96, 32), 64.0 * 32);
  // Fewer keys than queries: the first 128 queries see none, the last 64 a square call.
  EXPECT_EQ(causal_score_pairs(192, 64, 0), causal_score_pairs(64));
  EXPECT_EQ(causal_score_pairs(192, 64, 16), causal_score_pairs(64, 16));
  for (auto [q, kv, w] : {std::tuple{64, 128, 160}, {64, 192, 160}, {100, 130, 50}}) {
    const double d = kv - q;
    double sum = 0;
    const int steps = 1 << 16;
    for (int i = 0; i < steps; ++i) {
      const double x = (i + 0.5) * q / steps;
      sum += std::min(x + d, static_cast<double>(w)) * q / steps;
    }
    EXPECT_NEAR(causal_score_pairs(q, kv, w), sum, 1e-6 * sum) << q << " " << kv << " " << w;
  }
}

TEST(Time, IsExactIntegerPicoseconds) {
  EXPECT_EQ(Time::us(1).count_ps(), 1'000'000);
  EXPECT_EQ(Time::ms(12.5).count_ps(), 12'500'000'000);
  EXPECT_EQ(Time::ns(0.4).count_ps(), 400);
  // Adding a million 1 ps steps is exact (no float drift).
  Time t;
  for (int i = 0; i < 1'000'000; ++i) t += Time::ps(1);
  EXPECT_EQ(t, Time::us(1));
  EXPECT_LT(Time::ps(1), Time::ps(2));
  EXPECT_DOUBLE_EQ(Time::ms(3) / Time::ms(12), 0.25);
}

TEST(Units, CrossUnitOperators) {
  // 1 GB at 100 GB/s is 10 ms.
  EXPECT_EQ(Bytes::GB(1) / Bandwidth::GBps(100), Time::ms(10));
  // 989 TFLOP at 989 TFLOP/s is one second.
  EXPECT_EQ(Flops(989e12) / FlopRate::tflops(989), Time::seconds(1));
  EXPECT_DOUBLE_EQ((Flops(2e12) / Time::seconds(2)).to_tflops(), 1.0);
  EXPECT_DOUBLE_EQ(Bandwidth::gbit_per_s(400).to_GBps(), 50.0);
  EXPECT_DOUBLE_EQ((Bytes::GB(50) / Time::seconds(1)).to_GBps(), 50.0);
}

TEST(Format, PrintsThreeSignificantDigitsWithUnits) {
  EXPECT_EQ(fmt::format("{}", Time::ms(12.5)), "12.5 ms");
  EXPECT_EQ(fmt::format("{}", Bytes::GiB(3.2)), "3.2 GiB");
  EXPECT_EQ(fmt::format("{}", Bandwidth::GBps(450)), "450 GB/s");
  EXPECT_EQ(fmt::format("{}", FlopRate::tflops(989.4)), "989 TFLOP/s");
  EXPECT_EQ(fmt::format("{}", Flops(1.5e18)), "1.5 EFLOP");
  EXPECT_EQ(fmt::format("{}", Time::us(1)), "1 us");
  EXPECT_EQ(fmt::format("{}", Time::ps(999'960)), "1 us");  // rounds into the next unit
  EXPECT_EQ(fmt::format("{}", Bytes(512)), "512 B");
  EXPECT_EQ(fmt::format("{}", Time::zero()), "0 ps");
  EXPECT_EQ(fmt::format("{:>10}", Time::ms(1)), "      1 ms");
  EXPECT_EQ(format_significant(0.012345), "0.0123");
  EXPECT_EQ(format_count(6.738e9), "6.74B");
  EXPECT_EQ(format_count(303e6), "303M");
  EXPECT_EQ(format_count(12), "12");
}

TEST(Ids, AreTypedAndOrdered) {
  RankId a(3), b(4);
  EXPECT_LT(a, b);
  EXPECT_FALSE(RankId().valid());
  EXPECT_EQ(fmt::format("{}", a), "3");
  static_assert(!std::is_convertible_v<RankId, LinkId>);
}

Result<int> parse_positive(int x) {
  if (x <= 0) return Status::invalid_argument(fmt::format("x: must be > 0, got {}", x));
  return x;
}
Status use_macros(int x, int* out) {
  HETPAR_ASSIGN_OR_RETURN(int v, parse_positive(x));
  *out = v;
  return Status::ok();
}

TEST(Status, ResultCarriesValueOrStatus) {
  auto good = parse_positive(3);
  ASSERT_TRUE(good.is_ok());
  EXPECT_EQ(*good, 3);
  auto bad = parse_positive(-1);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(bad.status().to_string(), "invalid argument: x: must be > 0, got -1");
  int out = 0;
  EXPECT_TRUE(use_macros(5, &out).is_ok());
  EXPECT_EQ(out, 5);
  EXPECT_FALSE(use_macros(0, &out).is_ok());
  EXPECT_EQ(Status::not_found("a").with_context("file.json").message(), "file.json: a");
}

TEST(CheckDeathTest, AbortsWithMessage) {
  EXPECT_DEATH(HETPAR_CHECK(1 + 1 == 3, "math is {}", "broken"), "math is broken");
}

TEST(JsonReader, ReadsFieldsAndNamesPathsInErrors) {
  auto j =
      parse_json(R"({"layers": 32, "act": "gelu", "moe": {"experts": 0}, "$comment": "x"})", "t");
  ASSERT_TRUE(j.is_ok());
  JsonReader r(*j, "model");
  EXPECT_EQ(r.required_int("layers", 1), 32);
  EXPECT_EQ(r.required_enum("act", {"gelu", "swiglu"}), "gelu");
  JsonReader moe = r.object("moe");
  moe.required_int("experts", 1);
  EXPECT_FALSE(moe.ok());
  EXPECT_EQ(moe.status().message(), "model.moe.experts: must be >= 1, got 0");
  r.merge(moe.status());
  EXPECT_FALSE(r.ok());
}

TEST(JsonReader, RejectsUnknownMissingAndWrongTypes) {
  auto j = parse_json(R"({"layers": "many", "hiden": 4})", "t");
  {
    JsonReader r(*j, "m");
    r.required_int("layers");
    EXPECT_EQ(r.status().message(), "m.layers: expected an integer, got string \"many\"");
  }
  {
    JsonReader r(*j, "m");
    r.optional_string("layers", "");
    r.finish();
    EXPECT_EQ(r.status().message(), "m.hiden: unknown field");
  }
  {
    JsonReader r(*j, "m");
    r.required_int("hidden");
    EXPECT_EQ(r.status().message(), "m.hidden: missing required field (an integer)");
  }
  {
    JsonReader r(*j, "m");
    r.raw("layers");
    r.raw("hiden");
    r.optional_enum("act", "gelu", {"gelu"});
    EXPECT_TRUE(r.ok());
  }
}

TEST(JsonReader, MalformedJsonNamesSourceAndOffset) {
  auto j = parse_json("{\"a\": 1,", "scenario.json");
  ASSERT_FALSE(j.is_ok());
  EXPECT_NE(j.status().message().find("scenario.json: malformed JSON at byte"), std::string::npos);
  auto f = read_json_file("/nonexistent/x.json");
  EXPECT_EQ(f.status().code(), Status::Code::kIoError);
}

}  // namespace
}  // namespace hetpar

namespace hetpar {
namespace {

TEST(FileIo, AtomicWriteLeavesNothingOnFailure) {
  std::string dir = ::testing::TempDir();
  std::string path = dir + "/hetpar_io_test.txt";
  ASSERT_TRUE(write_file_atomically(path, "hello").is_ok());
  auto back = read_file(path);
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ(*back, "hello");
  std::remove(path.c_str());
  Status bad = write_file_atomically("/nonexistent-dir/x.txt", "data");
  EXPECT_EQ(bad.code(), Status::Code::kIoError);
  EXPECT_NE(bad.message().find("/nonexistent-dir/x.txt"), std::string::npos);
}

// Blocks from kHugePageBlock up are 2 MiB aligned (what huge pages need); smaller ones come
// from the ordinary allocator; a vector growing across the threshold keeps its contents.
TEST(HugePages, LargeBlocksAreAlignedAndVectorsBehave) {
  HugePageAllocator<double> a;
  const std::size_t n = kHugePageBlock / sizeof(double) + 3;
  double* big = a.allocate(n);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(big) % kHugePageBlock, 0u);
  big[0] = 1;
  big[n - 1] = 2;  // the whole block is usable
  EXPECT_EQ(big[0] + big[n - 1], 3);
  a.deallocate(big, n);
  int* small = HugePageAllocator<int>().allocate(16);
  small[15] = 7;
  HugePageAllocator<int>().deallocate(small, 16);

  HugeVector<int64_t> v;
  for (int64_t i = 0; i < 1 << 20; ++i) v.push_back(i);  // 8 MiB: crosses the threshold
  int64_t sum = 0;
  for (int64_t x : v) sum += x;
  EXPECT_EQ(sum, (int64_t{1} << 20) * ((int64_t{1} << 20) - 1) / 2);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(v.data()) % kHugePageBlock, 0u);
  HugeVector<int64_t> w = v;  // copies through the allocator too
  EXPECT_EQ(w, v);
}

}  // namespace
}  // namespace hetpar

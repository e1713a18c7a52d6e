// Helpers shared by the runtime tests: a backend per test, and float <-> buffer transfers.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "hetpar/runtime/backend.h"
#include "hetpar/runtime/host_data.h"

namespace hetpar::runtime::testing {

inline std::unique_ptr<Backend> must_make(std::string_view name) {
  auto r = make_backend(name);
  if (!r.is_ok()) {
    ADD_FAILURE() << r.status().to_string();
    return nullptr;
  }
  return std::move(r).value();
}

/// `values` rounded to `t`, in a new buffer of `be`.
inline Buffer upload(Backend& be, DType t, std::span<const float> values) {
  auto bytes = from_floats(t, values);
  auto buf = be.allocate(Bytes(static_cast<int64_t>(bytes.size())));
  EXPECT_TRUE(buf.is_ok()) << buf.status().to_string();
  Status st = be.copy_from_host(kComputeStream, bytes, *buf);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return std::move(buf).value();
}

inline Buffer zeros(Backend& be, DType t, int64_t n) {
  return upload(be, t, std::vector<float>(static_cast<size_t>(n), 0.0f));
}

inline std::vector<float> download(Backend& be, const Buffer& b, DType t, int64_t n) {
  std::vector<std::byte> bytes(static_cast<size_t>(n * dtype_bytes(t)));
  Status st = be.copy_to_host(kComputeStream, b, bytes);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return to_floats(t, bytes);
}

/// Host values of fill_random(seed, scale) rounded to `t`.
inline std::vector<float> random_values(DType t, int64_t n, uint64_t seed, float scale,
                                        int64_t first = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = round_to(t, random_uniform(seed, first + i, scale));
  return v;
}

/// Relative tolerance of one rounding to `t` (half an ulp).
inline float eps(DType t) {
  switch (t) {
    case DType::kF32:
      return 1e-6f;
    case DType::kBf16:
      return 1.0f / 256;
    case DType::kF16:
      return 1.0f / 2048;
    case DType::kF8E4M3:
      return 1.0f / 16;
  }
  return 0;
}

}  // namespace hetpar::runtime::testing

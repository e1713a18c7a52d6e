// Bit-exact host conversions for bf16, fp16 and fp8 e4m3fn (see host_data.h).
#include "hetpar/runtime/host_data.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "random_hash.h"

namespace hetpar::runtime {
namespace {

uint16_t bf16_from(float x) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7FFF + ((bits >> 16) & 1);  // round to nearest even (carries into the exponent)
  return static_cast<uint16_t>(bits >> 16);
}
float bf16_to(uint16_t v) {
  return std::bit_cast<float>(static_cast<uint32_t>(v) << 16);
}

// GCC and Clang's _Float16 converts with IEEE round-to-nearest-even.
uint16_t f16_from(float x) {
  return std::bit_cast<uint16_t>(static_cast<_Float16>(x));
}
float f16_to(uint16_t v) {
  return static_cast<float>(std::bit_cast<_Float16>(v));
}

// OCP fp8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; S.1111.111 is NaN, no inf.
constexpr float kF8Max = 448.0f;
uint8_t f8_from(float x) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  if (std::isnan(x)) return sign | 0x7F;
  float a = std::fabs(x);
  if (a >= kF8Max) return sign | 0x7E;  // saturate (inf too)
  if (a < 0.015625f) {                  // below 2^-6: subnormal steps of 2^-9
    // a * 512 is exact; rint rounds ties to even. 8 lands on 0x08 = 2^-6, the first normal.
    return sign | static_cast<uint8_t>(std::rint(a * 512.0f));
  }
  uint32_t b = std::bit_cast<uint32_t>(a);
  b += 0x7FFFF + ((b >> 20) & 1);  // keep 3 mantissa bits, nearest even
  int e = static_cast<int>(b >> 23) - 127 + 7;
  uint32_t m = (b >> 20) & 7;
  if (e > 15 || (e == 15 && m == 7)) return sign | 0x7E;
  return sign | static_cast<uint8_t>((e << 3) | m);
}
float f8_to(uint8_t v) {
  float sign = (v & 0x80) ? -1.0f : 1.0f;
  int e = (v >> 3) & 0xF;
  int m = v & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -9);
  return sign * std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
}

// Decoding fp8 goes through a table (256 entries), built once.
struct F8Table {
  float v[256];
  F8Table() {
    for (int i = 0; i < 256; ++i) v[i] = f8_to(static_cast<uint8_t>(i));
  }
};
const F8Table& f8_table() {
  static const F8Table t;
  return t;
}

}  // namespace

float to_float(DType t, const void* value) {
  float f = 0;
  to_float(t, value, &f, 1);
  return f;
}

void from_float(DType t, float x, void* value) {
  from_float(t, &x, value, 1);
}

float round_to(DType t, float x) {
  std::byte b[4];
  from_float(t, x, b);
  return to_float(t, b);
}

void to_float(DType t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kBf16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to(s[i]);
      return;
    }
    case DType::kF8E4M3: {
      const auto* s = static_cast<const uint8_t*>(src);
      const float* table = f8_table().v;
      for (int64_t i = 0; i < n; ++i) dst[i] = table[s[i]];
      return;
    }
  }
}

void from_float(DType t, const float* src, void* dst, int64_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kBf16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = bf16_from(src[i]);
      return;
    }
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f16_from(src[i]);
      return;
    }
    case DType::kF8E4M3: {
      auto* d = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f8_from(src[i]);
      return;
    }
  }
}

std::vector<float> to_floats(DType t, std::span<const std::byte> bytes) {
  std::vector<float> out(bytes.size() / static_cast<size_t>(dtype_bytes(t)));
  to_float(t, bytes.data(), out.data(), static_cast<int64_t>(out.size()));
  return out;
}

std::vector<std::byte> from_floats(DType t, std::span<const float> values) {
  std::vector<std::byte> out(values.size() * static_cast<size_t>(dtype_bytes(t)));
  from_float(t, values.data(), out.data(), static_cast<int64_t>(values.size()));
  return out;
}

float random_uniform(uint64_t seed, uint64_t index, float scale) {
  return detail::random_value(detail::mix64(seed), index, scale);
}

}  // namespace hetpar::runtime

// Host-side views of device data: conversions between each DType's bit pattern (what a
// Buffer holds on every backend, see backend.h) and float, and the counter-based random
// values that Backend::fill_random writes, so tests and the executor's single-process
// references can rebuild any slice of a randomly initialised tensor on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "hetpar/runtime/backend.h"

namespace hetpar::runtime {

/// Rounding is to nearest, ties to even, as the GPU's conversions do. fp16 overflows to
/// infinity; fp8 e4m3fn (no infinity, max 448) saturates to +-448 (CUDA's __NV_SATFINITE);
/// NaN stays NaN.
float to_float(DType t, const void* value);
void from_float(DType t, float x, void* value);
/// x rounded to the nearest value of `t` (fp8: saturated), as a float.
float round_to(DType t, float x);

/// `n` consecutive values of type `t` at `src` to floats, and back.
void to_float(DType t, const void* src, float* dst, int64_t n);
void from_float(DType t, const float* src, void* dst, int64_t n);
/// The whole span (bytes.size() / dtype_bytes(t) values).
std::vector<float> to_floats(DType t, std::span<const std::byte> bytes);
std::vector<std::byte> from_floats(DType t, std::span<const float> values);

/// Element `index` of fill_random(seed, scale) before the dtype's rounding: uniform in
/// [-scale, scale), from a hash of (seed, index) alone (splitmix64), so slices are
/// reproducible independently of the rest of the tensor.
float random_uniform(uint64_t seed, uint64_t index, float scale);

}  // namespace hetpar::runtime

// The counter-based hash behind fill_random (splitmix64's mixer), shared by the host code
// and the CUDA kernels so both backends write the same values. Internal to runtime/.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define HETPAR_HOST_DEVICE __host__ __device__
#else
#define HETPAR_HOST_DEVICE
#endif

namespace hetpar::runtime::detail {

HETPAR_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// `seed_key` is mix64(seed). The top 24 bits of the hash give u in [0, 1) exactly, so
/// 2u - 1 is exact and the only rounding is the multiplication by `scale` (the same on
/// host and device).
HETPAR_HOST_DEVICE inline float random_value(uint64_t seed_key, uint64_t index, float scale) {
  uint64_t h = mix64(seed_key + (index + 1) * 0x9E3779B97F4A7C15ull);
  float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
  return (2.0f * u - 1.0f) * scale;
}

}  // namespace hetpar::runtime::detail

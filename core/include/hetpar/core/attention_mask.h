// How many (query, key) pairs a causal attention call scores, in the model-FLOP convention
// the op graphs (models), the simulator's kernels (sim) and the runtime's kernels share:
// the continuous count, seq²/2 for a causal call (not seq·(seq+1)/2), and under a sliding
// window, where each query sees itself and the `window` keys before it, the band's area
// seq·window − window²/2, which meets seq²/2 at window = seq.
#pragma once

#include <cstdint>

namespace hetpar {

/// `window` 0 (or at least `seq`): no window.
inline double causal_score_pairs(int64_t seq, int64_t window = 0) {
  const auto s = static_cast<double>(seq);
  if (window <= 0 || window >= seq) return s * s / 2;
  const auto w = static_cast<double>(window);
  return s * w - w * w / 2;
}

}  // namespace hetpar

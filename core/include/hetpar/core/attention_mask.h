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

/// A causal call of `seq_q` queries against `seq_kv` keys, bottom-right aligned (query i
/// sees keys through i + seq_kv - seq_q, as FlashAttention and the runtime), each seeing
/// itself and at most `window` keys before it (0: no window): the continuous count of the
/// integral over x in [0, seq_q) of min(x + d, window), d = seq_kv - seq_q. Transformer
/// Engine's all-gather CP calls a chunk's queries against the keys up to its end. With
/// seq_q == seq_kv, causal_score_pairs(seq, window); with fewer keys than queries the first
/// seq_q - seq_kv queries see none and the rest make a square call.
inline double causal_score_pairs(int64_t seq_q, int64_t seq_kv, int64_t window) {
  if (seq_q >= seq_kv) return causal_score_pairs(seq_kv, window);
  const auto q = static_cast<double>(seq_q);
  const auto d = static_cast<double>(seq_kv - seq_q);
  if (window <= 0 || window >= seq_kv) return q * d + q * q / 2;
  const auto w = static_cast<double>(window);
  if (d >= w) return q * w;
  const double x0 = w - d;  // the first query whose keys reach the window (x0 < q)
  return x0 * x0 / 2 + d * x0 + (q - x0) * w;
}

}  // namespace hetpar

// The cpu backend's math on fp32 arrays: attention forward/backward (a plain reference:
// full score matrices, Eigen products) and the elementwise ops. The cpu backend converts
// each dtype to fp32, runs these and rounds the results back. Internal to runtime/.
#pragma once

#include <cstdint>

#include "hetpar/runtime/backend.h"

namespace hetpar::runtime::cpu {

/// q, out [b, sq, h, d]; k, v [b, skv, kvh, d]; lse [b, h, sq]; sinks [h] (null without
/// d.sinks). See AttentionDesc.
void attention_forward(const AttentionDesc& d, const float* q, const float* k, const float* v,
                       const float* sinks, float* out, float* lse);
/// Overwrites dq and d_sinks; dk and dv must hold zeros (they accumulate over the heads
/// sharing a kv head).
void attention_backward(const AttentionDesc& d, const float* q, const float* k, const float* v,
                        const float* sinks, const float* out, const float* d_out, const float* lse,
                        float* dq, float* dk, float* dv, float* d_sinks);

/// `n` elements of op `d.op` (a whole number of rows for the row ops); in[i] as the op takes.
void elementwise(const ElementwiseDesc& d, const float* const* in, float* out, int64_t n);

}  // namespace hetpar::runtime::cpu

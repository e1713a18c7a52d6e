// Totals: parameter counts (closed form from the specs, independent of the op graphs, so
// the two check each other), model FLOPs of forward, backward and recompute passes (sums
// over an OpGraph's GEMM and attention-core ops only: the convention of Megatron-LM, 6N
// and MFU; causal attention counted as half), activation bytes under a recompute policy,
// and how many LLM tokens an encoder's item becomes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "hetpar/core/units.h"
#include "hetpar/models/op_graph.h"
#include "hetpar/models/spec.h"

namespace hetpar::models {

struct ParamCounts {
  int64_t total = 0;
  /// Token/position embedding tables, the class token and an untied output layer.
  int64_t embedding = 0;
  /// Parameters one token passes through: total minus the routed experts it skips.
  int64_t active = 0;
  int64_t non_embedding() const { return total - embedding; }
};

ParamCounts count_params(const ModuleSpec& spec);
ParamCounts count_params(const ModelSpec& model);

/// Model FLOPs (GEMMs and the attention core) of the graph's forward / backward pass.
Flops forward_flops(const OpGraph& g);
Flops backward_flops(const OpGraph& g);
/// Extra forward FLOPs the backward pass re-runs under `policy`.
Flops recompute_flops(const OpGraph& g, RecomputePolicy policy);
/// Forward + backward, no recompute: the FLOPs MFU counts.
Flops model_flops(const OpGraph& g);

/// Activation bytes one micro-batch holds between its forward and backward. Selective
/// recompute keeps only Q, K, V of the attention core; full recompute keeps each layer's
/// input (Korthikanti et al.'s 2sbh per layer) and the ops outside the layers.
Bytes activation_bytes(const OpGraph& g, RecomputePolicy policy);

/// LLM tokens one item (image, clip) of encoder `encoder` becomes after its projector.
/// REQUIRES: validate_model(model) passed; `encoder` indexes an encoder.
int64_t llm_tokens_per_item(const ModelSpec& model, size_t encoder);

/// Training model FLOPs (3x forward) per token of an LLM at sequence length seq_len.
double model_flops_per_token(const LlmSpec& llm, int64_t seq_len);

}  // namespace hetpar::models

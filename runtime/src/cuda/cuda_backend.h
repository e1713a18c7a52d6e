// The cuda backend: cudaMalloc'd buffers, cuBLASLt GEMMs (heuristic algorithm per shape,
// cached, with a workspace), unfused attention (cuBLAS batched GEMMs and the softmax
// kernels of kernels.cu; score matrices in a workspace, in chunks of (batch, head) pairs),
// elementwise kernels, NCCL collectives and P2P (the unique id broadcast over MPI, one
// ncclCommSplit per group), CUDA streams and events. One GPU per process: the process's
// local rank modulo the GPUs it sees. Internal to runtime/.
#pragma once

#include <memory>

#include "hetpar/runtime/backend.h"

namespace hetpar::runtime {

/// Status::unavailable when no GPU is usable (no driver, no device).
Result<std::unique_ptr<Backend>> make_cuda_backend();

}  // namespace hetpar::runtime

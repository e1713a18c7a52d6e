// Numerical check of the boundary communicator (planner/boundary.h): that a heterogeneous
// layout preserves the training math across the encoder -> LLM boundary. Real tensors
// move with the backend's collectives and P2P, following the boundary plan the lowering
// emits — the same leaders, groups, micro-batch mapping and byte counts — and are compared
// with a single-process reference computation of the same values.
//
// The model of the check (one encoder, its projector's output as the boundary tensor):
// - encoder output: sample n's V x H tensor (V modality tokens, H the LLM hidden size) is
//   fill_random(seed kActivationSeed + n), held by every TP rank of the encoder replica that
//   computes it (as after the projector's own TP collective). Samples are numbered by the
//   encoder side: replica e, step t, row q is sample (e * enc_steps + t) * enc_micro_batch + q.
// - the LLM's side: modality tokens sit first in the fused sequence; with cp > 1 each CP
//   rank keeps the tokens of its two load-balanced chunks (c and 2cp-1-c of seq / 2cp).
// - backward: the LLM's first layer is column-parallel, y = A W (W: H x F, F = 32 columns,
//   split over the LLM's TP ranks); with upstream gradient dY (fill_random(kGradSeed + n))
//   each TP rank computes its partial dA = dY_t W_t^T and the TP all-reduce (the consumer's
//   own collective, in the LLM's backward) sums them — the only reduction. The boundary
//   then moves that one summed gradient back (boundary.h's gradient rule).
// Pure data movement must be exact (activations compared bitwise); gradients match the
// reference dA = dY W^T (double precision) within float rounding.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hetpar/core/status.h"
#include "hetpar/core/units.h"
#include "hetpar/planner/layout.h"
#include "hetpar/planner/scenario.h"
#include "hetpar/runtime/backend.h"
#include "hetpar/sim/task_graph.h"

namespace hetpar::executor {

/// One boundary communication a rank took part in, in the lowering's terms.
struct BoundaryComm {
  bool p2p = false;
  sim::CollectiveKind kind = sim::CollectiveKind::kBroadcast;  // collectives
  std::vector<int> ranks;  // p2p: {src, dst}; collective: the group in group order
  int root = -1;           // broadcast: world rank
  Bytes bytes;             // at the workload's precision, nccl-tests size (task_graph.h)
  bool operator==(const BoundaryComm&) const = default;
  auto operator<=>(const BoundaryComm&) const = default;
};
std::string describe(const BoundaryComm& c);

struct BoundaryCheckResult {
  int64_t activation_values = 0;      // LLM-side values compared (this rank)
  int64_t activation_mismatches = 0;  // of them, not bitwise equal to the reference
  int64_t gradient_values = 0;        // encoder-side gradient values compared (this rank)
  double max_gradient_error = 0;      // max |got - ref| / max(|ref|, 1)
  std::vector<BoundaryComm> comms;    // the boundary communications this rank ran
};

/// Runs the check on this rank; every rank of the plan's world calls it (mpirun -np
/// world). REQUIRES: a colocated or non-colocated plan with one encoder, feasible
/// (planner::infeasibility() empty). Errors: the world differs from the plan's; backend
/// failures.
Result<BoundaryCheckResult> check_boundary(runtime::Backend& b, const planner::Scenario& s,
                                           const planner::Plan& p);

/// The boundary_comm tasks of a lowered graph (full ranks) that involve `rank`, in the same
/// terms, for comparing with BoundaryCheckResult::comms.
std::vector<BoundaryComm> lowered_boundary_comms(const sim::TaskGraph& g, int rank);

}  // namespace hetpar::executor

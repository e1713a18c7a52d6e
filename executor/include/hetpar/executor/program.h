// RankProgram: one rank's share of a lowered TaskGraph in the order the executor issues it.
//
// Issue order. Every rank issues its tasks in one global order: a topological order of the
// whole graph (dependencies plus each stream's program order, sim/task_graph.h), the
// smallest task id first among the ready ones, computed the same way on every rank.
// Collectives and P2P then reach every member in the same relative order, so blocking
// backends (cpu: MPI) cannot deadlock — the earliest unfinished task in that order has all
// its members' earlier tasks done, so every member is at it — and asynchronous ones (cuda:
// NCCL) see the same issue order on every rank, as NCCL requires.
//
// Streams. A task runs on the backend stream of its sim stream on this rank: the compute
// stream is runtime stream 0, comm stream i is runtime stream 1 + i. A dependency between
// two tasks of this rank on different streams becomes an event (record after the first,
// wait before the second); on one stream program order already holds.
#pragma once

#include <cstdint>
#include <vector>

#include "hetpar/core/ids.h"
#include "hetpar/core/status.h"
#include "hetpar/sim/task_graph.h"

namespace hetpar::executor {

struct ProgramTask {
  TaskId id;
  int stream = 0;  // runtime stream index on this rank
  /// Tasks of this rank on other streams this one waits for (indices into
  /// RankProgram::tasks, all earlier).
  std::vector<int32_t> waits;
  bool recorded = false;  // a later task of another stream waits for this one
};

struct RankProgram {
  int rank = 0;
  std::vector<ProgramTask> tasks;  // in issue order
  int num_streams = 1;             // runtime streams used: 0 .. num_streams-1
  /// Dependencies into this rank's tasks from tasks of other ranks that no member of the
  /// dependent task runs (no transfer carries them, so the executor cannot honour them; a
  /// send waiting for its sender's compute is carried). Zero for lower()'s graphs.
  int64_t foreign_dependencies = 0;
};

/// The global issue order of every task of `g` (see the top of this file).
/// Errors: a cycle through dependencies and stream order.
Result<std::vector<TaskId>> issue_order(const sim::TaskGraph& g);

/// Rank `rank`'s program, from the global order. REQUIRES: `order` from issue_order(g).
/// Errors: a task mirrored onto this rank (a graph lowered with representatives: lower
/// with LowerOptions::full_ranks to execute it).
Result<RankProgram> rank_program(const sim::TaskGraph& g, const std::vector<TaskId>& order,
                                 int rank);

}  // namespace hetpar::executor

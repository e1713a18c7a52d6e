// TaskGraph: the per-rank programs the simulator replays. Each task occupies one stream on
// each rank it involves; a stream runs its tasks one at a time in the order they were added
// (program order, like CUDA streams); streams of one rank run concurrently. Building never
// fails: validate() reports bad ids, bad sizes and cycles.
//
// A ComputeTask occupies one compute stream, a P2P task one comm stream on the sender and
// one on the receiver, a collective one comm stream on every member. A task starts when
// its explicit dependencies are done and every stream it occupies is idle and has reached
// it; so a multi-rank task starts when its last participant arrives (NCCL semantics).
// Cycles include deadlocks that stream order creates (a collective waiting, through
// dependencies, for one queued behind it on some member's stream).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hetpar/core/ids.h"
#include "hetpar/core/status.h"
#include "hetpar/core/units.h"

namespace hetpar::sim {

using LabelId = Id<struct LabelTag>;  // an interned string: a task's name or category
using GroupId = Id<struct GroupTag>;  // an interned list of ranks of a collective

enum class StreamKind : uint8_t { kCompute, kComm };
enum class TaskKind : uint8_t { kCompute, kCollective, kP2P };
/// Sizes follow nccl-tests (calibration.md §2.5): all_reduce, broadcast, reduce: the
/// buffer per rank; all_gather, reduce_scatter: the total (gathered) array; all_to_all:
/// the whole send buffer of one rank (it sends bytes/n to each member).
enum class CollectiveKind : uint8_t {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kBroadcast,
  kReduce
};
/// kAuto picks by predicted time, as NCCL's tuner does (see collective.h).
enum class Algorithm : uint8_t { kAuto, kRing, kTree };

std::string_view to_string(StreamKind k);
std::string_view to_string(TaskKind k);
std::string_view to_string(CollectiveKind k);
std::string_view to_string(Algorithm a);

struct StreamRef {
  RankId rank{};
  StreamKind kind = StreamKind::kCompute;
  int32_t index = 0;
};

/// Name and category (e.g. "fwd", "tp_comm") of a task, from TaskGraph::label().
struct Label {
  LabelId category{};
  LabelId name{};
};

struct CollectiveSpec {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  std::span<const RankId> group{};
  Bytes bytes{};
  int32_t stream = 0;  // comm stream index, the same on every member
  Algorithm algorithm = Algorithm::kAuto;
  RankId root{};  // broadcast / reduce; invalid = group[0]
};

/// One task; fields that do not apply to its kind keep their defaults.
struct Task {
  TaskKind kind = TaskKind::kCompute;
  Label label{};
  Time duration{};  // compute
  Flops flops{};    // compute, for metrics only
  Bytes bytes{};    // collective (see CollectiveKind), p2p
  CollectiveKind collective = CollectiveKind::kAllReduce;
  Algorithm algorithm = Algorithm::kAuto;
  GroupId group{};
  RankId root{};
};

class TaskGraph {
 public:
  /// Interns `text`; the same text always gives the same id.
  LabelId label(std::string_view text);
  std::string_view label_text(LabelId id) const;
  int num_labels() const { return static_cast<int>(label_text_.size()); }

  TaskId add_compute(RankId rank, int32_t stream, Time duration, Flops flops, Label label = {});
  TaskId add_collective(const CollectiveSpec& spec, Label label = {});
  /// `src` sends `bytes` to `dst`; occupies comm stream `src_stream` on src and
  /// `dst_stream` on dst.
  TaskId add_p2p(RankId src, RankId dst, Bytes bytes, int32_t src_stream, int32_t dst_stream,
                 Label label = {});
  /// `after` starts only once `before` has finished.
  void add_dependency(TaskId before, TaskId after);

  /// Ok when every id is known, ranks are < num_ranks, sizes and durations are >= 0,
  /// groups have distinct members (root among them), and no cycle exists through
  /// dependencies and stream order.
  Status validate(int num_ranks) const;

  int num_tasks() const { return static_cast<int>(tasks_.size()); }
  const Task& task(TaskId id) const { return tasks_[id.value()]; }
  /// The streams `id` occupies: compute: 1; p2p: {src, dst}; collective: in group order.
  std::span<const StreamRef> streams(TaskId id) const {
    return {stream_refs_.data() + stream_begin_[id.value()],
            stream_refs_.data() + stream_begin_[id.value() + 1]};
  }
  std::span<const RankId> group(GroupId id) const { return groups_[id.value()]; }
  int num_groups() const { return static_cast<int>(groups_.size()); }
  /// Dependencies as (before, after) pairs, in the order added.
  std::span<const std::pair<TaskId, TaskId>> dependencies() const { return deps_; }

 private:
  TaskId push(const Task& t);
  GroupId intern_group(std::span<const RankId> group);

  std::vector<Task> tasks_;
  std::vector<int32_t> stream_begin_{0};
  std::vector<StreamRef> stream_refs_;
  std::vector<std::pair<TaskId, TaskId>> deps_;
  std::vector<std::vector<RankId>> groups_;
  std::map<std::vector<RankId>, GroupId> group_ids_;
  std::vector<std::string> label_text_;
  std::map<std::string, LabelId, std::less<>> label_ids_;
};

}  // namespace hetpar::sim

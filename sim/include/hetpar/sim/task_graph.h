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
//
// Host (optional; none unless set_host is called): each simulated rank has one host thread,
// the trainer's program, that issues the rank's tasks given a host cost (set_host) in the
// order they were added (whatever their streams), spending host_issue(t) on each; such a
// task starts no earlier than the host of every simulated rank it occupies has issued it.
// A compute task issued as several calls (its kernels, spread evenly over its host time)
// runs them as they come: it may start once the first is issued, and its work ends no
// earlier than its last kernel (1/n of its duration for n calls) run after the host's last
// launch; the GPU's waits for launches inside it are taken before it, as idle time.
// Tasks without a host cost are not issued by the host (they start as if it were ahead).
// The host runs ahead of the GPU without bound (CUDA's launch queue), except after a sync
// task: having issued it, the host waits for it to finish before issuing the next one (a
// device-to-host read the program needs, e.g. the split sizes of a dropless all-to-all),
// and the GPU then waits for the host's launches until the host gets ahead again.
//
// Symmetry reduction (how a planner simulates one representative of many alike ranks):
// - A rank's multiplicity says how many ranks of the world its streams stand for: 1 by
//   default; k > 1 for a representative of k ranks that behave exactly alike (the
//   representative and k-1 others); 0 for a mirrored rank. A mirrored rank runs no stream
//   of its own: a collective or P2P that includes it occupies streams on its other members
//   only, and the mirrored member is taken to arrive when they do (a peer that behaves like
//   a simulated one). Its routes still carry the task's flows: a collective's flow pattern
//   is always the whole group's. SimResult reports multiplicity per rank, and category
//   totals count every stream a task stands for.
// - A collective or P2P may name copies: further groups (P2P: further (src, dst) pairs)
//   over which the same task runs at the same time in the world, unsimulated. They load
//   the network: on every link the task's flows cross, each flow counts as (flows of the
//   task and all its copies on that link) / (flows of the task on it), so shared links see
//   the right load while only the task's own flows are simulated.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hetpar/core/huge_pages.h"
#include "hetpar/core/ids.h"
#include "hetpar/core/status.h"
#include "hetpar/core/units.h"
#include "hetpar/sim/kernel.h"

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
inline constexpr int kNumCollectiveKinds = 6;
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
  bool operator==(const StreamRef&) const = default;
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
  /// Concurrent unsimulated copies (see the top of this file): from add_group, k x the
  /// group's size ranks, copy i's members in the group's member order. Invalid = none.
  GroupId copies{};
  /// When valid, the group (from TaskGraph::add_group) instead of `group`: saves interning
  /// the same list per task.
  GroupId group_id{};
  /// Moved by the GPUs' copy engines rather than by kernels on their SMs (Transformer
  /// Engine's userbuffers ring exchange): compute beside it is not slowed
  /// (SimOptions::collective_compute_slowdown), and no NCCL latency is paid.
  bool copy_engine = false;
  /// From buffers registered with NCCL (Megatron's nccl_ub user buffers), which NCCL moves
  /// with SM-efficient kernels: compute beside it is slowed by
  /// SimOptions::registered_collective_compute_slowdown instead.
  bool registered = false;
};

/// One task; fields that do not apply to its kind keep their defaults.
struct Task {
  // Fields ordered so that the struct packs into one 64-byte cache line (the engine walks
  // millions of tasks); designated initializers must follow this order.
  TaskKind kind = TaskKind::kCompute;
  CollectiveKind collective = CollectiveKind::kAllReduce;
  Algorithm algorithm = Algorithm::kAuto;
  bool copy_engine : 1 = false;  // collective: see CollectiveSpec::copy_engine
  bool registered : 1 = false;   // collective: see CollectiveSpec::registered
  Label label{};
  GroupId group{};
  Time duration{};  // compute
  Flops flops{};    // compute, for metrics only
  Bytes bytes{};    // collective (see CollectiveKind), p2p
  RankId root{};
  RankId src{}, dst{};     // p2p: the (first) transfer; `group`, when valid, all of them
  GroupId copies{};        // collective, p2p: see CollectiveSpec::copies; invalid = none
  int32_t num_copies = 0;  // copies `copies` holds (p2p: pairs)
  /// Compute: what the task runs, for an executor (sim/kernel.h); invalid = not described.
  /// The simulator ignores it.
  KernelListId kernels{};
};
static_assert(sizeof(Task) <= 64, "Task should fit one cache line");

/// Per rank, how many compute and comm streams its tasks use (one more than the largest
/// index any task names).
struct StreamCounts {
  std::vector<int32_t> compute, comm;
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
  /// `copies`: from add_group, (src, dst) pairs of concurrent unsimulated copies.
  TaskId add_p2p(RankId src, RankId dst, Bytes bytes, int32_t src_stream, int32_t dst_stream,
                 Label label = {}, GroupId copies = {});
  /// Several transfers as one task (NCCL's grouped send/recv): `pairs` (from add_group) is
  /// (src, dst, src, dst, ...); each moves `bytes`, on src_stream of its source and
  /// dst_stream of its destination (simulated ones; the task must not occupy a stream
  /// twice), and the task ends when all are delivered. This is how a representative's
  /// ring step is one task: it sends to one mirrored neighbour and receives from another.
  TaskId add_p2p_group(GroupId pairs, Bytes bytes, int32_t src_stream, int32_t dst_stream,
                       Label label = {}, GroupId copies = {});
  /// Interns a list of ranks (a collective's group, or copies); the same list always gives
  /// the same id.
  GroupId add_group(std::span<const RankId> ranks);

  /// Stores a list of kernels (sim/kernel.h) for compute tasks to refer to; lists are
  /// not interned (callers reuse an id for alike tasks).
  KernelListId add_kernels(std::span<const Kernel> kernels);
  std::span<const Kernel> kernels(KernelListId id) const {
    return {kernels_.data() + kernel_begin_[id.value()],
            kernels_.data() + kernel_begin_[id.value() + 1]};
  }
  int num_kernel_lists() const { return static_cast<int>(kernel_begin_.size()) - 1; }
  /// Says what compute task `task` runs. REQUIRES: a compute task; `list` from add_kernels.
  void set_kernels(TaskId task, KernelListId list);

  /// Task `task`'s host cost (top of this file): `issue` of host time to launch it, spread
  /// evenly over `calls` launches (the task may start after the first) and, with `sync`, a
  /// wait for it to finish before the host issues anything after it.
  /// REQUIRES: issue >= 0, calls >= 1.
  void set_host(TaskId task, Time issue, bool sync = false, int32_t calls = 1);
  /// Makes the host-issued `task` a sync task, its host cost kept. REQUIRES: host_issued.
  void set_host_sync(TaskId task);
  /// Whether any task has a host cost (otherwise no host is modelled).
  bool has_host() const { return !host_issue_.empty(); }
  /// Whether set_host was called for `task` (the host issues it).
  bool host_issued(TaskId task) const {
    return task.value() < static_cast<int>(host_issue_.size()) &&
           host_issue_[task.value()] >= Time::zero();
  }
  /// The host time set_host gave `task`; zero without.
  Time host_issue(TaskId task) const {
    return host_issued(task) ? host_issue_[task.value()] : Time::zero();
  }
  bool host_sync(TaskId task) const {
    return task.value() < static_cast<int>(host_sync_.size()) && host_sync_[task.value()] != 0;
  }
  /// The launches set_host spread `task`'s host time over; 1 without.
  int32_t host_calls(TaskId task) const {
    return host_issued(task) ? host_calls_[task.value()] : 1;
  }

  /// Sets `rank`'s multiplicity (top of this file). REQUIRES: n >= 0, called before any
  /// task involving `rank` is added.
  void set_multiplicity(RankId rank, int32_t n);
  /// A name for stream `index` of `kind` on every rank (what the lowering runs on it, e.g.
  /// "dp collectives"), for traces; "" (the default) leaves it unnamed.
  void set_stream_name(StreamKind kind, int32_t index, std::string_view name);
  std::string_view stream_name(StreamKind kind, int32_t index) const;
  /// 1 unless set_multiplicity said otherwise.
  int32_t multiplicity(RankId rank) const {
    return rank.value() < static_cast<int>(multiplicity_.size()) ? multiplicity_[rank.value()] : 1;
  }
  /// How many streams of the world task `id` stands for: compute: its rank's multiplicity;
  /// collective: group size x (1 + copies) (mirrored members do what the others do);
  /// p2p: 2 x (its transfers + copy pairs).
  int64_t world_streams(TaskId id) const {
    const Task& t = tasks_[id.value()];
    switch (t.kind) {
      case TaskKind::kCompute:
        return multiplicity(stream_refs_[stream_begin_[id.value()]].rank);
      case TaskKind::kCollective:
        return static_cast<int64_t>(groups_[t.group.value()].size()) * (1 + t.num_copies);
      case TaskKind::kP2P:
        return 2 *
               ((t.group.valid() ? static_cast<int64_t>(groups_[t.group.value()].size() / 2) : 1) +
                t.num_copies);
    }
    return 1;
  }
  /// Room for this many tasks, stream references and dependencies (no effect on results).
  void reserve(size_t tasks, size_t stream_refs, size_t deps);
  /// Empties the graph (no tasks, groups, labels, kernels or multiplicities) but keeps its
  /// arrays' capacity: a graph refilled for plan after plan (LowerOptions::reuse) is not
  /// allocated and page-faulted afresh each time.
  void clear();
  size_t num_stream_refs() const { return stream_refs_.size(); }
  size_t num_dependencies() const { return deps_.size(); }
  /// `after` starts only once `before` has finished.
  void add_dependency(TaskId before, TaskId after);

  /// Ok when every id is known, ranks are < num_ranks, sizes and durations are >= 0,
  /// groups have distinct members (root among them), and (with `cycles`) no cycle exists
  /// through dependencies and stream order. simulate() skips the cycle check: its run
  /// finds the tasks that can never start itself, in the same words. `counts` (may be
  /// null): once all but the cycle check pass, each rank's streams of each kind, as
  /// simulate() lays them out.
  Status validate(int num_ranks, bool cycles = true, StreamCounts* counts = nullptr) const;
  /// The error for `stuck` tasks that can never start, `first` of them named: what
  /// validate() and simulate() report for a cycle of dependencies and stream order.
  Status cycle_error(TaskId first, int stuck) const;

  int num_tasks() const { return static_cast<int>(tasks_.size()); }
  const Task& task(TaskId id) const { return tasks_[id.value()]; }
  /// The streams `id` occupies: compute: 1; p2p: {src, dst}; collective: in group order.
  /// Mirrored ranks (multiplicity 0) occupy none.
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
  /// Transfer pairs a P2P task's `copies` group stands for (0 when none).
  int32_t copy_pairs(GroupId copies) const;
  GroupId intern_group(std::span<const RankId> group);

  // The per-task arrays, huge-page backed (core/huge_pages.h): a million-task graph
  // otherwise spends a cold run's time in page faults.
  HugeVector<Task> tasks_;
  HugeVector<int32_t> stream_begin_{0};
  HugeVector<StreamRef> stream_refs_;
  HugeVector<std::pair<TaskId, TaskId>> deps_;
  std::vector<std::vector<RankId>> groups_;
  std::map<std::vector<RankId>, GroupId> group_ids_;
  std::vector<std::string> label_text_;
  std::map<std::string, LabelId, std::less<>> label_ids_;
  std::vector<int32_t> multiplicity_;
  std::vector<std::string> stream_names_[2];  // [kind][index]
  HugeVector<Kernel> kernels_;
  HugeVector<int32_t> kernel_begin_{0};
  HugeVector<Time> host_issue_;     // per task (< 0: no set_host); empty: no host
  HugeVector<uint8_t> host_sync_;   // parallel to host_issue_
  HugeVector<int32_t> host_calls_;  // parallel to host_issue_
};

}  // namespace hetpar::sim

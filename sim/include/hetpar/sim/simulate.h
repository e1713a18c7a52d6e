// simulate(): replays a TaskGraph on a Network and reports when everything ran. One call
// builds its own engine (event queue, flow network, stream states), so concurrent calls
// on different threads are independent; the graph and network are only read.
// Compute tasks take their given duration (longer while a collective of their rank runs,
// SimOptions::collective_compute_slowdown); P2P tasks are one flow (route latency + bytes
// at the max-min share); collectives are the flow patterns of collective.h. Graphs reduced
// by symmetry (task_graph.h: multiplicities, mirrored ranks, copies) report the world they
// stand for: category totals count every stream of every copy and every rank a
// representative stands for; per-rank stats are the simulated ranks' own, each with its
// multiplicity (0 for mirrored ranks, whose stats stay zero), so a mean over the world is
// sum(stat x multiplicity) / sum(multiplicity).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hetpar/core/status.h"
#include "hetpar/core/units.h"
#include "hetpar/sim/collective.h"
#include "hetpar/sim/network.h"
#include "hetpar/sim/task_graph.h"
#include "hetpar/sim/trace.h"

namespace hetpar::sim {

struct SimOptions {
  CollectiveConfig collectives;
  /// Per rank (empty: none): while at least one collective of rank r whose members all sit
  /// on one node is in flight, its compute tasks run (1 + s[r]) times slower — NCCL's
  /// kernels take SMs and memory bandwidth from the GEMMs they overlap. A compute task that
  /// straddles the start or end of such a collective is re-timed at that instant (its
  /// remaining work at the new speed). P2P transfers and copy-engine collectives leave
  /// compute alone (NCCL drives P2P with one or two channels per peer).
  std::vector<double> collective_compute_slowdown;
  /// Per rank (empty: none): the same while a collective of rank r whose members span nodes
  /// is in flight (SystemProfile::cross_node_collective_slowdown: the SMs its channels
  /// hold). With collectives of both kinds in flight the larger slowdown applies.
  std::vector<double> cross_node_collective_compute_slowdown;
  /// Per rank (empty: registered collectives slow compute as the others do): the slowdowns
  /// beside a collective from registered buffers (CollectiveSpec::registered), whose
  /// kernels hold fewer SMs: all-gathers (and broadcasts) and reductions (reduce-scatter,
  /// all-reduce, reduce) apart, inside one node and across nodes with one member per node.
  /// One across nodes with several members on a node holds as many SMs as an unregistered
  /// one (cross_node_collective_compute_slowdown). The larger slowdown in flight applies.
  struct RegisteredSlowdown {
    double in_node_gather = 0, in_node_reduce = 0;
    double one_per_node_gather = 0, one_per_node_reduce = 0;
  };
  std::vector<RegisteredSlowdown> registered_collective_compute_slowdown;
  /// Per node (by NodeId; empty or 0: none): compute units its ranks share (a CPU host's
  /// cores). While n compute tasks of the node's ranks run and n exceeds the units, each
  /// runs n / units times slower (processor sharing), re-timed whenever n changes.
  std::vector<double> node_compute_units;
  /// Start a collective's flows of one source with the same share through the same first
  /// link as one bundle moving at one rate (simulate.cpp: exact when their max-min rates
  /// are equal, as in symmetric collectives; an all-to-all then costs 2 flows per source,
  /// not n - 1). false: every flow of the pattern on its own.
  bool bundle_flows = true;
  /// A transfer that starts on idle links takes its time alone (its isolated run, kept per
  /// plan and size) and enters the shared flow network only when another transfer reaches
  /// one of its links, replayed up to that instant: the same times up to the order of
  /// events within one instant, without re-solving rates for transfers that never meet.
  /// false: every transfer's flows enter the shared network when it starts.
  bool defer_flows = true;
  /// Model the host where the graph gives tasks host costs (task_graph.h "Host"); false:
  /// every task is issued in time (a free host, as closed forms assume).
  bool host = true;
  /// Fill SimResult::tasks (costs 16 bytes per task).
  bool record_tasks = false;
  /// Exposed communication by kind (empty: not measured). Per category label (indexed by
  /// LabelId, one last slot for tasks without a category) the kind a communication task of
  /// that category counts under, from 0; the kinds are 0 .. the largest. RankStats::
  /// exposed_by_kind[k] is then the time a communication task of kind k ran on the rank (a
  /// stream of it there) while no compute task of the rank did: the union of the kind's
  /// intervals less the compute tasks' union, integrated as the run goes.
  std::vector<int32_t> comm_kind_of_category;
};

struct RankStats {
  std::vector<Time> compute_stream_busy;  // per compute stream index
  std::vector<Time> comm_stream_busy;     // per comm stream index
  Time compute{};                         // time at least one compute stream was busy
  Time comm{};                            // time at least one comm stream was busy
  Time exposed_comm{};                    // time a comm stream was busy and no compute stream was
  Flops flops{};                          // of the compute tasks that ran on this rank
  Time host{};       // host time spent issuing this rank's tasks (TaskGraph "Host"; 0 without)
  Time host_wait{};  // host time held by sync tasks, from their issue until they finished
  // Time compute tasks were ready on the GPU (dependencies done, stream free) before their
  // host had launched them: the GPU's wait for launches (what CUDA graphs would remove).
  Time launch_wait{};
  std::vector<Time> exposed_by_kind;  // per SimOptions comm kind; empty unless measured
  int32_t multiplicity = 1;           // ranks of the world these stats stand for
};

struct TaskTiming {
  Time start{};
  Time end{};
};

/// Stream time of one category: the durations of its tasks summed over every rank they
/// occupy (a collective over 8 ranks counts 8 times its duration), in the world the graph
/// stands for (TaskGraph::world_streams); `tasks` counts copies and represented ranks too.
struct CategoryTotal {
  std::string category;  // "" collects tasks without a category
  Time rank_time{};
  int64_t tasks = 0;
};

struct SimResult {
  Time makespan{};
  std::vector<RankStats> ranks;
  std::vector<CategoryTotal> categories;  // sorted by category name
  std::vector<TaskTiming> tasks;          // indexed by TaskId; empty unless record_tasks
  /// Resolved algorithm per task (kAuto resolved; kRing for non-collectives) when
  /// record_tasks, else empty.
  std::vector<Algorithm> algorithms;
  /// Flows the transfers started (bundles count once; a deferred transfer counts its flows
  /// whether or not it met another; tasks that ran alone on their links, with a fixed
  /// time, start none): what the network part of a run costs.
  int64_t flows_started = 0;
  /// Transfers that started on idle links and took their isolated time
  /// (SimOptions::defer_flows), and those of them that another transfer met, which the
  /// shared flow network then timed: how much of the network part deferral saved.
  int64_t deferred_transfers = 0, contended_deferrals = 0;
  /// Per SimOptions comm kind, the communication tasks of that kind that ran (empty unless
  /// exposure by kind was measured): which kinds the graph has at all.
  std::vector<int64_t> comm_kind_tasks;
};

/// Arrays simulate() can reuse from one call to the next. A caller that simulates plan
/// after plan on one thread (a layout search, a benchmark) passes the same workspace to
/// each call: the engine's per-task arrays (some 50 bytes per task) then keep their memory
/// rather than being allocated and page-faulted afresh, which on a million-task plan costs
/// as much as a fifth of the run. Results do not depend on it. One call at a time per
/// workspace.
class SimWorkspace {
 public:
  SimWorkspace();
  ~SimWorkspace();
  SimWorkspace(SimWorkspace&&) noexcept;
  SimWorkspace& operator=(SimWorkspace&&) noexcept;
  /// Takes back a finished result's per-task arrays (tasks, algorithms) for the next call.
  void recycle(SimResult&& result);

  struct Arrays;  // defined where simulate() is
  Arrays& arrays() { return *arrays_; }

 private:
  std::unique_ptr<Arrays> arrays_;
};

/// Busy time of a stream is counted from the task's start (all participants there) to
/// its end; time a participant waits at a collective for the others is idle time.
/// Errors: the graph does not validate against the network's ranks, or the network has
/// no router. `workspace` (may be null): arrays to reuse, see SimWorkspace.
Result<SimResult> simulate(const TaskGraph& graph, const Network& net, const SimOptions& options,
                           TraceSink* sink = nullptr, SimWorkspace* workspace = nullptr);

}  // namespace hetpar::sim

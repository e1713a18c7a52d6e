#include "hetpar/sim/simulate.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>
#include <unordered_map>

#include "hetpar/core/check.h"
#include "hetpar/sim/event_queue.h"
#include "hetpar/sim/flow_network.h"

namespace hetpar::sim {
namespace {

// A collective pattern (or a P2P's flows) as the flow network runs it: its flows, bundled
// (SimOptions::bundle_flows), with their routes resolved and their link weights (members
// of the bundle and the task's copies on each link), and its idle-network cost per byte.
struct Plan {
  CollectivePattern pattern;         // the pattern's own flows, one per (src, dst, share)
  std::vector<double> share;         // per flow started: the share of S of each member
  std::vector<int32_t> route_begin;  // started flow i's links are links[route_begin[i] .. [i+1])
  std::vector<LinkId> links;
  std::vector<LinkId> link_set;  // the distinct links of links (what it occupies or claims)
  std::vector<int32_t> members;  // parallel to links: the flows of the bundle crossing it
  std::vector<double> weights;   // parallel to links; empty when all 1
  double seconds_per_byte = 0;
  std::vector<Time> p2p_latency;  // P2P: per flow, its route's latency
  // Collective: per kind of node among its members (CollectiveConfig::curves_of), its
  // kind's size scale for the group's scope (null: none) and the node scale's factor at
  // the number of nodes the group spans (inside a node: the group scale's at its size).
  // Empty: neither.
  struct Ramp {
    const std::vector<CurvePoint>* size_scale = nullptr;
    double node_factor = 1.0;
  };
  std::vector<Ramp> ramps;
  // find_uncontended: whether every link it crosses is private to one stream (-1: not yet
  // known); a property of its links alone, so decided once per plan.
  mutable int8_t private_links = -1;
};

// Bytes the flows of `task` move per byte of its size: 1 / (the size scale's factor at its
// size x the node scale's at its nodes, or inside a node the group scale's at its size) for
// NCCL's collectives (CollectiveCurves), the smallest such factor where its members' nodes
// differ; 1 for P2P and copy engines. Below 1 where a factor exceeds 1 (NVLS).
double wire_bytes_per_byte(const Plan& p, const Task& task) {
  if (task.kind != TaskKind::kCollective || task.copy_engine || p.ramps.empty()) return 1.0;
  double factor = std::numeric_limits<double>::infinity();  // ramps is not empty
  for (const Plan::Ramp& r : p.ramps) {
    const double size = r.size_scale ? curve_factor(*r.size_scale, task.bytes.count()) : 1.0;
    factor = std::min(factor, size * r.node_factor);
  }
  return 1.0 / factor;
}

std::vector<LinkId> distinct(std::vector<LinkId> links) {
  std::sort(links.begin(), links.end());
  links.erase(std::unique(links.begin(), links.end()), links.end());
  return links;
}

// What a task pays after its last flow is delivered: a collective's NCCL latency, unless
// copy engines move it (CollectiveSpec::copy_engine); P2P pays its routes' latencies in
// its flows.
Time tail_latency(const Plan& p, const Task& task) {
  return task.kind == TaskKind::kCollective && !task.copy_engine ? p.pattern.latency : Time::zero();
}

// Makes room for `n` elements, with half as much again when `v` must grow (its contents
// are then dropped): a search thread's workspace serves plans of every size, and an array
// reallocated to each larger plan's exact size faults all its pages in anew.
template <class V>
void reserve_for(V& v, size_t n) {
  if (v.capacity() >= n) return;
  v.clear();
  v.reserve(n + n / 2);
}

// std::llround for 0 <= x < 2^63 (halves away from zero), inline: the engine rounds every
// re-timed compute's remaining picoseconds. x - trunc(x) is exact for a double.
int64_t round_nonnegative(double x) {
  const auto i = static_cast<int64_t>(x);
  return i + (x - static_cast<double>(i) >= 0.5 ? 1 : 0);
}

struct PlanKey {
  int32_t a = 0, b = 0, root = 0, copies = 0;  // collective: a = group; p2p: a = src, b = dst
  uint8_t kind = 0, algorithm = 0, p2p = 0;
  bool operator==(const PlanKey&) const = default;
};
struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    uint64_t h = static_cast<uint32_t>(k.a);
    h = h * 0x9E3779B97F4A7C15ULL ^ static_cast<uint32_t>(k.b);
    h = h * 0x9E3779B97F4A7C15ULL ^ static_cast<uint32_t>(k.root);
    h = h * 0x9E3779B97F4A7C15ULL ^ static_cast<uint32_t>(k.copies);
    h = h * 0x9E3779B97F4A7C15ULL ^ (k.kind | k.algorithm << 8 | k.p2p << 16);
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

// The key of a collective's plan: its group, root (broadcast, reduce), copies, kind and
// algorithm.
PlanKey collective_key(const Task& task, Algorithm algorithm) {
  const bool rooted =
      task.collective == CollectiveKind::kBroadcast || task.collective == CollectiveKind::kReduce;
  return {.a = task.group.value(),
          .root = rooted ? task.root.value() : -1,
          .copies = task.copies.valid() ? task.copies.value() : -1,
          .kind = static_cast<uint8_t>(task.collective),
          .algorithm = static_cast<uint8_t>(algorithm)};
}

// Time a rank spends with compute streams busy, comm streams busy, and comm alone:
// integrated piecewise between the instants its stream occupancy changes.
struct RankClock {
  Time last;
  int32_t compute_active = 0;
  int32_t comm_active = 0;
  Time compute, comm, exposed;

  void advance(Time now) {
    Time dt = now - last;
    if (compute_active > 0) compute += dt;
    if (comm_active > 0) comm += dt;
    if (comm_active > 0 && compute_active == 0) exposed += dt;
    last = now;
  }
};

// What the engine tracks per task, together so that starting and finishing a task touch
// one cache line rather than one per array (a 1T-parameter plan has over a million tasks).
struct TaskState {
  Time start;
  Time issue;                  // its earliest start as its ranks' hosts issue it (TaskGraph)
  Time tail_latency;           // collective: paid after its last flow
  Time fixed = Time::ps(-1);   // comm: its time when it runs alone (find_uncontended), else < 0
  const Plan* plan = nullptr;  // comm: its resolved plan
  EventHandle deferred_end;    // comm, deferred (SimOptions::defer_flows): its finish
  int32_t waiting = 0;         // dependencies + streams not yet at it
  int32_t flows_left = 0;      // comm: flows in flight; kDeferred while timed alone
};

}  // namespace

// The engine's per-task arrays, kept between calls by a SimWorkspace.
struct SimWorkspace::Arrays {
  HugeVector<TaskState> state;  // per task; huge-page backed (core/huge_pages.h)
  HugeVector<int32_t> succ_begin, succ, fill, stream_tasks;
  std::vector<Algorithm> algorithm;
  std::vector<TaskTiming> timings;
};

SimWorkspace::SimWorkspace() : arrays_(std::make_unique<Arrays>()) {}
SimWorkspace::~SimWorkspace() = default;
SimWorkspace::SimWorkspace(SimWorkspace&&) noexcept = default;
SimWorkspace& SimWorkspace::operator=(SimWorkspace&&) noexcept = default;

void SimWorkspace::recycle(SimResult&& result) {
  if (result.tasks.capacity() > arrays_->timings.capacity())
    arrays_->timings = std::move(result.tasks);
  if (result.algorithms.capacity() > arrays_->algorithm.capacity())
    arrays_->algorithm = std::move(result.algorithms);
}

namespace {

class Engine final : public EventSource, public FlowNetwork::Observer {
 public:
  // `counts`: the graph's streams per rank (TaskGraph::validate).
  Engine(const TaskGraph& g, const Network& net, const SimOptions& opt, TraceSink* sink,
         SimWorkspace* ws, StreamCounts counts);
  Result<SimResult> run();

  void on_event(Time now, uint32_t tag) override {
    if (tag & kStartTag)
      start(static_cast<int32_t>(tag & ~kStartTag));
    else
      finish(now, static_cast<int32_t>(tag));
  }
  void on_flow_done(Time now, uint32_t task) override;
  void on_claim_contended(int32_t task) override;

 private:
  int32_t stream_of(const StreamRef& s) const {
    int32_t r = s.rank.value();
    return stream_base_[r] + (s.kind == StreamKind::kComm ? num_compute_[r] : 0) + s.index;
  }
  // An event's tag: the task that finishes, or with this bit the task whose start waited
  // for its host's issue.
  static constexpr uint32_t kStartTag = 1u << 31;
  static constexpr int32_t kDeferred = -1;  // TaskState::flows_left of a deferred transfer
  void arrive(int32_t t);
  void start(int32_t t);
  // The host of `rank` issues its next tasks from `now` on, up to and including its next
  // sync task (TaskGraph: "Host").
  void issue_from(int32_t rank, Time now);
  const Plan& resolve(int32_t t);
  int32_t launch(const Plan& p, const Task& task, uint32_t cookie, FlowNetwork& fn);
  void find_uncontended();
  Time isolated_time(const Plan& p, const Task& task);
  void finish(Time now, int32_t t);
  void report(int32_t t, const StreamRef& s, Time end, bool started);
  std::string_view task_name(int32_t t) const;  // its name, or its kind without one
  // Variable-speed compute (SimOptions::collective_compute_slowdown, node_compute_units):
  // the time multiplier of `rank`'s compute now, and re-timing its running tasks when it
  // changed (their remaining work at the new speed).
  double speed_factor(int32_t rank) const;
  void retime(int32_t rank);
  void retime_node(int32_t node);
  // Where `group`'s members sit (decided once per group): on one node, across nodes with
  // one member per node, or across nodes with several on some node.
  enum Spread : int8_t { kOneNode, kOnePerNode, kAcrossNodes };
  Spread spread(GroupId group) {
    int8_t& known = group_spread_[group.value()];
    if (known < 0) {
      auto members = g_.group(group);
      std::vector<int32_t> nodes;
      nodes.reserve(members.size());
      for (RankId r : members) nodes.push_back(net_.node_of(r).value());
      std::sort(nodes.begin(), nodes.end());
      const bool one_node = !nodes.empty() && nodes.front() == nodes.back();
      const bool one_per_node = std::adjacent_find(nodes.begin(), nodes.end()) == nodes.end();
      known = one_node ? kOneNode : one_per_node ? kOnePerNode : kAcrossNodes;
    }
    return static_cast<Spread>(known);
  }
  bool in_one_node(GroupId group) { return spread(group) == kOneNode; }
  // Whether a collective slows its members' compute: a slowdown set and NCCL's kernels
  // (not copy engines) moving it (a collective asks at its start and at its end).
  bool slows_compute(const Task& task) { return !slowdown_.empty() && !task.copy_engine; }
  // Which of the slowdowns (SimOptions) a slowing collective applies while it runs.
  enum SlowClass : int32_t {
    kInNode,
    kCrossNode,
    kRegisteredInNodeGather,
    kRegisteredInNodeReduce,
    kRegisteredOnePerNodeGather,
    kRegisteredOnePerNodeReduce,
    kSlowClasses
  };
  // Registered collectives without figures of their own (SimOptions) take the others' class.
  int32_t slow_class(const Task& task) {
    const Spread where = spread(task.group);
    if (!task.registered || !registered_figures_ || where == kAcrossNodes)
      return where == kOneNode ? kInNode : kCrossNode;
    const bool gather = task.collective == CollectiveKind::kAllGather ||
                        task.collective == CollectiveKind::kBroadcast;
    if (where == kOneNode) return gather ? kRegisteredInNodeGather : kRegisteredInNodeReduce;
    return gather ? kRegisteredOnePerNodeGather : kRegisteredOnePerNodeReduce;
  }
  const Plan& plan(const Task& task, Algorithm algorithm);
  const Plan& p2p_plan(const Task& task);
  void add_flow(Plan& p, RankId src, RankId dst, double share);
  void bundle_flows(Plan& p);
  void weigh(Plan& p, const Task& task, Algorithm algorithm);

  const TaskGraph& g_;
  const Network& net_;
  const SimOptions& opt_;
  TraceSink* sink_;
  // The per-task arrays: the workspace's when one is given, else the engine's own.
  SimWorkspace::Arrays own_;
  SimWorkspace::Arrays& a_;
  EventQueue queue_;
  FlowNetwork flows_;

  // Streams: rank r owns streams stream_base_[r] .. +num_compute_[r] (compute) and the
  // comm streams after them. Each stream's tasks in program order (CSR) and its head.
  std::vector<int32_t> stream_base_, num_compute_;
  std::vector<int32_t> stream_task_begin_, stream_head_;
  HugeVector<int32_t>& stream_tasks_ = a_.stream_tasks;
  std::vector<Time> stream_busy_;
  std::vector<RankClock> clocks_;
  std::vector<Flops> flops_;

  // Tasks: what each still waits for (dependencies + streams not yet at it), successors
  // (CSR), start times, flows in flight and the latency paid after the last one.
  HugeVector<int32_t>& succ_begin_ = a_.succ_begin;
  HugeVector<int32_t>& succ_ = a_.succ;
  HugeVector<TaskState>& state_ = a_.state;
  std::vector<Algorithm>& algorithm_ = a_.algorithm;
  std::vector<Time> category_time_;
  std::vector<int64_t> category_tasks_;
  int32_t finished_ = 0;
  Time makespan_;
  SimResult result_;

  std::unordered_map<PlanKey, Plan, PlanKeyHash> plans_;  // node-based: stable addresses
  struct Resolved {  // resolve()'s memo: a collective's key (its own algorithm) -> plan
    PlanKey key;
    const Plan* plan = nullptr;
    Algorithm algorithm = Algorithm::kRing;
  };
  std::array<Resolved, 64> resolved_{};
  struct Isolated {
    const Plan* plan = nullptr;
    Bytes bytes;
    bool copy_engine = false;  // the size scale applies only to NCCL's collectives
    Time time;                 // of the flows, without the collective's tail latency
  };
  std::unordered_map<uint64_t, Isolated> isolated_;
  struct LastDelivery final : FlowNetwork::Observer {
    Time last;
    void on_flow_done(Time now, uint32_t) override { last = std::max(last, now); }
  };
  EventQueue iso_queue_;
  LastDelivery iso_;
  FlowNetwork iso_flows_;
  std::vector<LinkId> route_;
  std::vector<double> link_load_;  // weigh() scratch: per link, flows of copies
  std::vector<int32_t> link_rep_;  // weigh() scratch: per link, flows of the task
  std::vector<int32_t> touched_;   // weigh() scratch: links with a load

  // Variable-speed compute, on when a slowdown or a shared node is set (else every compute
  // task is one fixed event): per rank the slowdowns and the slowing collectives in flight
  // (inside one node, across nodes), the
  // current time multiplier; per compute stream the task it runs (-1: none) with its pending
  // end event and its work left (picoseconds at full speed) as of `since`; per node the
  // shared units (0 = none), the compute tasks running and the node's ranks.
  struct Running {
    int32_t task = -1;
    EventHandle end;
    double left_ps = 0;
    Time since;
  };
  bool variable_ = false;
  // Per rank and SlowClass (rank * kSlowClasses + class): the slowdown, and the slowing
  // collectives of the class in flight.
  std::vector<double> slowdown_;
  std::vector<int32_t> slowing_active_;
  std::vector<uint32_t> slowing_classes_;  // per rank: bit c set while class c slows it
  bool registered_figures_ = false;   // SimOptions::registered_collective_compute_slowdown given
  std::vector<int8_t> group_spread_;  // per group: -1 not yet known, else a Spread
  std::vector<double> factor_;
  std::vector<Running> running_;  // indexed like streams (only compute ones used)

  // Host (on when the graph has host costs): per rank its tasks in issue order (CSR), the
  // next one to issue and the host's clock; per task (state_) when it is issued.
  bool host_ = false;
  std::vector<int32_t> host_begin_, host_tasks_, host_next_;
  std::vector<Time> host_clock_, host_busy_, host_wait_, launch_wait_;
  std::vector<double> units_;
  std::vector<int32_t> computing_;
  std::vector<std::vector<int32_t>> ranks_of_node_;

  // Exposure by kind (SimOptions::comm_kind_of_category; off when num_kinds_ is 0): per
  // (rank, kind) the kind's streams busy and its exposed time, integrated with the rank's
  // clock (advance: compute tasks occupy compute streams only, communication tasks comm
  // streams only, so the clock's counts are the tasks'); per kind the tasks that ran.
  int32_t num_kinds_ = 0;
  std::vector<int32_t> kind_active_;
  std::vector<Time> kind_exposed_;
  std::vector<int64_t> kind_tasks_;
  int32_t comm_kind(const Task& task) const {
    return opt_.comm_kind_of_category[task.label.category.valid() ? task.label.category.value()
                                                                  : g_.num_labels()];
  }
  // Moves `rank`'s clock to `now`, first adding the time since its last change to each kind
  // running there while no compute stream was busy; call before any of its counts change.
  RankClock& advance(int32_t rank, Time now) {
    RankClock& c = clocks_[rank];
    if (num_kinds_ > 0 && c.comm_active > 0 && c.compute_active == 0 && now > c.last)
      for (int32_t k = rank * num_kinds_; k < (rank + 1) * num_kinds_; ++k)
        if (kind_active_[k] > 0) kind_exposed_[k] += now - c.last;
    c.advance(now);
    return c;
  }
};

Engine::Engine(const TaskGraph& g, const Network& net, const SimOptions& opt, TraceSink* sink,
               SimWorkspace* ws, StreamCounts counts)
    : g_(g),
      net_(net),
      opt_(opt),
      sink_(sink),
      a_(ws ? ws->arrays() : own_),
      flows_(queue_, net, *this),
      iso_flows_(iso_queue_, net, iso_) {
  const int nr = net.num_ranks();
  const int nt = g.num_tasks();
  HETPAR_CHECK(
      static_cast<int>(counts.compute.size()) == nr && static_cast<int>(counts.comm.size()) == nr,
      "stream counts for {} / {} ranks, not {}", counts.compute.size(), counts.comm.size(), nr);
  num_compute_ = std::move(counts.compute);
  const std::vector<int32_t>& num_comm = counts.comm;
  stream_base_.assign(nr + 1, 0);
  for (int r = 0; r < nr; ++r)
    stream_base_[r + 1] = stream_base_[r] + num_compute_[r] + num_comm[r];
  const int ns = stream_base_[nr];

  // Program order per stream, and per task the number of things it waits for.
  reserve_for(state_, static_cast<size_t>(nt));
  state_.assign(nt, TaskState{});
  stream_task_begin_.assign(ns + 1, 0);
  for (int t = 0; t < nt; ++t)
    for (const StreamRef& s : g.streams(TaskId(t))) {
      ++stream_task_begin_[stream_of(s) + 1];
      ++state_[t].waiting;
    }
  for (int s = 0; s < ns; ++s) stream_task_begin_[s + 1] += stream_task_begin_[s];
  reserve_for(stream_tasks_, static_cast<size_t>(stream_task_begin_[ns]));
  stream_tasks_.resize(stream_task_begin_[ns]);
  stream_head_.assign(stream_task_begin_.begin(), stream_task_begin_.end() - 1);
  for (int t = 0; t < nt; ++t)
    for (const StreamRef& s : g.streams(TaskId(t))) stream_tasks_[stream_head_[stream_of(s)]++] = t;
  stream_head_.assign(stream_task_begin_.begin(), stream_task_begin_.end() - 1);
  stream_busy_.assign(ns, Time::zero());
  clocks_.assign(nr, RankClock{});

  reserve_for(succ_begin_, static_cast<size_t>(nt) + 1);
  succ_begin_.assign(nt + 1, 0);
  for (auto [before, after] : g.dependencies()) {
    ++succ_begin_[before.value() + 1];
    ++state_[after.value()].waiting;
  }
  for (int t = 0; t < nt; ++t) succ_begin_[t + 1] += succ_begin_[t];
  reserve_for(succ_, static_cast<size_t>(succ_begin_[nt]));
  succ_.resize(succ_begin_[nt]);
  {
    HugeVector<int32_t>& fill = a_.fill;
    reserve_for(fill, static_cast<size_t>(nt));
    fill.assign(succ_begin_.begin(), succ_begin_.end() - 1);
    for (auto [before, after] : g.dependencies()) succ_[fill[before.value()]++] = after.value();
  }
  reserve_for(algorithm_, static_cast<size_t>(nt));
  algorithm_.assign(nt, Algorithm::kRing);
  category_time_.assign(g.num_labels() + 1, Time::zero());  // last slot: no category
  category_tasks_.assign(g.num_labels() + 1, 0);
  flops_.assign(nr, Flops(0));
  if (opt.record_tasks) {
    result_.tasks = std::move(a_.timings);
    reserve_for(result_.tasks, static_cast<size_t>(nt));
    result_.tasks.assign(nt, TaskTiming{});
  }
  group_spread_.assign(static_cast<size_t>(g.num_groups()), -1);
  bool slowed = false, shared = false;
  for (double x : opt.collective_compute_slowdown) slowed = slowed || x > 0;
  for (double x : opt.cross_node_collective_compute_slowdown) slowed = slowed || x > 0;
  for (const SimOptions::RegisteredSlowdown& x : opt.registered_collective_compute_slowdown)
    slowed = slowed || x.in_node_gather > 0 || x.in_node_reduce > 0 || x.one_per_node_gather > 0 ||
             x.one_per_node_reduce > 0;
  for (double x : opt.node_compute_units) shared = shared || x > 0;
  if (slowed) {
    // Per rank, inside a node and across nodes; an empty one slows nothing.
    auto check = [&](size_t size, std::string_view name) {
      HETPAR_CHECK(size == 0 || static_cast<int>(size) == nr, "{} has {} entries for {} ranks",
                   name, size, nr);
    };
    check(opt.collective_compute_slowdown.size(), "collective_compute_slowdown");
    check(opt.cross_node_collective_compute_slowdown.size(),
          "cross_node_collective_compute_slowdown");
    check(opt.registered_collective_compute_slowdown.size(),
          "registered_collective_compute_slowdown");
    slowdown_.assign(static_cast<size_t>(nr) * kSlowClasses, 0.0);
    registered_figures_ = !opt.registered_collective_compute_slowdown.empty();
    for (int r = 0; r < nr; ++r) {
      auto of = [&](const std::vector<double>& v) { return v.empty() ? 0.0 : v[r]; };
      double* x = &slowdown_[static_cast<size_t>(r) * kSlowClasses];
      x[kInNode] = of(opt.collective_compute_slowdown);
      x[kCrossNode] = of(opt.cross_node_collective_compute_slowdown);
      if (!registered_figures_) continue;
      const SimOptions::RegisteredSlowdown& reg = opt.registered_collective_compute_slowdown[r];
      x[kRegisteredInNodeGather] = reg.in_node_gather;
      x[kRegisteredInNodeReduce] = reg.in_node_reduce;
      x[kRegisteredOnePerNodeGather] = reg.one_per_node_gather;
      x[kRegisteredOnePerNodeReduce] = reg.one_per_node_reduce;
    }
    slowing_active_.assign(static_cast<size_t>(nr) * kSlowClasses, 0);
    slowing_classes_.assign(static_cast<size_t>(nr), 0);
  }
  if (shared) {
    int nodes = 0;
    for (int r = 0; r < nr; ++r) nodes = std::max(nodes, net.node_of(RankId(r)).value() + 1);
    units_.assign(nodes, 0.0);
    for (size_t n = 0; n < opt.node_compute_units.size() && n < units_.size(); ++n)
      units_[n] = opt.node_compute_units[n];
    computing_.assign(nodes, 0);
    ranks_of_node_.resize(nodes);
    for (int r = 0; r < nr; ++r) ranks_of_node_[net.node_of(RankId(r)).value()].push_back(r);
  }
  variable_ = slowed || shared;
  host_ = opt.host && g.has_host();
  if (host_) {
    // Each task waits for the host of every simulated rank it occupies (once per rank,
    // though a P2P group may occupy two streams of one).
    host_begin_.assign(nr + 1, 0);
    auto each_rank = [&](int t, auto&& f) {
      auto refs = g.streams(TaskId(t));
      for (size_t i = 0; i < refs.size(); ++i) {
        bool seen = false;
        for (size_t j = 0; j < i && !seen; ++j) seen = refs[j].rank == refs[i].rank;
        if (!seen) f(refs[i].rank.value());
      }
    };
    for (int t = 0; t < nt; ++t)
      if (g.host_issued(TaskId(t))) each_rank(t, [&](int32_t r) { ++host_begin_[r + 1]; });
    for (int r = 0; r < nr; ++r) host_begin_[r + 1] += host_begin_[r];
    host_tasks_.resize(host_begin_[nr]);
    host_next_.assign(host_begin_.begin(), host_begin_.end() - 1);
    for (int t = 0; t < nt; ++t)
      if (g.host_issued(TaskId(t)))
        each_rank(t, [&](int32_t r) {
          host_tasks_[host_next_[r]++] = t;
          ++state_[t].waiting;
        });
    host_next_.assign(host_begin_.begin(), host_begin_.end() - 1);
    host_clock_.assign(nr, Time::zero());
    host_busy_.assign(nr, Time::zero());
    host_wait_.assign(nr, Time::zero());
    launch_wait_.assign(nr, Time::zero());
  }
  if (variable_) {
    factor_.assign(nr, 1.0);
    running_.resize(stream_base_[nr]);
  }
  if (!opt.comm_kind_of_category.empty()) {
    HETPAR_CHECK(static_cast<int>(opt.comm_kind_of_category.size()) == g.num_labels() + 1,
                 "comm_kind_of_category has {} entries for {} labels + 1",
                 opt.comm_kind_of_category.size(), g.num_labels());
    for (int32_t k : opt.comm_kind_of_category) {
      HETPAR_CHECK(k >= 0, "comm kind {} is negative", k);
      num_kinds_ = std::max(num_kinds_, k + 1);
    }
    kind_active_.assign(static_cast<size_t>(nr) * num_kinds_, 0);
    kind_exposed_.assign(static_cast<size_t>(nr) * num_kinds_, Time::zero());
    kind_tasks_.assign(num_kinds_, 0);
  }
}

double Engine::speed_factor(int32_t rank) const {
  double f = 1.0;
  if (!slowdown_.empty()) {  // the largest of the classes in flight, not their sum
    const double* slowdown = &slowdown_[static_cast<size_t>(rank) * kSlowClasses];
    double x = 0.0;
    for (uint32_t m = slowing_classes_[rank]; m != 0; m &= m - 1)
      x = std::max(x, slowdown[std::countr_zero(m)]);
    f *= 1.0 + x;
  }
  if (!units_.empty()) {
    const int32_t node = net_.node_of(RankId(rank)).value();
    if (units_[node] > 0 && computing_[node] > units_[node]) f *= computing_[node] / units_[node];
  }
  return f;
}

void Engine::retime(int32_t rank) {
  // Without compute running there is nothing to re-time: factor_[rank] may go stale, and
  // start() sets it afresh for the rank's next compute (while one runs, it is kept current).
  const int32_t first = stream_base_[rank], end = first + num_compute_[rank];
  int32_t st = first;
  while (st < end && running_[st].task < 0) ++st;
  if (st == end) return;
  const double after = speed_factor(rank);
  const double before = factor_[rank];
  if (after == before) return;
  factor_[rank] = after;
  const Time now = queue_.now();
  for (; st < end; ++st) {
    Running& r = running_[st];
    if (r.task < 0) continue;
    r.left_ps = std::max(0.0, r.left_ps - static_cast<double>((now - r.since).count_ps()) / before);
    r.since = now;
    queue_.cancel(r.end);
    r.end = queue_.schedule_in(Time::ps(round_nonnegative(r.left_ps * after)), *this,
                               static_cast<uint32_t>(r.task));
  }
}

void Engine::retime_node(int32_t node) {
  if (units_[node] <= 0) return;
  for (int32_t r : ranks_of_node_[node]) retime(r);
}

Result<SimResult> Engine::run() {
  find_uncontended();
  if (host_)
    for (int32_t r = 0; r < net_.num_ranks(); ++r) issue_from(r, Time::zero());
  for (size_t s = 0; s + 1 < stream_task_begin_.size(); ++s)
    if (stream_task_begin_[s] < stream_task_begin_[s + 1])
      arrive(stream_tasks_[stream_task_begin_[s]]);
  queue_.run();
  if (finished_ < g_.num_tasks()) {
    // Tasks still waiting sit on (or behind) a cycle of dependencies and stream order: the
    // check TaskGraph::validate() leaves to this run.
    const int nt = g_.num_tasks();
    int t = 0;
    while (t < nt && state_[t].waiting == 0) ++t;
    HETPAR_CHECK(t < nt, "{} of {} tasks never finished", nt - finished_, nt);
    int never = 0;
    for (int u = 0; u < nt; ++u) never += state_[u].waiting > 0 ? 1 : 0;
    return g_.cycle_error(TaskId(t), never);
  }

  SimResult& r = result_;
  r.makespan = makespan_;
  r.ranks.resize(net_.num_ranks());
  for (int rank = 0; rank < net_.num_ranks(); ++rank) {
    RankStats& st = r.ranks[rank];
    const int32_t base = stream_base_[rank];
    st.compute_stream_busy.assign(stream_busy_.begin() + base,
                                  stream_busy_.begin() + base + num_compute_[rank]);
    st.comm_stream_busy.assign(stream_busy_.begin() + base + num_compute_[rank],
                               stream_busy_.begin() + stream_base_[rank + 1]);
    st.compute = clocks_[rank].compute;
    st.comm = clocks_[rank].comm;
    st.exposed_comm = clocks_[rank].exposed;
    st.flops = flops_[rank];
    if (host_) {
      st.host = host_busy_[rank];
      st.host_wait = host_wait_[rank];
      st.launch_wait = launch_wait_[rank];
    }
    st.multiplicity = g_.multiplicity(RankId(rank));
    if (num_kinds_ > 0)
      st.exposed_by_kind.assign(kind_exposed_.begin() + rank * num_kinds_,
                                kind_exposed_.begin() + (rank + 1) * num_kinds_);
  }
  r.comm_kind_tasks = kind_tasks_;
  for (int c = 0; c <= g_.num_labels(); ++c) {
    if (category_tasks_[c] == 0) continue;
    r.categories.push_back(
        {std::string(g_.label_text(LabelId(c))), category_time_[c], category_tasks_[c]});
  }
  std::sort(r.categories.begin(), r.categories.end(),
            [](const CategoryTotal& a, const CategoryTotal& b) { return a.category < b.category; });
  if (opt_.record_tasks) r.algorithms.assign(algorithm_.begin(), algorithm_.end());
  return std::move(result_);
}

void Engine::arrive(int32_t t) {
  if (--state_[t].waiting == 0) start(t);
}

void Engine::issue_from(int32_t rank, Time now) {
  Time h = std::max(host_clock_[rank], now);
  while (host_next_[rank] < host_begin_[rank + 1]) {
    const int32_t t = host_tasks_[host_next_[rank]++];
    const Time cost = g_.host_issue(TaskId(t));
    if (sink_ && cost > Time::zero())
      sink_->host_span({TaskId(t), RankId(rank), task_name(t), h, h + cost});
    // A task of n calls may start after the first, and its work ends no earlier than its
    // last kernel (1/n of it, on average) run after the host's last launch: the GPU's waits
    // for those launches are taken before it.
    const int64_t n = g_.host_calls(TaskId(t));
    const Time first = h + Time::ps(cost.count_ps() / n);
    const Time before_last = Time::ps(g_.task(TaskId(t)).duration.count_ps() * (n - 1) / n);
    state_[t].issue = std::max({state_[t].issue, first, h + cost - before_last});
    h += cost;
    host_busy_[rank] += cost;
    arrive(t);                           // starts it at the earliest at its issue (start())
    if (g_.host_sync(TaskId(t))) break;  // finish() resumes this host
  }
  host_clock_[rank] = h;
}

std::string_view Engine::task_name(int32_t t) const {
  const Task& task = g_.task(TaskId(t));
  std::string_view name = g_.label_text(task.label.name);
  if (name.empty())
    name = task.kind == TaskKind::kCollective ? to_string(task.collective) : to_string(task.kind);
  return name;
}

void Engine::report(int32_t t, const StreamRef& s, Time end, bool started) {
  const Task& task = g_.task(TaskId(t));
  TaskSpan span{TaskId(t),
                s,
                g_.label_text(task.label.category),
                task_name(t),
                g_.stream_name(s.kind, s.index),
                state_[t].start,
                end};
  if (started)
    sink_->task_started(span);
  else
    sink_->task_finished(span);
}

void Engine::start(int32_t t) {
  const Time now = queue_.now();
  if (host_ && now < state_[t].issue) {  // ready on the GPU before its host launched it
    const Task& task = g_.task(TaskId(t));
    if (task.kind == TaskKind::kCompute)
      launch_wait_[g_.streams(TaskId(t))[0].rank.value()] += state_[t].issue - now;
    queue_.schedule_at(state_[t].issue, *this, static_cast<uint32_t>(t) | kStartTag);
    return;
  }
  state_[t].start = now;
  const Task& task = g_.task(TaskId(t));
  const std::span<const StreamRef> refs = g_.streams(TaskId(t));
  const int32_t kind = num_kinds_ > 0 && task.kind != TaskKind::kCompute ? comm_kind(task) : -1;
  for (const StreamRef& s : refs) {
    RankClock& c = advance(s.rank.value(), now);
    ++(s.kind == StreamKind::kCompute ? c.compute_active : c.comm_active);
    if (kind >= 0) ++kind_active_[s.rank.value() * num_kinds_ + kind];
    if (sink_) report(t, s, now, true);
    // finish() will touch the state of the stream's next task: fetch it while this one
    // runs (a million-task graph's states are far from cache).
    const int32_t stream = stream_of(s);
    if (stream_head_[stream] + 1 < stream_task_begin_[stream + 1]) {
      const int32_t next = stream_tasks_[stream_head_[stream] + 1];
      __builtin_prefetch(&state_[next], 1);
      __builtin_prefetch(&g_.task(TaskId(next)), 0);
    }
  }
  for (int32_t i = succ_begin_[t]; i < succ_begin_[t + 1]; ++i) {
    __builtin_prefetch(&state_[succ_[i]], 1);
    __builtin_prefetch(&g_.task(TaskId(succ_[i])), 0);
  }
  if (task.kind == TaskKind::kCollective && slows_compute(task)) {
    const int32_t c = slow_class(task);
    for (const StreamRef& s : refs) {
      if (++slowing_active_[static_cast<size_t>(s.rank.value()) * kSlowClasses + c] == 1)
        slowing_classes_[s.rank.value()] |= 1u << c;
      retime(s.rank.value());
    }
  }
  switch (task.kind) {
    case TaskKind::kCompute: {
      if (!variable_) {
        queue_.schedule_in(task.duration, *this, static_cast<uint32_t>(t));
        break;
      }
      const StreamRef& ref = refs[0];
      const int32_t rank = ref.rank.value();
      if (!units_.empty()) {
        const int32_t node = net_.node_of(ref.rank).value();
        ++computing_[node];
        retime_node(node);
      }
      factor_[rank] = speed_factor(rank);
      Running& r = running_[stream_of(ref)];
      r = {t, {}, static_cast<double>(task.duration.count_ps()), now};
      r.end = queue_.schedule_in(Time::ps(round_nonnegative(r.left_ps * factor_[rank])), *this,
                                 static_cast<uint32_t>(t));
      break;
    }
    case TaskKind::kP2P:
    case TaskKind::kCollective: {
      if (state_[t].fixed >= Time::zero()) {
        queue_.schedule_in(state_[t].fixed, *this, static_cast<uint32_t>(t));
        break;
      }
      const Plan& p = *state_[t].plan;
      state_[t].tail_latency = tail_latency(p, task);
      if (opt_.defer_flows && flows_.idle(p.link_set)) {
        state_[t].flows_left = kDeferred;
        state_[t].deferred_end = queue_.schedule_in(isolated_time(p, task), *this, t);
        flows_.claim(p.link_set, t);
        result_.flows_started += static_cast<int64_t>(p.route_begin.size() - 1);
        ++result_.deferred_transfers;
        break;
      }
      state_[t].flows_left = launch(p, task, static_cast<uint32_t>(t), flows_);
      result_.flows_started += state_[t].flows_left;
      if (state_[t].flows_left == 0)
        queue_.schedule_in(state_[t].tail_latency, *this, static_cast<uint32_t>(t));
      break;
    }
  }
}

void Engine::add_flow(Plan& p, RankId src, RankId dst, double share) {
  p.pattern.flows.push_back({src, dst, share});
  p.share.push_back(share);
  net_.route(src, dst, route_);
  p.links.insert(p.links.end(), route_.begin(), route_.end());
  p.members.insert(p.members.end(), route_.size(), 1);
  p.route_begin.push_back(static_cast<int32_t>(p.links.size()));
}

// The pattern's flows as bundles: flows of the same source with the same share that leave
// through the same first link start as one flow, whose route is the union of theirs and
// which weighs, on each link, the number of members crossing it. All members then move
// at one rate, the bundle's, and the flow network tracks one flow and two events instead
// of one per member (an all-to-all over n ranks: 2 per source rather than n - 1). Exact
// when the members' max-min rates are equal, as in a symmetric collective on a symmetric
// fabric, where they share their source's egress and meet alike loads after it; otherwise
// every member moves at the pace of the most contended one.
void Engine::bundle_flows(Plan& p) {
  const size_t n = p.pattern.flows.size();
  if (link_rep_.empty()) {
    link_rep_.assign(net_.num_links(), 0);
    link_load_.assign(net_.num_links(), 0.0);
  }
  // Bundles in order of their first flow; members in pattern order.
  std::map<std::tuple<int32_t, double, int32_t>, int32_t> bundle_at;  // (src, share, link)
  std::vector<std::vector<int32_t>> flows_of;
  for (size_t i = 0; i < n; ++i) {
    const CollectiveFlow& f = p.pattern.flows[i];
    if (p.route_begin[i] == p.route_begin[i + 1]) {  // no route: on its own
      flows_of.push_back({static_cast<int32_t>(i)});
      continue;
    }
    auto [it, fresh] = bundle_at.try_emplace(
        {f.src.value(), f.share, p.links[p.route_begin[i]].value()}, int32_t(flows_of.size()));
    if (fresh) flows_of.emplace_back();
    flows_of[it->second].push_back(static_cast<int32_t>(i));
  }
  if (flows_of.size() == n) return;
  std::vector<LinkId> links;
  std::vector<int32_t> members, route_begin{0};
  std::vector<double> share;
  for (const std::vector<int32_t>& flows : flows_of) {
    const size_t begin = links.size();
    for (int32_t i : flows)
      for (int32_t k = p.route_begin[i]; k < p.route_begin[i + 1]; ++k) {
        int32_t& at = link_rep_[p.links[k].value()];  // 1 + its index in `links`, or 0
        if (at == 0) {
          links.push_back(p.links[k]);
          members.push_back(0);
          at = static_cast<int32_t>(links.size());
        }
        ++members[at - 1];
      }
    for (size_t k = begin; k < links.size(); ++k) link_rep_[links[k].value()] = 0;
    route_begin.push_back(static_cast<int32_t>(links.size()));
    share.push_back(p.pattern.flows[flows[0]].share);
  }
  p.links = std::move(links);
  p.members = std::move(members);
  p.route_begin = std::move(route_begin);
  p.share = std::move(share);
}

// Link weights of a task with copies: on each link, (its flows + the copies' flows) / its
// flows.
void Engine::weigh(Plan& p, const Task& task, Algorithm algorithm) {
  if (!task.copies.valid() || task.num_copies == 0) {
    bool bundled = false;
    for (int32_t m : p.members) bundled = bundled || m != 1;
    if (bundled) p.weights.assign(p.members.begin(), p.members.end());
    return;
  }
  if (link_rep_.empty()) {
    link_rep_.assign(net_.num_links(), 0);
    link_load_.assign(net_.num_links(), 0.0);
  }
  auto load = [&](LinkId l, int32_t flows = 1) {
    if (link_load_[l.value()] == 0) touched_.push_back(l.value());
    link_load_[l.value()] += flows;
  };
  for (size_t i = 0; i < p.links.size(); ++i) {
    link_rep_[p.links[i].value()] += p.members[i];
    load(p.links[i], p.members[i]);
  }
  auto count = [&](RankId src, RankId dst) {
    net_.route(src, dst, route_);
    for (LinkId l : route_) load(l);
  };
  std::span<const RankId> copies = g_.group(task.copies);
  if (task.kind == TaskKind::kP2P) {
    for (size_t i = 0; i + 1 < copies.size(); i += 2) count(copies[i], copies[i + 1]);
  } else {
    std::span<const RankId> group = g_.group(task.group);
    const size_t n = group.size();
    const size_t root_at =
        static_cast<size_t>(std::find(group.begin(), group.end(), task.root) - group.begin());
    for (size_t c = 0; c + n <= copies.size(); c += n) {
      std::span<const RankId> copy = copies.subspan(c, n);
      const RankId root = root_at < n ? copy[root_at] : copy[0];
      for (const CollectiveFlow& f :
           collective_pattern(task.collective, algorithm, copy, root, net_, opt_.collectives).flows)
        count(f.src, f.dst);
    }
  }
  p.weights.resize(p.links.size());
  for (size_t i = 0; i < p.links.size(); ++i) {
    const int32_t l = p.links[i].value();
    p.weights[i] = p.members[i] * link_load_[l] / link_rep_[l];
  }
  for (int32_t l : touched_) link_load_[l] = 0;
  for (LinkId l : p.links) link_rep_[l.value()] = 0;
  touched_.clear();
}

const Plan& Engine::plan(const Task& task, Algorithm algorithm) {
  auto [it, fresh] = plans_.try_emplace(collective_key(task, algorithm));
  Plan& p = it->second;
  if (!fresh) return p;
  const CollectivePattern pattern = collective_pattern(
      task.collective, algorithm, g_.group(task.group), task.root, net_, opt_.collectives);
  p.pattern.latency = pattern.latency;
  p.pattern.algorithm = pattern.algorithm;
  p.pattern.flows.reserve(pattern.flows.size());
  p.route_begin.push_back(0);
  for (const CollectiveFlow& f : pattern.flows) add_flow(p, f.src, f.dst, f.share);
  p.seconds_per_byte = idle_seconds_per_byte(p.pattern, net_);
  // One ramp per kind of node among the members (usually one), in order of first member.
  const bool local = in_one_node(task.group);
  const auto kind = static_cast<size_t>(task.collective);
  std::vector<const CollectiveCurves*> kinds = {&opt_.collectives.curves.front()};
  if (!opt_.collectives.node_curves.empty()) {  // several kinds of node
    kinds.clear();
    for (RankId r : g_.group(task.group)) {
      const CollectiveCurves* c = &opt_.collectives.curves_of(net_.node_of(r));
      if (std::find(kinds.begin(), kinds.end(), c) == kinds.end()) kinds.push_back(c);
    }
  }
  for (const CollectiveCurves* c : kinds) {
    const std::vector<CurvePoint>& scale =
        (local ? c->intra_node_size_scale : c->inter_node_size_scale)[kind];
    Plan::Ramp ramp;
    if (!scale.empty()) ramp.size_scale = &scale;
    if (pattern.nodes > 1)
      ramp.node_factor = curve_factor(c->inter_node_node_scale[kind], pattern.nodes);
    else
      ramp.node_factor = curve_factor(c->intra_node_group_scale[kind],
                                      static_cast<int64_t>(g_.group(task.group).size()));
    if (ramp.size_scale || ramp.node_factor != 1.0) p.ramps.push_back(ramp);
  }
  if (opt_.bundle_flows) bundle_flows(p);
  weigh(p, task, algorithm);
  p.link_set = distinct(p.links);
  return p;
}

const Plan& Engine::p2p_plan(const Task& task) {
  const PlanKey key{.a = task.group.valid() ? task.group.value() : task.src.value(),
                    .b = task.group.valid() ? -1 : task.dst.value(),
                    .copies = task.copies.valid() ? task.copies.value() : -1,
                    .p2p = 1};
  auto [it, fresh] = plans_.try_emplace(key);
  Plan& p = it->second;
  if (!fresh) return p;
  p.route_begin.push_back(0);
  auto transfer = [&](RankId src, RankId dst) {
    add_flow(p, src, dst, 1.0);
    p.p2p_latency.push_back(net_.latency(
        std::span<const LinkId>(p.links).subspan(p.route_begin[p.route_begin.size() - 2])));
  };
  if (task.group.valid()) {
    std::span<const RankId> pairs = g_.group(task.group);
    for (size_t i = 0; i + 1 < pairs.size(); i += 2) transfer(pairs[i], pairs[i + 1]);
  } else {
    transfer(task.src, task.dst);
  }
  weigh(p, task, Algorithm::kRing);
  p.link_set = distinct(p.links);
  return p;
}

// The plan task t runs (kAuto resolved as NCCL's tuner would), recorded per task.
const Plan& Engine::resolve(int32_t t) {
  const Task& task = g_.task(TaskId(t));
  if (task.kind == TaskKind::kP2P) return p2p_plan(task);
  // A graph repeats a few collectives (a TP group's all-gather, ...) a million times: their
  // plan and algorithm come from a small direct-mapped memo in front of plan()'s map, but
  // where the algorithm depends on the size (NCCL's tree or ring across nodes).
  const PlanKey key = collective_key(task, task.algorithm);
  Resolved& memo = resolved_[PlanKeyHash{}(key) % resolved_.size()];
  if (memo.plan != nullptr && memo.key == key) {
    algorithm_[t] = memo.algorithm;
    return *memo.plan;
  }
  bool by_size = false;
  Algorithm algorithm = task.algorithm;
  if (algorithm == Algorithm::kAuto) {
    algorithm = Algorithm::kRing;
    if (auto_considers_tree(task.collective, g_.group(task.group), net_)) {
      by_size = true;
      auto predicted = [&](const Plan& p) {
        return p.pattern.latency + Time::seconds(task.bytes.as_double() * p.seconds_per_byte *
                                                 wire_bytes_per_byte(p, task));
      };
      const Time tree = predicted(plan(task, Algorithm::kTree));
      if (tree < predicted(plan(task, Algorithm::kRing))) algorithm = Algorithm::kTree;
    }
  }
  algorithm_[t] = algorithm;
  const Plan& p = plan(task, algorithm);
  if (!by_size) memo = {key, &p, algorithm};
  return p;
}

// Starts the flows of `p` for `task` in `fn`; returns how many.
int32_t Engine::launch(const Plan& p, const Task& task, uint32_t cookie, FlowNetwork& fn) {
  const bool p2p = task.kind == TaskKind::kP2P;
  const size_t n = p.route_begin.size() - 1;
  const double wire = wire_bytes_per_byte(p, task);
  for (size_t i = 0; i < n; ++i) {
    const Bytes bytes =
        p2p ? task.bytes : Bytes(std::llround(p.share[i] * task.bytes.as_double() * wire));
    std::span<const LinkId> route(p.links.data() + p.route_begin[i],
                                  p.links.data() + p.route_begin[i + 1]);
    std::span<const double> weights;
    if (!p.weights.empty())
      weights = {p.weights.data() + p.route_begin[i], p.weights.data() + p.route_begin[i + 1]};
    fn.start(route, weights, bytes, p2p ? p.p2p_latency[i] : Time::zero(), cookie);
  }
  return static_cast<int32_t>(n);
}

// A task's time alone on the network: its flows in a private flow network. Exactly what
// the shared one gives it when nothing else uses its links (rates are solved per connected
// component, and times are relative to the start).
Time Engine::isolated_time(const Plan& p, const Task& task) {
  const uint64_t key = (reinterpret_cast<uintptr_t>(&p) * 0x9E3779B97F4A7C15ULL ^
                        static_cast<uint64_t>(task.bytes.count())) +
                       (task.copy_engine ? 1 : 0);
  auto [it, fresh] = isolated_.try_emplace(key);
  if (!fresh && it->second.plan == &p && it->second.bytes == task.bytes &&
      it->second.copy_engine == task.copy_engine)
    return it->second.time + tail_latency(p, task);
  const Time begin = iso_queue_.now();
  iso_.last = begin;
  launch(p, task, 0, iso_flows_);
  iso_queue_.run();
  const Time flows = iso_.last - begin;
  if (fresh) it->second = {&p, task.bytes, task.copy_engine, flows};
  return flows + tail_latency(p, task);
}

// Tasks whose links no task outside their own streams' program order ever uses run alone:
// their time is fixed (isolated_time), and they skip the shared flow network. A link is
// private to a stream when every task crossing it occupies that stream, so those tasks run
// one after another.
void Engine::find_uncontended() {
  const int nt = g_.num_tasks();
  std::vector<int32_t> owner(net_.num_links(), -1);  // -1 unused, -2 shared, else stream
  auto occupies = [&](int32_t t, int32_t stream) {
    for (const StreamRef& s : g_.streams(TaskId(t)))
      if (stream_of(s) == stream) return true;
    return false;
  };
  // A task with the plan and streams of one marked before would mark its links as that one
  // did, whatever ran between: once marked, a link holds that task's first stream, another
  // of its streams or "shared", and marks only move from unused to a stream to shared. The
  // tasks marked last, by plan and first stream, sit in a small direct-mapped table.
  struct Marked {
    const Plan* plan = nullptr;
    std::span<const StreamRef> refs;
  };
  std::array<Marked, 64> marked{};
  for (int32_t t = 0; t < nt; ++t) {
    if (g_.task(TaskId(t)).kind == TaskKind::kCompute) continue;
    const Plan& p = resolve(t);
    state_[t].plan = &p;
    const std::span<const StreamRef> refs = g_.streams(TaskId(t));
    const int32_t first = stream_of(refs[0]);
    const uint64_t h =
        ((reinterpret_cast<uintptr_t>(&p) >> 4) ^ static_cast<uint64_t>(first) << 32) *
        0x9E3779B97F4A7C15ull;
    Marked& m = marked[h >> 58];  // the top 6 bits: 64 slots
    if (m.plan == &p && std::equal(refs.begin(), refs.end(), m.refs.begin(), m.refs.end()))
      continue;
    m = {&p, refs};
    for (LinkId l : p.link_set) {
      int32_t& o = owner[l.value()];
      if (o == -1)
        o = first;
      else if (o >= 0 && o != first && !occupies(t, o))
        o = -2;
    }
  }
  for (int32_t t = 0; t < nt; ++t) {
    if (!state_[t].plan) continue;
    const Plan& p = *state_[t].plan;
    const Task& task = g_.task(TaskId(t));
    if (p.private_links < 0) {
      p.private_links = 1;
      for (LinkId l : p.link_set)
        if (owner[l.value()] < 0) p.private_links = 0;
    }
    bool alone = p.private_links == 1;
    // A collective whose bytes take under 1 % of its latency on an idle network (a routing
    // probabilities' all-to-all, a scalar's all-reduce) is timed alone too: sharing links
    // could not move it measurably, and its flows would cost the engine as much as a big
    // collective's.
    if (!alone && task.bytes.count() > 0) {
      const double latency = tail_latency(p, task).to_seconds();
      const double bytes = p.seconds_per_byte * static_cast<double>(task.bytes.count());
      if (bytes < 0.01 * latency)  // the size scale only adds to it: checked second
        alone = bytes * wire_bytes_per_byte(p, task) < 0.01 * latency;
    }
    if (alone) state_[t].fixed = isolated_time(p, task);
  }
}

void Engine::on_flow_done(Time now, uint32_t task) {
  const auto t = static_cast<int32_t>(task);
  if (--state_[t].flows_left > 0) return;
  if (state_[t].tail_latency == Time::zero())
    finish(now, t);
  else
    queue_.schedule_in(state_[t].tail_latency, *this, task);
}

// Task t, deferred, meets another transfer on its links now: its flows as they stand now
// (replayed alone from its start) join the shared network, which times the rest.
void Engine::on_claim_contended(int32_t t) {
  TaskState& st = state_[t];
  const Plan& p = *st.plan;
  flows_.release(p.link_set, t);
  ++result_.contended_deferrals;
  const Time base = iso_queue_.now();
  launch(p, g_.task(TaskId(t)), static_cast<uint32_t>(t), iso_flows_);
  iso_queue_.run_until(base + (queue_.now() - st.start));
  st.flows_left = iso_flows_.move_to(flows_, st.start - base);
  if (st.flows_left > 0) queue_.cancel(st.deferred_end);  // else only its tail is left
}

void Engine::finish(Time now, int32_t t) {
  if (state_[t].flows_left == kDeferred) {
    flows_.release(state_[t].plan->link_set, t);
    state_[t].flows_left = 0;
  }
  ++finished_;
  makespan_ = std::max(makespan_, now);
  const Time span = now - state_[t].start;
  if (opt_.record_tasks) result_.tasks[t] = {state_[t].start, now};
  const Task& task = g_.task(TaskId(t));
  auto refs = g_.streams(TaskId(t));
  if (task.kind == TaskKind::kCompute) flops_[refs[0].rank.value()] += task.flops;
  const int32_t kind = num_kinds_ > 0 && task.kind != TaskKind::kCompute ? comm_kind(task) : -1;
  if (kind >= 0) ++kind_tasks_[kind];
  if (variable_) {
    if (task.kind == TaskKind::kCompute) {
      const int32_t rank = refs[0].rank.value();
      running_[stream_of(refs[0])].task = -1;
      if (!units_.empty()) {
        const int32_t node = net_.node_of(RankId(rank)).value();
        --computing_[node];
        retime_node(node);
      }
    }
    if (task.kind == TaskKind::kCollective && slows_compute(task)) {
      const int32_t c = slow_class(task);
      for (const StreamRef& s : refs) {
        if (--slowing_active_[static_cast<size_t>(s.rank.value()) * kSlowClasses + c] == 0)
          slowing_classes_[s.rank.value()] &= ~(1u << c);
        retime(s.rank.value());
      }
    }
  }
  const int32_t cat = task.label.category.valid() ? task.label.category.value() : g_.num_labels();
  category_time_[cat] += span * g_.world_streams(TaskId(t));
  category_tasks_[cat] += task.kind == TaskKind::kCompute ? g_.multiplicity(refs[0].rank)
                                                          : 1 + int64_t{task.num_copies};
  for (const StreamRef& s : refs) {
    RankClock& c = advance(s.rank.value(), now);
    --(s.kind == StreamKind::kCompute ? c.compute_active : c.comm_active);
    if (kind >= 0) --kind_active_[s.rank.value() * num_kinds_ + kind];
    if (sink_) report(t, s, now, false);
    const int32_t stream = stream_of(s);
    stream_busy_[stream] += span;
    if (++stream_head_[stream] < stream_task_begin_[stream + 1])
      arrive(stream_tasks_[stream_head_[stream]]);
  }
  for (int32_t i = succ_begin_[t]; i < succ_begin_[t + 1]; ++i) arrive(succ_[i]);
  if (host_ && g_.host_sync(TaskId(t)))
    for (const StreamRef& s : refs) {
      const int32_t r = s.rank.value();
      const int32_t last = host_next_[r] - 1;  // a host waiting on t issued t last
      if (last < host_begin_[r] || host_tasks_[last] != t) continue;
      if (now > host_clock_[r]) {
        host_wait_[r] += now - host_clock_[r];
        if (sink_)
          sink_->host_span({TaskId(t), RankId(r), task_name(t), host_clock_[r], now, true});
      }
      issue_from(r, now);
    }
}

}  // namespace

Result<SimResult> simulate(const TaskGraph& graph, const Network& net, const SimOptions& options,
                           TraceSink* sink, SimWorkspace* workspace) {
  HETPAR_RETURN_IF_ERROR(net.validate());
  StreamCounts counts;
  HETPAR_RETURN_IF_ERROR(graph.validate(net.num_ranks(), /*cycles=*/false, &counts));
  Engine engine(graph, net, options, sink, workspace, std::move(counts));
  return engine.run();
}

}  // namespace hetpar::sim

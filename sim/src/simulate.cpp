#include "hetpar/sim/simulate.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "hetpar/core/check.h"
#include "hetpar/sim/event_queue.h"
#include "hetpar/sim/flow_network.h"

namespace hetpar::sim {
namespace {

// A collective pattern with its routes resolved and its idle-network cost per byte.
struct Plan {
  CollectivePattern pattern;
  std::vector<int32_t> route_begin;  // flow i's route is links[route_begin[i] .. [i+1])
  std::vector<LinkId> links;
  double seconds_per_byte = 0;
};

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

class Engine final : public EventSource, public FlowNetwork::Observer {
 public:
  Engine(const TaskGraph& g, const Network& net, const SimOptions& opt, TraceSink* sink);
  SimResult run();

  void on_event(Time now, uint32_t task) override { finish(now, static_cast<int32_t>(task)); }
  void on_flow_done(Time now, uint32_t task) override;

 private:
  int32_t stream_of(const StreamRef& s) const {
    int32_t r = s.rank.value();
    return stream_base_[r] + (s.kind == StreamKind::kComm ? num_compute_[r] : 0) + s.index;
  }
  void arrive(int32_t t);
  void start(int32_t t);
  void start_collective(int32_t t);
  void finish(Time now, int32_t t);
  void report(int32_t t, const StreamRef& s, Time end, bool started);
  const Plan& plan(const Task& task, Algorithm algorithm);

  const TaskGraph& g_;
  const Network& net_;
  const SimOptions& opt_;
  TraceSink* sink_;
  EventQueue queue_;
  FlowNetwork flows_;

  // Streams: rank r owns streams stream_base_[r] .. +num_compute_[r] (compute) and the
  // comm streams after them. Each stream's tasks in program order (CSR) and its head.
  std::vector<int32_t> stream_base_, num_compute_;
  std::vector<int32_t> stream_task_begin_, stream_tasks_, stream_head_;
  std::vector<Time> stream_busy_;
  std::vector<RankClock> clocks_;
  std::vector<Flops> flops_;

  // Tasks: what each still waits for (dependencies + streams not yet at it), successors
  // (CSR), start times, flows in flight and the latency paid after the last one.
  std::vector<int32_t> waiting_, succ_begin_, succ_, flows_left_;
  std::vector<Time> start_, tail_latency_;
  std::vector<Algorithm> algorithm_;
  std::vector<Time> category_time_;
  std::vector<int64_t> category_tasks_;
  int32_t finished_ = 0;
  Time makespan_;
  SimResult result_;

  std::unordered_map<uint64_t, Plan> plans_;
  std::vector<LinkId> route_;
};

Engine::Engine(const TaskGraph& g, const Network& net, const SimOptions& opt, TraceSink* sink)
    : g_(g), net_(net), opt_(opt), sink_(sink), flows_(queue_, net, *this) {
  const int nr = net.num_ranks();
  const int nt = g.num_tasks();
  num_compute_.assign(nr, 0);
  std::vector<int32_t> num_comm(nr, 0);
  for (int t = 0; t < nt; ++t)
    for (const StreamRef& s : g.streams(TaskId(t))) {
      auto& count = s.kind == StreamKind::kCompute ? num_compute_ : num_comm;
      count[s.rank.value()] = std::max(count[s.rank.value()], s.index + 1);
    }
  stream_base_.assign(nr + 1, 0);
  for (int r = 0; r < nr; ++r)
    stream_base_[r + 1] = stream_base_[r] + num_compute_[r] + num_comm[r];
  const int ns = stream_base_[nr];

  // Program order per stream, and per task the number of things it waits for.
  waiting_.assign(nt, 0);
  stream_task_begin_.assign(ns + 1, 0);
  for (int t = 0; t < nt; ++t)
    for (const StreamRef& s : g.streams(TaskId(t))) {
      ++stream_task_begin_[stream_of(s) + 1];
      ++waiting_[t];
    }
  for (int s = 0; s < ns; ++s) stream_task_begin_[s + 1] += stream_task_begin_[s];
  stream_tasks_.resize(stream_task_begin_[ns]);
  stream_head_.assign(stream_task_begin_.begin(), stream_task_begin_.end() - 1);
  for (int t = 0; t < nt; ++t)
    for (const StreamRef& s : g.streams(TaskId(t))) stream_tasks_[stream_head_[stream_of(s)]++] = t;
  stream_head_.assign(stream_task_begin_.begin(), stream_task_begin_.end() - 1);
  stream_busy_.assign(ns, Time::zero());
  clocks_.assign(nr, RankClock{});

  succ_begin_.assign(nt + 1, 0);
  for (auto [before, after] : g.dependencies()) {
    ++succ_begin_[before.value() + 1];
    ++waiting_[after.value()];
  }
  for (int t = 0; t < nt; ++t) succ_begin_[t + 1] += succ_begin_[t];
  succ_.resize(succ_begin_[nt]);
  {
    std::vector<int32_t> fill(succ_begin_.begin(), succ_begin_.end() - 1);
    for (auto [before, after] : g.dependencies()) succ_[fill[before.value()]++] = after.value();
  }
  start_.assign(nt, Time::zero());
  tail_latency_.assign(nt, Time::zero());
  flows_left_.assign(nt, 0);
  algorithm_.assign(nt, Algorithm::kRing);
  category_time_.assign(g.num_labels() + 1, Time::zero());  // last slot: no category
  category_tasks_.assign(g.num_labels() + 1, 0);
  flops_.assign(nr, Flops(0));
  if (opt.record_tasks) result_.tasks.resize(nt);
}

SimResult Engine::run() {
  for (size_t s = 0; s + 1 < stream_task_begin_.size(); ++s)
    if (stream_task_begin_[s] < stream_task_begin_[s + 1])
      arrive(stream_tasks_[stream_task_begin_[s]]);
  queue_.run();
  HETPAR_CHECK(finished_ == g_.num_tasks(), "{} of {} tasks never ran on a validated graph",
               g_.num_tasks() - finished_, g_.num_tasks());

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
  }
  for (int c = 0; c <= g_.num_labels(); ++c) {
    if (category_tasks_[c] == 0) continue;
    r.categories.push_back(
        {std::string(g_.label_text(LabelId(c))), category_time_[c], category_tasks_[c]});
  }
  std::sort(r.categories.begin(), r.categories.end(),
            [](const CategoryTotal& a, const CategoryTotal& b) { return a.category < b.category; });
  if (opt_.record_tasks) r.algorithms = algorithm_;
  return std::move(result_);
}

void Engine::arrive(int32_t t) {
  if (--waiting_[t] == 0) start(t);
}

void Engine::report(int32_t t, const StreamRef& s, Time end, bool started) {
  const Task& task = g_.task(TaskId(t));
  std::string_view name = g_.label_text(task.label.name);
  if (name.empty())
    name = task.kind == TaskKind::kCollective ? to_string(task.collective) : to_string(task.kind);
  TaskSpan span{TaskId(t), s, g_.label_text(task.label.category), name, start_[t], end};
  if (started)
    sink_->task_started(span);
  else
    sink_->task_finished(span);
}

void Engine::start(int32_t t) {
  const Time now = queue_.now();
  start_[t] = now;
  for (const StreamRef& s : g_.streams(TaskId(t))) {
    RankClock& c = clocks_[s.rank.value()];
    c.advance(now);
    ++(s.kind == StreamKind::kCompute ? c.compute_active : c.comm_active);
    if (sink_) report(t, s, now, true);
  }
  const Task& task = g_.task(TaskId(t));
  switch (task.kind) {
    case TaskKind::kCompute:
      queue_.schedule_in(task.duration, *this, static_cast<uint32_t>(t));
      break;
    case TaskKind::kP2P: {
      auto refs = g_.streams(TaskId(t));
      net_.route(refs[0].rank, refs[1].rank, route_);
      flows_left_[t] = 1;
      flows_.start(route_, task.bytes, net_.latency(route_), static_cast<uint32_t>(t));
      break;
    }
    case TaskKind::kCollective:
      start_collective(t);
      break;
  }
}

const Plan& Engine::plan(const Task& task, Algorithm algorithm) {
  const bool rooted =
      task.collective == CollectiveKind::kBroadcast || task.collective == CollectiveKind::kReduce;
  const uint64_t key = (static_cast<uint64_t>(task.group.value()) << 37) |
                       (static_cast<uint64_t>(task.collective) << 34) |
                       (static_cast<uint64_t>(algorithm) << 32) |
                       static_cast<uint32_t>(rooted ? task.root.value() : -1);
  auto [it, fresh] = plans_.try_emplace(key);
  Plan& p = it->second;
  if (!fresh) return p;
  p.pattern = collective_pattern(task.collective, algorithm, g_.group(task.group), task.root, net_,
                                 opt_.collectives);
  p.route_begin.push_back(0);
  for (const CollectiveFlow& f : p.pattern.flows) {
    net_.route(f.src, f.dst, route_);
    p.links.insert(p.links.end(), route_.begin(), route_.end());
    p.route_begin.push_back(static_cast<int32_t>(p.links.size()));
  }
  p.seconds_per_byte = idle_seconds_per_byte(p.pattern, net_);
  return p;
}

void Engine::start_collective(int32_t t) {
  const Task& task = g_.task(TaskId(t));
  Algorithm algorithm = task.algorithm;
  if (algorithm == Algorithm::kAuto) {
    algorithm = Algorithm::kRing;
    if (auto_considers_tree(task.collective, g_.group(task.group), net_)) {
      auto predicted = [&](const Plan& p) {
        return p.pattern.latency + Time::seconds(task.bytes.as_double() * p.seconds_per_byte);
      };
      const Time tree = predicted(plan(task, Algorithm::kTree));
      if (tree < predicted(plan(task, Algorithm::kRing))) algorithm = Algorithm::kTree;
    }
  }
  algorithm_[t] = algorithm;
  const Plan& p = plan(task, algorithm);
  tail_latency_[t] = p.pattern.latency;
  const auto& flows = p.pattern.flows;
  flows_left_[t] = static_cast<int32_t>(flows.size());
  if (flows.empty()) {
    queue_.schedule_in(p.pattern.latency, *this, static_cast<uint32_t>(t));
    return;
  }
  for (size_t i = 0; i < flows.size(); ++i) {
    Bytes bytes(std::llround(flows[i].share * task.bytes.as_double()));
    std::span<const LinkId> route(p.links.data() + p.route_begin[i],
                                  p.links.data() + p.route_begin[i + 1]);
    flows_.start(route, bytes, Time::zero(), static_cast<uint32_t>(t));
  }
}

void Engine::on_flow_done(Time now, uint32_t task) {
  const auto t = static_cast<int32_t>(task);
  if (--flows_left_[t] > 0) return;
  if (tail_latency_[t] == Time::zero())
    finish(now, t);
  else
    queue_.schedule_in(tail_latency_[t], *this, task);
}

void Engine::finish(Time now, int32_t t) {
  ++finished_;
  makespan_ = std::max(makespan_, now);
  const Time span = now - start_[t];
  if (opt_.record_tasks) result_.tasks[t] = {start_[t], now};
  const Task& task = g_.task(TaskId(t));
  auto refs = g_.streams(TaskId(t));
  if (task.kind == TaskKind::kCompute) flops_[refs[0].rank.value()] += task.flops;
  const int32_t cat = task.label.category.valid() ? task.label.category.value() : g_.num_labels();
  category_time_[cat] += span * static_cast<int64_t>(refs.size());
  ++category_tasks_[cat];
  for (const StreamRef& s : refs) {
    RankClock& c = clocks_[s.rank.value()];
    c.advance(now);
    --(s.kind == StreamKind::kCompute ? c.compute_active : c.comm_active);
    if (sink_) report(t, s, now, false);
    const int32_t stream = stream_of(s);
    stream_busy_[stream] += span;
    if (++stream_head_[stream] < stream_task_begin_[stream + 1])
      arrive(stream_tasks_[stream_head_[stream]]);
  }
  for (int32_t i = succ_begin_[t]; i < succ_begin_[t + 1]; ++i) arrive(succ_[i]);
}

}  // namespace

Result<SimResult> simulate(const TaskGraph& graph, const Network& net, const SimOptions& options,
                           TraceSink* sink) {
  HETPAR_RETURN_IF_ERROR(net.validate());
  HETPAR_RETURN_IF_ERROR(graph.validate(net.num_ranks()));
  Engine engine(graph, net, options, sink);
  return engine.run();
}

}  // namespace hetpar::sim

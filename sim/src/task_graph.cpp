#include "hetpar/sim/task_graph.h"

#include <algorithm>

#include "hetpar/core/check.h"
#include "hetpar/core/format.h"

namespace hetpar::sim {

std::string_view to_string(StreamKind k) {
  return k == StreamKind::kCompute ? "compute" : "comm";
}

std::string_view to_string(TaskKind k) {
  switch (k) {
    case TaskKind::kCompute:
      return "compute";
    case TaskKind::kCollective:
      return "collective";
    case TaskKind::kP2P:
      return "p2p";
  }
  return "?";
}

std::string_view to_string(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllToAll:
      return "all_to_all";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kReduce:
      return "reduce";
  }
  return "?";
}

std::string_view to_string(Algorithm a) {
  switch (a) {
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kTree:
      return "tree";
  }
  return "?";
}

LabelId TaskGraph::label(std::string_view text) {
  auto it = label_ids_.find(text);
  if (it != label_ids_.end()) return it->second;
  LabelId id(num_labels());
  label_text_.emplace_back(text);
  label_ids_.emplace(std::string(text), id);
  return id;
}

std::string_view TaskGraph::label_text(LabelId id) const {
  return id.valid() && id.value() < num_labels() ? std::string_view(label_text_[id.value()])
                                                 : std::string_view();
}

TaskId TaskGraph::push(const Task& t) {
  tasks_.push_back(t);
  stream_begin_.push_back(static_cast<int32_t>(stream_refs_.size()));
  return TaskId(num_tasks() - 1);
}

GroupId TaskGraph::intern_group(std::span<const RankId> group) {
  std::vector<RankId> key(group.begin(), group.end());
  auto it = group_ids_.find(key);
  if (it != group_ids_.end()) return it->second;
  GroupId id(num_groups());
  groups_.push_back(key);
  group_ids_.emplace(std::move(key), id);
  return id;
}

GroupId TaskGraph::add_group(std::span<const RankId> ranks) {
  return intern_group(ranks);
}

void TaskGraph::set_multiplicity(RankId rank, int32_t n) {
  HETPAR_CHECK(rank.valid() && n >= 0, "multiplicity {} of rank {}", n, rank);
  if (rank.value() >= static_cast<int>(multiplicity_.size()))
    multiplicity_.resize(static_cast<size_t>(rank.value()) + 1, 1);
  multiplicity_[rank.value()] = n;
}

KernelListId TaskGraph::add_kernels(std::span<const Kernel> kernels) {
  kernels_.insert(kernels_.end(), kernels.begin(), kernels.end());
  kernel_begin_.push_back(static_cast<int32_t>(kernels_.size()));
  return KernelListId(num_kernel_lists() - 1);
}

void TaskGraph::set_kernels(TaskId task, KernelListId list) {
  HETPAR_CHECK(task.valid() && task.value() < num_tasks() &&
                   tasks_[task.value()].kind == TaskKind::kCompute && list.valid() &&
                   list.value() < num_kernel_lists(),
               "set_kernels: task {} list {}", task.value(), list.value());
  tasks_[task.value()].kernels = list;
}

void TaskGraph::set_host(TaskId task, Time issue, bool sync, int32_t calls) {
  HETPAR_CHECK(task.valid() && task.value() < num_tasks() && issue >= Time::zero() && calls >= 1,
               "set_host: task {} issue {} calls {}", task.value(), issue.count_ps(), calls);
  const auto i = static_cast<size_t>(task.value());
  if (i >= host_issue_.size()) {  // grown geometrically: set_host follows each new task
    const size_t n = std::max({i + 1, 2 * host_issue_.size(), size_t{1024}});
    host_issue_.resize(n, Time::ps(-1));
    host_sync_.resize(n, 0);
    host_calls_.resize(n, 1);
  }
  host_issue_[i] = issue;
  host_sync_[i] = sync ? 1 : 0;
  host_calls_[i] = calls;
}

void TaskGraph::set_host_sync(TaskId task) {
  HETPAR_CHECK(host_issued(task), "set_host_sync: task {} has no host cost", task.value());
  host_sync_[task.value()] = 1;
}

void TaskGraph::clear() {
  tasks_.clear();
  stream_begin_.assign(1, 0);
  stream_refs_.clear();
  deps_.clear();
  groups_.clear();
  group_ids_.clear();
  label_text_.clear();
  label_ids_.clear();
  multiplicity_.clear();
  for (auto& names : stream_names_) names.clear();
  kernels_.clear();
  kernel_begin_.assign(1, 0);
  host_issue_.clear();
  host_sync_.clear();
  host_calls_.clear();
}

void TaskGraph::set_stream_name(StreamKind kind, int32_t index, std::string_view name) {
  HETPAR_CHECK(index >= 0, "stream index {}", index);
  std::vector<std::string>& names = stream_names_[static_cast<int>(kind)];
  if (static_cast<size_t>(index) >= names.size()) names.resize(static_cast<size_t>(index) + 1);
  names[static_cast<size_t>(index)] = std::string(name);
}

std::string_view TaskGraph::stream_name(StreamKind kind, int32_t index) const {
  const std::vector<std::string>& names = stream_names_[static_cast<int>(kind)];
  return index >= 0 && static_cast<size_t>(index) < names.size()
             ? std::string_view(names[static_cast<size_t>(index)])
             : std::string_view();
}

void TaskGraph::reserve(size_t tasks, size_t stream_refs, size_t deps) {
  tasks_.reserve(tasks);
  stream_begin_.reserve(tasks + 1);
  stream_refs_.reserve(stream_refs);
  deps_.reserve(deps);
}

TaskId TaskGraph::add_compute(RankId rank, int32_t stream, Time duration, Flops flops,
                              Label label) {
  stream_refs_.push_back({rank, StreamKind::kCompute, stream});
  return push({.kind = TaskKind::kCompute, .label = label, .duration = duration, .flops = flops});
}

TaskId TaskGraph::add_collective(const CollectiveSpec& spec, Label label) {
  const GroupId gid = spec.group_id.valid() ? spec.group_id : intern_group(spec.group);
  const bool known = gid.value() < num_groups();
  const std::span<const RankId> group =
      known ? std::span<const RankId>(groups_[gid.value()]) : std::span<const RankId>();
  for (RankId r : group)
    if (multiplicity(r) != 0) stream_refs_.push_back({r, StreamKind::kComm, spec.stream});
  int32_t copies = 0;
  if (spec.copies.valid() && spec.copies.value() < num_groups() && !group.empty())
    copies = static_cast<int32_t>(groups_[spec.copies.value()].size() / group.size());
  return push({.kind = TaskKind::kCollective,
               .collective = spec.kind,
               .algorithm = spec.algorithm,
               .copy_engine = spec.copy_engine,
               .registered = spec.registered,
               .label = label,
               .group = gid,
               .bytes = spec.bytes,
               .root = spec.root.valid() || group.empty() ? spec.root : group[0],
               .copies = spec.copies,
               .num_copies = copies});
}

TaskId TaskGraph::add_p2p_group(GroupId pairs, Bytes bytes, int32_t src_stream, int32_t dst_stream,
                                Label label, GroupId copies) {
  const bool known = pairs.valid() && pairs.value() < num_groups();
  RankId src, dst;
  if (known) {
    const auto& g = groups_[pairs.value()];
    for (size_t i = 0; i + 1 < g.size(); i += 2) {
      if (multiplicity(g[i]) != 0) stream_refs_.push_back({g[i], StreamKind::kComm, src_stream});
      if (multiplicity(g[i + 1]) != 0)
        stream_refs_.push_back({g[i + 1], StreamKind::kComm, dst_stream});
    }
    if (g.size() >= 2) {
      src = g[0];
      dst = g[1];
    }
  }
  return push({.kind = TaskKind::kP2P,
               .label = label,
               .group = pairs,
               .bytes = bytes,
               .src = src,
               .dst = dst,
               .copies = copies,
               .num_copies = copy_pairs(copies)});
}

TaskId TaskGraph::add_p2p(RankId src, RankId dst, Bytes bytes, int32_t src_stream,
                          int32_t dst_stream, Label label, GroupId copies) {
  if (multiplicity(src) != 0) stream_refs_.push_back({src, StreamKind::kComm, src_stream});
  if (multiplicity(dst) != 0) stream_refs_.push_back({dst, StreamKind::kComm, dst_stream});
  return push({.kind = TaskKind::kP2P,
               .label = label,
               .bytes = bytes,
               .src = src,
               .dst = dst,
               .copies = copies,
               .num_copies = copy_pairs(copies)});
}

int32_t TaskGraph::copy_pairs(GroupId copies) const {
  if (!copies.valid() || copies.value() >= num_groups()) return 0;
  return static_cast<int32_t>(groups_[copies.value()].size() / 2);
}

void TaskGraph::add_dependency(TaskId before, TaskId after) {
  deps_.emplace_back(before, after);
}

Status TaskGraph::cycle_error(TaskId first, int stuck) const {
  const Task& task = tasks_[first.value()];
  return Status::invalid_argument(fmt::format(
      "task {} ({} \"{}\"): on a cycle of dependencies, stream order and host order ({} of {} "
      "tasks can never start)",
      first.value(), to_string(task.kind), label_text(task.label.name), stuck, num_tasks()));
}

Status TaskGraph::validate(int num_ranks, bool cycles, StreamCounts* counts) const {
  const int n = num_tasks();
  auto fail = [&](int t, std::string_view what) {
    std::string_view name = label_text(tasks_[t].label.name);
    return Status::invalid_argument(
        fmt::format("task {} ({} \"{}\"): {}", t, to_string(tasks_[t].kind), name, what));
  };
  // Per task: sizes, ranks, streams, groups; and how many streams of each kind a rank has.
  std::vector<int32_t> num_compute(num_ranks, 0), num_comm(num_ranks, 0);
  // Groups are shared by many tasks: each is checked (ranks in range; for collectives,
  // sorted to find duplicates and roots) once. 0 unchecked, 1 in range, -1 out of range.
  std::vector<int8_t> in_range_group(groups_.size(), 0);
  std::vector<std::vector<RankId>> sorted(groups_.size());
  std::vector<int8_t> sorted_done(groups_.size(), 0);
  auto all_in_range = [&](int32_t gid) {
    if (in_range_group[gid] == 0) {
      in_range_group[gid] = 1;
      for (RankId r : groups_[gid])
        if (!r.valid() || r.value() >= num_ranks) in_range_group[gid] = -1;
    }
    return in_range_group[gid] > 0;
  };
  for (int t = 0; t < n; ++t) {
    const Task& task = tasks_[t];
    if (task.duration < Time::zero()) return fail(t, "negative duration");
    if (task.bytes.count() < 0) return fail(t, "negative bytes");
    auto refs = streams(TaskId(t));
    if (task.kind == TaskKind::kCollective &&
        (!task.group.valid() || task.group.value() >= num_groups() ||
         groups_[task.group.value()].empty()))
      return fail(t, "empty group");
    if (refs.empty()) return fail(t, "no simulated participant (every member is mirrored)");
    auto in_range = [&](RankId r) { return r.valid() && r.value() < num_ranks; };
    if (task.kind == TaskKind::kP2P && (!in_range(task.src) || !in_range(task.dst)))
      return fail(
          t, fmt::format("p2p {} -> {} out of range (world {})", task.src, task.dst, num_ranks));
    if (task.copies.valid()) {
      if (task.copies.value() >= num_groups()) return fail(t, "unknown copies");
      const auto& c = groups_[task.copies.value()];
      const size_t width = task.kind == TaskKind::kP2P ? 2 : groups_[task.group.value()].size();
      if (c.size() % width != 0)
        return fail(t, fmt::format("{} copy ranks are not whole groups of {}", c.size(), width));
      if (!all_in_range(task.copies.value()))
        for (RankId r : c)
          if (!in_range(r)) return fail(t, fmt::format("copy rank {} out of range", r));
    }
    if (task.kind == TaskKind::kCompute && multiplicity(refs[0].rank) == 0)
      return fail(t, fmt::format("compute on mirrored rank {}", refs[0].rank));
    for (const StreamRef& s : refs) {
      if (!s.rank.valid() || s.rank.value() >= num_ranks)
        return fail(t, fmt::format("rank {} out of range (world {})", s.rank, num_ranks));
      if (s.index < 0) return fail(t, fmt::format("negative stream index {}", s.index));
      auto& count = s.kind == StreamKind::kCompute ? num_compute : num_comm;
      count[s.rank.value()] = std::max(count[s.rank.value()], s.index + 1);
    }
    if (task.kind == TaskKind::kP2P && task.group.valid()) {
      if (task.group.value() >= num_groups()) return fail(t, "unknown transfer pairs");
      const auto& g = groups_[task.group.value()];
      if (g.empty() || g.size() % 2 != 0) return fail(t, "transfer pairs of odd length");
      for (size_t i = 0; i < g.size(); i += 2) {
        if (!in_range(g[i]) || !in_range(g[i + 1]))
          return fail(
              t, fmt::format("p2p {} -> {} out of range (world {})", g[i], g[i + 1], num_ranks));
        if (g[i] == g[i + 1]) return fail(t, "p2p from a rank to itself");
      }
      for (size_t a = 0; a < refs.size(); ++a)
        for (size_t b = a + 1; b < refs.size(); ++b)
          if (refs[a].rank == refs[b].rank && refs[a].index == refs[b].index)
            return fail(t, "grouped transfers occupy one stream twice");
    }
    if (task.kind == TaskKind::kP2P && task.src == task.dst)
      return fail(t, "p2p from a rank to itself");
    if (task.kind == TaskKind::kCollective) {
      const int32_t gid = task.group.value();
      if (!all_in_range(gid))
        for (RankId r : groups_[gid])
          if (!in_range(r))
            return fail(t, fmt::format("rank {} out of range (world {})", r, num_ranks));
      std::vector<RankId>& members = sorted[gid];
      if (!sorted_done[gid]) {
        members = groups_[gid];
        std::sort(members.begin(), members.end());
        sorted_done[gid] =
            std::adjacent_find(members.begin(), members.end()) == members.end() ? 1 : 2;
      }
      if (sorted_done[gid] == 2) return fail(t, "a rank appears twice in the group");
      if (!std::binary_search(members.begin(), members.end(), task.root))
        return fail(t, fmt::format("root {} is not in the group", task.root));
    }
  }
  for (auto [before, after] : deps_)
    if (!before.valid() || before.value() >= n || !after.valid() || after.value() >= n)
      return Status::invalid_argument(
          fmt::format("dependency {} -> {}: unknown task (graph has {})", before, after, n));
  if (counts) *counts = {num_compute, num_comm};  // ids, ranks and sizes check out
  if (!cycles) return Status::ok();

  // Edges (CSR): explicit dependencies, then each stream's program order (consecutive
  // tasks on one stream). Streams get dense ids: rank by rank, compute before comm.
  std::vector<int32_t> stream_base(num_ranks + 1, 0);
  for (int r = 0; r < num_ranks; ++r)
    stream_base[r + 1] = stream_base[r] + num_compute[r] + num_comm[r];
  auto stream_id = [&](const StreamRef& s) {
    const int32_t r = s.rank.value();
    return stream_base[r] + (s.kind == StreamKind::kComm ? num_compute[r] : 0) + s.index;
  };
  std::vector<std::pair<int32_t, int32_t>> edges;
  edges.reserve(deps_.size() + stream_refs_.size());
  for (auto [before, after] : deps_) edges.emplace_back(before.value(), after.value());
  std::vector<int32_t> last_on_stream(stream_base[num_ranks], -1);
  for (int t = 0; t < n; ++t)
    for (const StreamRef& s : streams(TaskId(t))) {
      int32_t& last = last_on_stream[stream_id(s)];
      if (last >= 0) edges.emplace_back(last, t);
      last = t;
    }
  std::vector<int32_t> succ_begin(n + 1, 0), succ(edges.size()), indeg(n, 0);
  for (auto [from, to] : edges) {
    ++succ_begin[from + 1];
    ++indeg[to];
  }
  for (int t = 0; t < n; ++t) succ_begin[t + 1] += succ_begin[t];
  {
    std::vector<int32_t> fill(succ_begin.begin(), succ_begin.end() - 1);
    for (auto [from, to] : edges) succ[fill[from]++] = to;
  }
  // Kahn's algorithm: whatever never reaches in-degree 0 sits on a cycle.
  std::vector<int32_t> ready;
  for (int t = 0; t < n; ++t)
    if (indeg[t] == 0) ready.push_back(t);
  int done = 0;
  while (!ready.empty()) {
    int32_t t = ready.back();
    ready.pop_back();
    ++done;
    for (int32_t i = succ_begin[t]; i < succ_begin[t + 1]; ++i)
      if (--indeg[succ[i]] == 0) ready.push_back(succ[i]);
  }
  if (done < n) {
    int t = static_cast<int>(
        std::find_if(indeg.begin(), indeg.end(), [](int32_t d) { return d > 0; }) - indeg.begin());
    return cycle_error(TaskId(t), n - done);
  }
  return Status::ok();
}

}  // namespace hetpar::sim

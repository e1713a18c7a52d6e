#include "hetpar/executor/program.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <queue>
#include <tuple>

namespace hetpar::executor {

Result<std::vector<TaskId>> issue_order(const sim::TaskGraph& g) {
  const int n = g.num_tasks();
  std::vector<std::vector<int32_t>> next(static_cast<size_t>(n));
  std::vector<int32_t> indegree(static_cast<size_t>(n), 0);
  auto edge = [&](int32_t a, int32_t b) {
    next[a].push_back(b);
    ++indegree[b];
  };
  for (const auto& [before, after] : g.dependencies()) edge(before.value(), after.value());
  // Program order of every stream: each task follows the previous one on its streams.
  std::map<std::tuple<int, int, int>, int32_t> last;
  for (int32_t t = 0; t < n; ++t)
    for (const sim::StreamRef& s : g.streams(TaskId(t))) {
      auto key = std::make_tuple(s.rank.value(), static_cast<int>(s.kind), s.index);
      auto [it, fresh] = last.try_emplace(key, t);
      if (!fresh) {
        if (it->second != t) edge(it->second, t);
        it->second = t;
      }
    }
  std::priority_queue<int32_t, std::vector<int32_t>, std::greater<>> ready;
  for (int32_t t = 0; t < n; ++t)
    if (indegree[t] == 0) ready.push(t);
  std::vector<TaskId> order;
  order.reserve(static_cast<size_t>(n));
  while (!ready.empty()) {
    const int32_t t = ready.top();
    ready.pop();
    order.emplace_back(t);
    for (int32_t u : next[t])
      if (--indegree[u] == 0) ready.push(u);
  }
  if (static_cast<int>(order.size()) != n)
    return Status::invalid_argument(
        fmt::format("task graph has a cycle through dependencies and stream order ({} of {} "
                    "tasks orderable)",
                    order.size(), n));
  return order;
}

Result<RankProgram> rank_program(const sim::TaskGraph& g, const std::vector<TaskId>& order,
                                 int rank) {
  RankProgram p;
  p.rank = rank;
  if (g.multiplicity(RankId(rank)) != 1)
    return Status::invalid_argument(fmt::format(
        "rank {} has multiplicity {}: the graph was lowered with representatives; lower with "
        "full_ranks to execute it",
        rank, g.multiplicity(RankId(rank))));
  std::vector<int32_t> index(static_cast<size_t>(g.num_tasks()), -1);
  for (TaskId id : order) {
    int stream = -1;
    for (const sim::StreamRef& s : g.streams(id))
      if (s.rank.value() == rank) {
        stream = s.kind == sim::StreamKind::kCompute ? 0 : 1 + s.index;
        break;
      }
    if (stream < 0) continue;
    index[id.value()] = static_cast<int32_t>(p.tasks.size());
    p.tasks.push_back({id, stream, {}, false});
    p.num_streams = std::max(p.num_streams, stream + 1);
  }
  for (const auto& [before, after] : g.dependencies()) {
    const int32_t a = index[after.value()];
    if (a < 0) continue;
    const int32_t b = index[before.value()];
    if (b < 0) {
      // Fine when another member of `after` runs `before`: the transfer carries the order.
      bool carried = false;
      for (const sim::StreamRef& x : g.streams(before))
        for (const sim::StreamRef& y : g.streams(after)) carried |= x.rank == y.rank;
      if (!carried) ++p.foreign_dependencies;
      continue;
    }
    if (p.tasks[b].stream == p.tasks[a].stream) continue;
    p.tasks[a].waits.push_back(b);
    p.tasks[b].recorded = true;
  }
  for (ProgramTask& t : p.tasks) {
    std::sort(t.waits.begin(), t.waits.end());
    t.waits.erase(std::unique(t.waits.begin(), t.waits.end()), t.waits.end());
  }
  return p;
}

}  // namespace hetpar::executor

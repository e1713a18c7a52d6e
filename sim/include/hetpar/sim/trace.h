// TraceSink: observes a simulation task by task (SimGrid's signals, reduced to one
// interface), so the simulator never depends on what watches it. ChromeTraceWriter turns
// the observations into Chrome / Perfetto Trace Event JSON: one process per rank, one
// thread per stream ("compute 0", "comm 1", or with the graph's name for it "comm 7: dp
// collectives"), an "X" (complete) event per task per stream, and where the graph has a
// host (task_graph.h "Host") a "host" thread with each launch and each wait for the GPU;
// timestamps and durations in microseconds.
#pragma once

#include <cstdint>
#include <ostream>
#include <string_view>
#include <unordered_set>

#include "hetpar/core/ids.h"
#include "hetpar/core/units.h"
#include "hetpar/sim/task_graph.h"

namespace hetpar::sim {

/// One task on one of its streams. A multi-rank task is reported once per stream.
struct TaskSpan {
  TaskId task;
  StreamRef stream;
  std::string_view category;     // "" when the task has none
  std::string_view name;         // the task's name, or its kind ("compute", "all_reduce", "p2p")
  std::string_view stream_name;  // TaskGraph::stream_name of `stream` ("" when unnamed)
  Time start;
  Time end;  // in task_started: not known yet, equals start
};

/// The host of `rank` launching `task` over [start, end), or (waiting) held by the sync
/// task `task` from its launch until it finished.
struct HostSpan {
  TaskId task;
  RankId rank;
  std::string_view name;  // as TaskSpan::name
  Time start;
  Time end;
  bool waiting = false;
};

class TraceSink {
 public:
  virtual ~TraceSink() = default;
  virtual void task_started(const TaskSpan& span) = 0;
  virtual void task_finished(const TaskSpan& span) = 0;
  /// Reported as the host issues, possibly ahead of the simulated time; not in time order.
  virtual void host_span(const HostSpan&) {}
};

/// Writes {"displayTimeUnit":"ns","traceEvents":[...]} to `out`; the closing brackets
/// come with finish() (or the destructor). Process/thread name metadata is emitted the
/// first time a rank/stream shows up.
class ChromeTraceWriter final : public TraceSink {
 public:
  explicit ChromeTraceWriter(std::ostream& out);
  ~ChromeTraceWriter() override;
  ChromeTraceWriter(const ChromeTraceWriter&) = delete;
  ChromeTraceWriter& operator=(const ChromeTraceWriter&) = delete;

  void task_started(const TaskSpan&) override {}
  void task_finished(const TaskSpan& span) override;
  void host_span(const HostSpan& span) override;
  /// Closes the JSON document; later calls do nothing.
  void finish();

  /// The Trace Event thread id of a stream: compute streams 0.., comm streams 1000...
  static int64_t thread_id(const StreamRef& s) {
    return (s.kind == StreamKind::kComm ? 1000 : 0) + s.index;
  }
  /// The Trace Event thread id of a rank's host.
  static constexpr int64_t kHostThread = 2000;

 private:
  void begin_event();
  // Emits rank `pid`'s process name the first time it shows; true the first time its thread
  // `tid` does (whose name the caller then emits, name_thread).
  bool new_track(int64_t pid, int64_t tid);
  void name_thread(int64_t pid, int64_t tid, std::string_view name);
  // An "X" event of `task` over [start, end) on thread `tid` of rank `pid`.
  void complete_event(std::string_view name, std::string_view category, int64_t pid, int64_t tid,
                      Time start, Time end, TaskId task);
  std::ostream& out_;
  bool first_ = true;
  bool finished_ = false;
  std::unordered_set<int64_t> seen_ranks_;
  std::unordered_set<int64_t> seen_threads_;  // rank << 32 | thread id
};

}  // namespace hetpar::sim

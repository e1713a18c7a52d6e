#include "hetpar/sim/trace.h"

#include <fmt/format.h>
#include <fmt/ostream.h>

namespace hetpar::sim {
namespace {

// `s` as a JSON string literal, quotes included.
std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20)
          out += fmt::format("\\u{:04x}", c);
        else
          out += ch;
    }
  }
  out += '"';
  return out;
}

// Microseconds with all six decimals of the picosecond count, exactly (no double).
std::string micros(Time t) {
  int64_t ps = t.count_ps();
  return fmt::format("{}.{:06}", ps / 1'000'000, ps % 1'000'000);
}

}  // namespace

ChromeTraceWriter::ChromeTraceWriter(std::ostream& out) : out_(out) {
  out_ << R"({"displayTimeUnit":"ns","traceEvents":[)";
}

ChromeTraceWriter::~ChromeTraceWriter() {
  finish();
}

void ChromeTraceWriter::begin_event() {
  out_ << (first_ ? "\n" : ",\n");
  first_ = false;
}

bool ChromeTraceWriter::new_track(int64_t pid, int64_t tid) {
  if (seen_ranks_.insert(pid).second) {
    begin_event();
    fmt::print(out_, R"({{"ph":"M","name":"process_name","pid":{},"args":{{"name":"rank {}"}}}})",
               pid, pid);
  }
  return seen_threads_.insert(pid << 32 | tid).second;
}

void ChromeTraceWriter::name_thread(int64_t pid, int64_t tid, std::string_view name) {
  begin_event();
  fmt::print(out_, R"({{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":{}}}}})",
             pid, tid, json_string(name));
}

void ChromeTraceWriter::complete_event(std::string_view name, std::string_view category,
                                       int64_t pid, int64_t tid, Time start, Time end,
                                       TaskId task) {
  begin_event();
  fmt::print(out_,
             R"({{"ph":"X","name":{},"cat":{},"pid":{},"tid":{},"ts":{},"dur":{},)"
             R"("args":{{"task":{}}}}})",
             json_string(name), json_string(category), pid, tid, micros(start), micros(end - start),
             task.value());
}

void ChromeTraceWriter::task_finished(const TaskSpan& span) {
  const int64_t pid = span.stream.rank.value();
  const int64_t tid = thread_id(span.stream);
  if (new_track(pid, tid)) {
    std::string name = fmt::format("{} {}", to_string(span.stream.kind), span.stream.index);
    if (!span.stream_name.empty()) name += fmt::format(": {}", span.stream_name);
    name_thread(pid, tid, name);
  }
  complete_event(span.name, span.category, pid, tid, span.start, span.end, span.task);
}

void ChromeTraceWriter::host_span(const HostSpan& span) {
  const int64_t pid = span.rank.value();
  if (new_track(pid, kHostThread)) name_thread(pid, kHostThread, "host");
  if (span.waiting)
    complete_event(fmt::format("wait for GPU: {}", span.name), "host_wait", pid, kHostThread,
                   span.start, span.end, span.task);
  else
    complete_event(span.name, "host", pid, kHostThread, span.start, span.end, span.task);
}

void ChromeTraceWriter::finish() {
  if (finished_) return;
  finished_ = true;
  out_ << "\n]}\n";
}

}  // namespace hetpar::sim

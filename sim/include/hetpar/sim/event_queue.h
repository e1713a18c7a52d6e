// EventQueue: the clock of one simulation. Components that want to be woken up are
// EventSources (htsim's shape); an event is (time, source, tag). Contract: events run in
// time order, and events at equal times run in the order they were scheduled (FIFO by a
// sequence number), so a run is deterministic. Time never goes backwards. Cancelling is
// O(1): the entry stays in the heap as a tombstone and is skipped when popped.
#pragma once

#include <cstdint>
#include <vector>

#include "hetpar/core/units.h"

namespace hetpar::sim {

/// Something that wants to be woken up at a scheduled time. `tag` is the value given to
/// schedule_at, so one source can tell its events apart without a closure per event.
class EventSource {
 public:
  virtual void on_event(Time now, uint32_t tag) = 0;

 protected:
  ~EventSource() = default;
};

/// Names one scheduled event for cancel(). A default-constructed handle names nothing.
class EventHandle {
 public:
  EventHandle() = default;

 private:
  friend class EventQueue;
  EventHandle(uint32_t slot, uint32_t gen) : slot_(slot), gen_(gen) {}
  uint32_t slot_ = UINT32_MAX;
  uint32_t gen_ = 0;
};

class EventQueue {
 public:
  EventQueue() = default;
  EventQueue(const EventQueue&) = delete;
  EventQueue& operator=(const EventQueue&) = delete;

  /// REQUIRES: when >= now().
  EventHandle schedule_at(Time when, EventSource& src, uint32_t tag = 0);
  EventHandle schedule_in(Time delay, EventSource& src, uint32_t tag = 0) {
    return schedule_at(now_ + delay, src, tag);
  }
  /// Cancels a pending event; returns false (and does nothing) if it already ran, was
  /// already cancelled, or `h` names nothing.
  bool cancel(EventHandle h);
  /// Runs the earliest pending event; false when none is left.
  bool run_next();
  /// Runs events until none is left.
  void run() {
    while (run_next()) {
    }
  }
  /// Runs the events due at or before `until`, in order; those after it stay pending.
  void run_until(Time until);
  /// Time of the event running now, or of the last one run.
  Time now() const { return now_; }
  /// Number of scheduled, not yet run, not cancelled events.
  size_t pending() const { return live_; }

 private:
  struct Entry {
    Time when;
    uint64_t seq;
    EventSource* src;
    uint32_t tag;
    uint32_t slot;
  };
  struct Slot {
    uint32_t gen = 0;
    bool cancelled = false;
  };
  void drop_cancelled_head();  // until the earliest pending event is a live one

  std::vector<Entry> heap_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  uint64_t next_seq_ = 0;
  size_t live_ = 0;
  Time now_;
};

}  // namespace hetpar::sim

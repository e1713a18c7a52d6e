#include "hetpar/sim/event_queue.h"

#include <algorithm>

#include "hetpar/core/check.h"
#include "hetpar/core/format.h"

namespace hetpar::sim {
namespace {
// Heap order: a pops after b when it is later, or equally late and scheduled later. A
// function object, not a function pointer, so that the heap's sift loops inline it.
struct PopsAfter {
  bool operator()(const auto& a, const auto& b) const {
    return a.when != b.when ? a.when > b.when : a.seq > b.seq;
  }
};
}  // namespace

EventHandle EventQueue::schedule_at(Time when, EventSource& src, uint32_t tag) {
  HETPAR_CHECK(when >= now_, "event scheduled in the past: {} < now {}", when, now_);
  uint32_t slot;
  if (free_slots_.empty()) {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  } else {
    slot = free_slots_.back();
    free_slots_.pop_back();
  }
  heap_.push_back({when, next_seq_++, &src, tag, slot});
  std::push_heap(heap_.begin(), heap_.end(), PopsAfter{});
  ++live_;
  return {slot, slots_[slot].gen};
}

bool EventQueue::cancel(EventHandle h) {
  if (h.slot_ >= slots_.size()) return false;
  Slot& s = slots_[h.slot_];
  if (s.gen != h.gen_ || s.cancelled) return false;
  s.cancelled = true;
  --live_;
  return true;
}

void EventQueue::drop_cancelled_head() {
  while (!heap_.empty() && slots_[heap_.front().slot].cancelled) {
    std::pop_heap(heap_.begin(), heap_.end(), PopsAfter{});
    Slot& s = slots_[heap_.back().slot];
    ++s.gen;  // the handle of this event is stale from now on
    s.cancelled = false;
    free_slots_.push_back(heap_.back().slot);
    heap_.pop_back();
  }
}

bool EventQueue::run_next() {
  drop_cancelled_head();
  if (heap_.empty()) return false;
  std::pop_heap(heap_.begin(), heap_.end(), PopsAfter{});
  const Entry e = heap_.back();
  heap_.pop_back();
  ++slots_[e.slot].gen;
  free_slots_.push_back(e.slot);
  --live_;
  now_ = e.when;
  e.src->on_event(e.when, e.tag);
  return true;
}

void EventQueue::run_until(Time until) {
  for (drop_cancelled_head(); !heap_.empty() && heap_.front().when <= until; drop_cancelled_head())
    run_next();
}

}  // namespace hetpar::sim

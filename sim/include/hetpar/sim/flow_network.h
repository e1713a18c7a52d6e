// FlowNetwork: transfers in flight on a Network, as fluid flows. A flow's bytes leave at
// its max-min fair share of its route's links (MaxMinSolver) and arrive one route latency
// after the last byte left; then the Observer is told. On an idle route a transfer takes
// exactly latency(route) + Bytes / bottleneck capacity (rounded to the nearest ps, as
// units.h's Bytes / Bandwidth).
//
// Rates are re-solved when flows start or drain: once per instant (a commit event queued
// behind the events already due now), over the connected component of the links touched
// only; a flow whose rate did not change keeps its scheduled completion.
//
// A caller may time a transfer itself while its links are idle (a collective alone runs as
// it did before, in a private FlowNetwork) and claim those links meanwhile: a flow that
// reaches a claimed link first has the Observer turn the claimant into flows here
// (on_claim_contended), typically by replaying it privately up to now and moving its
// flows in (move_to).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "hetpar/core/ids.h"
#include "hetpar/core/units.h"
#include "hetpar/sim/event_queue.h"
#include "hetpar/sim/max_min.h"
#include "hetpar/sim/network.h"

namespace hetpar::sim {

class FlowNetwork final : public EventSource {
 public:
  class Observer {
   public:
    /// The flow started with `cookie` has been delivered at `now`.
    virtual void on_flow_done(Time now, uint32_t cookie) = 0;
    /// A flow is about to use a link that `owner` claimed. ENSURES: the claim is released
    /// (and the claimant's transfers moved in) on return.
    virtual void on_claim_contended(int32_t owner) { (void)owner; }

   protected:
    ~Observer() = default;
  };

  /// `net` and `observer` must outlive this object.
  FlowNetwork(EventQueue& queue, const Network& net, Observer& observer);
  FlowNetwork(const FlowNetwork&) = delete;
  FlowNetwork& operator=(const FlowNetwork&) = delete;

  /// Starts moving `bytes` along `route` now; the observer hears `cookie` on delivery,
  /// `latency` after the last byte left. An empty route or zero bytes take only `latency`.
  void start(std::span<const LinkId> route, Bytes bytes, Time latency, uint32_t cookie) {
    start(route, {}, bytes, latency, cookie);
  }
  /// As above; the flow weighs `weights[i]` on route[i] (MaxMinSolver): it stands for that
  /// many alike flows there. Empty = 1 everywhere.
  void start(std::span<const LinkId> route, std::span<const double> weights, Bytes bytes,
             Time latency, uint32_t cookie);
  /// Flows started and not yet delivered.
  int active() const { return static_cast<int>(flows_.size() - free_.size()); }

  /// True when no flow drains through any of `links` and none is claimed.
  bool idle(std::span<const LinkId> links) const;
  /// Claims `links` (each once) for `owner` (>= 0), a transfer the caller times itself.
  /// REQUIRES: idle(links).
  void claim(std::span<const LinkId> links, int32_t owner);
  /// Releases those of `links` that `owner` claimed.
  void release(std::span<const LinkId> links, int32_t owner);
  /// Moves every flow in flight here (draining, or delivered after its latency) into
  /// another network `dst` with its state and cookie, its times shifted by `offset`; this network
  /// is left empty and its events cancelled. Returns how many flows moved. The moved flows keep
  /// their rates until `dst` next re-solves their links, so their links there must carry
  /// nothing else (claimed ones). REQUIRES: no re-solve pending here (run the queue
  /// through the current instant first).
  int32_t move_to(FlowNetwork& dst, Time offset);

  void on_event(Time now, uint32_t tag) override;

 private:
  // One link of a flow's route: its weight there, and where the flow sits in the link's
  // list (on_link_), so that leaving it takes no search.
  struct Hop {
    int32_t link;
    int32_t slot;
    double weight;
  };
  struct Flow {
    std::vector<Hop> hops;  // kept across reuse of the slot: no allocation when warm
    double remaining = 0;   // bytes left at time `since`
    double rate = 0;        // bytes/s since `since` (0: not yet solved)
    Time since;
    Time latency;
    Time until;        // when it drains (rate > 0) or, drained, is delivered
    EventHandle next;  // that event
    uint32_t cookie = 0;
    enum Phase : uint8_t { kFree, kDraining, kDelivering } phase = kFree;
  };
  static constexpr uint32_t kCommitTag = UINT32_MAX;

  int32_t allocate();
  void enter_links(int32_t f);          // lists flow f on its hops' links
  void drain_at(int32_t f, Time when);  // schedules flow f's drain (its rate is set)
  void deliver_after(int32_t f, Time when);
  void mark_dirty(int32_t link);
  void commit(Time now);
  void drain(Time now, int32_t f);

  EventQueue& queue_;
  Observer& observer_;
  std::vector<double> capacity_;  // per link, bytes/s
  std::vector<int32_t> claim_;    // per link, its claimant or -1
  struct OnLink {
    int32_t flow;
    int32_t hop;  // hops[hop] of that flow is this link
  };
  std::vector<std::vector<OnLink>> on_link_;  // per link, the flows draining through it
  std::vector<Flow> flows_;
  std::vector<int32_t> free_;
  std::vector<int32_t> dirty_;  // links whose flows changed since the last commit, each once
  bool commit_pending_ = false;
  // commit() scratch: epoch marks instead of clearing per-link/per-flow arrays. A link of
  // the component being built holds epoch_, a link in dirty_ epoch_ + 1 (the next commit's).
  uint32_t epoch_ = 0;
  std::vector<uint32_t> link_mark_, flow_mark_;
  std::vector<int32_t> local_, comp_links_, comp_flows_;
  MaxMinSolver solver_;
};

}  // namespace hetpar::sim

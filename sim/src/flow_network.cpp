#include "hetpar/sim/flow_network.h"

#include <algorithm>
#include <limits>

#include "hetpar/core/check.h"

namespace hetpar::sim {

// Tags: 2f = flow f drained its bytes, 2f+1 = flow f delivered, kCommitTag = re-solve.
FlowNetwork::FlowNetwork(EventQueue& queue, const Network& net, Observer& observer)
    : queue_(queue),
      observer_(observer),
      claim_(net.num_links(), -1),
      on_link_(net.num_links()),
      link_mark_(net.num_links(), 0),
      local_(net.num_links(), -1) {
  capacity_.reserve(net.num_links());
  for (int l = 0; l < net.num_links(); ++l)
    capacity_.push_back(net.link(LinkId(l)).capacity.bytes_per_s());
}

int32_t FlowNetwork::allocate() {
  if (free_.empty()) {
    flows_.emplace_back();
    flow_mark_.push_back(0);
    return static_cast<int32_t>(flows_.size() - 1);
  }
  const int32_t f = free_.back();
  free_.pop_back();
  return f;
}

void FlowNetwork::enter_links(int32_t f) {
  std::vector<Hop>& hops = flows_[f].hops;
  for (size_t i = 0; i < hops.size(); ++i) {
    hops[i].slot = static_cast<int32_t>(on_link_[hops[i].link].size());
    on_link_[hops[i].link].push_back({f, static_cast<int32_t>(i)});
  }
}

void FlowNetwork::drain_at(int32_t f, Time when) {
  Flow& fl = flows_[f];
  fl.until = when;
  fl.next = queue_.schedule_at(when, *this, static_cast<uint32_t>(2 * f));
}

void FlowNetwork::deliver_after(int32_t f, Time when) {
  Flow& fl = flows_[f];
  fl.phase = Flow::kDelivering;
  fl.until = when;
  fl.next = queue_.schedule_at(when, *this, static_cast<uint32_t>(2 * f + 1));
}

void FlowNetwork::start(std::span<const LinkId> route, std::span<const double> weights, Bytes bytes,
                        Time latency, uint32_t cookie) {
  // Claimants first: turning one into flows here adds flows (and may move flows_).
  for (LinkId l : route)
    if (const int32_t owner = claim_[l.value()]; owner >= 0) {
      observer_.on_claim_contended(owner);
      HETPAR_CHECK(claim_[l.value()] < 0, "claim of {} on link {} not released", owner, l.value());
    }
  const int32_t f = allocate();
  Flow& fl = flows_[f];
  fl.hops.clear();
  for (size_t i = 0; i < route.size(); ++i)
    fl.hops.push_back({route[i].value(), 0, weights.empty() ? 1.0 : weights[i]});
  fl.remaining = bytes.as_double();
  fl.rate = 0;
  fl.since = queue_.now();
  fl.latency = latency;
  fl.cookie = cookie;
  if (fl.hops.empty() || bytes.count() <= 0) {
    deliver_after(f, queue_.now() + latency);
    return;
  }
  fl.phase = Flow::kDraining;
  enter_links(f);
  for (const Hop& h : fl.hops) mark_dirty(h.link);
}

bool FlowNetwork::idle(std::span<const LinkId> links) const {
  for (LinkId l : links)
    if (!on_link_[l.value()].empty() || claim_[l.value()] >= 0) return false;
  return true;
}

void FlowNetwork::claim(std::span<const LinkId> links, int32_t owner) {
  for (LinkId l : links) {
    HETPAR_CHECK(on_link_[l.value()].empty() && claim_[l.value()] < 0,
                 "link {} claimed while in use", l.value());
    claim_[l.value()] = owner;
  }
}

void FlowNetwork::release(std::span<const LinkId> links, int32_t owner) {
  for (LinkId l : links)
    if (claim_[l.value()] == owner) claim_[l.value()] = -1;
}

int32_t FlowNetwork::move_to(FlowNetwork& dst, Time offset) {
  HETPAR_CHECK(&dst != this, "move_to onto itself");
  HETPAR_CHECK(!commit_pending_ && dirty_.empty(), "move_to with a re-solve pending");
  int32_t moved = 0;
  for (size_t i = 0; i < flows_.size(); ++i) {
    Flow& src = flows_[i];
    if (src.phase == Flow::kFree) continue;
    queue_.cancel(src.next);
    const int32_t f = dst.allocate();
    Flow& fl = dst.flows_[f];
    fl.hops.assign(src.hops.begin(), src.hops.end());
    fl.remaining = src.remaining;
    fl.rate = src.rate;
    fl.since = src.since + offset;
    fl.latency = src.latency;
    fl.cookie = src.cookie;
    if (src.phase == Flow::kDelivering) {
      dst.deliver_after(f, src.until + offset);
    } else {
      HETPAR_CHECK(src.rate > 0, "move_to: flow {} not yet solved", i);
      fl.phase = Flow::kDraining;
      dst.drain_at(f, src.until + offset);
      dst.enter_links(f);
      for (const Hop& h : src.hops) on_link_[h.link].clear();
    }
    src.phase = Flow::kFree;
    free_.push_back(static_cast<int32_t>(i));
    ++moved;
  }
  return moved;
}

void FlowNetwork::mark_dirty(int32_t link) {
  // Marked with the next commit's epoch: listed once, and already in that commit's component.
  if (link_mark_[link] != epoch_ + 1) {
    link_mark_[link] = epoch_ + 1;
    dirty_.push_back(link);
  }
  if (!commit_pending_) {
    commit_pending_ = true;
    queue_.schedule_in(Time::zero(), *this, kCommitTag);
  }
}

void FlowNetwork::on_event(Time now, uint32_t tag) {
  if (tag == kCommitTag) {
    commit_pending_ = false;
    commit(now);
    return;
  }
  int32_t f = static_cast<int32_t>(tag / 2);
  if (tag % 2 == 0) {
    drain(now, f);
    return;
  }
  uint32_t cookie = flows_[f].cookie;
  flows_[f].phase = Flow::kFree;
  free_.push_back(f);
  observer_.on_flow_done(now, cookie);
}

void FlowNetwork::drain(Time now, int32_t f) {
  Flow& fl = flows_[f];
  for (const Hop& h : fl.hops) {
    auto& v = on_link_[h.link];
    const OnLink moved = v.back();
    v[h.slot] = moved;
    flows_[moved.flow].hops[moved.hop].slot = h.slot;
    v.pop_back();
    mark_dirty(h.link);
  }
  fl.remaining = 0;
  fl.rate = 0;
  deliver_after(f, now + fl.latency);
}

void FlowNetwork::commit(Time now) {
  // The connected component of the dirty links: links <-> flows draining through them.
  ++epoch_;
  comp_links_.swap(dirty_);  // marked with this epoch by mark_dirty
  dirty_.clear();
  comp_flows_.clear();
  bool shared = false;  // some link carries two flows or more
  for (size_t i = 0; i < comp_links_.size(); ++i) {
    shared |= on_link_[comp_links_[i]].size() > 1;
    for (const OnLink& on : on_link_[comp_links_[i]]) {
      const int32_t f = on.flow;
      if (flow_mark_[f] == epoch_) continue;
      flow_mark_[f] = epoch_;
      comp_flows_.push_back(f);
      for (const Hop& h : flows_[f].hops) {
        if (link_mark_[h.link] == epoch_) continue;
        link_mark_[h.link] = epoch_;
        comp_links_.push_back(h.link);
      }
    }
  }
  if (comp_flows_.empty()) return;

  if (shared) {
    solver_.clear();
    for (int32_t l : comp_links_) local_[l] = solver_.add_link(capacity_[l]);
    for (int32_t f : comp_flows_) {
      for (const Hop& h : flows_[f].hops) solver_.add_hop(local_[h.link], h.weight);
      solver_.end_flow();
    }
    solver_.solve();
  }
  // Flows that share no link (a TP pair's two directions) each run at their route's
  // narrowest capacity over their weight there, which is what the solver would find.
  auto narrowest = [&](const Flow& fl) {
    double rate = std::numeric_limits<double>::infinity();
    for (const Hop& h : fl.hops) rate = std::min(rate, capacity_[h.link] / h.weight);
    return rate;
  };

  for (size_t i = 0; i < comp_flows_.size(); ++i) {
    Flow& fl = flows_[comp_flows_[i]];
    const double rate = shared ? solver_.rate(static_cast<int32_t>(i)) : narrowest(fl);
    if (rate == fl.rate) continue;
    fl.remaining = std::max(0.0, fl.remaining - fl.rate * (now - fl.since).to_seconds());
    fl.since = now;
    fl.rate = rate;
    queue_.cancel(fl.next);
    HETPAR_CHECK(rate > 0, "flow {} got no bandwidth", comp_flows_[i]);
    drain_at(comp_flows_[i], now + Time::seconds(fl.remaining / rate));
  }
}

}  // namespace hetpar::sim

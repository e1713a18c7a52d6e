#include "hetpar/sim/flow_network.h"

#include <algorithm>
#include <limits>

#include "hetpar/core/check.h"

namespace hetpar::sim {

// Tags: 2f = flow f drained its bytes, 2f+1 = flow f delivered, kCommitTag = re-solve.
FlowNetwork::FlowNetwork(EventQueue& queue, const Network& net, Observer& observer)
    : queue_(queue),
      observer_(observer),
      on_link_(net.num_links()),
      link_mark_(net.num_links(), 0),
      local_(net.num_links(), -1) {
  capacity_.reserve(net.num_links());
  for (int l = 0; l < net.num_links(); ++l)
    capacity_.push_back(net.link(LinkId(l)).capacity.bytes_per_s());
}

void FlowNetwork::start(std::span<const LinkId> route, std::span<const double> weights, Bytes bytes,
                        Time latency, uint32_t cookie) {
  int32_t f;
  if (free_.empty()) {
    f = static_cast<int32_t>(flows_.size());
    flows_.emplace_back();
    flow_mark_.push_back(0);
  } else {
    f = free_.back();
    free_.pop_back();
  }
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
    queue_.schedule_in(latency, *this, 2 * f + 1);
    return;
  }
  for (size_t i = 0; i < fl.hops.size(); ++i) {
    Hop& h = fl.hops[i];
    h.slot = static_cast<int32_t>(on_link_[h.link].size());
    on_link_[h.link].push_back({f, static_cast<int32_t>(i)});
    mark_dirty(h.link);
  }
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
  queue_.schedule_at(now + fl.latency, *this, 2 * f + 1);
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
      local_route_.clear();
      local_weights_.clear();
      for (const Hop& h : flows_[f].hops) {
        local_route_.push_back(local_[h.link]);
        local_weights_.push_back(h.weight);
      }
      solver_.add_flow(local_route_, local_weights_);
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
    queue_.cancel(fl.drained);
    HETPAR_CHECK(rate > 0, "flow {} got no bandwidth", comp_flows_[i]);
    fl.drained = queue_.schedule_at(now + Time::seconds(fl.remaining / rate), *this,
                                    static_cast<uint32_t>(2 * comp_flows_[i]));
  }
}

}  // namespace hetpar::sim

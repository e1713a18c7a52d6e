#include "hetpar/sim/max_min.h"

#include <algorithm>
#include <functional>
#include <limits>

#include "hetpar/core/check.h"

namespace hetpar::sim {

void MaxMinSolver::clear() {
  capacity_.clear();
  flow_begin_.assign(1, 0);
  flow_links_.clear();
  flow_weights_.clear();
  rate_.clear();
}

int32_t MaxMinSolver::add_link(double capacity) {
  HETPAR_CHECK(capacity >= 0, "negative link capacity {}", capacity);
  capacity_.push_back(capacity);
  return num_links() - 1;
}

int32_t MaxMinSolver::add_flow(std::span<const int32_t> links) {
  return add_flow(links, {});
}

int32_t MaxMinSolver::add_flow(std::span<const int32_t> links, std::span<const double> weights) {
  HETPAR_CHECK(weights.empty() || weights.size() == links.size(), "{} weights for {} links",
               weights.size(), links.size());
  for (size_t i = 0; i < links.size(); ++i) add_hop(links[i], weights.empty() ? 1.0 : weights[i]);
  return end_flow();
}

int32_t MaxMinSolver::end_flow() {
  const size_t begin = static_cast<size_t>(flow_begin_.back()), end = flow_links_.size();
  // One pass without a branch per hop (a contended MoE commit adds millions of hops); the
  // hop at fault is named on the slow path.
  const auto nl = static_cast<uint32_t>(num_links());
  bool ok = true;
  for (size_t i = begin; i < end; ++i)
    ok &= (static_cast<uint32_t>(flow_links_[i]) < nl) & (flow_weights_[i] > 0);
  if (!ok) [[unlikely]]
    for (size_t i = begin; i < end; ++i) {
      const int32_t l = flow_links_[i];
      HETPAR_CHECK(l >= 0 && l < num_links(), "flow uses unknown link {}", l);
      HETPAR_CHECK(flow_weights_[i] > 0, "flow weight {} on link {}", flow_weights_[i], l);
    }
  flow_begin_.push_back(static_cast<int32_t>(end));
  return num_flows() - 1;
}

void MaxMinSolver::solve() {
  const int32_t nl = num_links();
  const int32_t nf = num_flows();
  constexpr double kUnfixed = -1;
  rate_.assign(nf, kUnfixed);
  remaining_.assign(capacity_.begin(), capacity_.end());
  unfixed_.assign(nl, 0);
  load_.assign(nl, 0.0);
  for (size_t i = 0; i < flow_links_.size(); ++i) {
    ++unfixed_[flow_links_[i]];
    load_[flow_links_[i]] += flow_weights_[i];
  }
  link_begin_.assign(nl + 1, 0);
  for (int32_t l = 0; l < nl; ++l) link_begin_[l + 1] = link_begin_[l] + unfixed_[l];
  link_flows_.resize(flow_links_.size());
  fill_.assign(link_begin_.begin(), link_begin_.end() - 1);
  for (int32_t f = 0; f < nf; ++f)
    for (int32_t i = flow_begin_[f]; i < flow_begin_[f + 1]; ++i)
      link_flows_[fill_[flow_links_[i]]++] = f;
  for (int32_t f = 0; f < nf; ++f)
    if (flow_begin_[f] == flow_begin_[f + 1]) rate_[f] = std::numeric_limits<double>::infinity();

  // Progressive filling: the link with the smallest fair share among its unfixed flows
  // saturates first; its flows get that share, which is taken from their other links.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  auto share_of = [&](int32_t l) { return std::max(remaining_[l], 0.0) / load_[l]; };
  // Fixes the bottleneck's unfixed flows at `share`, and lists in touched_ each link whose
  // share that changes (the caller clears its marks).
  auto saturate = [&](int32_t bottleneck, double share) {
    touched_.clear();
    for (int32_t i = link_begin_[bottleneck]; i < link_begin_[bottleneck + 1]; ++i) {
      int32_t f = link_flows_[i];
      if (rate_[f] != kUnfixed) continue;
      rate_[f] = share;
      for (int32_t j = flow_begin_[f]; j < flow_begin_[f + 1]; ++j) {
        const int32_t l = flow_links_[j];
        const double w = flow_weights_[j];
        remaining_[l] -= w == 1.0 ? share : w * share;
        load_[l] -= w;
        --unfixed_[l];
        if (!is_touched_[l]) {
          is_touched_[l] = 1;
          touched_.push_back(l);
        }
      }
    }
  };
  is_touched_.assign(nl, 0);
  if (nl <= kScanLinks) {
    // Each level scans the links that still carry unfixed flows for the smallest cached
    // share; only the links the level's saturation touched recompute theirs (a share is a
    // function of its link's remaining capacity and load alone, so the cache is exact).
    share_.resize(nl);
    active_.clear();
    for (int32_t l = 0; l < nl; ++l) {
      if (unfixed_[l] == 0) continue;
      share_[l] = share_of(l);
      active_.push_back(l);
    }
    while (true) {
      int32_t bottleneck = -1;
      double share = kInf;
      size_t kept = 0;  // compacted in place, in link order: the first smallest wins ties
      for (const int32_t l : active_) {
        if (unfixed_[l] == 0) continue;  // all its flows fixed
        active_[kept++] = l;
        if (share_[l] < share) {
          share = share_[l];
          bottleneck = l;
        }
      }
      active_.resize(kept);
      if (bottleneck < 0) break;
      saturate(bottleneck, share);
      for (int32_t l : touched_) {
        is_touched_[l] = 0;
        if (unfixed_[l] > 0) share_[l] = share_of(l);
      }
    }
    return;
  }
  // Many links: a min-heap of (share, link), an entry stale once its link's share moved
  // (each change pushes the new one) or its flows are all fixed. Links of infinite share
  // never saturate, as in the scan.
  const auto later = std::greater<std::pair<double, int32_t>>();
  heap_.clear();
  for (int32_t l = 0; l < nl; ++l)
    if (unfixed_[l] > 0 && share_of(l) < kInf) heap_.emplace_back(share_of(l), l);
  std::make_heap(heap_.begin(), heap_.end(), later);
  while (!heap_.empty()) {
    std::pop_heap(heap_.begin(), heap_.end(), later);
    const auto [share, bottleneck] = heap_.back();
    heap_.pop_back();
    if (unfixed_[bottleneck] == 0 || share_of(bottleneck) != share) continue;  // stale
    saturate(bottleneck, share);
    for (int32_t l : touched_) {
      is_touched_[l] = 0;
      if (unfixed_[l] == 0) continue;
      const double s = share_of(l);
      if (s == kInf) continue;
      heap_.emplace_back(s, l);
      std::push_heap(heap_.begin(), heap_.end(), later);
    }
  }
}

}  // namespace hetpar::sim

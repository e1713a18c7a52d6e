#include "hetpar/sim/max_min.h"

#include <algorithm>
#include <limits>

#include "hetpar/core/check.h"

namespace hetpar::sim {

void MaxMinSolver::clear() {
  capacity_.clear();
  flow_begin_.assign(1, 0);
  flow_links_.clear();
  rate_.clear();
}

int32_t MaxMinSolver::add_link(double capacity) {
  HETPAR_CHECK(capacity >= 0, "negative link capacity {}", capacity);
  capacity_.push_back(capacity);
  return num_links() - 1;
}

int32_t MaxMinSolver::add_flow(std::span<const int32_t> links) {
  for (int32_t l : links) {
    HETPAR_CHECK(l >= 0 && l < num_links(), "flow uses unknown link {}", l);
    flow_links_.push_back(l);
  }
  flow_begin_.push_back(static_cast<int32_t>(flow_links_.size()));
  return num_flows() - 1;
}

void MaxMinSolver::solve() {
  const int32_t nl = num_links();
  const int32_t nf = num_flows();
  constexpr double kUnfixed = -1;
  rate_.assign(nf, kUnfixed);
  remaining_.assign(capacity_.begin(), capacity_.end());
  unfixed_.assign(nl, 0);
  for (int32_t l : flow_links_) ++unfixed_[l];
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
  while (true) {
    int32_t bottleneck = -1;
    double share = std::numeric_limits<double>::infinity();
    for (int32_t l = 0; l < nl; ++l) {
      if (unfixed_[l] == 0) continue;
      double s = std::max(remaining_[l], 0.0) / unfixed_[l];
      if (s < share) {
        share = s;
        bottleneck = l;
      }
    }
    if (bottleneck < 0) break;
    for (int32_t i = link_begin_[bottleneck]; i < link_begin_[bottleneck + 1]; ++i) {
      int32_t f = link_flows_[i];
      if (rate_[f] != kUnfixed) continue;
      rate_[f] = share;
      for (int32_t j = flow_begin_[f]; j < flow_begin_[f + 1]; ++j) {
        remaining_[flow_links_[j]] -= share;
        --unfixed_[flow_links_[j]];
      }
    }
  }
}

}  // namespace hetpar::sim

// MaxMinSolver: max-min fair rates for flows that each cross a set of links (SimGrid's
// lmm, without weights). Given capacities C_l and flows f with link sets L_f, it finds
// rates x_f with sum_{f uses l} x_f <= C_l for every link such that no flow can go
// faster without slowing a flow that is already slower or as slow (progressive filling:
// raise all unfixed rates together; when a link saturates, fix its flows at its share).
// A flow may weigh w > 0 on a link: it uses w x its rate there, standing for w alike flows
// (sim's copies of a symmetric task); the share of a link is then its capacity left over
// the weights of its unfixed flows. Pure numerics in bytes/s as doubles; no time, no events. Reuse
// one solver to avoid allocations: clear() keeps the buffers.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace hetpar::sim {

class MaxMinSolver {
 public:
  void clear();
  /// Adds a link and returns its index (0, 1, ...). REQUIRES: capacity >= 0.
  int32_t add_link(double capacity);
  /// Adds a flow over `links` (indices from add_link, each at most once) and returns its
  /// index. A flow over no link is unconstrained: its rate is +infinity.
  int32_t add_flow(std::span<const int32_t> links);
  /// As above, with `weights[i]` (> 0) on links[i]; empty weights = all 1.
  int32_t add_flow(std::span<const int32_t> links, std::span<const double> weights);
  /// The same, hop by hop, for a caller that would otherwise copy a route first: add_hop()
  /// for each link of the next flow, then end_flow(), which checks them (as add_flow does)
  /// and returns the flow's index.
  void add_hop(int32_t link, double weight) {
    flow_links_.push_back(link);
    flow_weights_.push_back(weight);
  }
  int32_t end_flow();
  /// Computes every flow's rate. Up to kScanLinks links each bottleneck level scans the
  /// links that still carry unfixed flows for the smallest share, recomputing only the
  /// shares the last level changed: O(levels x links + sum of route lengths), with no
  /// division in the scan. Above it a min-heap of the links' shares finds the bottleneck:
  /// O((links + sum of route lengths) log links), so a collective over tens of thousands
  /// of nodes plans in well under a second (below, the heap's pushes for every link a
  /// level touches cost more than the scan: an MoE all-to-all's bundled flows cross a
  /// dozen links each). Both pick the same bottleneck (the smallest share, then the
  /// lowest link index): the same rates.
  void solve();
  static constexpr int32_t kScanLinks = 4096;
  /// Rate of `flow` after solve().
  double rate(int32_t flow) const { return rate_[flow]; }
  int32_t num_links() const { return static_cast<int32_t>(capacity_.size()); }
  int32_t num_flows() const { return static_cast<int32_t>(flow_begin_.size()) - 1; }

 private:
  std::vector<double> capacity_;
  std::vector<int32_t> flow_begin_{0};  // flow f uses flow_links_[flow_begin_[f] .. [f+1])
  std::vector<int32_t> flow_links_;
  std::vector<double> flow_weights_;  // parallel to flow_links_
  std::vector<double> rate_;
  // solve() scratch: per link, the capacity left, the flows not fixed yet, and the flows
  // using it (CSR, link_begin_[l] .. link_begin_[l+1] into link_flows_).
  std::vector<double> remaining_;
  std::vector<int32_t> unfixed_;
  std::vector<double> load_;  // per link, the weights of its unfixed flows
  std::vector<int32_t> link_begin_;
  std::vector<int32_t> link_flows_;
  std::vector<int32_t> fill_;
  std::vector<double> share_;    // up to kScanLinks: per link, its share, kept current
  std::vector<int32_t> active_;  // up to kScanLinks: links that may carry unfixed flows
  std::vector<std::pair<double, int32_t>> heap_;  // (share, link) when over kScanLinks
  std::vector<int32_t> touched_;
  std::vector<char> is_touched_;
};

}  // namespace hetpar::sim

// Network: what the simulator needs to know about a cluster, and nothing more. Directed
// links (capacity, latency), the node each rank lives on, and a router that gives the
// links from one rank to another. An adapter fills it from the hardware topology; the
// builders below make the simple shapes tests use. Immutable while simulations run, so
// one Network may be shared by concurrent simulations.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "hetpar/core/ids.h"
#include "hetpar/core/status.h"
#include "hetpar/core/units.h"

namespace hetpar::sim {

struct LinkSpec {
  Bandwidth capacity;  // one direction
  Time latency;        // paid once per transfer that crosses the link
  std::string name;
};

class Network {
 public:
  /// Appends the links from `src` to `dst`, in order, to `out`.
  using Router = std::function<void(RankId src, RankId dst, std::vector<LinkId>& out)>;

  /// All ranks start on node 0 with no route; set_node and set_router fill them in.
  explicit Network(int num_ranks);

  /// REQUIRES: capacity > 0, latency >= 0.
  LinkId add_link(Bandwidth capacity, Time latency, std::string name);
  void set_node(RankId rank, NodeId node);
  void set_router(Router router) { router_ = std::move(router); }

  int num_ranks() const { return static_cast<int>(node_of_.size()); }
  int num_links() const { return static_cast<int>(links_.size()); }
  const LinkSpec& link(LinkId id) const { return links_[id.value()]; }
  NodeId node_of(RankId rank) const { return node_of_[rank.value()]; }
  /// Clears `out` and fills it with the route from `src` to `dst` (empty when src == dst).
  /// REQUIRES: a router is set; checks that the router returned known links.
  void route(RankId src, RankId dst, std::vector<LinkId>& out) const;
  /// Sum of the latencies of `route`.
  Time latency(std::span<const LinkId> route) const;
  /// Ok when there is a router and at least one rank.
  Status validate() const;

 private:
  std::vector<LinkSpec> links_;
  std::vector<NodeId> node_of_;
  Router router_;
};

/// `ranks` ranks on one non-blocking switch; rank r has an up link (r -> switch) and a
/// down link (switch -> r), named "up r" / "down r"; a route is {up src, down dst}.
Network single_switch_network(int ranks, Bandwidth bandwidth, Time latency);

/// `nodes` x `gpus_per_node` ranks (rank = node * gpus_per_node + local). Inside a node
/// every GPU has an NVLink up/down link to the node's NVSwitch; every GPU has its own NIC
/// (up/down) to a non-blocking core switch (rail-optimised, one NIC per GPU). Intra-node
/// route: {nvlink up src, nvlink down dst}; inter-node: {nic up src, nic down dst}.
struct ClusterShape {
  int nodes = 1;
  int gpus_per_node = 8;
  Bandwidth nvlink = Bandwidth::GBps(450);
  Time nvlink_latency = Time::us(1);
  Bandwidth nic = Bandwidth::gbit_per_s(400);
  Time nic_latency = Time::us(5);
};
Network cluster_network(const ClusterShape& shape);

}  // namespace hetpar::sim

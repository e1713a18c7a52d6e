#include "hetpar/sim/network.h"

#include <algorithm>

#include "hetpar/core/check.h"
#include "hetpar/core/format.h"

namespace hetpar::sim {

Network::Network(int num_ranks) : node_of_(std::max(num_ranks, 0), NodeId(0)) {}

LinkId Network::add_link(Bandwidth capacity, Time latency, std::string name) {
  HETPAR_CHECK(capacity.bytes_per_s() > 0, "link {}: capacity must be > 0", name);
  HETPAR_CHECK(latency >= Time::zero(), "link {}: negative latency", name);
  links_.push_back({capacity, latency, std::move(name)});
  return LinkId(num_links() - 1);
}

void Network::set_node(RankId rank, NodeId node) {
  HETPAR_CHECK(rank.valid() && rank.value() < num_ranks(), "unknown rank {}", rank);
  node_of_[rank.value()] = node;
}

void Network::route(RankId src, RankId dst, std::vector<LinkId>& out) const {
  out.clear();
  if (src == dst) return;
  router_(src, dst, out);
  for (LinkId l : out)
    HETPAR_CHECK(l.valid() && l.value() < num_links(), "route {} -> {} uses unknown link {}", src,
                 dst, l);
}

Time Network::latency(std::span<const LinkId> route) const {
  Time t;
  for (LinkId l : route) t += links_[l.value()].latency;
  return t;
}

Status Network::validate() const {
  if (num_ranks() < 1) return Status::invalid_argument("network: needs at least one rank");
  if (!router_) return Status::invalid_argument("network: no router set");
  return Status::ok();
}

Network single_switch_network(int ranks, Bandwidth bandwidth, Time latency) {
  Network net(ranks);
  for (int r = 0; r < ranks; ++r) net.add_link(bandwidth, latency, fmt::format("up {}", r));
  for (int r = 0; r < ranks; ++r) net.add_link(bandwidth, latency, fmt::format("down {}", r));
  net.set_router([ranks](RankId src, RankId dst, std::vector<LinkId>& out) {
    out.push_back(LinkId(src.value()));
    out.push_back(LinkId(ranks + dst.value()));
  });
  return net;
}

Network cluster_network(const ClusterShape& s) {
  const int n = s.nodes * s.gpus_per_node;
  Network net(n);
  // Link ids: [0,n) nvlink up, [n,2n) nvlink down, [2n,3n) nic up, [3n,4n) nic down.
  for (int r = 0; r < n; ++r)
    net.add_link(s.nvlink, s.nvlink_latency, fmt::format("nvlink up {}", r));
  for (int r = 0; r < n; ++r)
    net.add_link(s.nvlink, s.nvlink_latency, fmt::format("nvlink down {}", r));
  for (int r = 0; r < n; ++r) net.add_link(s.nic, s.nic_latency, fmt::format("nic up {}", r));
  for (int r = 0; r < n; ++r) net.add_link(s.nic, s.nic_latency, fmt::format("nic down {}", r));
  for (int r = 0; r < n; ++r) net.set_node(RankId(r), NodeId(r / s.gpus_per_node));
  net.set_router([n, g = s.gpus_per_node](RankId src, RankId dst, std::vector<LinkId>& out) {
    bool same_node = src.value() / g == dst.value() / g;
    int base = same_node ? 0 : 2 * n;
    out.push_back(LinkId(base + src.value()));
    out.push_back(LinkId(base + n + dst.value()));
  });
  return net;
}

}  // namespace hetpar::sim

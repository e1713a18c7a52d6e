#include "hetpar/sim/collective.h"

#include <algorithm>
#include <limits>
#include <unordered_map>

#include "hetpar/core/check.h"
#include "hetpar/core/format.h"
#include "hetpar/sim/max_min.h"

namespace hetpar::sim {
namespace {

// Group members per node, nodes in order of first appearance, members in group order.
std::vector<std::vector<RankId>> members_by_node(std::span<const RankId> group,
                                                 const Network& net) {
  // Nodes in order of their first member, looked up in a hash map (a linear search over
  // the nodes seen made a DP group over 65536 nodes quadratic).
  std::unordered_map<int32_t, size_t> index;
  std::vector<std::vector<RankId>> out;
  for (RankId r : group) {
    const size_t at = index.try_emplace(net.node_of(r).value(), out.size()).first->second;
    if (at == out.size()) out.emplace_back();
    out[at].push_back(r);
  }
  return out;
}

int num_channels(const std::vector<std::vector<RankId>>& nodes, const CollectiveConfig& config) {
  if (config.channels > 0) return config.channels;
  if (nodes.size() == 1) return 1;
  size_t fewest = nodes[0].size();
  for (const auto& members : nodes) fewest = std::min(fewest, members.size());
  return static_cast<int>(fewest);
}

// Channel c's ring: node by node, each node's members rotated by c.
std::vector<RankId> channel_order(const std::vector<std::vector<RankId>>& nodes, int c) {
  std::vector<RankId> order;
  for (const auto& members : nodes)
    for (size_t i = 0; i < members.size(); ++i) order.push_back(members[(i + c) % members.size()]);
  return order;
}

int ceil_log2(int x) {
  int k = 0;
  while ((1 << k) < x) ++k;
  return k;
}

// Parent of position r (r > 0) in NCCL's binary tree over n positions (ncclGetBtree):
// r's lowest set bit b; the parent is (r ^ b) | 2b, or r ^ b when that is out of range.
int btree_parent(int r, int n) {
  int bit = r & -r;
  int up = (r ^ bit) | (bit << 1);
  return up < n ? up : r ^ bit;
}

// One step's latencies over NVLink and over the network, ring and tree.
struct Hops {
  Time intra, ring_inter, tree_inter;
};

// The config's hops, or on several kinds of node (node_curves) the largest of the kinds
// `nodes` lie on: a step waits for its slowest member.
Hops hops_of(const std::vector<std::vector<RankId>>& nodes, const Network& net,
             const CollectiveConfig& cfg) {
  if (cfg.node_curves.empty()) return {cfg.intra_hop, cfg.ring_inter_hop, cfg.tree_inter_hop};
  Hops h;
  for (const auto& members : nodes) {
    const CollectiveCurves& c = cfg.curves_of(net.node_of(members.front()));
    h.intra = std::max(h.intra, c.intra_hop.value_or(cfg.intra_hop));
    h.ring_inter = std::max(h.ring_inter, c.ring_inter_hop.value_or(cfg.ring_inter_hop));
    h.tree_inter = std::max(h.tree_inter, c.tree_inter_hop.value_or(cfg.tree_inter_hop));
  }
  return h;
}

Time ring_latency(CollectiveKind kind, int n, const std::vector<std::vector<RankId>>& nodes,
                  const Hops& hops, const CollectiveConfig& cfg) {
  const int k = static_cast<int>(nodes.size());
  int steps = n - 1;
  int inter = k - 1;
  if (kind == CollectiveKind::kAllReduce) {
    steps = 2 * (n - 1);
    inter = 2 * (k - 1);
  } else if (kind == CollectiveKind::kAllToAll) {
    inter = n - static_cast<int>(nodes[0].size());  // peers of one rank outside its node
  }
  return cfg.ring_base + hops.intra * (steps - inter) + hops.ring_inter * inter;
}

}  // namespace

CollectivePattern collective_pattern(CollectiveKind kind, Algorithm algorithm,
                                     std::span<const RankId> group, RankId root, const Network& net,
                                     const CollectiveConfig& config) {
  HETPAR_CHECK(!group.empty(), "collective over an empty group");
  HETPAR_CHECK(algorithm != Algorithm::kAuto, "collective_pattern needs a resolved algorithm");
  HETPAR_CHECK(algorithm == Algorithm::kRing || kind == CollectiveKind::kAllReduce,
               "the tree algorithm is all_reduce only, not {}", to_string(kind));
  CollectivePattern p;
  p.algorithm = algorithm;
  const int n = static_cast<int>(group.size());
  if (n == 1) return p;
  const auto nodes = members_by_node(group, net);
  p.nodes = static_cast<int32_t>(nodes.size());
  const int channels = num_channels(nodes, config);
  auto add = [&](RankId src, RankId dst, double share) { p.flows.push_back({src, dst, share}); };

  if (algorithm == Algorithm::kTree) {
    size_t per_node = 0;
    for (const auto& members : nodes) per_node = std::max(per_node, members.size());
    const Hops hops = hops_of(nodes, net, config);
    p.latency = config.tree_base + (hops.intra * static_cast<int64_t>(per_node - 1) +
                                    hops.tree_inter * ceil_log2(static_cast<int>(nodes.size()))) *
                                       2;
    // Tree 0 over positions 0..n-1; tree 1 mirrors it (n even) or shifts it by one (n odd).
    auto position = [n](int tree, int label) {
      if (tree == 0) return label;
      return n % 2 == 0 ? n - 1 - label : (label + 1) % n;
    };
    const double share = 1.0 / (2.0 * channels);
    for (int c = 0; c < channels; ++c) {
      const auto order = channel_order(nodes, c);
      for (int tree = 0; tree < 2; ++tree) {
        for (int label = 1; label < n; ++label) {
          RankId child = order[position(tree, label)];
          RankId parent = order[position(tree, btree_parent(label, n))];
          add(child, parent, share);
          add(parent, child, share);
        }
      }
    }
    return p;
  }

  p.latency = ring_latency(kind, n, nodes, hops_of(nodes, net, config), config);
  switch (kind) {
    case CollectiveKind::kAllToAll:
      for (RankId src : group)
        for (RankId dst : group)
          if (src != dst) add(src, dst, 1.0 / n);
      break;
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kAllGather:
    case CollectiveKind::kReduceScatter: {
      const double volume = kind == CollectiveKind::kAllReduce ? 2.0 * (n - 1) / n : (n - 1.0) / n;
      for (int c = 0; c < channels; ++c) {
        const auto order = channel_order(nodes, c);
        for (int i = 0; i < n; ++i) add(order[i], order[(i + 1) % n], volume / channels);
      }
      break;
    }
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kReduce: {
      // The channel's ring cut open at the root: a chain of n-1 edges from (broadcast) or
      // towards (reduce) the root.
      for (int c = 0; c < channels; ++c) {
        const auto order = channel_order(nodes, c);
        const int at =
            static_cast<int>(std::find(order.begin(), order.end(), root) - order.begin());
        HETPAR_CHECK(at < n, "root {} is not in the group", root);
        for (int i = 0; i + 1 < n; ++i) {
          RankId a = order[(at + i) % n];
          RankId b = order[(at + i + 1) % n];
          if (kind == CollectiveKind::kBroadcast)
            add(a, b, 1.0 / channels);
          else
            add(b, a, 1.0 / channels);
        }
      }
      break;
    }
  }
  return p;
}

double idle_seconds_per_byte(const CollectivePattern& pattern, const Network& net) {
  MaxMinSolver solver;
  std::vector<int32_t> local(net.num_links(), -1);
  std::vector<LinkId> route;
  std::vector<int32_t> local_route;
  for (const CollectiveFlow& f : pattern.flows) {
    net.route(f.src, f.dst, route);
    local_route.clear();
    for (LinkId l : route) {
      int32_t& idx = local[l.value()];
      if (idx < 0) idx = solver.add_link(net.link(l).capacity.bytes_per_s());
      local_route.push_back(idx);
    }
    solver.add_flow(local_route);
  }
  solver.solve();
  double spb = 0;
  for (int32_t i = 0; i < solver.num_flows(); ++i)
    spb = std::max(spb, pattern.flows[i].share / solver.rate(i));
  return spb;
}

Time idle_time(const CollectivePattern& pattern, Bytes bytes, const Network& net) {
  return pattern.latency + Time::seconds(bytes.as_double() * idle_seconds_per_byte(pattern, net));
}

double bus_bandwidth_factor(CollectiveKind kind, int n) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return 2.0 * (n - 1) / n;
    case CollectiveKind::kAllGather:
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllToAll:
      return (n - 1.0) / n;
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kReduce:
      return 1.0;
  }
  return 1.0;
}

bool auto_considers_tree(CollectiveKind kind, std::span<const RankId> group, const Network& net) {
  if (kind != CollectiveKind::kAllReduce) return false;
  for (RankId r : group)
    if (net.node_of(r) != net.node_of(group[0])) return true;
  return false;
}

Algorithm choose_algorithm(CollectiveKind kind, std::span<const RankId> group, RankId root,
                           Bytes bytes, const Network& net, const CollectiveConfig& config) {
  if (!auto_considers_tree(kind, group, net)) return Algorithm::kRing;
  Time ring =
      idle_time(collective_pattern(kind, Algorithm::kRing, group, root, net, config), bytes, net);
  Time tree =
      idle_time(collective_pattern(kind, Algorithm::kTree, group, root, net, config), bytes, net);
  return tree < ring ? Algorithm::kTree : Algorithm::kRing;
}

}  // namespace hetpar::sim

#include "hetpar/planner/network_builder.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "hetpar/core/check.h"

namespace hetpar::planner {

using hardware::Collective;
using hardware::CollectiveScope;

namespace {

// Link ids of one node.
struct NodeLinks {
  int first_gpu = 0;
  int gpus = 0;
  int nics = 0;
  int32_t gpu_up = -1;  // + local index; down = gpu_up + gpus
  int32_t nic_up = -1;  // + NIC index; down = nic_up + nics
  int32_t wan_up = -1;  // down = wan_up + 1
};

Time half(Time t) {
  return Time::ps(t.count_ps() / 2);
}

// The simulator's collective a profile figure describes; send_recv is P2P, not one.
std::optional<sim::CollectiveKind> sim_collective(Collective op) {
  switch (op) {
    case Collective::kAllReduce:
      return sim::CollectiveKind::kAllReduce;
    case Collective::kAllGather:
      return sim::CollectiveKind::kAllGather;
    case Collective::kReduceScatter:
      return sim::CollectiveKind::kReduceScatter;
    case Collective::kAllToAll:
      return sim::CollectiveKind::kAllToAll;
    case Collective::kBroadcast:
      return sim::CollectiveKind::kBroadcast;
    case Collective::kSendRecv:
      return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

sim::Network build_network(const hardware::ClusterSpec& cluster) {
  const int world = cluster.total_gpus();
  const int nodes = cluster.num_nodes();
  HETPAR_CHECK(world > 0, "a network needs at least one GPU");
  sim::Network net(world);
  std::vector<NodeLinks> links(nodes);
  std::vector<int32_t> node_of(world);
  for (int n = 0; n < nodes; ++n) {
    const hardware::SystemProfile& prof = cluster.profile_of_node(NodeId(n));
    NodeLinks& nl = links[n];
    nl.first_gpu = cluster.first_gpu_of_node(NodeId(n));
    nl.gpus = prof.gpus_per_node;
    for (int i = 0; i < nl.gpus; ++i) {
      node_of[nl.first_gpu + i] = n;
      net.set_node(RankId(nl.first_gpu + i), NodeId(n));
    }
    if (nl.gpus > 1) {
      const Bandwidth bw = prof.collective(CollectiveScope::kIntraNode, Collective::kAllGather)
                               .bus_bandwidth(nl.gpus);
      const Time lat =
          half(prof.collective(CollectiveScope::kIntraNode, Collective::kSendRecv).alpha);
      nl.gpu_up = net.num_links();
      for (int i = 0; i < nl.gpus; ++i)
        net.add_link(bw, lat, fmt::format("node {} gpu {} up", n, i));
      for (int i = 0; i < nl.gpus; ++i)
        net.add_link(bw, lat, fmt::format("node {} gpu {} down", n, i));
    }
    if (nodes > 1) {
      nl.nics = std::max(prof.inter_node.nics_per_node, 1);
      const Bandwidth bw = prof.collective(CollectiveScope::kInterNode, Collective::kAllReduce)
                               .bus_bandwidth(nodes) *
                           (1.0 / nl.nics);
      const Time lat =
          half(prof.collective(CollectiveScope::kInterNode, Collective::kSendRecv).alpha);
      nl.nic_up = net.num_links();
      for (int i = 0; i < nl.nics; ++i)
        net.add_link(bw, lat, fmt::format("node {} nic {} up", n, i));
      for (int i = 0; i < nl.nics; ++i)
        net.add_link(bw, lat, fmt::format("node {} nic {} down", n, i));
      if (prof.wan) {
        nl.wan_up = net.num_links();
        net.add_link(prof.wan->up, half(prof.wan->latency), fmt::format("node {} wan up", n));
        net.add_link(prof.wan->down, half(prof.wan->latency), fmt::format("node {} wan down", n));
      }
    }
  }
  net.set_router([links = std::move(links), node_of = std::move(node_of)](
                     RankId src, RankId dst, std::vector<LinkId>& out) {
    const NodeLinks& a = links[node_of[src.value()]];
    const NodeLinks& b = links[node_of[dst.value()]];
    const int la = src.value() - a.first_gpu, lb = dst.value() - b.first_gpu;
    if (&a == &b) {
      out.push_back(LinkId(a.gpu_up + la));
      out.push_back(LinkId(a.gpu_up + a.gpus + lb));
      return;
    }
    out.push_back(LinkId(a.nic_up + la % a.nics));
    if (a.wan_up >= 0) out.push_back(LinkId(a.wan_up));
    if (b.wan_up >= 0) out.push_back(LinkId(b.wan_up + 1));
    out.push_back(LinkId(b.nic_up + b.nics + lb % b.nics));
  });
  return net;
}

sim::CollectiveConfig collective_config(const hardware::ClusterSpec& cluster) {
  sim::CollectiveConfig cfg;
  cfg.curves.assign(cluster.groups().size(), {});
  Time intra, ring_inter, tree_inter;
  auto at_least_zero = [](Time t) { return std::max(t, Time::zero()); };
  for (size_t gi = 0; gi < cluster.groups().size(); ++gi) {
    const hardware::SystemProfile& prof = cluster.groups()[gi].profile;
    sim::CollectiveCurves& curves = cfg.curves[gi];
    // NCCL's per-step latencies, from the profile's measured floors; the config's own are
    // the slowest group's (every node's on one kind).
    const int g = prof.gpus_per_node;
    Time hop = cfg.intra_hop;
    if (g > 1) {
      const Time alpha = prof.collective(CollectiveScope::kIntraNode, Collective::kAllGather).alpha;
      hop = Time::ps((alpha - cfg.ring_base).count_ps() / (g - 1));
    }
    hop = at_least_zero(hop);
    const Time ag = prof.collective(CollectiveScope::kInterNode, Collective::kAllGather).alpha;
    const Time ring = at_least_zero(ag - cfg.ring_base - hop * (2 * (g - 1)));
    const Time ar_alpha =
        prof.collective(CollectiveScope::kInterNode, Collective::kAllReduce).alpha;
    const Time tree = at_least_zero(half(ar_alpha - cfg.tree_base) - hop * (g - 1));
    curves.intra_hop = hop;
    curves.ring_inter_hop = ring;
    curves.tree_inter_hop = tree;
    intra = std::max(intra, hop);
    ring_inter = std::max(ring_inter, ring);
    tree_inter = std::max(tree_inter, tree);
    // NCCL's ramps: over message sizes (the collectives' size_scale; sim's reduce has no
    // figure of its own and keeps none) and, across nodes, over the nodes a ring spans. The
    // network's links carry all_reduce's per-NIC rate at the cluster's node count (above);
    // NCCL runs all_gather and reduce_scatter across nodes as rings only, whose bus
    // bandwidth falls as the ring spans more nodes: per node count of the profile's figure,
    // its busbw over all_reduce's, at most 1.
    for (const hardware::CollectiveFigure& f : prof.collectives) {
      const std::optional<sim::CollectiveKind> kind = sim_collective(f.op);
      if (!kind) continue;
      auto& scales = f.scope == CollectiveScope::kIntraNode ? curves.intra_node_size_scale
                                                            : curves.inter_node_size_scale;
      scales[static_cast<size_t>(*kind)] = f.size_scale;
    }
    // Inside a node the links carry all_gather's ring rate; an all_reduce runs at its own
    // figure's busbw for its group size (NVLS's from nvls_min_group GPUs up, the ring's
    // below it), a point per group size the node holds.
    if (g > 1 && prof.has_collective(CollectiveScope::kIntraNode, Collective::kAllReduce)) {
      const hardware::CollectiveFigure& ar =
          prof.collective(CollectiveScope::kIntraNode, Collective::kAllReduce);
      const double link = prof.collective(CollectiveScope::kIntraNode, Collective::kAllGather)
                              .bus_bandwidth(g)
                              .bytes_per_s();
      std::vector<CurvePoint> curve;
      bool differs = false;
      for (int n = 2; n <= g; ++n) {
        curve.push_back({n, ar.bus_bandwidth(n).bytes_per_s() / link});
        differs = differs || curve.back().factor != 1.0;
      }
      if (differs)
        curves.intra_node_group_scale[static_cast<size_t>(sim::CollectiveKind::kAllReduce)] =
            std::move(curve);
    }
    if (cluster.num_nodes() < 2 ||
        !prof.has_collective(CollectiveScope::kInterNode, Collective::kAllReduce))
      continue;
    const hardware::CollectiveFigure& ar =
        prof.collective(CollectiveScope::kInterNode, Collective::kAllReduce);
    for (Collective op : {Collective::kAllGather, Collective::kReduceScatter}) {
      if (!prof.has_collective(CollectiveScope::kInterNode, op)) continue;
      const hardware::CollectiveFigure& f = prof.collective(CollectiveScope::kInterNode, op);
      std::vector<CurvePoint> curve;
      bool below = false;
      for (const auto& [nodes, busbw] : f.busbw) {
        const double factor =
            std::min(1.0, busbw.bytes_per_s() / ar.bus_bandwidth(nodes).bytes_per_s());
        below = below || factor < 1.0;
        curve.push_back({nodes, factor});
      }
      if (below) curves.inter_node_node_scale[static_cast<size_t>(*sim_collective(op))] = curve;
    }
  }
  cfg.intra_hop = intra;
  cfg.ring_inter_hop = ring_inter;
  cfg.tree_inter_hop = tree_inter;
  if (cfg.curves.size() > 1) {
    cfg.node_curves.resize(static_cast<size_t>(cluster.num_nodes()));
    for (int n = 0; n < cluster.num_nodes(); ++n)
      cfg.node_curves[static_cast<size_t>(n)] = static_cast<int32_t>(cluster.group_of_node(n));
  }
  return cfg;
}

}  // namespace hetpar::planner

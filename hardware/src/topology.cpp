#include "hetpar/hardware/topology.h"

#include <algorithm>
#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/dijkstra_shortest_paths.hpp>
#include <limits>

#include "hetpar/core/check.h"
#include "hetpar/core/format.h"

namespace hetpar::hardware {

std::string_view to_string(DeviceKind k) {
  switch (k) {
    case DeviceKind::kGpu:
      return "gpu";
    case DeviceKind::kSwitch:
      return "switch";
    case DeviceKind::kNic:
      return "nic";
    case DeviceKind::kWanGateway:
      return "wan_gateway";
    case DeviceKind::kCore:
      return "core";
  }
  return "?";
}

std::string_view to_string(LinkKind k) {
  switch (k) {
    case LinkKind::kNvLink:
      return "nvlink";
    case LinkKind::kPcie:
      return "pcie";
    case LinkKind::kNic:
      return "nic";
    case LinkKind::kWan:
      return "wan";
  }
  return "?";
}

namespace {

struct EdgeProp {
  int32_t link = -1;
  int64_t weight = 0;  // latency in ps + 1, so equal latencies prefer fewer hops
};
using Graph =
    boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS, boost::no_property, EdgeProp>;

// The links of one node, indexed by local GPU or NIC, for closed-form routing.
struct NodeLinks {
  int first_gpu = 0;
  int nics = 0;
  std::vector<LinkId> gpu_to_switch, switch_to_gpu;
  std::vector<LinkId> gpu_to_nic, nic_to_gpu;  // by local GPU (its rail NIC)
  std::vector<LinkId> nic_out, nic_in;         // by NIC: to/from the core or the gateway
  LinkId wan_up, wan_down;                     // invalid without a WAN link
};

Time fraction(Time t, int parts) {
  return Time::ps(t.count_ps() / parts);
}

}  // namespace

struct Topology::Impl {
  std::vector<Device> devices;
  std::vector<Link> links;
  std::vector<DeviceId> gpu_device;  // by global GPU index
  std::vector<int32_t> gpu_node;     // by global GPU index
  std::vector<NodeLinks> nodes;
  DeviceId core;
  Graph graph;

  DeviceId add_device(DeviceKind kind, NodeId node, int index) {
    DeviceId id(static_cast<int32_t>(devices.size()));
    devices.push_back({id, kind, node, index});
    boost::add_vertex(graph);
    return id;
  }
  LinkId add_link(DeviceId src, DeviceId dst, LinkKind kind, Bandwidth bw, Time latency) {
    LinkId id(static_cast<int32_t>(links.size()));
    links.push_back({id, src, dst, kind, bw, latency});
    boost::add_edge(static_cast<size_t>(src.value()), static_cast<size_t>(dst.value()),
                    EdgeProp{id.value(), latency.count_ps() + 1}, graph);
    return id;
  }
};

Topology build_topology(const ClusterSpec& cluster) {
  auto impl = std::make_shared<Topology::Impl>();
  Topology::Impl& t = *impl;
  t.core = t.add_device(DeviceKind::kCore, NodeId(), -1);
  t.nodes.resize(static_cast<size_t>(cluster.num_nodes()));
  t.gpu_device.reserve(static_cast<size_t>(cluster.total_gpus()));
  for (int n = 0; n < cluster.num_nodes(); ++n) {
    const NodeId node(n);
    const SystemProfile& p = cluster.profile_of_node(node);
    NodeLinks& nl = t.nodes[static_cast<size_t>(n)];
    nl.first_gpu = cluster.first_gpu_of_node(node);
    nl.nics = p.inter_node.nics_per_node;

    std::vector<DeviceId> gpus, nics;
    for (int g = 0; g < p.gpus_per_node; ++g) {
      gpus.push_back(t.add_device(DeviceKind::kGpu, node, nl.first_gpu + g));
      t.gpu_device.push_back(gpus.back());
      t.gpu_node.push_back(n);
    }
    if (p.gpus_per_node > 1) {
      const DeviceId sw = t.add_device(DeviceKind::kSwitch, node, -1);
      const LinkKind kind =
          p.intra_node.kind == FabricKind::kNvSwitch ? LinkKind::kNvLink : LinkKind::kPcie;
      const Time lat = fraction(p.intra_node.latency, 2);
      for (DeviceId g : gpus) {
        nl.gpu_to_switch.push_back(t.add_link(g, sw, kind, p.intra_node.bandwidth, lat));
        nl.switch_to_gpu.push_back(t.add_link(sw, g, kind, p.intra_node.bandwidth, lat));
      }
    }
    // The network latency is spread over the four links GPU -> NIC -> core -> NIC -> GPU,
    // so a GPU -> NIC -> GPU detour is never shorter than the intra-node fabric.
    const Time net_lat = fraction(p.inter_node.latency, 4);
    for (int i = 0; i < nl.nics; ++i) nics.push_back(t.add_device(DeviceKind::kNic, node, i));
    for (int g = 0; g < p.gpus_per_node; ++g) {
      const DeviceId nic = nics[static_cast<size_t>(g % nl.nics)];
      const DeviceId gpu = gpus[static_cast<size_t>(g)];
      nl.gpu_to_nic.push_back(t.add_link(gpu, nic, LinkKind::kPcie, p.gpu.host_link, net_lat));
      nl.nic_to_gpu.push_back(t.add_link(nic, gpu, LinkKind::kPcie, p.gpu.host_link, net_lat));
    }
    // WAN nodes hang off their gateway; the others sit directly on the core.
    DeviceId uplink = t.core;
    if (p.wan) {
      uplink = t.add_device(DeviceKind::kWanGateway, node, -1);
      const Time lat = fraction(p.wan->latency, 2);
      nl.wan_up = t.add_link(uplink, t.core, LinkKind::kWan, p.wan->up, lat);
      nl.wan_down = t.add_link(t.core, uplink, LinkKind::kWan, p.wan->down, lat);
    }
    for (DeviceId nic : nics) {
      nl.nic_out.push_back(
          t.add_link(nic, uplink, LinkKind::kNic, p.inter_node.nic_bandwidth, net_lat));
      nl.nic_in.push_back(
          t.add_link(uplink, nic, LinkKind::kNic, p.inter_node.nic_bandwidth, net_lat));
    }
  }
  Topology topo;
  topo.impl_ = std::move(impl);
  return topo;
}

Topology::Topology() : impl_(std::make_shared<Impl>()) {}

int Topology::num_gpus() const {
  return static_cast<int>(impl_->gpu_device.size());
}
int Topology::num_nodes() const {
  return static_cast<int>(impl_->nodes.size());
}
std::span<const Device> Topology::devices() const {
  return impl_->devices;
}
std::span<const Link> Topology::links() const {
  return impl_->links;
}
DeviceId Topology::core() const {
  return impl_->core;
}

const Device& Topology::device(DeviceId id) const {
  HETPAR_CHECK(id.valid() && static_cast<size_t>(id.value()) < impl_->devices.size(), "device {}",
               id);
  return impl_->devices[static_cast<size_t>(id.value())];
}

const Link& Topology::link(LinkId id) const {
  HETPAR_CHECK(id.valid() && static_cast<size_t>(id.value()) < impl_->links.size(), "link {}", id);
  return impl_->links[static_cast<size_t>(id.value())];
}

DeviceId Topology::gpu(int global_index) const {
  HETPAR_CHECK(global_index >= 0 && global_index < num_gpus(), "gpu {} of {}", global_index,
               num_gpus());
  return impl_->gpu_device[static_cast<size_t>(global_index)];
}

std::vector<LinkId> Topology::route(DeviceId from_gpu, DeviceId to_gpu) const {
  const Device& from = device(from_gpu);
  const Device& to = device(to_gpu);
  HETPAR_CHECK(from.kind == DeviceKind::kGpu && to.kind == DeviceKind::kGpu,
               "route() connects GPUs, got {} -> {}", to_string(from.kind), to_string(to.kind));
  if (from_gpu == to_gpu) return {};
  const NodeLinks& a = impl_->nodes[static_cast<size_t>(from.node.value())];
  const NodeLinks& b = impl_->nodes[static_cast<size_t>(to.node.value())];
  const auto la = static_cast<size_t>(from.index - a.first_gpu);
  const auto lb = static_cast<size_t>(to.index - b.first_gpu);
  if (from.node == to.node) return {a.gpu_to_switch[la], a.switch_to_gpu[lb]};

  std::vector<LinkId> r;
  r.reserve(6);
  r.push_back(a.gpu_to_nic[la]);
  r.push_back(a.nic_out[la % static_cast<size_t>(a.nics)]);
  if (a.wan_up.valid()) r.push_back(a.wan_up);
  if (b.wan_down.valid()) r.push_back(b.wan_down);
  r.push_back(b.nic_in[lb % static_cast<size_t>(b.nics)]);
  r.push_back(b.nic_to_gpu[lb]);
  return r;
}

Time Topology::latency(std::span<const LinkId> route) const {
  Time t;
  for (LinkId l : route) t += link(l).latency;
  return t;
}

Bandwidth Topology::bottleneck(std::span<const LinkId> route) const {
  HETPAR_CHECK(!route.empty(), "empty route has no bottleneck");
  Bandwidth bw = link(route.front()).bandwidth;
  for (LinkId l : route) bw = std::min(bw, link(l).bandwidth);
  return bw;
}

std::vector<LinkId> Topology::shortest_path(DeviceId from, DeviceId to) const {
  device(from);
  device(to);
  if (from == to) return {};
  const Graph& g = impl_->graph;
  const size_t n = boost::num_vertices(g);
  std::vector<int64_t> dist(n);
  std::vector<Graph::edge_descriptor> pred(n);
  const auto index = boost::get(boost::vertex_index, g);
  boost::dijkstra_shortest_paths(
      g, static_cast<size_t>(from.value()),
      boost::weight_map(boost::get(&EdgeProp::weight, g))
          .distance_map(boost::make_iterator_property_map(dist.begin(), index))
          .visitor(boost::make_dijkstra_visitor(boost::record_edge_predecessors(
              boost::make_iterator_property_map(pred.begin(), index), boost::on_edge_relaxed()))));
  if (dist[static_cast<size_t>(to.value())] == std::numeric_limits<int64_t>::max()) return {};
  std::vector<LinkId> path;
  for (size_t v = static_cast<size_t>(to.value()); v != static_cast<size_t>(from.value());) {
    const Graph::edge_descriptor e = pred[v];
    path.emplace_back(g[e].link);
    v = boost::source(e, g);
  }
  std::reverse(path.begin(), path.end());
  return path;
}

}  // namespace hetpar::hardware

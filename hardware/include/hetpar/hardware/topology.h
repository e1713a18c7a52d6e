// Topology: the cluster as a directed graph. Vertices are GPUs, one intra-node switch per
// node (NVSwitch or PCIe host bridge), NICs, one WAN gateway per WAN-connected node and a
// single non-blocking network core; edges are one-direction links with a bandwidth and
// latency. GPU i of a node uses NIC (i mod nics) (rail-aligned). WAN nodes reach the core
// only through their gateway (up link out, down link in). Immutable once built, cheap to
// copy (shared storage) and safe to query from many threads; route() is O(path length).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "hetpar/core/ids.h"
#include "hetpar/core/units.h"
#include "hetpar/hardware/cluster.h"

namespace hetpar::hardware {

enum class DeviceKind { kGpu, kSwitch, kNic, kWanGateway, kCore };
enum class LinkKind { kNvLink, kPcie, kNic, kWan };

std::string_view to_string(DeviceKind k);
std::string_view to_string(LinkKind k);

struct Device {
  DeviceId id;
  DeviceKind kind = DeviceKind::kGpu;
  NodeId node;     // invalid for the core
  int index = -1;  // global GPU index for GPUs, NIC index within the node for NICs
};

struct Link {
  LinkId id;
  DeviceId src;
  DeviceId dst;
  LinkKind kind = LinkKind::kNvLink;
  Bandwidth bandwidth;
  Time latency;
};

class Topology {
 public:
  /// An empty topology (no devices); build_topology() makes real ones.
  Topology();
  int num_gpus() const;
  int num_nodes() const;
  std::span<const Device> devices() const;
  std::span<const Link> links() const;
  const Device& device(DeviceId id) const;
  const Link& link(LinkId id) const;
  /// The vertex of global GPU `global_index` (node-major, as in ClusterSpec).
  DeviceId gpu(int global_index) const;
  /// The network core vertex (invalid in an empty topology).
  DeviceId core() const;

  /// Links from one GPU to another: GPU -> switch -> GPU inside a node; across nodes
  /// GPU -> rail NIC -> [WAN gateway -> WAN up] -> core -> [WAN down -> gateway] -> NIC
  /// -> GPU. Empty when from == to. Closed form from the regular structure; equal to
  /// shortest_path() for GPU pairs.
  std::vector<LinkId> route(DeviceId from_gpu, DeviceId to_gpu) const;
  /// Sum of link latencies along `route`.
  Time latency(std::span<const LinkId> route) const;
  /// Smallest link bandwidth along `route`. REQUIRES: !route.empty().
  Bandwidth bottleneck(std::span<const LinkId> route) const;
  /// Lowest-latency path (fewest hops among equals) between any two vertices, by Dijkstra
  /// over the whole graph: O(E log V) per call. Empty when unreachable or from == to.
  std::vector<LinkId> shortest_path(DeviceId from, DeviceId to) const;

 private:
  friend Topology build_topology(const ClusterSpec& cluster);
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

Topology build_topology(const ClusterSpec& cluster);

}  // namespace hetpar::hardware

// The simulator's view of a cluster: one rank per GPU (node-major, as ClusterSpec numbers
// them) and links whose capacities make sim's flow model of NCCL's ring collectives
// reproduce the profile's measured nccl-tests bus bandwidths rather than datasheet rates:
//
// - Each GPU of a multi-GPU node has an up and a down link to its node's switch with
//   capacity = the node's intra-node all_gather busbw at the node's GPU count (a ring edge
//   carries (n-1)/n·S, so a simulated ring all-gather inside the node runs at exactly that
//   busbw; an all-reduce's flows are a ring's too, run at the share of that rate its own
//   figure gives for its group size: collective_config()'s group scale, above 1 where
//   NVLS reduces in the switch).
// - Each NIC has an up and a down link to the network core with capacity = the node's
//   inter-node all_reduce busbw (at the cluster's node count) / NICs per node: with one ring
//   per NIC (sim's channels), a ring across nodes reaches that busbw. GPU i of a node uses
//   NIC i mod nics (rail-aligned, as hardware::Topology).
// - A node with a WAN link reaches the core through it: an up link (node -> core) and a
//   down link (core -> node) at the datasheet rates.
// Routes: same node {up src, down dst}; across nodes {nic up, [wan up], [wan down],
// nic down}. Link latencies halve the profile's send_recv alphas (intra-node links,
// NICs) and the WAN latency, so a P2P transfer pays the measured small-message time;
// collectives take their latency from CollectiveConfig instead.
#pragma once

#include "hetpar/hardware/cluster.h"
#include "hetpar/sim/collective.h"
#include "hetpar/sim/network.h"

namespace hetpar::planner {

/// REQUIRES: `cluster` has at least one GPU (ClusterSpec::create() guarantees it).
sim::Network build_network(const hardware::ClusterSpec& cluster);

/// NCCL-tuner latency constants fitted to the profiles' alpha figures, read as g-GPU rings
/// inside a node and 2 x g rings / trees across two nodes (sim's latency formulas,
/// collective.h): NVLink hop = (intra all_gather alpha - ring base) / (g-1); ring network
/// hop = inter all_gather alpha - ring base - 2(g-1)·NVLink hop; tree network hop =
/// (inter all_reduce alpha - tree base) / 2 - (g-1)·NVLink hop (never below zero), per
/// node group (CollectiveCurves' hops; the config's own are the slowest group's); the bases
/// stay NCCL's (sim::CollectiveConfig defaults). Each node group's nodes follow its own
/// profile's ramps (CollectiveConfig::curves, one per group in order, node_curves when
/// there are several): the collectives' size scales
/// (size_scale) and the rings' node scales: the links carry all_reduce's per-NIC rate
/// (build_network), and an inter-node all_gather / reduce_scatter over k nodes reaches its
/// busbw at k over all_reduce's at k, at most 1 (inter_node_node_scale; none when never
/// below 1). Inside a node an all_reduce of n ranks reaches its figure's busbw at n over
/// all_gather's at the node's GPU count (intra_node_group_scale, a point per group size from
/// CollectiveFigure::bus_bandwidth; none where they are equal, as on the A100).
sim::CollectiveConfig collective_config(const hardware::ClusterSpec& cluster);

}  // namespace hetpar::planner

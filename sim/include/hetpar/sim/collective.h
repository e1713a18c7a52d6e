// Collective algorithms as NCCL runs them, reduced to their steady state: the flows a
// collective keeps busy while it streams, plus a latency term from NCCL's tuner formulas
// (calibration.md §3.3). simulate() starts all flows of a collective at once (bundled per
// source and first link, SimOptions::bundle_flows) and ends it `latency` after the last
// one is delivered; link latencies are not added on top (the tuner's per-hop latencies
// stand for them).
//
// Why flows, not steps: on an idle network this gives latency + max over flows of
// share·S / rate, and under contention every flow gets its max-min share. It is the
// pipelined ring (each ring edge carries its whole 2(n-1)/n·S-type volume at once), not
// 2(n-1) lock-step steps: a ring runs at the pace of its slowest edge either way, and this
// costs one rate solve per collective instead of one per step. The price: edges that
// finish early free their links slightly sooner than a lock-step ring would.
//
// Ring: ranks ordered node by node (nodes in order of first appearance in the group), so
// only one hop per node crosses the network. C channels run C parallel rings of S/C each;
// channel c rotates every node's local order by c, so its inter-node hop leaves through
// local GPU c-1's NIC and enters through GPU c's: with one NIC per GPU and C = GPUs per
// node, every NIC carries one ring. Per ring edge: all_reduce 2(n-1)/n·S/C, all_gather /
// reduce_scatter (n-1)/n·S/C; broadcast / reduce: the ring cut open at the root, a chain
// of n-1 edges of S/C. all_to_all: every rank sends S/n to every other rank at once.
// Tree (all_reduce only): NCCL's double binary tree over the channel order (its bottom
// levels stay inside nodes); each of the two trees carries S/2 up (reduce) and down
// (broadcast) at once, so a rank sends and receives about 2·S: algbw = busbw / 2.
#pragma once

#include <array>
#include <optional>
#include <span>
#include <vector>

#include "hetpar/core/curve.h"
#include "hetpar/core/ids.h"
#include "hetpar/core/units.h"
#include "hetpar/sim/network.h"
#include "hetpar/sim/task_graph.h"

namespace hetpar::sim {

/// NCCL's ramps on one kind of node (one node group's profile), per CollectiveKind.
struct CollectiveCurves {
  /// The fraction of its flows' max-min rate a collective of S bytes (the task's size)
  /// reaches, for groups inside one node and groups across nodes (empty: all of it): NCCL
  /// ramps its protocols and pipelining up over mid-size messages, which the steady-state
  /// flows leave out. simulate() runs the flows of such a collective as S / factor(S)
  /// bytes. Copy-engine collectives (CollectiveSpec) are not NCCL's and keep all of it.
  std::array<std::vector<CurvePoint>, kNumCollectiveKinds> intra_node_size_scale{};
  std::array<std::vector<CurvePoint>, kNumCollectiveKinds> inter_node_size_scale{};
  /// The fraction of its flows' max-min rate a collective across nodes reaches against the
  /// number of nodes its group spans (CurvePoint::at; empty: all of it): NCCL's rings
  /// (all_gather, reduce_scatter) fall below the per-NIC rate the network's links carry as
  /// the ring grows, where all_reduce's algorithms hold it. It multiplies the size scale's
  /// factor; copy-engine collectives keep all of it.
  std::array<std::vector<CurvePoint>, kNumCollectiveKinds> inter_node_node_scale{};
  /// The same inside one node against the group's size (CurvePoint::at: ranks; empty: all
  /// of it), where the node's fabric runs a collective at a rate of its own rather than the
  /// ring's the links carry: NVLS reduces in the NVSwitch, so an all_reduce of 5-8 H100s
  /// reaches 1.31 times the all_gather's link rate. May exceed 1; multiplies the size
  /// scale's factor; copy-engine collectives keep all of it.
  std::array<std::vector<CurvePoint>, kNumCollectiveKinds> intra_node_group_scale{};
  /// NCCL's per-step latencies on this kind of node (CollectiveConfig's meaning; unset: the
  /// config's); read only where CollectiveConfig::node_curves tells kinds apart, and then a
  /// collective spanning several kinds takes each the largest of theirs.
  std::optional<Time> intra_hop{}, ring_inter_hop{}, tree_inter_hop{};
};

/// Latency constants from NCCL's tuner (src/graph/tuning.cc, LL protocol, calibration.md
/// §3.3). They give ~15 us for an 8-GPU NVLink all_reduce and ~29 us across 2 nodes x 8,
/// inside the measured 10-15 us intra-node and 25-50 us inter-node floors (§2.4).
struct CollectiveConfig {
  Time ring_base = Time::us(6.6);
  Time tree_base = Time::us(6.8);
  Time intra_hop = Time::us(0.6);       // one step over NVLink
  Time ring_inter_hop = Time::us(2.7);  // one ring step over the network
  Time tree_inter_hop = Time::us(5.0);  // one tree level over the network
  /// Parallel rings/trees. 0 = automatic: within one node 1 (one ring already fills every
  /// GPU's link), across nodes the smallest number of group members on one node (one
  /// ring per NIC when every GPU has its own NIC).
  int channels = 0;
  /// NCCL's ramps per kind of node (CollectiveCurves); curves[0] is every node's unless
  /// node_curves says otherwise. Never empty.
  std::vector<CollectiveCurves> curves = std::vector<CollectiveCurves>(1);
  /// Per NodeId: the index into `curves` of that node's kind (mixed clusters: one per node
  /// group). Empty, or a node past its end: 0. A collective whose group spans nodes of
  /// several kinds takes, at its size, the smallest factor of any of them (the ring runs at
  /// its slowest member's pace). Non-empty, the kinds' own hop latencies replace the three
  /// above (the largest of the kinds a collective spans).
  std::vector<int32_t> node_curves{};

  /// The curves of `node`'s kind.
  const CollectiveCurves& curves_of(NodeId node) const {
    const auto i = static_cast<size_t>(node.value());
    return curves[i < node_curves.size() ? static_cast<size_t>(node_curves[i]) : 0];
  }
};

/// One flow of a collective: src sends share x S bytes to dst.
struct CollectiveFlow {
  RankId src{};
  RankId dst{};
  double share = 0;
};

struct CollectivePattern {
  std::vector<CollectiveFlow> flows;
  Time latency{};
  Algorithm algorithm = Algorithm::kRing;
  int32_t nodes = 1;  // the nodes its group spans
};

/// The flows and latency of `kind` over `group` with `algorithm` (kRing or kTree; kTree
/// applies to all_reduce only). REQUIRES: group non-empty with distinct ranks, root in it
/// (broadcast / reduce). A group of one rank has no flows and no latency.
CollectivePattern collective_pattern(CollectiveKind kind, Algorithm algorithm,
                                     std::span<const RankId> group, RankId root, const Network& net,
                                     const CollectiveConfig& config);

/// Seconds per byte of S that `pattern`'s flows need on an otherwise idle network
/// (max over flows of share / max-min rate). Time on an idle network is
/// pattern.latency + S x this.
double idle_seconds_per_byte(const CollectivePattern& pattern, const Network& net);

/// Time of `pattern` moving `bytes` on an idle network.
Time idle_time(const CollectivePattern& pattern, Bytes bytes, const Network& net);

/// nccl-tests busbw = algbw x factor (calibration.md §2.5): all_reduce 2(n-1)/n;
/// all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce 1.
double bus_bandwidth_factor(CollectiveKind kind, int n);

/// Whether kAuto weighs the tree at all: only all_reduce over more than one node (NCCL
/// builds its trees across nodes); everything else is a ring.
bool auto_considers_tree(CollectiveKind kind, std::span<const RankId> group, const Network& net);

/// What kAuto resolves to, like NCCL's tuner: of the algorithms considered, the one with
/// the smaller predicted idle-network time (ring on a tie).
Algorithm choose_algorithm(CollectiveKind kind, std::span<const RankId> group, RankId root,
                           Bytes bytes, const Network& net, const CollectiveConfig& config);

}  // namespace hetpar::sim

// ClusterSpec: the machines of a run — node groups (a count of nodes of one
// SystemProfile; groups may differ in GPU type) with the cluster-wide overrides (NICs,
// WAN link) already applied to every group's profile. GPUs are numbered node-major
// (node 0's GPUs first), so a global GPU index is also the rank of the GPU's process.
//
// JSON (a scenario's "cluster" section):
//   {"profile": "dgx-h100", "nodes": 8}
//   {"node_groups": [{"profile": "dgx-h100", "nodes": 4}, {"profile": "my.json", "nodes": 2}],
//    "nics_per_node": 1, "nic_gbps": 100,                           // optional, all nodes
//    "wan": {"up_gbps": 0.02, "down_gbps": 0.1, "latency_ms": 50}}  // optional, all nodes
// A profile that is not a built-in name is read as a profile file (system_profile.h).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hetpar/core/ids.h"
#include "hetpar/core/status.h"
#include "hetpar/hardware/system_profile.h"

namespace hetpar::hardware {

struct NodeGroup {
  std::string profile_ref;  // the built-in name or file path it was loaded from
  SystemProfile profile;
  int nodes = 0;
  bool operator==(const NodeGroup&) const = default;
};

struct ClusterOverrides {
  std::optional<int> nics_per_node;
  std::optional<Bandwidth> nic_bandwidth;  // per NIC, one direction
  std::optional<WanLink> wan;
  /// false: NCCL's NVLS disabled (NCCL_NVLS_ENABLE=0), so intra-node all_reduces run as
  /// rings at the profile's `busbw_without_nvls_GBps`; unset or true: as the profile has it.
  std::optional<bool> nvls;
  bool operator==(const ClusterOverrides&) const = default;
};

/// The most GPUs a cluster may hold, and so the most a plan's layout may use (the plan
/// reader bounds each degree and their product by it): 2^20, far beyond any machine
/// built, small enough that counts of ranks, tasks per rank and bytes never overflow.
inline constexpr int64_t kMaxClusterGpus = int64_t{1} << 20;

/// A default-constructed ClusterSpec is empty (no nodes); create() makes real ones.
class ClusterSpec {
 public:
  /// Validates the groups and applies `overrides` to each group's profile. A NIC override
  /// rescales the profile's inter-node bus bandwidths with the NIC capacity: the node's
  /// aggregate for ring-like collectives, one NIC for all_to_all and send_recv. NVLS
  /// switched off replaces an NVLS profile's intra-node all_reduce figure by its ring's
  /// (an error naming the profile where it has none). Each group's GPU runs its tensor-core
  /// work at the slowest of the cluster's GPUs of its model (DeviceProfile::compute_scale).
  static Result<ClusterSpec> create(std::vector<NodeGroup> groups, ClusterOverrides overrides = {});

  const std::vector<NodeGroup>& groups() const { return groups_; }
  const ClusterOverrides& overrides() const { return overrides_; }
  int num_nodes() const { return group_first_node_.back(); }
  int total_gpus() const { return group_first_gpu_.back(); }
  /// The cluster's GPUs of this model (DeviceProfile::model), over every group.
  int gpus_of_model(std::string_view model) const;
  /// True when every node has the same profile.
  bool homogeneous() const;

  /// REQUIRES: 0 <= gpu < total_gpus().
  NodeId node_of_gpu(int gpu) const;
  /// The GPU's index within its node.
  int local_index(int gpu) const;
  /// GPUs on the node that holds `gpu`.
  int gpus_per_node_of(int gpu) const { return profile_of_gpu(gpu).gpus_per_node; }
  const SystemProfile& profile_of_gpu(int gpu) const;
  /// REQUIRES: 0 <= node < num_nodes().
  const SystemProfile& profile_of_node(NodeId node) const;
  int first_gpu_of_node(NodeId node) const;
  /// The index in groups() of the group that holds `node`. REQUIRES: 0 <= node < num_nodes().
  size_t group_of_node(int node) const;
  /// The index in groups() of the group that holds `gpu`. REQUIRES: 0 <= gpu < total_gpus().
  size_t group_of_gpu(int gpu) const;
  /// The first node and the first GPU of groups()[group]. REQUIRES: group < groups().size().
  int group_first_node(size_t group) const { return group_first_node_[group]; }
  int group_first_gpu(size_t group) const { return group_first_gpu_[group]; }
  /// Group indices [begin, end) into groups(): groups hold consecutive GPUs, so the groups a
  /// run of GPUs lies on are consecutive too.
  struct GroupRange {
    size_t begin = 0, end = 0;
    size_t size() const { return end - begin; }
  };
  /// The groups that GPUs [first, first + count) lie on; GPUs outside the cluster count for
  /// none.
  GroupRange groups_of_gpus(int first, int count) const;

 private:
  std::vector<NodeGroup> groups_;
  ClusterOverrides overrides_;
  std::vector<int> group_first_node_ = {0};  // prefix sums; size groups + 1
  std::vector<int> group_first_gpu_ = {0};
};

/// Parses cluster JSON text (schema above); errors are prefixed by `source`.
Result<ClusterSpec> parse_cluster_text(std::string_view text, std::string_view source,
                                       std::string_view base_dir = "");

}  // namespace hetpar::hardware

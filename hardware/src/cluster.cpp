#include "hetpar/hardware/cluster.h"

#include <fmt/format.h>

#include <algorithm>

#include "hetpar/core/check.h"

namespace hetpar::hardware {

namespace {

// Replaces the sources of `prefix` and every field below it by `note`.
void replace_provenance(SystemProfile& p, const std::string& prefix, const std::string& note) {
  std::erase_if(p.provenance, [&](const auto& entry) {
    return entry.first == prefix || entry.first.rfind(prefix + ".", 0) == 0;
  });
  p.provenance[prefix] = note;
}

void apply_nic_override(SystemProfile& p, const ClusterOverrides& o) {
  const InterNodeNetwork before = p.inter_node;
  if (o.nics_per_node) p.inter_node.nics_per_node = *o.nics_per_node;
  if (o.nic_bandwidth) p.inter_node.nic_bandwidth = *o.nic_bandwidth;
  if (p.inter_node == before) return;
  const double per_nic = p.inter_node.nic_bandwidth / before.nic_bandwidth;
  const double aggregate = per_nic * p.inter_node.nics_per_node / before.nics_per_node;
  for (CollectiveFigure& f : p.collectives) {
    if (f.scope != CollectiveScope::kInterNode) continue;
    const bool one_nic = f.op == Collective::kAllToAll || f.op == Collective::kSendRecv;
    for (auto& entry : f.busbw) entry.second = entry.second * (one_nic ? per_nic : aggregate);
  }
  const std::string note = fmt::format(
      "cluster override: {} x {} Gb/s NICs; inter-node bus bandwidths rescaled from the profile's "
      "{} x {} Gb/s",
      p.inter_node.nics_per_node, p.inter_node.nic_bandwidth.bytes_per_s() * 8e-9,
      before.nics_per_node, before.nic_bandwidth.bytes_per_s() * 8e-9);
  replace_provenance(p, "inter_node.nics_per_node", note);
  replace_provenance(p, "inter_node.nic_gbps", note);
  replace_provenance(p, "collectives.inter_node", note);
  // NCCL runs two channels (SMs) per NIC for a collective across nodes: 2 with one NIC,
  // 16 with a DGX's eight (NVIDIA/nccl#689), so the SMs it holds follow the NIC count.
  const int sms = p.inter_node.collective_sms;
  if (sms > 0 && p.inter_node.nics_per_node != before.nics_per_node) {
    const int scaled = std::max(1, sms * p.inter_node.nics_per_node / before.nics_per_node);
    p.inter_node.collective_sms = std::min(scaled, std::max(1, p.gpu.sm_count - 1));
    replace_provenance(
        p, "inter_node.collective_sms",
        fmt::format("cluster override: {} NICs per node; the profile's {} SMs for {} NICs "
                    "scaled with the NIC count (NCCL runs two channels per NIC, "
                    "NVIDIA/nccl#689)",
                    p.inter_node.nics_per_node, sms, before.nics_per_node));
  }
}

// NVLS disabled: the intra-node all_reduce becomes the ring the profile measured for it.
// False when the profile has NVLS and no such figure.
bool apply_nvls_override(SystemProfile& p, const ClusterOverrides& o) {
  if (o.nvls.value_or(true) || !p.intra_node.nvls) return true;
  for (CollectiveFigure& f : p.collectives) {
    if (f.scope != CollectiveScope::kIntraNode || f.op != Collective::kAllReduce) continue;
    if (f.busbw_without_nvls.empty()) return false;
    f.busbw = std::move(f.busbw_without_nvls);
    f.size_scale = std::move(f.size_scale_without_nvls);
    f.busbw_without_nvls.clear();
    f.size_scale_without_nvls.clear();
    auto moved = [&](const std::string& from, const std::string& to) {
      if (auto it = p.provenance.find(from); it != p.provenance.end()) {
        p.provenance[to] = "cluster override nvls false: " + it->second;
        p.provenance.erase(it);
      }
    };
    const std::string key = "collectives.intra_node.all_reduce";
    p.provenance.erase(key + ".busbw_GBps");
    p.provenance.erase(key + ".size_scale");
    moved(key + ".busbw_without_nvls_GBps", key + ".busbw_GBps");
    moved(key + ".size_scale_without_nvls", key + ".size_scale");
  }
  p.intra_node.nvls = false;
  p.intra_node.nvls_min_group = 0;
  p.provenance.erase("intra_node.nvls_min_group");
  return true;
}

}  // namespace

Result<ClusterSpec> ClusterSpec::create(std::vector<NodeGroup> groups, ClusterOverrides overrides) {
  if (groups.empty()) return Status::invalid_argument("node_groups: must list at least one group");
  if (overrides.nics_per_node && *overrides.nics_per_node < 1)
    return Status::invalid_argument(
        fmt::format("nics_per_node: must be >= 1, got {}", *overrides.nics_per_node));
  if (overrides.nic_bandwidth && !(overrides.nic_bandwidth->bytes_per_s() > 0))
    return Status::invalid_argument(fmt::format("nic_gbps: must be > 0, got {}",
                                                overrides.nic_bandwidth->bytes_per_s() * 8e-9));

  ClusterSpec c;
  for (size_t i = 0; i < groups.size(); ++i) {
    NodeGroup& g = groups[i];
    if (g.nodes < 1)
      return Status::invalid_argument(
          fmt::format("node_groups[{}].nodes: must be >= 1, got {}", i, g.nodes));
    apply_nic_override(g.profile, overrides);
    if (!apply_nvls_override(g.profile, overrides))
      return Status::invalid_argument(fmt::format(
          "nvls: false, but profile {} (node_groups[{}]) gives no all_reduce without NVLS "
          "(collectives.intra_node.all_reduce.busbw_without_nvls_GBps)",
          g.profile_ref, i));
    if (overrides.wan) {
      g.profile.wan = overrides.wan;
      replace_provenance(g.profile, "wan", "cluster override");
    }
    if (Status st = validate_profile(g.profile); !st.is_ok())
      return st.with_context(fmt::format("node_groups[{}].profile {}", i, g.profile_ref));
    const int64_t nodes = int64_t{c.group_first_node_.back()} + g.nodes;
    const int64_t gpus =
        int64_t{c.group_first_gpu_.back()} + int64_t{g.nodes} * g.profile.gpus_per_node;
    if (gpus > kMaxClusterGpus)
      return Status::invalid_argument(
          fmt::format("node_groups[{}]: too many GPUs ({}, at most {} in a cluster)", i, gpus,
                      kMaxClusterGpus));
    c.group_first_node_.push_back(static_cast<int>(nodes));
    c.group_first_gpu_.push_back(static_cast<int>(gpus));
  }
  c.groups_ = std::move(groups);
  c.overrides_ = std::move(overrides);
  // A synchronous job runs at its slowest GPU (DeviceProfile::clock_spread): each model's
  // tensor-core rates are those of the slowest of the cluster's GPUs of that model.
  for (NodeGroup& g : c.groups_)
    g.profile.gpu.compute_scale =
        slowest_rate_share(g.profile.gpu.clock_spread, c.gpus_of_model(g.profile.gpu.model));
  return c;
}

int ClusterSpec::gpus_of_model(std::string_view model) const {
  int n = 0;  // at most kMaxClusterGpus
  for (const NodeGroup& g : groups_)
    if (g.profile.gpu.model == model) n += g.nodes * g.profile.gpus_per_node;
  return n;
}

bool ClusterSpec::homogeneous() const {
  return std::all_of(groups_.begin(), groups_.end(),
                     [&](const NodeGroup& g) { return g.profile == groups_.front().profile; });
}

size_t ClusterSpec::group_of_node(int node) const {
  HETPAR_CHECK(node >= 0 && node < num_nodes(), "node {} of {}", node, num_nodes());
  auto it = std::upper_bound(group_first_node_.begin(), group_first_node_.end(), node);
  return static_cast<size_t>(it - group_first_node_.begin()) - 1;
}

size_t ClusterSpec::group_of_gpu(int gpu) const {
  HETPAR_CHECK(gpu >= 0 && gpu < total_gpus(), "gpu {} of {}", gpu, total_gpus());
  auto it = std::upper_bound(group_first_gpu_.begin(), group_first_gpu_.end(), gpu);
  return static_cast<size_t>(it - group_first_gpu_.begin()) - 1;
}

NodeId ClusterSpec::node_of_gpu(int gpu) const {
  const size_t g = group_of_gpu(gpu);
  return NodeId(group_first_node_[g] +
                (gpu - group_first_gpu_[g]) / groups_[g].profile.gpus_per_node);
}

int ClusterSpec::local_index(int gpu) const {
  const size_t g = group_of_gpu(gpu);
  return (gpu - group_first_gpu_[g]) % groups_[g].profile.gpus_per_node;
}

const SystemProfile& ClusterSpec::profile_of_gpu(int gpu) const {
  return groups_[group_of_gpu(gpu)].profile;
}

const SystemProfile& ClusterSpec::profile_of_node(NodeId node) const {
  return groups_[group_of_node(node.value())].profile;
}

ClusterSpec::GroupRange ClusterSpec::groups_of_gpus(int first, int count) const {
  GroupRange r{groups_.size(), 0};
  for (size_t g = 0; g < groups_.size(); ++g)
    if (group_first_gpu_[g] < first + count && first < group_first_gpu_[g + 1]) {
      r.begin = std::min(r.begin, g);
      r.end = g + 1;
    }
  return r.end == 0 ? GroupRange{} : r;
}

int ClusterSpec::first_gpu_of_node(NodeId node) const {
  const size_t g = group_of_node(node.value());
  return group_first_gpu_[g] +
         (node.value() - group_first_node_[g]) * groups_[g].profile.gpus_per_node;
}

}  // namespace hetpar::hardware

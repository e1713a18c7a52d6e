#include <fmt/format.h>

#include "hetpar/core/json_reader.h"
#include "hetpar/hardware/cluster.h"
#include "hetpar/hardware/hardware_json.h"

namespace hetpar::hardware {

namespace {
constexpr int64_t kMaxNodes = kMaxClusterGpus;  // nodes of one GPU at least

// Reads {"profile", "nodes"} from `r` (a group object or the short cluster form).
NodeGroup read_group(JsonReader& r, std::string_view base_dir) {
  NodeGroup g;
  g.profile_ref = r.required_string("profile");
  g.nodes = static_cast<int>(r.required_int("nodes", 1, kMaxNodes));
  if (!r.ok()) return g;
  Result<SystemProfile> p = load_profile(g.profile_ref, base_dir);
  if (p)
    g.profile = std::move(p).value();
  else
    r.fail("profile", p.status().message());
  return g;
}
}  // namespace

Result<ClusterSpec> parse_cluster(const nlohmann::json& j, const std::string& path,
                                  std::string_view base_dir) {
  JsonReader r(j, path);
  std::vector<NodeGroup> groups;
  if (r.has("node_groups")) {
    if (r.has("profile") || r.has("nodes"))
      r.fail("node_groups", "give either \"profile\" and \"nodes\" or \"node_groups\", not both");
    const nlohmann::json& arr = r.array("node_groups", /*required=*/true);
    if (arr.empty() && r.ok()) r.fail("node_groups", "must list at least one group");
    for (size_t i = 0; i < arr.size() && r.ok(); ++i) {
      JsonReader g(arr[i], json_index_path(path, "node_groups", i));
      groups.push_back(read_group(g, base_dir));
      g.finish();
      r.merge(g.status());
    }
  } else {
    groups.push_back(read_group(r, base_dir));
  }

  ClusterOverrides o;
  if (r.has("nics_per_node"))
    o.nics_per_node = static_cast<int>(r.required_int("nics_per_node", 1, 1 << 20));
  if (r.has("nic_gbps")) {
    const double gbps = r.required_double("nic_gbps");
    if (!(gbps > 0)) r.fail("nic_gbps", fmt::format("must be > 0, got {}", gbps));
    o.nic_bandwidth = Bandwidth::gbit_per_s(gbps);
  }
  if (r.has("nvls")) o.nvls = r.optional_bool("nvls", true);
  if (const nlohmann::json* wan = r.raw("wan"); wan && r.ok()) {
    Result<WanLink> w = parse_wan(*wan, r.path_of("wan"));
    r.merge(w.status());
    if (w) o.wan = *w;
  }
  r.finish();
  if (!r.ok()) return r.status();
  Result<ClusterSpec> c = ClusterSpec::create(std::move(groups), std::move(o));
  if (!c && !path.empty())
    return Status::invalid_argument(fmt::format("{}.{}", path, c.status().message()));
  return c;
}

Result<ClusterSpec> parse_cluster_text(std::string_view text, std::string_view source,
                                       std::string_view base_dir) {
  Result<nlohmann::json> j = parse_json(text, source);
  if (!j) return j.status();
  Result<ClusterSpec> c = parse_cluster(*j, "", base_dir);
  if (!c) return c.status().with_context(source);
  return c;
}

}  // namespace hetpar::hardware

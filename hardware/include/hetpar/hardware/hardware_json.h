// JSON entry points of the hardware library for other libraries' *_json.cpp files that
// already hold an nlohmann::json (e.g. a scenario's "cluster" section). Errors carry the
// JSON path (`cluster.node_groups[1].profile: unknown profile "h300" ...`). Code without
// nlohmann uses the text functions of system_profile.h and cluster.h instead.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "hetpar/core/status.h"
#include "hetpar/hardware/cluster.h"
#include "hetpar/hardware/system_profile.h"

namespace hetpar::hardware {

/// Reads a profile object (schema in system_profile.h); `path` is its JSON path ("" at
/// the document root).
Result<SystemProfile> parse_profile(const nlohmann::json& j, const std::string& path);
/// The profile in the same schema; parse_profile(profile_to_json(p), "") == p.
nlohmann::json profile_to_json(const SystemProfile& p);

/// Reads a cluster object (schema in cluster.h). Profile names that are not built-ins
/// are file paths, relative ones resolved against `base_dir` when it is not empty.
Result<ClusterSpec> parse_cluster(const nlohmann::json& j, const std::string& path,
                                  std::string_view base_dir = "");
/// Reads a WAN link object {"up_gbps", "down_gbps", "latency_ms"} at `path`.
Result<WanLink> parse_wan(const nlohmann::json& j, const std::string& path);
nlohmann::json wan_to_json(const WanLink& w);

}  // namespace hetpar::hardware

// `hetpar models` and `hetpar hardware`: the zoo and the built-in profiles.
#include <fmt/format.h>

#include "commands.h"
#include "hetpar/core/format.h"
#include "hetpar/hardware/system_profile.h"
#include "hetpar/models/load.h"
#include "hetpar/models/totals.h"
#include "render.h"

namespace hetpar::cli {

int run_models(const CatalogOptions& opts) {
  if (opts.json) {
    fmt::print("{}\n", zoo_to_json());
    return 0;
  }
  fmt::print("{:<28} {:<15} {:>8}  {}\n", "name", "kind", "params", "description");
  for (const models::ZooEntry& e : models::zoo_entries()) {
    auto model = models::load_zoo_model(e.name);
    std::string params = "-";
    if (model.is_ok()) {
      params = format_count(static_cast<double>(models::count_params(*model).total));
    } else if (auto module = models::load_zoo_module(e.name); module.is_ok()) {
      params = format_count(static_cast<double>(models::count_params(*module).total));
    }
    fmt::print("{:<28} {:<15} {:>8}  {}\n", e.name, e.kind, params, e.description);
  }
  return 0;
}

int run_hardware(const CatalogOptions& opts) {
  if (opts.json) {
    fmt::print("{}\n", profiles_to_json());
    return 0;
  }
  fmt::print("{:<14} {:<18} {:>5} {:>14} {:>9} {:>10} {:>14} {:>16}\n", "name", "gpu", "gpus",
             "bf16 peak", "HBM", "HBM bw", "intra-node", "NICs");
  for (const std::string& name : hardware::builtin_profile_names()) {
    auto p = hardware::load_profile(name);
    if (!p.is_ok()) return report_error(p.status());
    fmt::print("{:<14} {:<18} {:>5} {:>14} {:>9} {:>10} {:>14} {:>16}\n", p->name, p->gpu.model,
               p->gpus_per_node, p->gpu.peak(hardware::Precision::kBf16), p->gpu.memory_capacity,
               p->gpu.memory_bandwidth, p->intra_node.bandwidth,
               fmt::format("{} x {}", p->inter_node.nics_per_node, p->inter_node.nic_bandwidth));
  }
  fmt::print(
      "(bandwidths per GPU or per NIC, one direction; `hetpar hardware --json` gives "
      "every number with its source)\n");
  return 0;
}

}  // namespace hetpar::cli

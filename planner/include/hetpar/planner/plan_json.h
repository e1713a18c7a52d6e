// JSON of a Plan (the "plan" section of a scenario file), for *_json.cpp files:
//   {"tp": 8, "sp": true, "cp": 1, "pp": 8, "vpp": 1, "dp": 16, "ep": 1, "micro_batch": 1,
//    "recompute": "none|selective|full", "distributed_optimizer": false,
//    "overlap_grad_reduce": true, "overlap_param_gather": true,
//    "schedule": "gpipe|1f1b|interleaved|zb-h1"}
// Degrees default to 1, the schedule to 1f1b (interleaved when vpp > 1). Only the shape
// is checked here; whether the plan fits the scenario is planner::infeasibility().
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "hetpar/core/status.h"
#include "hetpar/planner/layout.h"

namespace hetpar {
class JsonReader;
}

namespace hetpar::planner {

/// The names to_string() gives, back (nullopt for anything else).
std::optional<Schedule> parse_schedule(std::string_view s);
std::optional<models::Recompute> parse_recompute(std::string_view s);
std::optional<Placement> parse_placement(std::string_view s);
std::optional<Fp8Recipe> parse_fp8_recipe(std::string_view s);
std::optional<CpComm> parse_cp_comm(std::string_view s);
std::optional<GradReduceDtype> parse_grad_reduce_dtype(std::string_view s);
std::optional<CrossEntropy> parse_cross_entropy(std::string_view s);
std::optional<MoeDispatcher> parse_moe_dispatcher(std::string_view s);
std::optional<FsdpImplementation> parse_fsdp_implementation(std::string_view s);

/// A layout object's "recompute_modules" (Megatron-Core's --recompute-modules), read from
/// `r` for a layout whose recompute is `kind`: the module bits, or nullopt where the field is
/// absent. Fails `r`, naming the field, unless `kind` is selective and every name is one of
/// core_attn, layernorm, moe_act.
std::optional<uint8_t> read_recompute_modules(JsonReader& r, std::optional<models::Recompute> kind);

Result<Plan> parse_plan(const nlohmann::json& j, const std::string& path);
/// parse_plan(plan_to_json(p), "") == p.
nlohmann::json plan_to_json(const Plan& p);

}  // namespace hetpar::planner

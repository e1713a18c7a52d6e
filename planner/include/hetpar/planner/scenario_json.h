// Scenario parsing from an nlohmann::json document, for other *_json.cpp files that embed
// a scenario in a larger document (validation runs). Errors are prefixed by `source`.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

#include "hetpar/core/status.h"
#include "hetpar/planner/scenario.h"

namespace hetpar::planner {

Result<Scenario> parse_scenario(const nlohmann::json& j, std::string_view source,
                                std::string_view base_dir);

}  // namespace hetpar::planner

// JSON renderings of what the subcommands print (summary_json.cpp; nlohmann stays there).
#pragma once

#include <string>

#include "hetpar/planner/summary.h"

namespace hetpar::cli {

std::string summary_to_json(const planner::ScenarioSummary& s);
/// The zoo with each entry's parameter count.
std::string zoo_to_json();
/// The built-in profiles in full (the profile file schema, provenance included).
std::string profiles_to_json();

}  // namespace hetpar::cli

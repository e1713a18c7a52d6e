// parse_model: a model from scenario JSON, for other libraries' *_json.cpp files (this
// header pulls in nlohmann/json). The value is a zoo name ("llama-3.1-8b") or an object
//   {"name": ..., "modules": [{"name": ..., "kind": ..., "spec": "<zoo name>" | {fields}}],
//    "edges": [["vision", "projector"], ["projector", "llm"]]}
// where an inline spec behaves exactly like the zoo entry with the same fields. Edges may
// be left out when the model has at most one encoder and one projector (the chain is
// inferred). Errors start with `path` (e.g. "model.modules[1].spec.heads: ...").
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "hetpar/core/status.h"
#include "hetpar/models/spec.h"

namespace hetpar::models {

Result<ModelSpec> parse_model(const nlohmann::json& j, std::string path);

}  // namespace hetpar::models

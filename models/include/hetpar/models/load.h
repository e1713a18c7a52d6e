// Loading models: from scenario JSON text, and from the model zoo compiled into the binary
// (models/zoo/*.json). A zoo entry is one module (an LLM, encoder or projector; an LLM is
// also a whole model) or a whole multimodal model whose modules may name other entries.
// Errors name the JSON path and the problem; an unknown zoo name lists the closest names.
// The JSON schema is documented in models/zoo/README.md.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "hetpar/core/status.h"
#include "hetpar/models/spec.h"

namespace hetpar::models {

struct ZooEntry {
  std::string name;
  std::string kind;  // "llm", "vision_encoder", "audio_encoder", "projector" or "model"
  std::string description;
  std::string source;  // URL of the published config or paper
};

/// Every zoo entry, sorted by name.
std::vector<ZooEntry> zoo_entries();
/// A zoo entry as a model: a multimodal entry, or an LLM as a one-module model (module "llm").
Result<ModelSpec> load_zoo_model(std::string_view name);
/// A zoo entry that is a single module.
Result<ModuleSpec> load_zoo_module(std::string_view name);
/// Parses `text` holding one model (a zoo name string or an inline object, see
/// parse_model in model_json.h); errors name `source`.
Result<ModelSpec> model_from_json_text(std::string_view text, std::string_view source);

}  // namespace hetpar::models

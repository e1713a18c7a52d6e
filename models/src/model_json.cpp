#include "hetpar/models/model_json.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "hetpar/core/check.h"
#include "hetpar/core/json_reader.h"
#include "hetpar/models/load.h"
#include "zoo_files.h"

namespace hetpar::models {

namespace {

using nlohmann::json;

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t next = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = row[j];
      row[j] = next;
    }
  }
  return row[b.size()];
}

Status unknown_zoo_name(std::string_view name) {
  std::vector<std::pair<size_t, std::string_view>> ranked;
  for (const EmbeddedFile& f : detail::zoo_files())
    ranked.emplace_back(edit_distance(name, f.name), f.name);
  std::sort(ranked.begin(), ranked.end());
  std::string closest;
  for (size_t i = 0; i < std::min<size_t>(3, ranked.size()); ++i)
    closest += fmt::format("{}{}", i ? ", " : "", ranked[i].second);
  return Status::not_found(fmt::format(
      "unknown zoo entry \"{}\" (closest: {}; `hetpar models` lists all)", name, closest));
}

// A zoo file (models/zoo/<name>.json), parsed.
struct ZooDoc {
  json j;
  std::string path;  // "zoo/<name>.json"
  std::string kind;
};

Result<ZooDoc> open_zoo(std::string_view name) {
  for (const EmbeddedFile& f : detail::zoo_files()) {
    if (f.name != name) continue;
    std::string path = fmt::format("zoo/{}.json", name);
    HETPAR_ASSIGN_OR_RETURN(json j, parse_json(f.text, path));
    HETPAR_CHECK(j.is_object() && j.contains("kind") && j["kind"].is_string(), "{} lacks \"kind\"",
                 path);
    std::string kind = j["kind"].get<std::string>();
    return ZooDoc{std::move(j), std::move(path), std::move(kind)};
  }
  return unknown_zoo_name(name);
}

// Reads the zoo metadata fields of `r` (so finish() accepts them).
ZooEntry read_metadata(JsonReader& r, std::string_view name) {
  ZooEntry e;
  e.name = name;
  e.kind = r.required_string("kind");
  e.description = r.required_string("description");
  e.source = r.required_string("source");
  return e;
}

// The spellings `activation` takes: to_string(Activation) of each of kActivations.
const std::initializer_list<std::string_view> kActivationNames = {"gelu", "swiglu", "squared_relu",
                                                                  "geglu", "quick_geglu"};

// `name` is one of kActivationNames (the reader checked it).
Activation activation_named(std::string_view name) {
  for (Activation a : kActivations)
    if (to_string(a) == name) return a;
  return Activation::kGelu;
}

Activation read_activation(JsonReader& r) {
  return activation_named(r.required_enum("activation", kActivationNames));
}

PositionEmbedding read_positions(JsonReader& r, std::string fallback) {
  std::string p =
      r.optional_enum("position_embedding", std::move(fallback), {"rope", "learned", "sinusoidal"});
  return p == "rope"      ? PositionEmbedding::kRope
         : p == "learned" ? PositionEmbedding::kLearned
                          : PositionEmbedding::kSinusoidal;
}

// An MoE LLM's ffn_hidden is its dense layers' (moe.dense_layers), absent without them.
TransformerSpec read_block(JsonReader& r) {
  TransformerSpec t;
  t.layers = r.required_int("layers");
  t.hidden = r.required_int("hidden");
  t.ffn_hidden = r.has("moe") ? r.optional_int("ffn_hidden", 0) : r.required_int("ffn_hidden");
  t.heads = r.required_int("heads");
  t.kv_heads = r.optional_int("kv_heads", t.heads);
  t.head_size = r.optional_int("head_dim", 0);
  t.activation = read_activation(r);
  t.activation_clamp = r.optional_double("activation_clamp", 0, 0, 1e6);
  t.glu_linear_offset = r.optional_double("glu_linear_offset", 0, -1e6, 1e6);
  t.norm = r.required_enum("norm", {"layernorm", "rmsnorm"}) == "rmsnorm" ? Norm::kRmsNorm
                                                                          : Norm::kLayerNorm;
  t.zero_centered_gamma = r.optional_bool("zero_centered_gamma", false);
  t.qkv_bias = r.optional_bool("qkv_bias", false);
  t.linear_bias = r.optional_bool("linear_bias", false);
  t.dropout = r.optional_bool("dropout", false);
  t.qk_norm = r.optional_bool("qk_norm", false);
  t.post_norms = r.optional_bool("post_norms", false);
  t.attention_sinks = r.optional_bool("attention_sinks", false);
  if (r.has("mla")) {
    JsonReader m = r.object("mla");
    t.mla = MlaSpec{m.optional_int("q_lora_rank", 0), m.required_int("kv_lora_rank"),
                    m.required_int("qk_head_dim"), m.required_int("rope_head_dim"),
                    m.required_int("v_head_dim")};
    m.finish();
    r.merge(m.status());
  }
  if (r.has("sliding_window")) {
    JsonReader w = r.object("sliding_window");
    t.sliding_window = SlidingWindow{w.required_int("size"), w.optional_int("full_every", 0)};
    w.finish();
    r.merge(w.status());
  }
  return t;
}

ModuleSpec read_fields(std::string_view kind, JsonReader& r) {
  if (kind == "llm") {
    LlmSpec s;
    s.block = read_block(r);
    s.vocab = r.required_int("vocab");
    s.tied_embeddings = r.optional_bool("tied_embeddings", false);
    s.positions = read_positions(r, "rope");
    s.max_positions = r.optional_int("max_positions", 0);
    s.rope_base = r.optional_double("rope_base", 0, 0, 1e12);
    s.rope_scaling_factor = r.optional_double("rope_scaling_factor", 0, 0, 1e6);
    if (r.has("yarn")) {  // Hugging Face's rope_scaling of rope_type yarn, by its names
      JsonReader y = r.object("yarn");
      Yarn v;
      v.factor = y.required_double("factor");
      v.original_max_positions = y.required_int("original_max_positions");
      v.beta_fast = y.optional_double("beta_fast", v.beta_fast, 0, 1e6);
      v.beta_slow = y.optional_double("beta_slow", v.beta_slow, 0, 1e6);
      v.mscale = y.optional_double("mscale", v.mscale, 0, 1e6);
      v.mscale_all_dim = y.optional_double("mscale_all_dim", v.mscale_all_dim, 0, 1e6);
      v.truncate = y.optional_bool("truncate", v.truncate);
      s.yarn = v;
      y.finish();
      r.merge(y.status());
    }
    s.rotary_percent = r.optional_double("rotary_percent", 1, 0, 1);
    s.no_rope_every = r.optional_int("no_rope_every", 0);
    s.mtp_layers = r.optional_int("mtp_layers", 0);
    if (r.has("moe")) {
      JsonReader m = r.object("moe");
      s.moe = MoeSpec{m.required_int("experts"),           m.required_int("top_k"),
                      m.required_int("expert_ffn_hidden"), m.optional_int("shared_experts", 0),
                      m.optional_int("dense_layers", 0),   {}};
      s.moe->sigmoid_router =
          m.optional_enum("score_function", "softmax", {"softmax", "sigmoid"}) == "sigmoid";
      s.moe->expert_bias = m.optional_bool("expert_bias", false);
      s.moe->probs_on_input = m.optional_bool("probs_on_input", false);
      s.moe->pre_softmax = m.optional_bool("pre_softmax", false);
      s.moe->shared_expert_gate = m.optional_bool("shared_expert_gate", false);
      s.moe->topk_scaling = m.optional_double("topk_scaling", 0, 0, 1e6);
      s.moe->groups = m.optional_int("groups", 0);
      s.moe->group_topk = m.optional_int("group_topk", 0);
      const json& pattern = m.array("layer_pattern", false);
      for (size_t i = 0; i < pattern.size(); ++i) {
        if (!pattern[i].is_number_integer() ||
            (pattern[i].get<int64_t>() != 0 && pattern[i].get<int64_t>() != 1)) {
          m.fail("layer_pattern", fmt::format("entry {} must be 0 (a dense layer) or 1 (a MoE "
                                              "layer)",
                                              i));
          break;
        }
        s.moe->layer_pattern.push_back(pattern[i].get<int64_t>());
      }
      m.finish();
      r.merge(m.status());
    }
    return s;
  }
  if (kind == "vision_encoder") {
    VisionEncoderSpec s;
    s.block = read_block(r);
    s.patch_size = r.required_int("patch_size");
    s.image_size = r.required_int("image_size");
    s.channels = r.optional_int("channels", 3);
    s.class_token = r.optional_bool("class_token", false);
    return s;
  }
  if (kind == "audio_encoder") {
    AudioEncoderSpec s;
    s.block = read_block(r);
    s.mel_bins = r.required_int("mel_bins");
    s.frames = r.optional_int("frames", 3000);
    s.positions = read_positions(r, "sinusoidal");
    return s;
  }
  HETPAR_CHECK(kind == "projector", "unexpected module kind {}", kind);
  ProjectorSpec s;
  s.input_hidden = r.required_int("input_hidden");
  s.output_hidden = r.required_int("output_hidden");
  s.layers = r.optional_int("layers", 2);
  s.ffn_hidden = r.optional_int("ffn_hidden", s.output_hidden);
  s.activation = activation_named(r.optional_enum("activation", "gelu", kActivationNames));
  s.downsample = r.optional_int("downsample", 1);
  return s;
}

// Parses the object at `path` holding `kind`'s fields; validates it.
Result<ModuleSpec> parse_fields(std::string_view kind, const json& j, const std::string& path) {
  JsonReader r(j, path);
  ModuleSpec spec = read_fields(kind, r);
  r.finish();
  HETPAR_RETURN_IF_ERROR(r.status());
  HETPAR_RETURN_IF_ERROR(validate_module(spec, path));
  return spec;
}

Result<Module> parse_module(const json& j, const std::string& path) {
  JsonReader r(j, path);
  Module m;
  m.name = r.required_string("name");
  std::string kind =
      r.optional_enum("kind", "", {"llm", "vision_encoder", "audio_encoder", "projector"});
  const json* spec = r.raw("spec");
  if (r.ok() && !spec) r.fail("spec", "missing required field (a zoo name or an object of fields)");
  r.finish();
  HETPAR_RETURN_IF_ERROR(r.status());
  std::string spec_path = r.path_of("spec");
  if (spec->is_string()) {
    auto loaded = load_zoo_module(spec->get<std::string>());
    if (!loaded.is_ok()) return loaded.status().with_context(spec_path);
    m.spec = std::move(loaded).value();
    if (!kind.empty() && kind != to_string(kind_of(m.spec)))
      return Status::invalid_argument(fmt::format("{}: zoo entry \"{}\" is a {}, not a {}",
                                                  spec_path, spec->get<std::string>(),
                                                  to_string(kind_of(m.spec)), kind));
    return m;
  }
  if (kind.empty())
    return Status::invalid_argument(
        fmt::format("{}: missing required field (an inline spec needs one of llm|vision_encoder|"
                    "audio_encoder|projector)",
                    r.path_of("kind")));
  if (!spec->is_object())
    return Status::invalid_argument(
        fmt::format("{}: expected a zoo name or an object, got {}", spec_path, spec->type_name()));
  HETPAR_ASSIGN_OR_RETURN(m.spec, parse_fields(kind, *spec, spec_path));
  return m;
}

// Edges for a model without "edges": the chain encoder -> [projector ->] llm.
Status infer_edges(ModelSpec& m, const std::string& path) {
  std::vector<size_t> encoders, projectors;
  std::optional<size_t> llm;
  for (size_t i = 0; i < m.modules.size(); ++i) {
    ModuleKind k = kind_of(m.modules[i].spec);
    if (is_encoder(k)) encoders.push_back(i);
    if (k == ModuleKind::kProjector) projectors.push_back(i);
    if (k == ModuleKind::kLlm) llm = i;
  }
  if (encoders.size() > 1 || projectors.size() > 1)
    return Status::invalid_argument(
        fmt::format("{}: required when a model has more than one encoder or projector",
                    path.empty() ? "edges" : path + ".edges"));
  if (!llm || encoders.empty()) return Status::ok();  // validate_model() reports what is missing
  if (projectors.empty()) {
    m.edges.push_back({encoders[0], *llm});
  } else {
    m.edges.push_back({encoders[0], projectors[0]});
    m.edges.push_back({projectors[0], *llm});
  }
  return Status::ok();
}

// Reads "modules" and "edges" of a model object, then validates the whole model.
Status read_model_body(JsonReader& r, ModelSpec& m) {
  const json& modules = r.array("modules", true);
  const json* edges = r.raw("edges");
  r.finish();
  HETPAR_RETURN_IF_ERROR(r.status());
  for (size_t i = 0; i < modules.size(); ++i) {
    HETPAR_ASSIGN_OR_RETURN(Module mod,
                            parse_module(modules[i], json_index_path(r.path(), "modules", i)));
    m.modules.push_back(std::move(mod));
  }
  if (!edges) {
    HETPAR_RETURN_IF_ERROR(infer_edges(m, r.path()));
  } else {
    if (!edges->is_array())
      return Status::invalid_argument(
          fmt::format("{}: expected an array of [from, to] pairs", r.path_of("edges")));
    for (size_t j = 0; j < edges->size(); ++j) {
      const json& e = (*edges)[j];
      std::string epath = json_index_path(r.path(), "edges", j);
      if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_string())
        return Status::invalid_argument(
            fmt::format("{}: expected [\"from\", \"to\"] module names, got {}", epath, e.dump()));
      size_t ends[2];
      for (size_t k = 0; k < 2; ++k) {
        std::optional<size_t> idx = m.find(e[k].get<std::string>());
        if (!idx) {
          std::string names;
          for (const Module& mod : m.modules) names += (names.empty() ? "" : ", ") + mod.name;
          return Status::invalid_argument(fmt::format("{}[{}]: unknown module \"{}\" (modules: {})",
                                                      epath, k, e[k].get<std::string>(), names));
        }
        ends[k] = *idx;
      }
      m.edges.push_back({ends[0], ends[1]});
    }
  }
  return validate_model(m, r.path());
}

}  // namespace

std::vector<ZooEntry> zoo_entries() {
  std::vector<ZooEntry> out;
  for (const EmbeddedFile& f : detail::zoo_files()) {
    auto doc = open_zoo(f.name);
    HETPAR_CHECK(doc.is_ok(), "{}", doc.status().message());
    JsonReader r(doc->j, doc->path);
    out.push_back(read_metadata(r, f.name));
    HETPAR_CHECK(r.ok(), "{}", r.status().message());
  }
  std::sort(out.begin(), out.end(),
            [](const ZooEntry& a, const ZooEntry& b) { return a.name < b.name; });
  return out;
}

Result<ModuleSpec> load_zoo_module(std::string_view name) {
  HETPAR_ASSIGN_OR_RETURN(ZooDoc doc, open_zoo(name));
  if (doc.kind == "model")
    return Status::invalid_argument(
        fmt::format("zoo entry \"{}\" is a whole model, not a single module", name));
  JsonReader r(doc.j, doc.path);
  std::string kind =
      r.required_enum("kind", {"llm", "vision_encoder", "audio_encoder", "projector"});
  read_metadata(r, name);
  const json* spec = r.raw("spec");
  if (r.ok() && !spec) r.fail("spec", "missing required object");
  r.finish();
  HETPAR_RETURN_IF_ERROR(r.status());
  return parse_fields(kind, *spec, r.path_of("spec"));
}

Result<ModelSpec> load_zoo_model(std::string_view name) {
  HETPAR_ASSIGN_OR_RETURN(ZooDoc doc, open_zoo(name));
  ModelSpec m;
  m.name = name;
  if (doc.kind == "model") {
    JsonReader r(doc.j, doc.path);
    read_metadata(r, name);
    HETPAR_RETURN_IF_ERROR(read_model_body(r, m));
    return m;
  }
  if (doc.kind != "llm")
    return Status::invalid_argument(
        fmt::format("zoo entry \"{}\" is a {}, not a model with an llm (use it as a module's spec)",
                    name, doc.kind));
  HETPAR_ASSIGN_OR_RETURN(ModuleSpec llm, load_zoo_module(name));
  m.modules.push_back({"llm", std::move(llm)});
  return m;
}

Result<ModelSpec> parse_model(const json& j, std::string path) {
  if (j.is_string()) {
    auto m = load_zoo_model(j.get<std::string>());
    if (!m.is_ok() && !path.empty()) return m.status().with_context(path);
    return m;
  }
  JsonReader r(j, path);
  if (!j.is_object())
    return Status::invalid_argument(
        fmt::format("{}: expected a zoo name or a model object, got {}", path, j.type_name()));
  ModelSpec m;
  m.name = r.required_string("name");
  HETPAR_RETURN_IF_ERROR(read_model_body(r, m));
  return m;
}

Result<ModelSpec> model_from_json_text(std::string_view text, std::string_view source) {
  HETPAR_ASSIGN_OR_RETURN(json j, parse_json(text, source));
  auto m = parse_model(j, "");
  if (!m.is_ok()) return m.status().with_context(source);
  return m;
}

}  // namespace hetpar::models

#include "helpers.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

namespace hetpar::exporter::testing {

planner::Scenario scenario(const std::string& model, int nodes, int64_t seq, int64_t global_batch,
                           int64_t images, const std::string& precision, const std::string& profile,
                           bool frozen) {
  const bool audio = model.find("whisper") != std::string::npos;
  std::string text = fmt::format(
      R"({{"name": "export-test", "model": "{}", "workload": {{"seq_len": {}, "global_batch": {},
        "{}": {}, "precision": "{}", "frozen_encoders": {}}},
        "cluster": {{"profile": "{}", "nodes": {}}}}})",
      model, seq, global_batch, audio ? "audio_clips_per_sample" : "images_per_sample", images,
      precision, frozen ? "true" : "false", profile, nodes);
  auto s = planner::parse_scenario_text(text, "test.json");
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return *s;
}

planner::Plan with_grads(planner::Plan p, planner::GradReduceDtype d) {
  p.layout.grad_reduce_dtype = d;
  return p;
}

planner::Layout layout(int tp, int pp, int dp, int mb) {
  planner::Layout l;
  l.tp = tp;
  l.pp = pp;
  l.dp = dp;
  l.micro_batch = mb;
  return l;
}

planner::Plan mixtral_ep8_plan() {
  planner::Plan p;
  p.layout = layout(2, 4, 8);
  p.layout.ep = 8;
  p.layout.sequence_parallel = true;
  return p;
}

namespace {
// TP with SP, EP 32 folded over TP x DP (whole experts), full recompute.
planner::Plan folded_ep32_plan(int tp, int pp, int dp) {
  planner::Plan p;
  p.layout = layout(tp, pp, dp);
  p.layout.sequence_parallel = true;
  p.layout.ep = 32;
  p.layout.etp = 1;
  p.layout.recompute = models::Recompute::kFull;
  return p;
}
}  // namespace

planner::Plan glm45_ep32_plan() {
  return folded_ep32_plan(2, 4, 32);
}

planner::Plan deepseek_v3_plan() {
  planner::Plan p;
  p.layout = layout(2, 8, 64);
  p.layout.sequence_parallel = true;
  p.layout.ep = 64;
  p.layout.etp = 1;
  p.layout.recompute = models::Recompute::kFull;
  p.layout.pipeline_layout = {8, 8, 8, 8, 8, 8, 8, 5};
  return p;
}

planner::Plan gpt_oss_ep8_plan() {
  planner::Plan p;
  p.layout = layout(1, 4, 16);
  p.layout.ep = 8;
  return p;
}

planner::Plan maverick_plan() {
  return folded_ep32_plan(4, 4, 8);
}

std::string encoder_name(const planner::Scenario& s) {
  for (const models::Module& m : s.model.modules)
    if (models::is_encoder(models::kind_of(m.spec))) return m.name;
  return "";
}

std::map<std::string, std::string> exported(const planner::Scenario& s, const planner::Plan& p,
                                            Target t) {
  auto files = export_plan(s, p, t);
  EXPECT_TRUE(files.is_ok()) << to_string(t) << ": " << files.status().message();
  std::map<std::string, std::string> out;
  if (files.is_ok())
    for (const ExportFile& f : *files) out[f.path] = f.contents;
  return out;
}

std::string refusal(const planner::Scenario& s, const planner::Plan& p, Target t) {
  auto files = export_plan(s, p, t);
  if (files.is_ok()) return "";
  EXPECT_EQ(files.status().code(), Status::Code::kInvalidArgument);
  return files.status().message();
}

std::map<std::string, Flags> bash_arrays(const std::string& script) {
  std::map<std::string, Flags> out;
  std::istringstream in(script);
  std::string line, array;
  static const std::regex open(R"(^([A-Z_]+)=\($)");
  std::smatch m;
  while (std::getline(in, line)) {
    if (array.empty()) {
      if (std::regex_match(line, m, open)) array = m[1];
      continue;
    }
    if (line == ")") {
      array.clear();
      continue;
    }
    const size_t start = line.find_first_not_of(' ');
    const size_t space = line.find(' ', start);
    Flags& flags = out[array];
    if (space == std::string::npos)
      flags.emplace_back(line.substr(start), "");
    else
      flags.emplace_back(line.substr(start, space - start), line.substr(space + 1));
  }
  return out;
}

std::map<std::string, std::string> all_flags(const std::string& script) {
  std::map<std::string, std::string> out;
  for (const auto& [array, flags] : bash_arrays(script))
    for (const auto& [name, value] : flags)
      EXPECT_TRUE(out.emplace(name, value).second) << name << " given twice";
  return out;
}

std::map<std::string, std::string> yaml_settings(const std::string& yaml) {
  std::map<std::string, std::string> out;
  std::vector<std::string> parents;  // by indentation level
  std::istringstream in(yaml);
  std::string line;
  while (std::getline(in, line)) {
    const size_t indent = line.find_first_not_of(' ');
    if (indent == std::string::npos || line[indent] == '#') continue;
    EXPECT_EQ(indent % 2, 0u) << line;
    const size_t colon = line.find(':', indent);
    EXPECT_NE(colon, std::string::npos) << line;
    const std::string key = line.substr(indent, colon - indent);
    parents.resize(indent / 2);
    std::string path;
    for (const std::string& p : parents) path += p + ".";
    path += key;
    if (colon + 1 == line.size())
      parents.push_back(key);
    else
      out[path] = line.substr(colon + 2);
  }
  return out;
}

namespace {

void collect(const nlohmann::json& j, const std::string& prefix, std::vector<std::string>& out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
      out.push_back(path);
      collect(it.value(), path, out);
    }
  } else if (j.is_array()) {
    for (const nlohmann::json& e : j) collect(e, prefix + "[]", out);
  }
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep)) out.push_back(part);
  return out;
}

}  // namespace

std::vector<std::string> json_paths(const std::string& json) {
  std::vector<std::string> out;
  collect(nlohmann::json::parse(json), "", out);
  return out;
}

Vocabulary::Vocabulary(const std::string& name) {
  std::ifstream in(std::string(HETPAR_SOURCE_DIR) + "/export/vocabulary/" + name + ".txt");
  EXPECT_TRUE(in.good()) << name;
  static const std::regex tag(R"( \[[^\]]*\]$)");
  static const std::regex class_segment(R"(\[[A-Za-z_][A-Za-z0-9_]*\])");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    line = std::regex_replace(line, tag, "");
    line = std::regex_replace(line, class_segment, "");
    if (line.find("<module>") != std::string::npos)
      patterns_.push_back(split(line, '.'));
    else
      exact_.insert(line);
  }
}

bool Vocabulary::contains(const std::string& key) const {
  if (exact_.count(key)) return true;
  const std::vector<std::string> parts = split(key, '.');
  for (const std::vector<std::string>& p : patterns_) {
    if (p.size() != parts.size()) continue;
    bool match = true;
    for (size_t i = 0; i < p.size() && match; ++i) match = p[i] == "<module>" || p[i] == parts[i];
    if (match) return true;
  }
  return false;
}

}  // namespace hetpar::exporter::testing

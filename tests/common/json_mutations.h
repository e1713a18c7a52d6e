// Single-edit mutations of a JSON document, for robustness tests of the readers: every node
// (object member or array element, at any depth) replaced in turn by each of a fixed set of
// values of the wrong size, sign or type, or deleted. Deterministic: one document gives the
// same mutations in the same order, so a failure names its case and reproduces.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace hetpar::testing {

/// The JSON document in file `path` (throws, failing the test, when it cannot be read).
inline nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

/// Every node of `j` below the root as a JSON pointer, parents before children. Members
/// named "$comment" (documentation, read by nothing) are left out.
inline void json_nodes(const nlohmann::json& j, const std::string& at,
                       std::vector<std::string>& out) {
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) {
      if (k == "$comment") continue;
      std::string token;  // RFC 6901: "~" as "~0", "/" as "~1"
      for (char c : k) token += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
      const std::string node = at + "/" + token;
      out.push_back(node);
      json_nodes(v, node, out);
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) {
      const std::string node = at + "/" + std::to_string(i);
      out.push_back(node);
      json_nodes(j[i], node, out);
    }
  }
}

/// The replacement values: zero, negative, odd, fractional and huge numbers, and every
/// other JSON type. Paired with a printable name for the failure message.
inline std::vector<std::pair<std::string, nlohmann::json>> mutation_values() {
  return {{"0", 0},
          {"-1", -1},
          {"7", 7},
          {"0.5", 0.5},
          {"1e6", 1e6},
          {"1e12", 1e12},
          {"1e300", 1e300},
          {"\"x\"", "x"},
          {"null", nullptr},
          {"true", true},
          {"[]", nlohmann::json::array()},
          {"{}", nlohmann::json::object()}};
}

/// `f(what, m)`, first printing `what` to stderr where HETPAR_MUTATION_TRACE is set: a
/// crash shows no SCOPED_TRACE.
template <typename F>
void call_traced(F& f, const std::string& what, const nlohmann::json& m) {
  static const bool trace = std::getenv("HETPAR_MUTATION_TRACE") != nullptr;
  if (trace) std::fprintf(stderr, "mutation %s\n", what.c_str());
  f(what, m);
}

/// Calls `f(what, mutated)` for every single-edit mutation of `doc`: each node of
/// json_nodes() set to each mutation_values() entry, then deleted. `what` reads
/// "/plan/tp = 7" or "/plan/tp deleted" (call_traced()).
template <typename F>
void for_each_mutation(const nlohmann::json& doc, F&& f) {
  auto call = [&](const std::string& what, const nlohmann::json& m) { call_traced(f, what, m); };
  std::vector<std::string> nodes;
  json_nodes(doc, "", nodes);
  const auto values = mutation_values();
  for (const std::string& node : nodes) {
    const nlohmann::json::json_pointer ptr(node);
    for (const auto& [name, value] : values) {
      nlohmann::json m = doc;
      m[ptr] = value;
      call(node + " = " + name, m);
    }
    nlohmann::json m = doc;
    nlohmann::json& parent = m[ptr.parent_pointer()];
    if (parent.is_object())
      parent.erase(ptr.back());
    else
      parent.erase(static_cast<size_t>(std::stoul(ptr.back())));
    call(node + " deleted", m);
  }
}

/// Calls `f(what, mutated)` `cases` times (call_traced()), each with 2 or 3 distinct numeric
/// leaves of `doc` set at once to the values below: sizes legal alone that overflow or
/// exhaust together, and small fractions. Drawn from a fixed `seed` with the generator's raw
/// output (no distribution, whose results differ between standard libraries), so cases
/// reproduce.
template <typename F>
void for_each_multi_edit(const nlohmann::json& doc, int cases, uint64_t seed, F&& f) {
  std::vector<std::string> nodes, numbers;
  json_nodes(doc, "", nodes);
  for (const std::string& n : nodes)
    if (doc[nlohmann::json::json_pointer(n)].is_number()) numbers.push_back(n);
  if (numbers.size() < 2) return;
  const std::vector<std::pair<std::string, nlohmann::json>> values = {{"2", 2},
                                                                      {"3", 3},
                                                                      {"1000", 1000},
                                                                      {"10000", 10000},
                                                                      {"65536", 65536},
                                                                      {"1048576", 1048576},
                                                                      {"16777216", 16777216},
                                                                      {"1e9", 1e9},
                                                                      {"0.999", 0.999},
                                                                      {"1e-6", 1e-6}};
  std::mt19937_64 gen(seed);
  for (int c = 0; c < cases; ++c) {
    const size_t edits = 2 + gen() % 2;
    nlohmann::json m = doc;
    std::string what;
    std::vector<size_t> picked;
    while (picked.size() < std::min(edits, numbers.size())) {
      const size_t i = gen() % numbers.size();
      if (std::find(picked.begin(), picked.end(), i) != picked.end()) continue;
      picked.push_back(i);
      const auto& [name, value] = values[gen() % values.size()];
      m[nlohmann::json::json_pointer(numbers[i])] = value;
      what += (what.empty() ? "" : ", ") + numbers[i] + " = " + name;
    }
    call_traced(f, what, m);
  }
}

}  // namespace hetpar::testing

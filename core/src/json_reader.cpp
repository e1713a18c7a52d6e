#include "hetpar/core/json_reader.h"

#include <fmt/format.h>

#include <cmath>

#include "hetpar/core/file_io.h"

namespace hetpar {

namespace {
const nlohmann::json kEmptyArray = nlohmann::json::array();

std::string type_name(const nlohmann::json& v) {
  return v.type_name();
}
}  // namespace

Result<nlohmann::json> parse_json(std::string_view text, std::string_view source) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    return Status::invalid_argument(
        fmt::format("{}: malformed JSON at byte {}: {}", source, e.byte, e.what()));
  }
}

Result<nlohmann::json> read_json_file(const std::string& path) {
  HETPAR_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return parse_json(text, path);
}

std::string json_index_path(const std::string& parent, std::string_view key, size_t i) {
  if (parent.empty()) return fmt::format("{}[{}]", key, i);
  return fmt::format("{}.{}[{}]", parent, key, i);
}

JsonReader::JsonReader(const nlohmann::json& j, std::string path) : j_(j), path_(std::move(path)) {
  if (!j_.is_object())
    status_ = Status::invalid_argument(fmt::format(
        "{}: expected an object, got {}", path_.empty() ? "<root>" : path_, type_name(j_)));
}

std::string JsonReader::path_of(std::string_view key) const {
  return path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
}

void JsonReader::fail(std::string_view key, std::string_view message) {
  if (!status_.is_ok()) return;
  status_ = Status::invalid_argument(fmt::format("{}: {}", path_of(key), message));
}

void JsonReader::merge(const Status& child) {
  if (status_.is_ok() && !child.is_ok()) status_ = child;
}

bool JsonReader::has(std::string_view key) const {
  return j_.is_object() && j_.find(key) != j_.end() && !j_.find(key)->is_null();
}

const nlohmann::json* JsonReader::find(std::string_view key) {
  if (!j_.is_object()) return nullptr;
  seen_.emplace(key);
  auto it = j_.find(key);
  if (it == j_.end() || it->is_null()) return nullptr;
  return &*it;
}

const nlohmann::json* JsonReader::raw(std::string_view key) {
  return find(key);
}

int64_t JsonReader::optional_int(std::string_view key, int64_t fallback, int64_t min, int64_t max) {
  const nlohmann::json* v = find(key);
  if (!v || !ok()) return fallback;
  int64_t x = 0;
  if (v->is_number_integer()) {
    x = v->get<int64_t>();
  } else if (v->is_number_float() && v->get<double>() == std::floor(v->get<double>()) &&
             std::fabs(v->get<double>()) < 9e15) {
    x = static_cast<int64_t>(v->get<double>());
  } else {
    fail(key, fmt::format("expected an integer, got {} {}", type_name(*v), v->dump()));
    return fallback;
  }
  if (x < min) fail(key, fmt::format("must be >= {}, got {}", min, x));
  if (x > max) fail(key, fmt::format("must be <= {}, got {}", max, x));
  return ok() ? x : fallback;
}

int64_t JsonReader::required_int(std::string_view key, int64_t min, int64_t max) {
  if (ok() && !find(key)) fail(key, "missing required field (an integer)");
  return optional_int(key, 0, min, max);
}

double JsonReader::optional_double(std::string_view key, double fallback, double min, double max) {
  const nlohmann::json* v = find(key);
  if (!v || !ok()) return fallback;
  if (!v->is_number()) {
    fail(key, fmt::format("expected a number, got {} {}", type_name(*v), v->dump()));
    return fallback;
  }
  double x = v->get<double>();
  if (!(x >= min)) fail(key, fmt::format("must be >= {}, got {}", min, x));
  if (!(x <= max)) fail(key, fmt::format("must be <= {}, got {}", max, x));
  return ok() ? x : fallback;
}

double JsonReader::required_double(std::string_view key, double min, double max) {
  if (ok() && !find(key)) fail(key, "missing required field (a number)");
  return optional_double(key, 0.0, min, max);
}

bool JsonReader::optional_bool(std::string_view key, bool fallback) {
  const nlohmann::json* v = find(key);
  if (!v || !ok()) return fallback;
  if (!v->is_boolean()) {
    fail(key, fmt::format("expected true or false, got {} {}", type_name(*v), v->dump()));
    return fallback;
  }
  return v->get<bool>();
}

std::string JsonReader::optional_string(std::string_view key, std::string fallback) {
  const nlohmann::json* v = find(key);
  if (!v || !ok()) return fallback;
  if (!v->is_string()) {
    fail(key, fmt::format("expected a string, got {} {}", type_name(*v), v->dump()));
    return fallback;
  }
  return v->get<std::string>();
}

std::string JsonReader::required_string(std::string_view key) {
  if (ok() && !find(key)) fail(key, "missing required field (a string)");
  return optional_string(key, "");
}

namespace {
std::string join_choices(std::initializer_list<std::string_view> choices) {
  std::string out;
  for (auto c : choices) {
    if (!out.empty()) out += "|";
    out += c;
  }
  return out;
}
}  // namespace

std::string JsonReader::optional_enum(std::string_view key, std::string fallback,
                                      std::initializer_list<std::string_view> choices) {
  bool present = find(key) != nullptr;
  std::string s = optional_string(key, fallback);
  if (!ok() || !present) return s;
  for (auto c : choices)
    if (c == s) return s;
  fail(key, fmt::format("unknown value \"{}\" (expected {})", s, join_choices(choices)));
  return fallback;
}

std::string JsonReader::required_enum(std::string_view key,
                                      std::initializer_list<std::string_view> choices) {
  if (ok() && !find(key))
    fail(key, fmt::format("missing required field (one of {})", join_choices(choices)));
  return optional_enum(key, "", choices);
}

JsonReader JsonReader::object(std::string_view key) {
  const nlohmann::json* v = find(key);
  static const nlohmann::json kEmptyObject = nlohmann::json::object();
  if (!v) {
    fail(key, "missing required object");
    return JsonReader(kEmptyObject, path_of(key));
  }
  return JsonReader(*v, path_of(key));
}

const nlohmann::json& JsonReader::array(std::string_view key, bool required) {
  const nlohmann::json* v = find(key);
  if (!v) {
    if (required) fail(key, "missing required array");
    return kEmptyArray;
  }
  if (!v->is_array()) {
    fail(key, fmt::format("expected an array, got {}", type_name(*v)));
    return kEmptyArray;
  }
  return *v;
}

void JsonReader::finish() {
  if (!ok() || !j_.is_object()) return;
  for (auto it = j_.begin(); it != j_.end(); ++it) {
    // Keys starting with '$' ("$comment") are annotations, never read.
    if (!it.key().empty() && it.key()[0] == '$') continue;
    if (seen_.find(it.key()) == seen_.end()) {
      fail(it.key(), "unknown field");
      return;
    }
  }
}

}  // namespace hetpar

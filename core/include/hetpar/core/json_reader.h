// JsonReader: reads one JSON object field by field, tracking the JSON path so every error
// names where it is (`model.modules[1].heads: must be >= 1, got 0`). The first error
// wins; later reads return defaults, and the caller checks status() once at the end.
// Unknown keys are errors (finish() reports them), which catches typos in scenarios;
// keys starting with `$` ("$comment") are annotations and always allowed.
// Only *_json.cpp files include this header: nlohmann/json stays out of public APIs.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "hetpar/core/status.h"

namespace hetpar {

/// Parses JSON text; a syntax error names `source` and the byte offset.
Result<nlohmann::json> parse_json(std::string_view text, std::string_view source);
/// Reads and parses a file; missing or unreadable files are kIoError naming the path.
Result<nlohmann::json> read_json_file(const std::string& path);

class JsonReader {
 public:
  /// `path` is the JSON path of `j` ("" for the document root). If `j` is not an object,
  /// the reader starts in the failed state.
  JsonReader(const nlohmann::json& j, std::string path);

  bool has(std::string_view key) const;
  int64_t required_int(std::string_view key, int64_t min = INT64_MIN, int64_t max = INT64_MAX);
  int64_t optional_int(std::string_view key, int64_t fallback, int64_t min = INT64_MIN,
                       int64_t max = INT64_MAX);
  double required_double(std::string_view key, double min = -1e308, double max = 1e308);
  double optional_double(std::string_view key, double fallback, double min = -1e308,
                         double max = 1e308);
  bool optional_bool(std::string_view key, bool fallback);
  std::string required_string(std::string_view key);
  std::string optional_string(std::string_view key, std::string fallback);
  /// A string that must be one of `choices`.
  std::string required_enum(std::string_view key, std::initializer_list<std::string_view> choices);
  std::string optional_enum(std::string_view key, std::string fallback,
                            std::initializer_list<std::string_view> choices);
  /// The raw value of `key` (nullptr when absent); marks the key as known.
  const nlohmann::json* raw(std::string_view key);
  /// The object at `key` as a reader; a missing or non-object value is an error.
  JsonReader object(std::string_view key);
  /// The array at `key`; a missing key gives an empty array when !required.
  const nlohmann::json& array(std::string_view key, bool required);

  /// Records an error at `key` of this object: `<path>.<key>: <message>`.
  void fail(std::string_view key, std::string_view message);
  /// Errors on keys never read (typos, unsupported fields). Call after all reads.
  void finish();
  /// Adopts the first error of a child reader or a nested parse.
  void merge(const Status& child);

  bool ok() const { return status_.is_ok(); }
  const Status& status() const { return status_; }
  const std::string& path() const { return path_; }
  std::string path_of(std::string_view key) const;

 private:
  const nlohmann::json* find(std::string_view key);
  const nlohmann::json& j_;
  std::string path_;
  std::set<std::string, std::less<>> seen_;
  Status status_;
};

/// Path of element `i` of array `key` under `parent` ("model.modules[2]").
std::string json_index_path(const std::string& parent, std::string_view key, size_t i);

}  // namespace hetpar

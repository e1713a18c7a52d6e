// CurvePoint and curve_factor(): an efficiency curve over a size, as profiles carry them
// (a GEMM's rate against its reduction length, attention's against its key/value length,
// a collective's bandwidth against its message size). Points sorted by strictly ascending
// size; between two points the factor is interpolated linearly in log2(size), outside them
// it is the nearest end's.
#pragma once

#include <cstdint>
#include <span>

namespace hetpar {

struct CurvePoint {
  int64_t at = 0;
  double factor = 1.0;
  bool operator==(const CurvePoint&) const = default;
};

/// The curve's factor at size `at`; 1 for an empty curve or a size <= 0.
double curve_factor(std::span<const CurvePoint> curve, int64_t at);

}  // namespace hetpar

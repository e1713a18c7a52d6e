#include "hetpar/core/curve.h"

#include <cmath>

namespace hetpar {

double curve_factor(std::span<const CurvePoint> curve, int64_t at) {
  if (curve.empty() || at <= 0) return 1.0;
  if (at <= curve.front().at) return curve.front().factor;
  if (at >= curve.back().at) return curve.back().factor;
  size_t i = 1;
  while (curve[i].at < at) ++i;
  const CurvePoint& lo = curve[i - 1];
  const CurvePoint& hi = curve[i];
  const double t = std::log2(static_cast<double>(at) / static_cast<double>(lo.at)) /
                   std::log2(static_cast<double>(hi.at) / static_cast<double>(lo.at));
  return lo.factor + t * (hi.factor - lo.factor);
}

}  // namespace hetpar

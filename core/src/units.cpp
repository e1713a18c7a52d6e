#include <cmath>
#include <string>

#include "hetpar/core/format.h"

namespace hetpar {

std::string format_significant(double v) {
  if (v == 0.0) return "0";
  if (!std::isfinite(v)) return fmt::format("{}", v);
  double mag = std::fabs(v);
  int digits_before = static_cast<int>(std::floor(std::log10(mag))) + 1;
  int decimals = std::max(0, 3 - digits_before);
  std::string s = fmt::format("{:.{}f}", v, decimals);
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  return s;
}

namespace {

struct Scale {
  double factor;
  const char* unit;
};

// Picks the largest unit whose scaled value is >= 1 (the first unit for tiny values),
// re-checking after rounding so 999.96 prints as "1 k" rather than "1000".
template <size_t N>
std::string scaled(double v, const Scale (&scales)[N]) {
  double mag = std::fabs(v);
  size_t pick = 0;
  for (size_t i = 0; i < N; ++i)
    if (mag >= scales[i].factor * 0.9995) pick = i;
  return fmt::format("{} {}", format_significant(v / scales[pick].factor), scales[pick].unit);
}

constexpr Scale kTime[] = {{1e-12, "ps"}, {1e-9, "ns"}, {1e-6, "us"}, {1e-3, "ms"}, {1.0, "s"}};
constexpr Scale kBytes[] = {{1.0, "B"},
                            {1024.0, "KiB"},
                            {1048576.0, "MiB"},
                            {1073741824.0, "GiB"},
                            {1099511627776.0, "TiB"},
                            {1125899906842624.0, "PiB"}};
constexpr Scale kFlops[] = {{1.0, "FLOP"},   {1e3, "kFLOP"},  {1e6, "MFLOP"}, {1e9, "GFLOP"},
                            {1e12, "TFLOP"}, {1e15, "PFLOP"}, {1e18, "EFLOP"}};
constexpr Scale kRate[] = {{1.0, "FLOP/s"},   {1e3, "kFLOP/s"},  {1e6, "MFLOP/s"}, {1e9, "GFLOP/s"},
                           {1e12, "TFLOP/s"}, {1e15, "PFLOP/s"}, {1e18, "EFLOP/s"}};
constexpr Scale kBandwidth[] = {
    {1.0, "B/s"}, {1e3, "kB/s"}, {1e6, "MB/s"}, {1e9, "GB/s"}, {1e12, "TB/s"}};

}  // namespace

std::string format_count(double v) {
  constexpr Scale kCount[] = {{1.0, ""}, {1e3, "K"}, {1e6, "M"}, {1e9, "B"}, {1e12, "T"}};
  std::string s = scaled(v, kCount);
  s.erase(s.find(' '), 1);
  return s;
}

std::string to_string(Time t) {
  return scaled(t.to_seconds(), kTime);
}
std::string to_string(Bytes b) {
  return scaled(b.as_double(), kBytes);
}
std::string to_string(Flops f) {
  return scaled(f.count(), kFlops);
}
std::string to_string(FlopRate r) {
  return scaled(r.per_second(), kRate);
}
std::string to_string(Bandwidth bw) {
  return scaled(bw.bytes_per_s(), kBandwidth);
}

}  // namespace hetpar

// fmt formatters for the unit types, so every number prints the same way everywhere:
// three significant digits and a scaled unit, e.g. `12.5 ms`, `3.2 GiB`, `450 GB/s`,
// `989 TFLOP/s`. Memory sizes use binary prefixes (GiB); rates and FLOPs use decimal
// ones (GB/s, TFLOP), as datasheets and nccl-tests do.
#pragma once

#include <fmt/format.h>

#include <string>

#include "hetpar/core/ids.h"
#include "hetpar/core/units.h"

namespace hetpar {

std::string to_string(Time t);
std::string to_string(Bytes b);
std::string to_string(Flops f);
std::string to_string(FlopRate r);
std::string to_string(Bandwidth bw);
/// A count such as a parameter number, ML style: "6.74B", "303M", "51.2K", "12".
std::string format_count(double v);
/// `v` with three significant digits and trailing zeros dropped ("3.2", "450", "0.0123").
std::string format_significant(double v);

}  // namespace hetpar

#define HETPAR_UNIT_FORMATTER(T)                                                  \
  template <>                                                                     \
  struct fmt::formatter<T> : fmt::formatter<std::string_view> {                   \
    template <class Ctx>                                                          \
    auto format(const T& v, Ctx& ctx) const {                                     \
      return fmt::formatter<std::string_view>::format(hetpar::to_string(v), ctx); \
    }                                                                             \
  };
HETPAR_UNIT_FORMATTER(hetpar::Time)
HETPAR_UNIT_FORMATTER(hetpar::Bytes)
HETPAR_UNIT_FORMATTER(hetpar::Flops)
HETPAR_UNIT_FORMATTER(hetpar::FlopRate)
HETPAR_UNIT_FORMATTER(hetpar::Bandwidth)
#undef HETPAR_UNIT_FORMATTER

template <class Tag>
struct fmt::formatter<hetpar::Id<Tag>> : fmt::formatter<int> {
  template <class Ctx>
  auto format(const hetpar::Id<Tag>& id, Ctx& ctx) const {
    return fmt::formatter<int>::format(id.value(), ctx);
  }
};

// Strongly typed integer ids. Id<RankTag> and Id<LinkTag> do not convert into each
// other; both are cheap, hashable and ordered, and index vectors via value().
#pragma once

#include <compare>
#include <cstdint>
#include <functional>

namespace hetpar {

template <class Tag>
class Id {
 public:
  constexpr Id() = default;
  constexpr explicit Id(int32_t v) : v_(v) {}
  constexpr int32_t value() const { return v_; }
  constexpr bool valid() const { return v_ >= 0; }
  constexpr auto operator<=>(const Id&) const = default;

 private:
  int32_t v_ = -1;
};

using RankId = Id<struct RankTag>;      // a process / GPU in the job, 0..world-1
using NodeId = Id<struct NodeTag>;      // a host
using DeviceId = Id<struct DeviceTag>;  // a vertex of the topology graph (GPU, switch, NIC)
using LinkId = Id<struct LinkTag>;      // a directed link of the topology graph
using TaskId = Id<struct TaskTag>;      // a task of a TaskGraph

}  // namespace hetpar

template <class Tag>
struct std::hash<hetpar::Id<Tag>> {
  size_t operator()(hetpar::Id<Tag> id) const noexcept { return std::hash<int32_t>()(id.value()); }
};

// HugePageAllocator: a std allocator whose large blocks the kernel backs with transparent
// huge pages (2 MiB) where it offers them on request (Linux THP in "madvise" mode, the
// default of Debian and Ubuntu). A million-task simulation fills a few hundred MB of
// arrays; touched for the first time in 4 KiB pages they cost ~90k page faults, about as
// much time as the simulation itself on a virtual machine (docs/performance.md, item 7).
// Small blocks, and every block elsewhere than Linux, come from the ordinary allocator.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace hetpar {

/// The size from which a block is huge-page backed.
inline constexpr std::size_t kHugePageBlock = std::size_t{2} << 20;

/// A block of `bytes` (>= kHugePageBlock), 2 MiB aligned, advised for huge pages; freed
/// with free_huge_block(). Throws std::bad_alloc when out of memory.
void* allocate_huge_block(std::size_t bytes);
void free_huge_block(void* p) noexcept;

template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  constexpr HugePageAllocator(const HugePageAllocator<U>&) noexcept {}

  T* allocate(std::size_t n) {
    const std::size_t bytes = n * sizeof(T);
    if (bytes >= kHugePageBlock) return static_cast<T*>(allocate_huge_block(bytes));
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n * sizeof(T) >= kHugePageBlock)
      free_huge_block(p);
    else
      std::allocator<T>().deallocate(p, n);
  }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
};

/// A vector whose large buffers are huge-page backed.
template <class T>
using HugeVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace hetpar

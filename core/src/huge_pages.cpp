#include "hetpar/core/huge_pages.h"

#include <cstdlib>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace hetpar {

void* allocate_huge_block(std::size_t bytes) {
  // aligned_alloc wants a multiple of the alignment; the rounding is at most one huge page.
  const std::size_t size = (bytes + kHugePageBlock - 1) / kHugePageBlock * kHugePageBlock;
  void* p = std::aligned_alloc(kHugePageBlock, size);
  if (p == nullptr) throw std::bad_alloc();
#if defined(MADV_HUGEPAGE)
  // Advice only: where THP is off ("never") or unavailable the block stays in small pages.
  (void)madvise(p, size, MADV_HUGEPAGE);
#endif
  return p;
}

void free_huge_block(void* p) noexcept {
  std::free(p);
}

}  // namespace hetpar

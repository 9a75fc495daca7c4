/// \file
/// ImageBytes: a byte vector at a page-aligned address, for pool images held in memory (crash
/// images, fuzz inputs, copies of pool files). Pool::open_image refuses memory that is not
/// cache-line aligned: the persistence API flushes the machine's lines (address & ~63), while
/// the pool's layouts and the crash simulator count lines from the pool's base, and the two
/// agree only when the base is a multiple of 64. A std::vector<char> of an image is 16-byte
/// aligned (glibc hands large blocks out at page + 16), so flushing a pool line from such a
/// buffer names the line before it: the simulator then drops stores the code did flush.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace pmindex::pm {

/// A std::allocator replacement whose blocks start on a 4 KiB page (so on a cache line).
template <class T>
struct PageAlignedAllocator {
  using value_type = T;                                ///< what it allocates
  static constexpr std::align_val_t kAlign{4096};      ///< every block's alignment

  PageAlignedAllocator() = default;                    ///< stateless
  /// Rebinding (containers allocate their own node types through it).
  template <class U>
  PageAlignedAllocator(const PageAlignedAllocator<U>&) noexcept {}  // NOLINT: rebind

  /// n objects' bytes at a page-aligned address; throws std::bad_alloc as operator new.
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  /// Frees a block allocate(n) returned.
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, kAlign); }

  /// Stateless: any two compare equal (memory from one is freed by the other).
  template <class U>
  bool operator==(const PageAlignedAllocator<U>&) const noexcept {
    return true;
  }
};

/// A pool image's bytes, page-aligned: what Pool::open_image accepts.
using ImageBytes = std::vector<char, PageAlignedAllocator<char>>;

}  // namespace pmindex::pm

// map_aligned_anonymous: an anonymous mapping of `size` bytes at an `align`-aligned address,
// made by mapping size + align bytes and giving back both ends. 2 MiB pages (THP for DRAM, DAX
// or huge-page tmpfs for a pool file) are only used at 2 MiB-aligned addresses: DramArena maps
// its regions with it, and Pool maps a pool file over a PROT_NONE reservation made with it.
//
// size: a multiple of the page size; align: a power of two and a multiple of the page size.
// Returns MAP_FAILED (errno set by mmap) on failure. Thread safety: none needed (mmap/munmap).
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>

namespace pmindex::pm::detail {

inline void* map_aligned_anonymous(std::size_t size, std::size_t align, int prot,
                                   int extra_flags = 0) {
  void* raw = mmap(nullptr, size + align, prot, MAP_PRIVATE | MAP_ANONYMOUS | extra_flags, -1, 0);
  if (raw == MAP_FAILED) return MAP_FAILED;
  const auto lo = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t at = (lo + align - 1) & ~(static_cast<std::uintptr_t>(align) - 1);
  if (at > lo) munmap(raw, at - lo);
  const std::uintptr_t end = at + size;
  const std::uintptr_t raw_end = lo + size + align;
  if (raw_end > end) munmap(reinterpret_cast<void*>(end), raw_end - end);
  return reinterpret_cast<void*>(at);
}

}  // namespace pmindex::pm::detail

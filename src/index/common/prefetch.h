// prefetch_lines: software prefetch of every 64 B line of [p, p + bytes), issued together as
// soon as a node's address is known, so the lines arrive in parallel (after one page walk)
// instead of one miss after another as a search touches them.
//
// Thread safety: a prefetch never faults and reads nothing the program can observe.
#pragma once

#include <cstddef>

namespace pmindex::index_common {

[[gnu::always_inline]] inline void prefetch_lines(const void* p, std::size_t bytes) {
  const char* c = static_cast<const char*>(p);
  // A constant `bytes` unrolls to one instruction per line (g++ left 17 lines a loop).
#pragma GCC unroll 64
  for (std::size_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off);
}

// The same for lines about to be written (prefetchw: fetched for ownership).
[[gnu::always_inline]] inline void prefetch_lines_for_write(const void* p, std::size_t bytes) {
  const char* c = static_cast<const char*>(p);
#pragma GCC unroll 64
  for (std::size_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 1);
}

}  // namespace pmindex::index_common

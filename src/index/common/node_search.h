// The search of one DRAM inner node's sorted separators, shared by InnerTree (LB+-Tree, FPTree)
// and NBTree: upper_bound without a branch that depends on a comparison. With random probes
// every comparison of a branching search is a coin flip, and the mispredictions cost more than
// the node's cache misses once its lines are prefetched.
//
// Cheap compares (integer keys): binary steps narrow the range to kWindow slots, which are then
// counted slot by slot; a node of at most kWindow separators is counted whole. The counted
// compares are independent and overlap, where binary steps are a chain of dependent
// load-compare steps. Expensive compares (byte-string keys, kWindow = 0): binary steps only.
//
// Thread safety: reads only. Optimistic readers pass a `sep` that loads with optimistic_read
// (or an atomic load): separators may be torn or unsorted mid-write, and then the result is any
// index in [0, cnt] and the caller's validation throws it away.
#pragma once

#include <algorithm>

namespace pmindex::index_common {

// The number of separators sep(0) .. sep(cnt - 1) that are <= the probe; probe_less(s) is
// "probe < s". capacity: the node's separator slots (cnt <= capacity); sep(i) is called for
// i < capacity only (the counted window is clamped there; slots at or past cnt are masked).
template <unsigned kWindow, class Sep, class ProbeLess>
[[gnu::always_inline]] inline unsigned count_not_above(unsigned cnt, unsigned capacity, Sep sep,
                                                    ProbeLess probe_less) {
  unsigned lo = 0, len = cnt;
  while (len > kWindow) {
    const unsigned half = len / 2;
    const bool right = !probe_less(sep(lo + half));
    lo = right ? lo + half + 1 : lo;
    len = right ? len - half - 1 : half;
  }
  if constexpr (kWindow > 0) {
    const unsigned window = std::min(capacity, kWindow);
    unsigned below = lo;
    for (unsigned i = 0; i < window; ++i) {
      const unsigned slot = std::min(lo + i, capacity - 1);
      below += static_cast<unsigned>(i < len) & static_cast<unsigned>(!probe_less(sep(slot)));
    }
    return below;
  }
  return lo;
}

}  // namespace pmindex::index_common

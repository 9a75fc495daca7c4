// The search of one DRAM inner node's sorted separators, shared by InnerTree (LB+-Tree, FPTree)
// and NBTree: upper_bound without a branch that depends on a comparison. With random probes
// every comparison of a branching search is a coin flip, and the mispredictions cost more than
// the node's cache misses once its lines are prefetched.
//
// Cheap compares (integer keys): binary steps narrow the range to kWindow slots, which are then
// counted slot by slot; a node of at most kWindow separators is counted whole. The counted
// compares are independent and overlap, where binary steps are a chain of dependent
// load-compare steps. Expensive compares (byte-string keys, kWindow = 0): binary steps only.
// Counting executes more instructions (callgrind: a 1M-key LB+-Tree bulk load plus 200k
// inserts went from 4.73 to 5.56 G) and still wins on time, because the node's loads all
// wait on the same miss instead of one after another. always_inline: g++ kept one shared
// out-of-line copy, which cost the descents measurably.
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
  if constexpr (kWindow > 0) {
    if (capacity <= kWindow) {  // a small node is counted whole
      unsigned below = 0;
      for (unsigned i = 0; i < capacity; ++i)
        below += static_cast<unsigned>(i < cnt) & static_cast<unsigned>(!probe_less(sep(i)));
      return below;
    }
  }
  // Binary steps. The probe goes right past slot lo + half (keeping len - half - 1 slots) or
  // left (keeping half); both updates are masks, so g++ cannot turn them into branches (it
  // did with the ternary form). Unsigned wrap-around is intended: len - 2 half - 1 is -1
  // for an even len, and half + (-1) = len - half - 1 there too.
  unsigned lo = 0, len = cnt;
  while (len > kWindow) {
    const unsigned half = len / 2;
    const unsigned right = 0u - static_cast<unsigned>(!probe_less(sep(lo + half)));  // ~0 or 0
    lo += (half + 1) & right;
    len = half + ((len - 2 * half - 1) & right);
  }
  if constexpr (kWindow > 0) {
    // kWindow slots from lo (a constant trip count: unrolled), clamped into the node.
    unsigned below = lo;
    for (unsigned i = 0; i < kWindow; ++i) {
      const unsigned slot = std::min(lo + i, capacity - 1);
      below += static_cast<unsigned>(i < len) & static_cast<unsigned>(!probe_less(sep(slot)));
    }
    return below;
  }
  return lo;
}

}  // namespace pmindex::index_common

// Retry once after pool_full with the epoch manager's deferred frees run first (issue 19
// item 2). Records and nodes an index retires wait in the epoch manager until two epochs
// pass; on a nearly full pool those blocks are the free space, and the usual trigger (a
// collect every kBagCapacity retires or kUnpinsPerCollect unpins) may be far away, or, for a
// thread without a ThreadScope, never run for the items its detaches hand to the orphan list.
//
//   Code c = write(...);
//   if (c == Code::pool_full && reclaim_deferred(epochs_)) c = write(...);
//
// Thread safety / invariants:
//   (1) Called only while the calling thread holds no Guard of `epochs` (deleters must not run
//       inside an operation: epoch.h invariant (4)); asserted. An operation therefore answers
//       pool_full, unpins, and its public wrapper reclaims and retries the whole operation.
//   (2) The retried operation must have left nothing behind when it answered pool_full (each
//       index's protocol rolls its partial work back), so running it again is a plain retry.
//   (3) Frees only what epoch.h says is safe: items of this thread and the orphan list whose
//       batch is two epochs old. Items in other attached threads' bags stay theirs to free.
#pragma once

#include <cassert>
#include <cstddef>

#include "pmindex/status.h"
#include "pmindex/sync/epoch.h"

namespace pmindex::index_common {

// Three collects: the first seals this thread's bag at epoch e and advances to e+1, the
// second advances to e+2 and frees it (and orphans of e), the third covers a tag read after
// a concurrent advance (epoch.h: a later tag frees later, never earlier). Each costs one
// heavy fence, paid only on the pool_full path. Returns whether any deleter ran.
inline bool reclaim_deferred(sync::EpochManager& epochs) {
  assert(!epochs.pinned_here());
  std::size_t freed = 0;
  for (int round = 0; round < 3; ++round) freed += epochs.collect();
  return freed != 0;
}

// Runs op(); if it answers pool_full and deferred frees ran, runs it once more.
template <class Op>
Code retry_after_reclaim(sync::EpochManager& epochs, Op&& op) {
  const Code c = op();
  if (c != Code::pool_full || !reclaim_deferred(epochs)) return c;
  return op();
}

}  // namespace pmindex::index_common

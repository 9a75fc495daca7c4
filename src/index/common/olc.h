// The hybrid indexes' use of sync::OptimisticLock (include/pmindex/sync/optimistic_lock.h) for
// DRAM inner nodes and per-leaf DRAM versions: the two things the lock's own verbs do not
// offer, and the names of the seqlock data accessors.
//
// Thread safety / Invariants (in addition to optimistic_lock.h's (1)-(3)):
//   (1) Seqlock data (inner-node keys/children/count/level; PM leaf words read by optimistic
//       readers) is read with sync::optimistic_read (acquire) and written by the lock holder
//       with sync::locked_write or pm::publish (both release stores), as the lock's proof needs.
//   (2) try_write_lock never waits, so a thread that already holds a lock may use it without
//       risking a deadlock (lock order: a leaf, then the SMO mutex; neighbours are try-locked).
//   (3) A recycled object (an inner node off the free list, a leaf block handed out again by
//       the allocator) restarts from a word strictly above every word it ever had
//       (recycle_locked / recycle_unlocked), so a stale version can never validate against
//       it; the obsolete bit is cleared only there.
#pragma once

#include <cassert>
#include <cstdint>

#include "pmindex/sync/optimistic_lock.h"

namespace pmindex::index_common {

using sync::OptimisticLock;
using sync::locked_write;
using sync::optimistic_read;

// Takes the lock if nobody holds it and it is not obsolete; never waits (invariant 2).
// The relaxed peek only chooses the CAS's expected value: the CAS itself (acquire on success)
// is what orders the holder after the previous holder's unlock, so no read is trusted before
// the lock is held.
inline bool try_write_lock(OptimisticLock& lock) {
  std::uint64_t word = lock.peek();
  if (OptimisticLock::isLocked(word) || OptimisticLock::isObsolete(word)) return false;
  bool restart = false;
  lock.upgradeToWriteLockOrRestart(word, restart);
  return !restart;
}

// The next unlocked, non-obsolete word above `word` (invariant 3).
constexpr std::uint64_t next_fresh_word(std::uint64_t word) {
  return (word | (OptimisticLock::kObsoleteBit | OptimisticLock::kLockedBit)) + 1;
}
static_assert(next_fresh_word(4) == 8 && next_fresh_word(5) == 8 && next_fresh_word(6) == 8);

// A recycled or fresh object that no new reader can reach yet (stale optimistic readers may
// still read its word; they fail validation because the word only grows). Unlocked.
inline void recycle_unlocked(OptimisticLock& lock) { lock.reset(next_fresh_word(lock.peek())); }

// The same, returned locked: its creator fills it before publishing it.
inline void recycle_locked(OptimisticLock& lock) {
  recycle_unlocked(lock);
  [[maybe_unused]] const bool locked = try_write_lock(lock);
  assert(locked && "a recycled object is not reachable: nobody else can hold its lock");
}

// Between two looks at a lock word (restart loops).
inline void olc_pause() {
  pm::yield_point("olc.restart");
  __builtin_ia32_pause();
}

}  // namespace pmindex::index_common

/// \file
/// Test-and-test-and-set spin lock with exponential backoff, for short critical sections on
/// DRAM state (a free list, a per-node overflow chain). It meets the standard Lockable
/// requirements, so std::lock_guard / std::unique_lock / std::scoped_lock work with it.
///
/// Thread safety: lock, try_lock and unlock may be called from any thread; unlock only by the
/// thread that holds the lock. Not recursive, not fair: a waiter can be overtaken.
///
/// Invariants: (1) the flag is true exactly while some thread holds the lock; (2) everything
/// written inside a critical section happens before the next holder's critical section
/// (release unlock, acquire lock).
#pragma once

#include <atomic>
#include <cassert>

#include "pmindex/pm/persist.h"
#include "pmindex/sync/backoff.h"

namespace pmindex::sync {

/// The spin lock described above (Lockable: use it with std::lock_guard).
class SpinLock {
 public:
  SpinLock() = default;
  SpinLock(const SpinLock&) = delete;
  SpinLock& operator=(const SpinLock&) = delete;

  /// Waits (spinning, then yielding) until the lock is free, then takes it.
  void lock() noexcept {
    pm::yield_point("spinlock.lock");
    // exchange acquire: the winner sees the previous holder's critical section.
    if (!locked_.exchange(true, std::memory_order_acquire)) return;
    SpinBackoff backoff;
    for (;;) {
      // Wait with plain loads so waiters share the cache line instead of bouncing it with
      // exchanges; relaxed: the exchange that follows is what orders the critical section.
      while (locked_.load(std::memory_order_relaxed)) backoff.spin("spinlock.spin");
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
    }
  }

  /// Takes the lock if it is free; never waits.
  [[nodiscard]] bool try_lock() noexcept {
    pm::yield_point("spinlock.try_lock");
    // relaxed pre-check: a held lock is refused without writing the line; acquire exchange as
    // in lock().
    return !locked_.load(std::memory_order_relaxed) &&
           !locked_.exchange(true, std::memory_order_acquire);
  }

  /// Releases the lock; only by its holder.
  void unlock() noexcept {
    assert(locked_.load(std::memory_order_relaxed));
    pm::yield_point("spinlock.unlock");
    // release: the critical section's writes are visible to the next holder.
    locked_.store(false, std::memory_order_release);
  }

  /// relaxed: for assertions and diagnostics only (the answer may be stale when it returns).
  [[nodiscard]] bool is_locked() const noexcept {
    return locked_.load(std::memory_order_relaxed);
  }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace pmindex::sync

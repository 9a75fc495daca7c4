/// \file
/// Reader-writer spin lock for DRAM state held briefly or rarely (an index's SMO locks), where a
/// waiting thread must stay at scheduling points: std::shared_mutex blocks in the kernel, which
/// the crash simulator's deterministic scheduler cannot switch out of (docs/crash-simulator.md,
/// "Locks under the scheduler"). It meets the standard SharedLockable and Lockable requirements,
/// so std::shared_lock / std::unique_lock / std::lock_guard work with it.
///
/// One 32-bit word: bit 31 = a writer holds the lock, bit 30 = a writer waits (new readers hold
/// off, so a stream of readers cannot starve it), bits 0-29 = the number of readers.
///
/// Thread safety: every member may be called from any thread; unlock / unlock_shared only by
/// a holder. Not recursive, not fair among writers.
///
/// Invariants: (1) the writer bit is set exactly while a writer holds the lock, and then the
/// reader count is 0; (2) everything written inside a critical section happens before the next
/// conflicting critical section (release unlocks, acquire locks).
#pragma once

#include <atomic>
#include <cassert>
#include <cstdint>

#include "pmindex/pm/persist.h"
#include "pmindex/sync/backoff.h"

namespace pmindex::sync {

/// The reader-writer spin lock described above (SharedLockable: use it with std::shared_lock).
class SharedSpinLock {
 public:
  SharedSpinLock() = default;
  SharedSpinLock(const SharedSpinLock&) = delete;
  SharedSpinLock& operator=(const SharedSpinLock&) = delete;

  /// Waits (spinning, then yielding) until no writer holds or waits, then joins the readers.
  void lock_shared() noexcept {
    pm::yield_point("sharedlock.lock_shared");
    SpinBackoff backoff;
    while (!join_readers()) backoff.spin("sharedlock.spin_shared");
  }

  /// Joins the readers if no writer holds or waits; never waits.
  [[nodiscard]] bool try_lock_shared() noexcept {
    pm::yield_point("sharedlock.try_lock_shared");
    return join_readers();
  }

  /// Leaves the readers; only by a reader.
  void unlock_shared() noexcept {
    assert((state_.load(std::memory_order_relaxed) & kReaders) != 0);
    pm::yield_point("sharedlock.unlock_shared");
    // release: the reader's reads happen before a writer's critical section.
    state_.fetch_sub(1, std::memory_order_release);
  }

  /// Waits until no one holds the lock, announcing itself so new readers hold off.
  void lock() noexcept {
    pm::yield_point("sharedlock.lock");
    SpinBackoff backoff;
    for (;;) {
      std::uint32_t s = state_.load(std::memory_order_relaxed);
      if ((s & ~kWaiting) == 0) {
        // acquire: the writer sees every earlier critical section.
        if (state_.compare_exchange_weak(s, kWriter, std::memory_order_acquire,
                                         std::memory_order_relaxed))
          return;
        continue;
      }
      // relaxed: only a hint to readers; the CAS above is what orders the critical section.
      if ((s & kWaiting) == 0) state_.fetch_or(kWaiting, std::memory_order_relaxed);
      backoff.spin("sharedlock.spin");
    }
  }

  /// Takes the lock if no one holds it; never waits.
  [[nodiscard]] bool try_lock() noexcept {
    pm::yield_point("sharedlock.try_lock");
    std::uint32_t s = state_.load(std::memory_order_relaxed);
    return (s & ~kWaiting) == 0 &&
           state_.compare_exchange_strong(s, kWriter, std::memory_order_acquire,
                                          std::memory_order_relaxed);
  }

  /// Releases the writer's hold (and clears a waiting mark: other waiting writers set it again).
  void unlock() noexcept {
    assert(state_.load(std::memory_order_relaxed) & kWriter);
    pm::yield_point("sharedlock.unlock");
    // release: the critical section's writes are visible to the next holder.
    state_.store(0, std::memory_order_release);
  }

 private:
  static constexpr std::uint32_t kWriter = 1u << 31;
  static constexpr std::uint32_t kWaiting = 1u << 30;
  static constexpr std::uint32_t kReaders = kWaiting - 1;

  bool join_readers() noexcept {
    std::uint32_t s = state_.load(std::memory_order_relaxed);
    while ((s & (kWriter | kWaiting)) == 0) {
      assert((s & kReaders) != kReaders);
      // acquire: the reader sees the last writer's critical section.
      if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acquire,
                                       std::memory_order_relaxed))
        return true;
    }
    return false;
  }

  std::atomic<std::uint32_t> state_{0};
};

}  // namespace pmindex::sync

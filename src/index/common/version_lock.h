// A DRAM version word for optimistic lock coupling (OLC), used by the shared inner-node layer
// and as the per-leaf DRAM version of the hybrid (DRAM-inner / PM-leaf) indexes.
//
// Thread safety / Invariants:
//   (1) word bit 0 = locked, bit 1 = obsolete, bits 2..63 = a counter bumped by every unlock;
//       so a reader that saw version v and later sees v again knows no writer finished a
//       critical section in between (and none is in one, since v has bit 0 clear).
//   (2) Readers never write the word: read_begin (acquire) ... read the protected data with
//       relaxed atomic loads ... validate (acquire fence + relaxed load) is a seqlock read.
//   (3) Writers take the lock by CAS from an observed unlocked version (try_upgrade) or by
//       spinning (lock); unlock publishes the data writes with a release store.
//   (4) Obsolete is sticky until reset_locked(): a node or leaf that was removed makes every
//       later optimistic reader restart; a recycled object restarts from a larger counter,
//       so stale versions can never validate against it (no ABA within 2^62 writes).
//
// Verbs follow the OLC vocabulary of the sync utilities (readLockOrRestart / checkOrRestart /
// upgradeToWriteLockOrRestart / writeUnlock / writeUnlockObsolete); this header is the hybrid
// indexes' own copy until include/pmindex/sync/optimistic_lock.h is on main.
#pragma once

#include <atomic>
#include <cstdint>

#include "pmindex/pm/persist.h"

namespace pmindex::index_common {

class VersionLock {
 public:
  static constexpr std::uint64_t kLocked = 1;
  static constexpr std::uint64_t kObsolete = 2;
  static constexpr std::uint64_t kStep = 4;

  // readLockOrRestart: false if the object is locked or obsolete (the caller restarts).
  // acquire: the data reads that follow see at least the writes of the last unlock.
  bool read_begin(std::uint64_t* version) const {
    *version = word_.load(std::memory_order_acquire);
    return (*version & (kLocked | kObsolete)) == 0;
  }
  // checkOrRestart: true if nothing changed since read_begin returned `version`.
  // The acquire fence orders the (relaxed) data reads before the re-read of the word.
  bool validate(std::uint64_t version) const {
    std::atomic_thread_fence(std::memory_order_acquire);
    return word_.load(std::memory_order_relaxed) == version;
  }
  // upgradeToWriteLockOrRestart: lock only if the version is still `version`.
  // acquire on success: the writer sees every write of the previous holder.
  bool try_upgrade(std::uint64_t version) {
    pm::yield_point("version_lock.try_upgrade");
    return word_.compare_exchange_strong(version, version | kLocked, std::memory_order_acquire,
                                         std::memory_order_relaxed);
  }
  // writeLockOrRestart without the restart: spins until unlocked. Returns false if the object
  // became obsolete (the caller must not use it).
  bool lock() {
    for (;;) {
      std::uint64_t v = word_.load(std::memory_order_relaxed);
      if ((v & kObsolete) != 0) return false;
      if ((v & kLocked) == 0 && try_upgrade(v)) return true;
      pause();
    }
  }
  bool is_locked() const { return (word_.load(std::memory_order_relaxed) & kLocked) != 0; }
  // writeUnlock. release: publishes the critical section's writes to validating readers.
  void unlock() {
    const std::uint64_t v = word_.load(std::memory_order_relaxed);
    word_.store((v & ~(kLocked | kObsolete)) + kStep, std::memory_order_release);
  }
  // writeUnlockObsolete: the object was removed; every reader holding a version restarts.
  void unlock_obsolete() {
    const std::uint64_t v = word_.load(std::memory_order_relaxed);
    word_.store(((v & ~(kLocked | kObsolete)) + kStep) | kObsolete, std::memory_order_release);
  }
  // A recycled (or fresh) object, locked by its creator before it becomes reachable.
  // relaxed: nobody can lock it concurrently; the publication of the object orders it.
  void reset_locked() {
    const std::uint64_t v = word_.load(std::memory_order_relaxed);
    word_.store(((v & ~(kLocked | kObsolete)) + kStep) | kLocked, std::memory_order_release);
  }
  // Unlocked and not obsolete, for single-threaded rebuilds.
  void reset_unlocked() {
    const std::uint64_t v = word_.load(std::memory_order_relaxed);
    word_.store((v & ~(kLocked | kObsolete)) + kStep, std::memory_order_release);
  }

  static void pause() {
    pm::yield_point("version_lock.spin");
    __builtin_ia32_pause();
  }

 private:
  std::atomic<std::uint64_t> word_{0};
};

// Relaxed atomic access to words that optimistic readers read while a locked writer changes
// them (seqlock data). Every such word is read and written only through these, so there is
// no data race; the version word provides the ordering.
inline std::uint64_t relaxed_load(const std::uint64_t* p) {
  return std::atomic_ref<std::uint64_t>(*const_cast<std::uint64_t*>(p))
      .load(std::memory_order_relaxed);
}
inline void relaxed_store(std::uint64_t* p, std::uint64_t v) {
  std::atomic_ref<std::uint64_t>(*p).store(v, std::memory_order_relaxed);
}

}  // namespace pmindex::index_common

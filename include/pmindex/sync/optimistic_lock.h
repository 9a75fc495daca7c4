/// \file
/// Optimistic version lock, the lock of optimistic lock coupling (Leis et al., "The ART of
/// Practical Synchronization", DaMoN 2016).
///
/// Lock word, 64 bits:
///   bit 0      obsolete  the protected object was unlinked; everyone who reaches it restarts
///   bit 1      locked    a writer holds the lock
///   bits 2-63  version   +1 per write critical section
/// The word only ever grows: lock +2, writeUnlock +2, writeUnlockObsolete +3. So two reads that
/// return the same value read the same store, with no critical section in between (a wrap
/// needs 2^62 critical sections).
///
/// A reader does not write the word:
///   bool restart = false;
///   uint64_t v = node.lock.readLockOrRestart(restart);      if (restart) goto retry;
///   Key k = sync::optimistic_read(node.key);               // may be torn: do not trust yet
///   node.lock.checkOrRestart(v, restart);                   if (restart) goto retry;
///   ... k is now a consistent snapshot ...
/// A writer locks (writeLockOrRestart, or upgradeToWriteLockOrRestart from a read version),
/// writes with sync::locked_write and unlocks (writeUnlock, or writeUnlockObsolete when it
/// unlinked the object; the memory itself is freed through epoch.h).
///
/// Thread safety: every verb may be called concurrently from any thread. The verbs set
/// needRestart = true on failure and never clear it, so a caller may chain several verbs and
/// test once; the caller resets it to false where its operation restarts.
///
/// Invariants the users of the lock must keep:
///  (1) A field that optimistic readers read is written only by the lock holder, with
///      locked_write (or before the object is published to other threads). The holder may
///      read such fields with plain loads: reads do not race with reads.
///  (2) Optimistic readers read such fields only with optimistic_read, and act on nothing they
///      read until checkOrRestart (or an upgrade) with the version from readLockOrRestart
///      succeeds. A value read but not yet validated may be garbage: following a pointer before
///      validation is allowed only when the memory stays mapped while the reader is pinned
///      (epoch.h) and the code tolerates garbage (bounded loops, indexes range-checked).
///  (3) Only the lock holder sets the obsolete bit, and an obsolete word is never unlocked
///      again; reset() is for objects no other thread can reach (initialisation, recovery).
///
/// Memory orders, and why there is no standalone fence. The textbook C++ seqlock reader is
/// "load version (acquire); read data (relaxed); atomic_thread_fence(acquire); load version
/// (relaxed)", with a release fence in the writer after it takes the lock. g++ 12's
/// ThreadSanitizer does not model atomic_thread_fence, so that version cannot be checked by
/// TSan. We put the ordering on the data accesses instead:
///
///   reader                                       writer
///   R1  v1 = word.load(acquire)                  W1  CAS word v -> v+2 (acquire)
///   R2  x  = atomic_ref(f).load(acquire)          W2  atomic_ref(f).store(x, release)
///   R3  v2 = word.load(acquire)                  W3  word.store(v+4, release)
///
/// Claim: if v1 == v2 and v1 is unlocked, each R2 returns the value stored by the last
/// critical section that unlocked at or before v1 (a consistent snapshot).
///  (a) The word only grows, so v1 == v2 means R1 and R3 read the same store S.
///  (b) Nothing newer: say R2 read a W2 of a critical section C whose lock W1 comes after S in
///      the word's modification order. W2 is a release store and R2 an acquire load reading it,
///      so W2 synchronizes with R2. W1 is sequenced before W2 and R2 before R3, hence W1
///      happens before R3, and by write-read coherence R3 reads W1 or a later store, never S,
///      which precedes W1. Contradiction. Both halves are needed: the release on W2 carries W1 to the reader (it
///      is what the writer's release fence does in the textbook version; without it, on ARM,
///      W2 may become visible before W1), and the acquire on R2 keeps R3 from being satisfied
///      before R2 (the reader's acquire fence).
///  (c) Nothing older: the critical section whose unlock is S happens before R1 (release W3,
///      acquire R1), and each earlier one happens before the next (its release unlock is read
///      by the next lock CAS, an acquire). By write-read coherence R2 reads the last of their
///      stores to f or something later, and by (b) nothing later.
/// An upgrade CAS from v1 succeeds only if the word still holds S (a CAS reads the latest
/// value), which is (a) and (b) again with the CAS in place of R3.
///
/// Cost: on x86 acquire loads and release stores are plain movs; the orders only restrict the
/// compiler. Checking with a read-modify-write instead (fetch_add(0) as R3) would also be
/// correct with relaxed data, but it makes every reader write the lock's cache line.
/// Data accesses through std::atomic_ref are also what makes the readers' racy reads TSan-clean
/// and defined behaviour (a plain read racing with a write is undefined behaviour in C++).
#pragma once

#include <atomic>
#include <cassert>
#include <cstdint>
#include <type_traits>

#include "pmindex/pm/persist.h"
#include "pmindex/sync/backoff.h"

namespace pmindex::sync {

/// A field that optimistic_read/locked_write can access: copied by value in one lock-free atomic
/// access. Structs of up to 8 bytes qualify if they are aligned to their size.
template <class T>
concept OptimisticField =
    std::is_trivially_copyable_v<T> &&
    (sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8) &&
    std::atomic_ref<T>::is_always_lock_free &&
    alignof(T) >= std::atomic_ref<T>::required_alignment;

/// Optimistic read of a field protected by an OptimisticLock. acquire: keeps the validating
/// version load (checkOrRestart) from being satisfied before this read; see the argument above.
template <OptimisticField T>
[[nodiscard]] inline T optimistic_read(const T& field) {
  // const_cast: atomic_ref<T> needs a T&; a load does not modify the object.
  return std::atomic_ref<T>(const_cast<T&>(field)).load(std::memory_order_acquire);
}

/// Write by the lock holder of a field that optimistic readers read. release: a reader that
/// sees this value also sees the lock being taken, so its validation fails; see above.
template <OptimisticField T>
inline void locked_write(T& field, std::type_identity_t<T> value) {
  std::atomic_ref<T>(field).store(value, std::memory_order_release);
}

/// A version lock word for optimistic readers and exclusive writers, in ARTSynchronized's
/// shape (see the file comment): readers take a version and validate it after reading,
/// writers lock, bump the version at unlock, and may mark the object obsolete.
class OptimisticLock {
 public:
  static constexpr std::uint64_t kObsoleteBit = 1;  ///< bit 0
  static constexpr std::uint64_t kLockedBit = 2;    ///< bit 1
  static constexpr std::uint64_t kVersionUnit = 4;  ///< bits 2-63 count critical sections

  OptimisticLock() = default;

  /// The word marks a removed object (readers restart elsewhere).
  static bool isObsolete(std::uint64_t word) { return (word & kObsoleteBit) != 0; }
  /// A writer holds the lock.
  static bool isLocked(std::uint64_t word) { return (word & kLockedBit) != 0; }

  /// Waits until no writer holds the lock and returns the version to validate against later.
  /// Restart if the object is obsolete.
  [[nodiscard]] std::uint64_t readLockOrRestart(bool& needRestart) const {
    pm::yield_point("optlock.read");
    std::uint64_t word = load_acquire();
    if (isLocked(word)) [[unlikely]] word = wait_unlocked();
    if (isObsolete(word)) needRestart = true;
    return word;
  }

  /// readLockOrRestart without the wait, for a caller with a general path to fall back on
  /// (one that must make no call in its common case): restart also while a writer holds it.
  [[nodiscard]] std::uint64_t tryReadLockOrRestart(bool& needRestart) const {
    pm::yield_point("optlock.read");
    const std::uint64_t word = load_acquire();
    if ((word & (kLockedBit | kObsoleteBit)) != 0) needRestart = true;
    return word;
  }

  /// Restart unless the word still holds `version`, i.e. no writer ran since readLockOrRestart
  /// returned it: then everything read with optimistic_read in between is consistent.
  void checkOrRestart(std::uint64_t version, bool& needRestart) const {
    pm::yield_point("optlock.check");
    if (load_acquire() != version) needRestart = true;
  }
  /// checkOrRestart at the end of a read (ARTSynchronized's name for it).
  void readUnlockOrRestart(std::uint64_t version, bool& needRestart) const {
    checkOrRestart(version, needRestart);
  }

  /// Takes the lock if the word still holds `version` (a version from readLockOrRestart), so
  /// what the caller read optimistically stays valid under the lock. On success `version`
  /// becomes the locked word; on failure restart.
  void upgradeToWriteLockOrRestart(std::uint64_t& version, bool& needRestart) {
    assert(!isLocked(version) && !isObsolete(version));
    pm::yield_point("optlock.upgrade");
    std::uint64_t expected = version;
    if (try_lock_from(expected)) {
      version += kLockedBit;
    } else {
      needRestart = true;
    }
  }

  /// Takes the lock, waiting for the current holder; restarts only if the object is obsolete
  /// (the caller has no version whose change would matter).
  void writeLockOrRestart(bool& needRestart) {
    SpinBackoff backoff;
    for (;;) {
      bool obsolete = false;
      std::uint64_t word = readLockOrRestart(obsolete);
      if (obsolete) {
        needRestart = true;
        return;
      }
      pm::yield_point("optlock.lock");
      if (try_lock_from(word)) return;
      backoff.spin("optlock.spin");
    }
  }

  /// Releases the lock and counts one more version, so validations of readers that started
  /// before the lock was taken fail.
  void writeUnlock() { unlock_adding(kLockedBit); }

  /// Releases the lock and marks the object obsolete: every later reader and writer restarts.
  void writeUnlockObsolete() { unlock_adding(kLockedBit + kObsoleteBit); }

  /// The current word. relaxed: for assertions and diagnostics only; never validate against it.
  [[nodiscard]] std::uint64_t peek() const {
    return std::atomic_ref<std::uint64_t>(word_).load(std::memory_order_relaxed);
  }

  /// Sets the word (unlocked, not obsolete, version 0 by default). Only for an object that no
  /// other thread can reach: node initialisation before publication, or recovery after a
  /// crash left a lock bit set in persistent memory. relaxed: publication orders it.
  void reset(std::uint64_t word = 0) {
    assert(!isLocked(word));
    std::atomic_ref<std::uint64_t>(word_).store(word, std::memory_order_relaxed);
  }

 private:
  /// readLockOrRestart's wait for a held lock, out of line: inlined, its backoff loop and
  /// yield call made every optimistic descent keep its vector registers on the stack (the
  /// call clobbers them) and added ~7 instructions per LB+-Tree inner level (callgrind).
  [[gnu::noinline, gnu::cold]] std::uint64_t wait_unlocked() const {
    SpinBackoff backoff;
    std::uint64_t word;
    do {
      backoff.spin("optlock.spin");
      word = load_acquire();
    } while (isLocked(word));
    return word;
  }

  /// acquire: a reader (R1/R3 above) must see the writes of every critical section that
  /// unlocked before the value it reads.
  std::uint64_t load_acquire() const {
    return std::atomic_ref<std::uint64_t>(word_).load(std::memory_order_acquire);
  }

  /// CAS an unlocked word to locked. acquire on success: the new holder sees the previous
  /// holder's writes (the unlock is a release store). relaxed on failure: nothing was read
  /// that the caller will use; it retries or restarts.
  bool try_lock_from(std::uint64_t& expected) {
    return std::atomic_ref<std::uint64_t>(word_).compare_exchange_strong(
        expected, expected + kLockedBit, std::memory_order_acquire, std::memory_order_relaxed);
  }

  /// While the lock is held no other thread modifies the word (every other modification is a
  /// CAS from an unlocked value), so a plain store is enough; it is cheaper than fetch_add.
  /// relaxed load: our own lock CAS wrote the value. release store: publishes the critical
  /// section's writes to the next holder and to readers (W3 above).
  void unlock_adding(std::uint64_t delta) {
    std::atomic_ref<std::uint64_t> word(word_);
    const std::uint64_t current = word.load(std::memory_order_relaxed);
    assert(isLocked(current) && !isObsolete(current));
    word.store(current + delta, std::memory_order_release);
  }

  /// A plain word accessed only through std::atomic_ref, so the lock is trivially copyable.
  /// Its stores do not go through pm:: (they are neither traced nor flushed), so it belongs in
  /// DRAM: the crash simulator's tracing build refuses PM bytes changed outside pm::. An index
  /// that keeps a lock word inside a PM node writes it through pm:: and tags it with the run's
  /// generation, as the ART core's NodeLock does (src/index/common/art/art_node.h).
  /// mutable: readers never write it, but atomic_ref needs a non-const reference to load.
  alignas(8) mutable std::uint64_t word_ = 0;
};

static_assert(sizeof(OptimisticLock) == 8);
static_assert(std::is_standard_layout_v<OptimisticLock>);
static_assert(std::is_trivially_copyable_v<OptimisticLock>);
static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free);

}  // namespace pmindex::sync

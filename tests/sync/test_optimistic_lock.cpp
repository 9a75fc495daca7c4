// Unit tests of the optimistic version lock: single-thread semantics of every verb, a
// deterministic torn read that validation must catch, and a reader waiting for a writer.
#include "pmindex/sync/optimistic_lock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>

namespace pmindex::sync {
namespace {

using Lock = OptimisticLock;

TEST(OptimisticLock, StartsUnlockedAtVersionZero) {
  Lock lock;
  bool restart = false;
  const std::uint64_t v = lock.readLockOrRestart(restart);
  EXPECT_FALSE(restart);
  EXPECT_EQ(v, 0u);
  EXPECT_FALSE(Lock::isLocked(v));
  EXPECT_FALSE(Lock::isObsolete(v));
}

TEST(OptimisticLock, BitPredicates) {
  EXPECT_TRUE(Lock::isObsolete(1));
  EXPECT_FALSE(Lock::isLocked(1));
  EXPECT_TRUE(Lock::isLocked(2));
  EXPECT_FALSE(Lock::isObsolete(2));
  EXPECT_FALSE(Lock::isLocked(4));
  EXPECT_FALSE(Lock::isObsolete(4));
}

TEST(OptimisticLock, WriteUnlockBumpsVersionAndClearsLock) {
  Lock lock;
  bool restart = false;
  const std::uint64_t before = lock.readLockOrRestart(restart);
  lock.writeLockOrRestart(restart);
  ASSERT_FALSE(restart);
  EXPECT_TRUE(Lock::isLocked(lock.peek()));
  lock.writeUnlock();
  const std::uint64_t after = lock.readLockOrRestart(restart);
  EXPECT_FALSE(restart);
  EXPECT_FALSE(Lock::isLocked(after));
  EXPECT_EQ(after, before + Lock::kVersionUnit);
}

// The checker itself: a version taken before a write must fail, one taken after must pass.
TEST(OptimisticLock, CheckOrRestartFlagsAChangedVersion) {
  Lock lock;
  bool restart = false;
  const std::uint64_t old_version = lock.readLockOrRestart(restart);
  lock.writeLockOrRestart(restart);
  lock.writeUnlock();
  ASSERT_FALSE(restart);

  bool stale = false;
  lock.checkOrRestart(old_version, stale);
  EXPECT_TRUE(stale);

  bool fresh = false;
  const std::uint64_t new_version = lock.readLockOrRestart(fresh);
  lock.checkOrRestart(new_version, fresh);
  lock.readUnlockOrRestart(new_version, fresh);
  EXPECT_FALSE(fresh);
}

TEST(OptimisticLock, CheckOrRestartFlagsAHeldLock) {
  Lock lock;
  bool restart = false;
  const std::uint64_t v = lock.readLockOrRestart(restart);
  lock.writeLockOrRestart(restart);
  ASSERT_FALSE(restart);
  bool check = false;
  lock.checkOrRestart(v, check);
  EXPECT_TRUE(check);  // a writer is inside: what we read may be half written
  lock.writeUnlock();
}

// tryReadLockOrRestart: readLockOrRestart's version when the lock is free, a restart instead
// of a wait while a writer holds it, and a restart once the object is obsolete.
TEST(OptimisticLock, TryReadRestartsInsteadOfWaiting) {
  Lock lock;
  bool restart = false;
  const std::uint64_t v = lock.readLockOrRestart(restart);
  EXPECT_EQ(lock.tryReadLockOrRestart(restart), v);
  ASSERT_FALSE(restart);
  lock.writeLockOrRestart(restart);
  ASSERT_FALSE(restart);
  bool held = false;
  (void)lock.tryReadLockOrRestart(held);  // readLockOrRestart would spin here until unlock
  EXPECT_TRUE(held);
  lock.writeUnlock();
  bool after = false;
  EXPECT_GT(lock.tryReadLockOrRestart(after), v);
  EXPECT_FALSE(after);
  lock.writeLockOrRestart(restart);
  lock.writeUnlockObsolete();
  bool obsolete = false;
  (void)lock.tryReadLockOrRestart(obsolete);
  EXPECT_TRUE(obsolete);
}

TEST(OptimisticLock, VerbsNeverClearNeedRestart) {
  Lock lock;
  bool restart = true;
  const std::uint64_t v = lock.readLockOrRestart(restart);
  lock.checkOrRestart(v, restart);
  EXPECT_TRUE(restart);
}

TEST(OptimisticLock, UpgradeSucceedsWhenNothingChanged) {
  Lock lock;
  bool restart = false;
  std::uint64_t v = lock.readLockOrRestart(restart);
  const std::uint64_t read_version = v;
  lock.upgradeToWriteLockOrRestart(v, restart);
  ASSERT_FALSE(restart);
  EXPECT_EQ(v, read_version + Lock::kLockedBit);
  EXPECT_EQ(lock.peek(), v);
  lock.writeUnlock();
  EXPECT_EQ(lock.peek(), read_version + Lock::kVersionUnit);
}

TEST(OptimisticLock, UpgradeFailsAfterAnInterveningWrite) {
  Lock lock;
  bool restart = false;
  std::uint64_t v = lock.readLockOrRestart(restart);
  // Another writer gets in between the read and the upgrade.
  lock.writeLockOrRestart(restart);
  lock.writeUnlock();
  ASSERT_FALSE(restart);
  const std::uint64_t word = lock.peek();

  lock.upgradeToWriteLockOrRestart(v, restart);
  EXPECT_TRUE(restart);
  EXPECT_EQ(lock.peek(), word);  // the failed upgrade left the lock alone
  EXPECT_FALSE(Lock::isLocked(lock.peek()));
}

TEST(OptimisticLock, UpgradeFailsWhileAnotherWriterHoldsTheLock) {
  Lock lock;
  bool restart = false;
  std::uint64_t v = lock.readLockOrRestart(restart);
  lock.writeLockOrRestart(restart);
  ASSERT_FALSE(restart);
  lock.upgradeToWriteLockOrRestart(v, restart);
  EXPECT_TRUE(restart);
  lock.writeUnlock();
}

TEST(OptimisticLock, ObsoleteMakesEveryoneRestart) {
  Lock lock;
  bool restart = false;
  const std::uint64_t before = lock.readLockOrRestart(restart);
  lock.writeLockOrRestart(restart);
  lock.writeUnlockObsolete();
  ASSERT_FALSE(restart);

  const std::uint64_t word = lock.peek();
  EXPECT_TRUE(Lock::isObsolete(word));
  EXPECT_FALSE(Lock::isLocked(word));
  EXPECT_GT(word, before);

  bool read_restart = false;
  (void)lock.readLockOrRestart(read_restart);
  EXPECT_TRUE(read_restart);

  bool write_restart = false;
  lock.writeLockOrRestart(write_restart);
  EXPECT_TRUE(write_restart);
  EXPECT_EQ(lock.peek(), word);  // nobody got the lock

  bool check_restart = false;
  lock.checkOrRestart(before, check_restart);
  EXPECT_TRUE(check_restart);
}

// A deterministic interleaving of a reader and a writer on one thread. The reader reads the
// first field, the writer updates both, the reader reads the second: the pair is torn, and a
// reader that skipped validation would use it. checkOrRestart must reject it.
TEST(OptimisticLock, ValidationRejectsATornRead) {
  struct Pair {
    Lock lock;
    std::uint64_t a = 1;
    std::uint64_t b = 1;
  } pair;

  bool restart = false;
  const std::uint64_t v = pair.lock.readLockOrRestart(restart);
  const std::uint64_t a = optimistic_read(pair.a);

  bool writer_restart = false;
  pair.lock.writeLockOrRestart(writer_restart);
  ASSERT_FALSE(writer_restart);
  locked_write(pair.a, 2);
  locked_write(pair.b, 2);
  pair.lock.writeUnlock();

  const std::uint64_t b = optimistic_read(pair.b);
  ASSERT_NE(a, b);  // the torn snapshot an unvalidated reader would act on
  pair.lock.checkOrRestart(v, restart);
  EXPECT_TRUE(restart);

  // The retry sees a consistent pair and validates.
  bool retry = false;
  const std::uint64_t v2 = pair.lock.readLockOrRestart(retry);
  const std::uint64_t a2 = optimistic_read(pair.a);
  const std::uint64_t b2 = optimistic_read(pair.b);
  pair.lock.checkOrRestart(v2, retry);
  EXPECT_FALSE(retry);
  EXPECT_EQ(a2, 2u);
  EXPECT_EQ(b2, 2u);
}

TEST(OptimisticLock, ReaderWaitsWhileAWriterHoldsTheLock) {
  Lock lock;
  bool restart = false;
  lock.writeLockOrRestart(restart);
  ASSERT_FALSE(restart);
  const std::uint64_t locked_word = lock.peek();

  std::atomic<bool> unlocked{false};
  std::atomic<bool> returned_before_unlock{false};
  std::uint64_t seen = 0;
  std::thread reader([&] {
    bool r = false;
    seen = lock.readLockOrRestart(r);
    // acquire: pairs with the release store below.
    if (!unlocked.load(std::memory_order_acquire)) {
      returned_before_unlock.store(true, std::memory_order_relaxed);
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  unlocked.store(true, std::memory_order_release);
  lock.writeUnlock();
  reader.join();
  EXPECT_FALSE(returned_before_unlock.load(std::memory_order_relaxed));
  EXPECT_EQ(seen, locked_word + Lock::kLockedBit);
}

TEST(OptimisticLock, ResetClearsALockLeftByACrash) {
  // A node image as a crash could leave it in persistent memory: locked, mid-update.
  Lock in_pm;
  bool restart = false;
  in_pm.writeLockOrRestart(restart);
  ASSERT_FALSE(restart);
  alignas(8) unsigned char image[sizeof(Lock)];
  std::memcpy(image, &in_pm, sizeof image);
  in_pm.writeUnlock();

  Lock recovered;
  std::memcpy(static_cast<void*>(&recovered), image, sizeof image);
  EXPECT_TRUE(Lock::isLocked(recovered.peek()));
  recovered.reset();
  bool r = false;
  EXPECT_EQ(recovered.readLockOrRestart(r), 0u);
  EXPECT_FALSE(r);
}

TEST(OptimisticHelpers, ReadAndWriteEveryAllowedWidth) {
  struct alignas(8) Small {
    std::uint32_t lo;
    std::uint32_t hi;
  };
  std::uint8_t u8 = 0;
  std::uint16_t u16 = 0;
  std::uint32_t u32 = 0;
  std::uint64_t u64 = 0;
  double f64 = 0;
  int* ptr = nullptr;
  Small small{0, 0};
  int target = 0;

  locked_write(u8, 0xab);
  locked_write(u16, 0xabcd);
  locked_write(u32, 0xabcdef01u);
  locked_write(u64, 0x0123456789abcdefull);
  locked_write(f64, 2.5);
  locked_write(ptr, &target);
  locked_write(small, Small{7, 9});

  EXPECT_EQ(optimistic_read(u8), 0xab);
  EXPECT_EQ(optimistic_read(u16), 0xabcd);
  EXPECT_EQ(optimistic_read(u32), 0xabcdef01u);
  EXPECT_EQ(optimistic_read(u64), 0x0123456789abcdefull);
  EXPECT_EQ(optimistic_read(f64), 2.5);
  EXPECT_EQ(optimistic_read(ptr), &target);
  const Small s = optimistic_read(small);
  EXPECT_EQ(s.lo, 7u);
  EXPECT_EQ(s.hi, 9u);
}

// What the helpers refuse at compile time: sizes an atomic access cannot copy in one piece,
// and types aligned below their size (atomic_ref would be undefined on them).
struct ThreeBytes {
  unsigned char b[3];
};
struct Wide {
  std::uint64_t a, b;
};
struct UnderAligned {
  std::uint32_t lo, hi;
};
static_assert(OptimisticField<std::uint64_t>);
static_assert(OptimisticField<const char*>);
static_assert(!OptimisticField<ThreeBytes>);
static_assert(!OptimisticField<Wide>);
static_assert(!OptimisticField<UnderAligned>);

}  // namespace
}  // namespace pmindex::sync

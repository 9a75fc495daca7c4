// Unit tests of the spin locks: the test-and-test-and-set SpinLock (Lockable) and the
// reader-writer SharedSpinLock (SharedLockable): their semantics and mutual exclusion (a plain
// counter incremented under the lock; TSan reports a race if exclusion or the release/acquire
// pairing is broken, and the total is off if increments are lost).
#include "pmindex/sync/spin_lock.h"
#include "pmindex/sync/shared_spin_lock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

namespace pmindex::sync {
namespace {

TEST(SpinLock, TryLockSucceedsOnlyWhenFree) {
  SpinLock lock;
  EXPECT_FALSE(lock.is_locked());
  ASSERT_TRUE(lock.try_lock());
  EXPECT_TRUE(lock.is_locked());
  EXPECT_FALSE(lock.try_lock());
  lock.unlock();
  EXPECT_FALSE(lock.is_locked());
  EXPECT_TRUE(lock.try_lock());
  lock.unlock();
}

TEST(SpinLock, WorksWithStandardLockGuards) {
  SpinLock a;
  SpinLock b;
  {
    std::lock_guard<SpinLock> guard(a);
    EXPECT_TRUE(a.is_locked());
  }
  EXPECT_FALSE(a.is_locked());
  {
    std::scoped_lock both(a, b);  // needs try_lock (std::lock's deadlock avoidance)
    EXPECT_TRUE(a.is_locked());
    EXPECT_TRUE(b.is_locked());
  }
  EXPECT_FALSE(a.is_locked());
  EXPECT_FALSE(b.is_locked());
  std::unique_lock<SpinLock> later(a, std::try_to_lock);
  EXPECT_TRUE(later.owns_lock());
}

TEST(SpinLock, TryLockFromAnotherThreadFailsWhileHeld) {
  SpinLock lock;
  lock.lock();
  bool got = true;
  std::thread other([&] { got = lock.try_lock(); });
  other.join();
  EXPECT_FALSE(got);
  lock.unlock();
}

// Exclusion and publication of the exclusive spin lock.
template <class Lock>
class ExclusiveSpinLock : public ::testing::Test {};
using ExclusiveLocks = ::testing::Types<SpinLock>;
TYPED_TEST_SUITE(ExclusiveSpinLock, ExclusiveLocks);

TYPED_TEST(ExclusiveSpinLock, ExcludesAndPublishesBetweenThreads) {
  constexpr int kThreads = 4;
  constexpr std::uint64_t kIncrements = 20000;
  TypeParam lock;
  std::uint64_t counter = 0;  // plain: protected by the lock only
  std::uint64_t holders = 0;  // more than 1 inside means exclusion failed
  std::atomic<std::uint64_t> overlaps{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (std::uint64_t i = 0; i < kIncrements; ++i) {
        std::lock_guard<TypeParam> guard(lock);
        if (++holders != 1) overlaps.fetch_add(1, std::memory_order_relaxed);
        ++counter;
        --holders;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(overlaps.load(), 0u);
  EXPECT_EQ(counter, kThreads * kIncrements);
}

TEST(SharedSpinLock, ReadersShareWritersExclude) {
  SharedSpinLock lock;
  ASSERT_TRUE(lock.try_lock_shared());
  ASSERT_TRUE(lock.try_lock_shared());  // a second reader joins
  EXPECT_FALSE(lock.try_lock());        // no writer while readers hold it
  lock.unlock_shared();
  EXPECT_FALSE(lock.try_lock());
  lock.unlock_shared();
  ASSERT_TRUE(lock.try_lock());
  EXPECT_FALSE(lock.try_lock_shared());  // no reader while a writer holds it
  EXPECT_FALSE(lock.try_lock());
  lock.unlock();
  {
    std::shared_lock<SharedSpinLock> r(lock);
    EXPECT_FALSE(lock.try_lock());
  }
  {
    std::unique_lock<SharedSpinLock> w(lock);
    EXPECT_FALSE(lock.try_lock_shared());
  }
  EXPECT_TRUE(lock.try_lock());
  lock.unlock();
}

// A waiting writer holds new readers off, so readers that keep coming cannot starve it.
TEST(SharedSpinLock, WaitingWriterHoldsNewReadersOff) {
  SharedSpinLock lock;
  lock.lock_shared();
  std::atomic<bool> written{false};
  std::thread writer([&] {
    lock.lock();
    written.store(true);
    lock.unlock();
  });
  // Once the writer announced itself, a new reader is refused although only readers hold it.
  bool refused = false;
  for (int i = 0; i < 1000000 && !refused; ++i) {
    if (lock.try_lock_shared()) {
      lock.unlock_shared();
      std::this_thread::yield();
    } else {
      refused = true;
    }
  }
  EXPECT_TRUE(refused) << "a new reader joined past a waiting writer";
  EXPECT_FALSE(written.load());
  lock.unlock_shared();
  writer.join();
  EXPECT_TRUE(written.load());
}

// Writers increment a plain counter; readers check that no writer is inside while they are.
TEST(SharedSpinLock, ExcludesAndPublishesBetweenThreads) {
  constexpr std::uint64_t kIncrements = 20000;
  SharedSpinLock lock;
  std::uint64_t counter = 0;                 // plain: written under the writer lock only
  std::atomic<std::uint64_t> writers{0};     // writers inside the lock
  std::atomic<std::uint64_t> overlaps{0};    // a reader or writer that saw another writer
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      for (std::uint64_t i = 0; i < kIncrements; ++i) {
        std::unique_lock<SharedSpinLock> w(lock);
        if (writers.fetch_add(1) != 0) overlaps.fetch_add(1);
        ++counter;
        writers.fetch_sub(1);
      }
    });
    threads.emplace_back([&] {
      std::uint64_t last = 0;
      for (std::uint64_t i = 0; i < kIncrements; ++i) {
        std::shared_lock<SharedSpinLock> r(lock);
        if (writers.load() != 0) overlaps.fetch_add(1);
        if (counter < last) overlaps.fetch_add(1);  // a reader must never see the count go back
        last = counter;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(overlaps.load(), 0u);
  EXPECT_EQ(counter, 2 * kIncrements);
}

}  // namespace
}  // namespace pmindex::sync

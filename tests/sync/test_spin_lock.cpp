// Unit tests of the test-and-test-and-set spin lock: Lockable semantics and mutual exclusion
// (a plain counter incremented under the lock; TSan reports a race if exclusion or the
// release/acquire pairing is broken, and the total is off if increments are lost).
#include "pmindex/sync/spin_lock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <mutex>
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

TEST(SpinLock, ExcludesAndPublishesBetweenThreads) {
  constexpr int kThreads = 4;
  constexpr std::uint64_t kIncrements = 20000;
  SpinLock lock;
  std::uint64_t counter = 0;  // plain: protected by the lock only
  std::uint64_t holders = 0;  // more than 1 inside means exclusion failed
  std::atomic<std::uint64_t> overlaps{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (std::uint64_t i = 0; i < kIncrements; ++i) {
        std::lock_guard<SpinLock> guard(lock);
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

}  // namespace
}  // namespace pmindex::sync

// Stress tests of the sync primitives (label `stress`; CI runs them under TSan). Each test is
// time-boxed by PMINDEX_STRESS_SECONDS (default 2).
//
//  OptimisticLockStress  writers keep two fields equal under the lock (some through the
//                        writeLock verb, some by upgrading a read version); readers validate
//                        and must never accept an unequal pair, and the final pair must equal
//                        the number of committed increments (no lost update).
//  EpochStress           readers pin and read a shared object; swappers replace it and retire
//                        the old one; short-lived threads come and go doing the same. The
//                        deleter poisons a canary before freeing (readers check it; ASan
//                        catches reads of freed memory; TSan a missing happens-before), and a
//                        FreeTracker checks that every retired object is freed exactly once.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pmindex/sync/epoch.h"
#include "pmindex/sync/optimistic_lock.h"
#include "pmindex/sync/spin_lock.h"

namespace pmindex::sync {
namespace {

using Clock = std::chrono::steady_clock;

Clock::duration stress_duration() {
  double seconds = 2.0;
  if (const char* env = std::getenv("PMINDEX_STRESS_SECONDS")) {
    char* end = nullptr;
    const double parsed = std::strtod(env, &end);
    if (end != env && parsed > 0) seconds = parsed;
  }
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// Set by the main thread when the time box is over. relaxed: only a stop signal; the joins
// order everything the workers did before the main thread checks it.
class StopFlag {
 public:
  void stop() { stop_.store(true, std::memory_order_relaxed); }
  bool stopped() const { return stop_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> stop_{false};
};

// --- optimistic lock -----------------------------------------------------------------------------

struct GuardedPair {
  OptimisticLock lock;
  std::uint64_t a = 0;  // a == b whenever the lock is free
  std::uint64_t b = 0;
};

// One increment of both fields under the lock. The pause between the two stores widens the
// window in which the pair is unequal, so readers do meet torn pairs.
void write_pair(GuardedPair& pair, std::uint64_t next) {
  locked_write(pair.a, next);
  for (int i = 0; i < 8; ++i) _mm_pause();
  locked_write(pair.b, next);
}

TEST(OptimisticLockStress, ReadersNeverValidateATornPair) {
  GuardedPair pair;
  StopFlag stop;
  std::atomic<std::uint64_t> committed{0};      // increments done by writers
  std::atomic<std::uint64_t> validated{0};      // reads that passed validation
  std::atomic<std::uint64_t> torn_accepted{0};  // must stay 0
  std::atomic<std::uint64_t> torn_rejected{0};  // torn pairs caught by validation
  std::atomic<std::uint64_t> went_back{0};      // must stay 0: a reader saw time go backwards

  auto writer = [&](bool use_upgrade) {
    std::uint64_t mine = 0;
    while (!stop.stopped()) {
      bool restart = false;
      if (use_upgrade) {
        std::uint64_t v = pair.lock.readLockOrRestart(restart);
        const std::uint64_t a = optimistic_read(pair.a);
        pair.lock.upgradeToWriteLockOrRestart(v, restart);
        if (restart) continue;
        write_pair(pair, a + 1);  // `a` is valid: the upgrade validated it
      } else {
        pair.lock.writeLockOrRestart(restart);
        if (restart) continue;
        write_pair(pair, pair.a + 1);  // plain read: we hold the lock
      }
      pair.lock.writeUnlock();
      ++mine;
      // Outside the lock, so that readers get in between writes (else they mostly wait).
      for (int i = 0; i < 64; ++i) _mm_pause();
    }
    committed.fetch_add(mine, std::memory_order_relaxed);
  };

  auto reader = [&] {
    std::uint64_t last = 0, ok = 0, rejected = 0;
    while (!stop.stopped()) {
      bool restart = false;
      const std::uint64_t v = pair.lock.readLockOrRestart(restart);
      const std::uint64_t a = optimistic_read(pair.a);
      const std::uint64_t b = optimistic_read(pair.b);
      pair.lock.checkOrRestart(v, restart);
      if (restart) {
        if (a != b) ++rejected;
        continue;
      }
      ++ok;
      if (a != b) torn_accepted.fetch_add(1, std::memory_order_relaxed);
      if (a < last) went_back.fetch_add(1, std::memory_order_relaxed);
      last = a;
    }
    validated.fetch_add(ok, std::memory_order_relaxed);
    torn_rejected.fetch_add(rejected, std::memory_order_relaxed);
  };

  std::vector<std::thread> threads;
  threads.emplace_back(writer, false);
  threads.emplace_back(writer, true);
  threads.emplace_back(reader);
  threads.emplace_back(reader);
  std::this_thread::sleep_for(stress_duration());
  stop.stop();
  for (auto& t : threads) t.join();

  EXPECT_EQ(torn_accepted.load(), 0u);
  EXPECT_EQ(went_back.load(), 0u);
  EXPECT_EQ(pair.a, pair.b);
  EXPECT_EQ(pair.a, committed.load());
  EXPECT_GT(committed.load(), 0u);
  EXPECT_GT(validated.load(), 0u);  // the check above was exercised
  std::printf("optimistic lock: %llu commits, %llu validated reads, %llu torn pairs rejected\n",
              static_cast<unsigned long long>(committed.load()),
              static_cast<unsigned long long>(validated.load()),
              static_cast<unsigned long long>(torn_rejected.load()));
}

// --- epoch-based reclamation ----------------------------------------------------------------------

// Counts frees per object id and reports doubles and misses.
class FreeTracker {
 public:
  explicit FreeTracker(std::size_t capacity)
      : counts_(std::make_unique<std::atomic<std::uint32_t>[]>(capacity)), capacity_(capacity) {}

  std::size_t capacity() const { return capacity_; }

  // Returns false if `id` was already freed (a double free).
  bool on_free(std::uint64_t id) {
    return counts_[id].fetch_add(1, std::memory_order_relaxed) == 0;
  }

  // Ids in [0, created) other than `live` must have been freed exactly once, `live` never.
  // Returns "" or a description of the first mismatch.
  std::string check(std::uint64_t created, std::uint64_t live) const {
    for (std::uint64_t id = 0; id < created; ++id) {
      const std::uint32_t n = counts_[id].load(std::memory_order_relaxed);
      const std::uint32_t want = id == live ? 0 : 1;
      if (n != want) {
        return "object " + std::to_string(id) + " freed " + std::to_string(n) +
               " times, expected " + std::to_string(want);
      }
    }
    return "";
  }

 private:
  std::unique_ptr<std::atomic<std::uint32_t>[]> counts_;
  std::size_t capacity_;
};

TEST(FreeTracker, FlagsDoubleAndMissingFrees) {
  FreeTracker tracker(4);
  EXPECT_TRUE(tracker.on_free(0));
  EXPECT_TRUE(tracker.on_free(2));
  EXPECT_EQ(tracker.check(3, 1), "");
  EXPECT_FALSE(tracker.on_free(2));  // double
  EXPECT_NE(tracker.check(3, 1), "");
  FreeTracker missing(4);
  EXPECT_TRUE(missing.on_free(0));
  EXPECT_NE(missing.check(3, 1), "");  // 2 never freed
  EXPECT_TRUE(missing.on_free(1));
  EXPECT_NE(missing.check(2, 1), "");  // the live object was freed
}

constexpr std::uint64_t kAlive = 0xA11CE5A11CE5A11Cull;
constexpr std::uint64_t kDead = 0xDEADDEADDEADDEADull;

struct SharedObject {
  std::uint64_t canary = kAlive;  // plain fields: readers' accesses race with the deleter's
  std::uint64_t id = 0;           // writes unless reclamation orders them (TSan checks)
  std::uint64_t payload = 0;      // id * 3
  FreeTracker* tracker = nullptr;
  std::atomic<std::uint64_t>* bad_frees = nullptr;
};

void free_shared_object(void* ctx, std::uint64_t /*arg*/) {
  auto* object = static_cast<SharedObject*>(ctx);
  if (object->canary != kAlive || !object->tracker->on_free(object->id)) {
    object->bad_frees->fetch_add(1, std::memory_order_relaxed);
  }
  object->canary = kDead;
  delete object;
}

// One EpochStress run's world: the shared object (published with release, read with acquire, so
// readers see its initialised fields), the ids handed out, and the tallies the checks read. The
// thread bodies run until `stop`; the EpochManager under test is passed in, so that the checks
// after its destruction can still read the tallies.
class EpochWorld {
 public:
  static constexpr std::size_t kMaxObjects = 4'000'000;

  EpochWorld() : tracker_(kMaxObjects), current_(make_object()) {}

  // Pins and reads the shared object until stopped.
  void reader(EpochManager& epochs, const StopFlag& stop) {
    auto me = epochs.attach();
    std::uint64_t n = 0, bad = 0;
    while (!stop.stopped()) {
      auto guard = me.pin();
      const SharedObject* object = current_.load(std::memory_order_acquire);
      if (object->canary != kAlive || object->payload != object->id * 3) ++bad;
      ++n;
    }
    reads_.fetch_add(n, std::memory_order_relaxed);
    bad_reads_.fetch_add(bad, std::memory_order_relaxed);
  }

  // Swaps on one pin in four and reads on the others, so the id space lasts the time box.
  void swapper(EpochManager& epochs, const StopFlag& stop) {
    auto me = epochs.attach();
    for (std::uint64_t i = 0; !stop.stopped(); ++i) {
      auto guard = me.pin();
      const SharedObject* object = current_.load(std::memory_order_acquire);
      if (object->canary != kAlive) bad_reads_.fetch_add(1, std::memory_order_relaxed);
      if (i % 4 == 0 && !swap_once(guard)) break;
    }
  }

  // Short-lived threads: attach (sometimes only through pin()), swap a little, read a little,
  // exit with items still pending, which the manager must take over.
  void churner(EpochManager& epochs, const StopFlag& stop) {
    std::uint64_t round = 0;
    while (!stop.stopped()) {
      std::thread([&, round] { churn_once(epochs, stop, round); }).join();
      ++round;
    }
    churn_threads_.store(round, std::memory_order_relaxed);
  }

  std::uint64_t reads() const { return reads_.load(); }
  std::uint64_t churn_threads() const { return churn_threads_.load(); }

  // After the manager is gone (every retired object freed): no bad read or free, every object
  // but the live one freed exactly once. Frees the live object.
  void check_and_free_live() {
    const std::uint64_t created = std::min<std::uint64_t>(next_id_.load(), kMaxObjects);
    SharedObject* live = current_.load(std::memory_order_relaxed);
    EXPECT_EQ(bad_reads_.load(), 0u);
    EXPECT_EQ(bad_frees_.load(), 0u);
    EXPECT_EQ(tracker_.check(created, live->id), "");
    delete live;
  }

 private:
  SharedObject* make_object() {
    const std::uint64_t id = next_id_.fetch_add(1, std::memory_order_relaxed);
    if (id >= kMaxObjects) return nullptr;
    auto* object = new SharedObject;
    object->id = id;
    object->payload = id * 3;
    object->tracker = &tracker_;
    object->bad_frees = &bad_frees_;
    return object;
  }

  // Replaces the shared object once; false when the id space is used up.
  template <class Retirer>
  bool swap_once(Retirer& retire_into) {
    SharedObject* fresh = make_object();
    if (fresh == nullptr) return false;
    SharedObject* old = current_.exchange(fresh, std::memory_order_acq_rel);
    retire_into.retire(old, &free_shared_object, 0);
    return true;
  }

  // One short-lived thread's work: even rounds retire through their pin, odd rounds unpinned
  // through the manager's thread lookup (an orphan here).
  void churn_once(EpochManager& epochs, const StopFlag& stop, std::uint64_t round) {
    for (int i = 0; i < 50 && !stop.stopped(); ++i) {
      auto guard = epochs.pin();  // self-attaching pin
      const SharedObject* object = current_.load(std::memory_order_acquire);
      if (object->canary != kAlive) bad_reads_.fetch_add(1, std::memory_order_relaxed);
      if (round % 2 == 0) {
        if (!swap_once(guard)) break;
      } else if (!swap_once(epochs)) {
        break;
      }
    }
  }

  FreeTracker tracker_;
  std::atomic<std::uint64_t> bad_frees_{0};
  std::atomic<std::uint64_t> bad_reads_{0};
  std::atomic<std::uint64_t> next_id_{0};
  std::atomic<std::uint64_t> reads_{0};
  std::atomic<std::uint64_t> churn_threads_{0};
  std::atomic<SharedObject*> current_;
};

TEST(EpochStress, NoReaderSeesAFreedObjectAndEveryObjectIsFreedOnce) {
  EpochWorld world;
  StopFlag stop;
  {
    EpochManager epochs;
    std::vector<std::thread> threads;
    threads.emplace_back([&] { world.reader(epochs, stop); });
    threads.emplace_back([&] { world.reader(epochs, stop); });
    threads.emplace_back([&] { world.swapper(epochs, stop); });
    threads.emplace_back([&] { world.churner(epochs, stop); });
    std::this_thread::sleep_for(stress_duration());
    stop.stop();
    for (auto& t : threads) t.join();

    // Every thread has detached: all pending items are orphans, and drain frees them all.
    epochs.drain();
    const auto s = epochs.stats();
    EXPECT_EQ(s.attached, 0u);
    EXPECT_EQ(s.pending(), 0u);
    EXPECT_EQ(s.retired, s.freed);
    std::printf("epoch: %llu reads, %llu objects retired, %llu churn threads, epoch %llu, "
                "%llu records\n",
                static_cast<unsigned long long>(world.reads()),
                static_cast<unsigned long long>(s.retired),
                static_cast<unsigned long long>(world.churn_threads()),
                static_cast<unsigned long long>(s.epoch),
                static_cast<unsigned long long>(s.records));
    EXPECT_GT(world.reads(), 0u);
    EXPECT_GT(s.retired, 0u);
  }
  world.check_and_free_live();
}

// Spin-lock protected counter under contention, with more threads than cores so that lock
// holders get preempted (the backoff must yield for this to finish quickly).
TEST(SpinLockStress, CounterUnderOversubscription) {
  SpinLock lock;
  std::uint64_t counter = 0;
  std::atomic<std::uint64_t> done{0};
  StopFlag stop;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      std::uint64_t mine = 0;
      while (!stop.stopped()) {
        std::lock_guard<SpinLock> guard(lock);
        ++counter;
        ++mine;
      }
      done.fetch_add(mine, std::memory_order_relaxed);
    });
  }
  std::this_thread::sleep_for(stress_duration() / 2);
  stop.stop();
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter, done.load());
  EXPECT_GT(counter, 0u);
}

}  // namespace
}  // namespace pmindex::sync

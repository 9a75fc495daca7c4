// Unit tests of epoch-based reclamation: when deleters may and may not run, nested pins,
// registration at the first pin, threads that leave (thread exit), the orphan list, several
// managers per thread, managers destroyed while their threads live on, and the contract
// checks that abort.
#include "pmindex/sync/epoch.h"

#include "pmindex/sync/asymmetric_fence.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <thread>
#include <vector>

namespace pmindex::sync {
namespace {

using Participant = EpochManager::Participant;

// Deleter that counts its runs; ctx is the counter. atomic: deleters may run on any thread.
void count_run(void* ctx, std::uint64_t /*arg*/) {
  static_cast<std::atomic<int>*>(ctx)->fetch_add(1, std::memory_order_relaxed);
}

// Deleter that counts runs per item: ctx is a vector<int>, arg the item's index.
void count_run_of(void* ctx, std::uint64_t arg) { ++(*static_cast<std::vector<int>*>(ctx))[arg]; }

int runs(const std::atomic<int>& counter) { return counter.load(std::memory_order_relaxed); }

TEST(Epoch, RetiredItemWaitsForTwoAdvances) {
  EpochManager epochs;
  auto me = epochs.attach();
  std::atomic<int> freed{0};
  me.retire(&freed, &count_run, 0);
  EXPECT_EQ(runs(freed), 0);  // a retire alone never frees (bag below capacity)

  // The first collect tags the item with the current epoch and advances once: not yet safe.
  const std::uint64_t start = epochs.epoch();
  EXPECT_EQ(epochs.collect(), 0u);
  EXPECT_EQ(runs(freed), 0);
  EXPECT_EQ(epochs.epoch(), start + 1);
  // The second advance makes it safe.
  EXPECT_EQ(epochs.collect(), 1u);
  EXPECT_EQ(runs(freed), 1);
  EXPECT_EQ(epochs.stats().pending(), 0u);
}

TEST(Epoch, OwnPinHoldsReclamationBack) {
  EpochManager epochs;
  auto me = epochs.attach();
  std::atomic<int> freed{0};
  const std::uint64_t start = epochs.epoch();
  {
    auto guard = me.pin();
    EXPECT_TRUE(epochs.pinned_here());
    guard.retire(&freed, &count_run, 0);
    for (int i = 0; i < 10; ++i) epochs.collect();
    EXPECT_EQ(runs(freed), 0);
    // Pinned at `start`: one advance is allowed, the next must wait for us.
    EXPECT_EQ(epochs.epoch(), start + 1);
    EXPECT_FALSE(epochs.try_advance());
  }
  EXPECT_FALSE(epochs.pinned_here());
  EXPECT_EQ(epochs.drain(), 1u);
  EXPECT_EQ(runs(freed), 1);
}

TEST(Epoch, AnotherThreadsPinHoldsReclamationBack) {
  EpochManager epochs;
  std::atomic<bool> pinned{false};
  std::atomic<bool> release{false};
  std::thread reader([&] {
    auto me = epochs.attach();
    auto guard = me.pin();
    pinned.store(true, std::memory_order_release);
    while (!release.load(std::memory_order_acquire)) std::this_thread::yield();
  });
  while (!pinned.load(std::memory_order_acquire)) std::this_thread::yield();

  std::atomic<int> freed{0};
  epochs.retire(&freed, &count_run, 0);  // main is not attached: the unattached bag
  for (int i = 0; i < 10; ++i) epochs.collect();
  EXPECT_EQ(runs(freed), 0);
  EXPECT_EQ(epochs.drain(), 0u);  // drain is safe even when misused: still nothing freed
  EXPECT_EQ(runs(freed), 0);

  release.store(true, std::memory_order_release);
  reader.join();  // its exit hands its (empty) record back
  epochs.drain();
  EXPECT_EQ(runs(freed), 1);
}

TEST(Epoch, NestedPinsAreCounted) {
  EpochManager epochs;
  auto me = epochs.attach();
  std::atomic<int> freed{0};
  {
    auto outer = me.pin();
    {
      auto inner = epochs.pin();  // finds the thread's registration: same record, depth 2
      inner.retire(&freed, &count_run, 0);
      EXPECT_EQ(epochs.stats().attached, 1u);
      EXPECT_EQ(epochs.stats().records, 1u);
    }
    EXPECT_TRUE(epochs.pinned_here());  // the outer guard still pins
    for (int i = 0; i < 5; ++i) epochs.collect();
    EXPECT_EQ(runs(freed), 0);
  }
  EXPECT_FALSE(epochs.pinned_here());
  epochs.drain();
  EXPECT_EQ(runs(freed), 1);
}

// try_pin_flat (a leaf function's pin, issue 16) pins like pin() in the common case: the
// announcement holds reclamation back exactly as a Guard's does.
TEST(Epoch, FlatPinHoldsReclamationBack) {
  if (!AsymmetricFence::light_skips_fence()) GTEST_SKIP() << "flat pins need membarrier";
  EpochManager epochs;
  { auto first = epochs.pin(); }  // registers the thread and makes this manager its last
  std::atomic<int> freed{0};
  const std::uint64_t start = epochs.epoch();
  const auto flat = epochs.try_pin_flat();
  ASSERT_TRUE(flat);
  EXPECT_TRUE(epochs.pinned_here());
  std::thread([&] { epochs.retire(&freed, &count_run, 0); }).join();  // an orphan
  for (int i = 0; i < 10; ++i) epochs.collect();
  EXPECT_EQ(runs(freed), 0);
  EXPECT_EQ(epochs.epoch(), start + 1);  // pinned at `start`: one advance, then it waits
  EXPECT_FALSE(epochs.try_advance());
  EXPECT_TRUE(epochs.unpin_flat(flat));  // the orphan is pending: the caller must finish
  epochs.after_unpin_flat(flat);
  EXPECT_FALSE(epochs.pinned_here());
  epochs.drain();
  EXPECT_EQ(runs(freed), 1);
  const auto again = epochs.try_pin_flat();  // nothing pending now: the common case
  ASSERT_TRUE(again);
  EXPECT_FALSE(epochs.unpin_flat(again));
}

// Wherever pin() has work beyond the common case, try_pin_flat declines and changes nothing.
TEST(Epoch, FlatPinDeclinesOutsideTheCommonCase) {
  if (!AsymmetricFence::light_skips_fence()) GTEST_SKIP() << "flat pins need membarrier";
  EpochManager epochs;
  EXPECT_FALSE(epochs.try_pin_flat());  // never pinned here: not registered
  EXPECT_FALSE(epochs.pinned_here());
  { auto first = epochs.pin(); }
  {
    auto outer = epochs.pin();
    EXPECT_FALSE(epochs.try_pin_flat());  // nested: pin() counts it
    EXPECT_TRUE(epochs.pinned_here());
  }
  EXPECT_FALSE(epochs.pinned_here());
  EpochManager other;
  { auto g = other.pin(); }  // the thread's last manager is another one: a cache miss
  EXPECT_FALSE(epochs.try_pin_flat());
  EXPECT_FALSE(epochs.pinned_here());
  { auto g = epochs.pin(); }
  const auto flat = epochs.try_pin_flat();
  ASSERT_TRUE(flat);
  EXPECT_FALSE(epochs.unpin_flat(flat));
  EXPECT_FALSE(epochs.pinned_here());
}

TEST(Epoch, FirstPinRegistersTheThreadForGood) {
  EpochManager epochs;
  std::atomic<int> freed{0};
  EXPECT_EQ(epochs.stats().attached, 0u);
  {
    auto guard = epochs.pin();
    EXPECT_TRUE(epochs.pinned_here());
    EXPECT_EQ(epochs.stats().attached, 1u);
    guard.retire(&freed, &count_run, 0);
  }
  EXPECT_FALSE(epochs.pinned_here());
  EXPECT_EQ(epochs.stats().attached, 1u);  // no detach per operation: still registered
  for (int i = 0; i < 100; ++i) {
    auto guard = epochs.pin();  // the thread-local cache finds the same record
  }
  EXPECT_EQ(epochs.stats().records, 1u);
  EXPECT_EQ(epochs.stats().pending(), 1u);  // the item stays with the thread
  EXPECT_EQ(runs(freed), 0);
  EXPECT_EQ(epochs.drain(), 1u);
  EXPECT_EQ(runs(freed), 1);
}

TEST(Epoch, ThreadExitHandsItsItemsOver) {
  EpochManager epochs;
  std::atomic<int> freed{0};
  std::thread worker([&] {
    auto guard = epochs.pin();  // registers; no Participant anywhere
    for (int i = 0; i < 10; ++i) guard.retire(&freed, &count_run, 0);
  });
  worker.join();  // its thread_local destructor has run: the record is free again
  const auto s = epochs.stats();
  EXPECT_EQ(s.attached, 0u);
  EXPECT_EQ(s.retired, 10u);
  EXPECT_EQ(s.pending(), 10u);  // handed over, not run (a thread's exit runs no deleter)
  epochs.collect();
  epochs.collect();  // two advances later the orphans are safe
  EXPECT_EQ(runs(freed), 10);
  EXPECT_EQ(epochs.stats().pending(), 0u);
}

// A thread that retires but never pins (an index whose writers take no pin: FPTree with
// integer keys) stays unregistered, and the retire that fills the unattached bag collects: at
// most the bag and two sealed batches wait. Before, each such retire paid a heavy fence and
// joined the orphans, freed only by another thread's collect or a pool_full reclaim: FPTree's
// leaves piled up to a full pool (issue 19).
TEST(Epoch, RetiresWithoutPinsAreFreedByTheRetiringThread) {
  EpochManager epochs;
  std::atomic<int> freed{0};
  constexpr int kBag = static_cast<int>(EpochManager::kBagCapacity);
  constexpr int kItems = 10 * kBag;
  std::thread([&] {
    for (int i = 0; i < kItems; ++i) epochs.retire(&freed, &count_run, 0);
    EXPECT_EQ(epochs.stats().attached, 0u);  // no registration
    EXPECT_FALSE(epochs.pinned_here());
    EXPECT_GE(runs(freed), kItems - 3 * kBag);
  }).join();
  epochs.drain();
  EXPECT_EQ(runs(freed), kItems);
}

// A background thread that retires a few items unregistered and then idles (PACTree's
// updater, DPTree's merge thread) leaves them in the unattached bag, not in a bag only it may
// touch: another thread's collects (a pool_full reclaim: three) seal and free them while it
// lives on.
TEST(Epoch, AnyCollectFreesAnIdleThreadsUnattachedItems) {
  EpochManager epochs;
  std::atomic<int> freed{0};
  std::atomic<bool> retired{false};
  std::atomic<bool> stop{false};
  std::thread idle([&] {
    for (int i = 0; i < 7; ++i) epochs.retire(&freed, &count_run, 0);
    retired.store(true, std::memory_order_release);
    while (!stop.load(std::memory_order_acquire)) std::this_thread::yield();
  });
  while (!retired.load(std::memory_order_acquire)) std::this_thread::yield();
  EXPECT_EQ(epochs.stats().pending(), 7u);
  { auto guard = epochs.pin(); }  // registers the caller; it collects unpinned
  for (int i = 0; i < 3; ++i) epochs.collect();
  EXPECT_EQ(runs(freed), 7);
  EXPECT_EQ(epochs.stats().pending(), 0u);
  stop.store(true, std::memory_order_release);
  idle.join();
}

// A participant kept in thread-local storage is destroyed at thread exit.
thread_local std::optional<Participant> tls_participant;

TEST(Epoch, ThreadLocalParticipantIsReleasedAtThreadExit) {
  EpochManager epochs;
  std::atomic<int> freed{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < 3; ++t) {
    workers.emplace_back([&] {
      tls_participant.emplace(epochs.attach());
      auto guard = tls_participant->pin();
      for (int i = 0; i < 5; ++i) guard.retire(&freed, &count_run, 0);
    });  // exits with the participant still attached
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(epochs.stats().attached, 0u);
  epochs.drain();
  EXPECT_EQ(runs(freed), 15);
}

TEST(Epoch, RecordsAreReusedByLaterThreads) {
  EpochManager epochs;
  for (int t = 0; t < 5; ++t) {
    std::thread([&] {
      auto me = epochs.attach();
      auto guard = me.pin();
    }).join();
  }
  EXPECT_EQ(epochs.stats().records, 1u);
}

TEST(Epoch, AttachTwiceSharesOneRegistration) {
  EpochManager epochs;
  auto first = epochs.attach();
  {
    auto second = epochs.attach();
    EXPECT_EQ(epochs.stats().attached, 1u);
  }
  EXPECT_EQ(epochs.stats().attached, 1u);
  first.detach();  // drops the handle only
  EXPECT_FALSE(first.attached());
  EXPECT_EQ(epochs.stats().attached, 1u);
  EXPECT_EQ(epochs.stats().records, 1u);
}

TEST(Epoch, EveryDeleterRunsExactlyOnce) {
  constexpr std::size_t kItems = 4 * EpochManager::kBagCapacity;  // several bags and collects
  std::vector<int> ran(kItems, 0);
  {
    EpochManager epochs;
    auto me = epochs.attach();
    for (std::size_t i = 0; i < kItems; ++i) {
      auto guard = me.pin();
      guard.retire(&ran, &count_run_of, i);
    }
    EXPECT_GT(epochs.stats().freed, 0u);  // unpins collected on the way
    epochs.drain();
    const auto s = epochs.stats();
    EXPECT_EQ(s.retired, kItems);
    EXPECT_EQ(s.freed, kItems);
  }
  for (std::size_t i = 0; i < kItems; ++i) ASSERT_EQ(ran[i], 1) << "item " << i;
}

TEST(Epoch, UnpinnedRetiresCollectWhenTheBagIsFull) {
  EpochManager epochs;
  auto me = epochs.attach();
  std::atomic<int> freed{0};
  const std::uint64_t start = epochs.epoch();
  for (std::size_t i = 0; i < EpochManager::kBagCapacity; ++i) me.retire(&freed, &count_run, 0);
  EXPECT_GT(epochs.epoch(), start);
}

TEST(Epoch, DestructorRunsPendingDeleters) {
  std::atomic<int> freed{0};
  {
    EpochManager epochs;
    auto me = epochs.attach();
    auto guard = me.pin();
    for (int i = 0; i < 3; ++i) guard.retire(&freed, &count_run, 0);
    epochs.retire(&freed, &count_run, 0);  // through the thread lookup
    // Unregistered: the unattached bag, never sealed (the destructor runs it all the same).
    std::thread([&] { epochs.retire(&freed, &count_run, 0); }).join();
    EXPECT_EQ(runs(freed), 0);
  }  // guard, participant, then the manager
  EXPECT_EQ(runs(freed), 5);
}

TEST(Epoch, RetireFunctionAndDelete) {
  struct Tracked {
    explicit Tracked(std::atomic<int>* d) : destroyed(d) {}
    ~Tracked() { destroyed->fetch_add(1, std::memory_order_relaxed); }
    std::atomic<int>* destroyed;
  };
  std::atomic<int> destroyed{0};
  std::atomic<int> called{0};
  {
    EpochManager epochs;
    auto me = epochs.attach();
    auto guard = me.pin();
    guard.retire_delete(new Tracked(&destroyed));
    guard.retire([&called] { called.fetch_add(1, std::memory_order_relaxed); });
    epochs.retire_delete(new Tracked(&destroyed));
    epochs.retire(std::function<void()>([&called] { called.fetch_add(1); }));
  }
  EXPECT_EQ(runs(destroyed), 2);
  EXPECT_EQ(runs(called), 2);
}

TEST(Epoch, DeleterMayRetireMore) {
  struct Context {
    EpochManager* epochs;
    std::atomic<int> freed{0};
  };
  EpochManager epochs;
  Context ctx{&epochs};
  auto chained = [](void* c, std::uint64_t depth) {
    auto* context = static_cast<Context*>(c);
    context->freed.fetch_add(1, std::memory_order_relaxed);
    if (depth > 0) {
      context->epochs->retire(c, +[](void* c2, std::uint64_t d2) {
        static_cast<Context*>(c2)->freed.fetch_add(1, std::memory_order_relaxed);
        (void)d2;
      }, depth - 1);
    }
  };
  {
    auto me = epochs.attach();
    me.retire(&ctx, chained, 1);
    epochs.drain();
    EXPECT_EQ(runs(ctx.freed), 2);
  }
  // Still registered (the handle is gone, the registration is not): into the thread's bag.
  epochs.retire(&ctx, chained, 1);
  epochs.drain();
  EXPECT_EQ(runs(ctx.freed), 4);
  // From an unregistered thread: an orphan whose deleter retires more.
  std::thread([&] { epochs.retire(&ctx, chained, 1); }).join();
  epochs.drain();
  EXPECT_EQ(runs(ctx.freed), 6);
}

TEST(Epoch, TryAdvanceIsRefusedOnlyByLaggingPins) {
  EpochManager epochs;
  auto me = epochs.attach();
  EXPECT_TRUE(epochs.try_advance());  // nobody pinned
  auto guard = me.pin();
  EXPECT_TRUE(epochs.try_advance());  // pinned at the current epoch: one step is fine
  EXPECT_FALSE(epochs.try_advance());
  EXPECT_FALSE(epochs.try_advance());
}

// --- several managers, lifetimes (issues 16 and 17) -------------------------------------------

TEST(Epoch, ManyManagersPerThread) {
  // More managers than cache slots, so some share a slot and take the list on a miss.
  constexpr int kManagers = 3 * 8 + 1;
  std::vector<std::atomic<int>> freed(kManagers);  // before the managers: outlives them
  std::vector<std::unique_ptr<EpochManager>> managers;
  for (int m = 0; m < kManagers; ++m) managers.push_back(std::make_unique<EpochManager>());
  for (int round = 0; round < 3; ++round) {
    for (int m = 0; m < kManagers; ++m) {
      auto outer = managers[m]->pin();
      auto other = managers[(m + 1) % kManagers]->pin();  // pins of two managers nest freely
      outer.retire(&freed[m], &count_run, 0);
      EXPECT_TRUE(managers[m]->pinned_here());
    }
  }
  for (int m = 0; m < kManagers; ++m) {
    const auto s = managers[m]->stats();
    EXPECT_EQ(s.records, 1u) << "manager " << m;  // one registration per manager, reused
    EXPECT_EQ(s.attached, 1u) << "manager " << m;
    EXPECT_EQ(s.retired, 3u) << "manager " << m;
    EXPECT_FALSE(managers[m]->pinned_here());
  }
  // A pin of one manager does not hold another's reclamation back.
  auto held = managers[0]->pin();
  for (int m = 1; m < kManagers; ++m) {
    managers[m]->drain();
    EXPECT_EQ(runs(freed[m]), 3) << "manager " << m;
  }
  EXPECT_EQ(runs(freed[0]), 0);
}

TEST(Epoch, NewManagerAtAReusedAddressStartsUnregistered) {
  alignas(EpochManager) unsigned char storage[sizeof(EpochManager)];
  std::atomic<int> freed{0};
  auto* first = new (storage) EpochManager;
  {
    auto guard = first->pin();
    guard.retire(&freed, &count_run, 0);
  }
  first->~EpochManager();  // frees its records; this thread's cache still names the old one
  EXPECT_EQ(runs(freed), 1);
  auto* second = new (storage) EpochManager;
  ASSERT_EQ(static_cast<void*>(second), static_cast<void*>(first));
  // A stale cache hit would return the freed record (ASan: use after free).
  EXPECT_EQ(second->stats().attached, 0u);
  EXPECT_FALSE(second->pinned_here());
  {
    auto guard = second->pin();
    EXPECT_TRUE(second->pinned_here());
    guard.retire(&freed, &count_run, 0);
  }
  EXPECT_EQ(second->stats().records, 1u);
  EXPECT_EQ(second->drain(), 1u);
  second->~EpochManager();
  EXPECT_EQ(runs(freed), 2);
}

// Issue 17's shape with std::threads: they use a manager, stay alive and idle while it is
// destroyed, then use a new manager and exit.
TEST(Epoch, ManagerDestroyedWhileItsThreadsAreAliveAndIdle) {
  constexpr int kThreads = 4;
  constexpr int kItems = 50;
  std::atomic<int> freed_old{0};
  std::atomic<int> freed_new{0};
  auto old_manager = std::make_unique<EpochManager>();
  std::unique_ptr<EpochManager> new_manager;
  std::atomic<int> idle{0};
  std::atomic<bool> go_on{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto participant = old_manager->attach();  // a handle that outlives the manager
      for (int i = 0; i < kItems; ++i) {
        auto guard = (t % 2 == 0) ? old_manager->pin() : participant.pin();
        guard.retire(&freed_old, &count_run, 0);
      }
      // release: this thread's use of the old manager happens before its destruction.
      idle.fetch_add(1, std::memory_order_release);
      // acquire: the new manager is constructed; the old one is gone.
      while (!go_on.load(std::memory_order_acquire)) std::this_thread::yield();
      for (int i = 0; i < kItems; ++i) {
        auto guard = new_manager->pin();
        guard.retire(&freed_new, &count_run, 0);
      }
    });  // exits: hands over the new manager's record, skips the dead one's
  }
  while (idle.load(std::memory_order_acquire) != kThreads) std::this_thread::yield();
  EXPECT_EQ(old_manager->stats().attached, static_cast<std::uint64_t>(kThreads));
  old_manager.reset();  // threads registered, alive, not pinned: runs their items
  EXPECT_EQ(runs(freed_old), kThreads * kItems);
  new_manager = std::make_unique<EpochManager>();
  go_on.store(true, std::memory_order_release);
  for (auto& th : threads) th.join();
  EXPECT_EQ(new_manager->stats().attached, 0u);
  new_manager->drain();
  EXPECT_EQ(runs(freed_new), kThreads * kItems);
  new_manager.reset();
}

TEST(Epoch, DrainAdoptsTheItemsOfIdleThreads) {
  EpochManager epochs;
  std::atomic<int> freed{0};
  std::atomic<bool> idle{false};
  std::atomic<bool> done{false};
  std::thread worker([&] {
    {
      auto guard = epochs.pin();
      for (int i = 0; i < 7; ++i) guard.retire(&freed, &count_run, 0);
    }
    idle.store(true, std::memory_order_release);  // quiescent from here
    while (!done.load(std::memory_order_acquire)) std::this_thread::yield();
  });
  while (!idle.load(std::memory_order_acquire)) std::this_thread::yield();
  EXPECT_EQ(epochs.drain(), 7u);  // the worker is registered, alive and idle
  EXPECT_EQ(runs(freed), 7);
  EXPECT_EQ(epochs.stats().attached, 1u);
  done.store(true, std::memory_order_release);
  worker.join();
}

// Pins made by a thread_local destructor that runs after the thread's registrations were
// handed over: the record stays claimed and the manager's destructor runs its items.
struct LatePinner {
  EpochManager* epochs = nullptr;
  std::atomic<int>* freed = nullptr;
  ~LatePinner() {
    if (epochs == nullptr) return;
    auto guard = epochs->pin();
    guard.retire(freed, &count_run, 0);
  }
};
thread_local LatePinner tls_late_pinner;

TEST(Epoch, PinFromALateThreadLocalDestructor) {
  std::atomic<int> freed{0};
  {
    EpochManager epochs;
    std::thread([&] {
      tls_late_pinner.epochs = &epochs;  // constructed before the registrations: destroyed after
      tls_late_pinner.freed = &freed;
      auto guard = epochs.pin();
      guard.retire(&freed, &count_run, 0);
    }).join();
    EXPECT_EQ(epochs.stats().attached, 1u);  // the late registration, never handed over
    EXPECT_EQ(epochs.stats().pending(), 2u);
    EXPECT_EQ(runs(freed), 0);
  }  // the destructor runs the handed-over item and the late registration's
  EXPECT_EQ(runs(freed), 2);
}

using EpochDeathTest = ::testing::Test;

TEST(EpochDeathTest, DestroyingTheManagerWhilePinnedAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto* epochs = new EpochManager;
        auto guard = epochs->pin();
        delete epochs;
      },
      "still alive");
}

TEST(EpochDeathTest, DestroyingTheManagerWhileAnotherThreadIsPinnedAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto* epochs = new EpochManager;
        std::atomic<bool> pinned{false};
        std::thread([&] {
          auto guard = epochs->pin();
          pinned.store(true, std::memory_order_release);
          for (;;) std::this_thread::yield();
        }).detach();
        while (!pinned.load(std::memory_order_acquire)) std::this_thread::yield();
        delete epochs;
      },
      "still alive");
}

TEST(EpochDeathTest, ThreadExitWhilePinnedAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        EpochManager epochs;
        std::thread([&] { new EpochManager::Guard(epochs.pin()); }).join();  // leaked pin
      },
      "exited while pinned");
}

}  // namespace
}  // namespace pmindex::sync

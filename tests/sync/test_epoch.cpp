// Unit tests of epoch-based reclamation: when deleters may and may not run, nested and
// self-attaching pins, threads that leave (explicitly or at thread exit), the orphan list,
// the destructor, and the contract checks that abort.
#include "pmindex/sync/epoch.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <functional>
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
  epochs.retire(&freed, &count_run, 0);  // main is not attached: goes to the orphans
  for (int i = 0; i < 10; ++i) epochs.collect();
  EXPECT_EQ(runs(freed), 0);
  EXPECT_EQ(epochs.drain(), 0u);  // drain is safe even when misused: still nothing freed
  EXPECT_EQ(runs(freed), 0);

  release.store(true, std::memory_order_release);
  reader.join();  // its detach collects, which may already free the orphan
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

TEST(Epoch, PinWithoutParticipantAttachesForItsLifetime) {
  EpochManager epochs;
  std::atomic<int> freed{0};
  {
    auto guard = epochs.pin();
    EXPECT_TRUE(epochs.pinned_here());
    EXPECT_EQ(epochs.stats().attached, 1u);
    guard.retire(&freed, &count_run, 0);
  }
  EXPECT_FALSE(epochs.pinned_here());
  EXPECT_EQ(epochs.stats().attached, 0u);  // the item went to the orphans
  EXPECT_EQ(epochs.stats().pending(), 1u);
  EXPECT_EQ(epochs.drain(), 1u);
  EXPECT_EQ(runs(freed), 1);
}

TEST(Epoch, ThreadThatDetachesHandsItsItemsOver) {
  EpochManager epochs;
  std::atomic<int> freed{0};
  std::thread worker([&] {
    auto me = epochs.attach();
    auto guard = me.pin();
    for (int i = 0; i < 10; ++i) guard.retire(&freed, &count_run, 0);
  });
  worker.join();
  const auto s = epochs.stats();
  EXPECT_EQ(s.attached, 0u);
  EXPECT_EQ(s.retired, 10u);
  EXPECT_EQ(s.freed + s.pending(), 10u);
  epochs.drain();
  EXPECT_EQ(runs(freed), 10);
  EXPECT_EQ(epochs.stats().pending(), 0u);
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
  EXPECT_EQ(epochs.stats().attached, 1u);  // `first` still holds it
  first.detach();
  EXPECT_FALSE(first.attached());
  EXPECT_EQ(epochs.stats().attached, 0u);
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
    std::thread([&] { epochs.retire(&freed, &count_run, 0); }).join();  // an orphan
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
  epochs.retire(&ctx, chained, 1);  // unattached: orphan whose deleter adds an orphan
  epochs.drain();
  EXPECT_EQ(runs(ctx.freed), 4);
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

using EpochDeathTest = ::testing::Test;

TEST(EpochDeathTest, DestroyingTheManagerWhileAttachedAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto* epochs = new EpochManager;
        auto me = epochs->attach();
        delete epochs;
      },
      "still alive");
}

TEST(EpochDeathTest, DestroyingAParticipantOnAnotherThreadAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        EpochManager epochs;
        auto me = epochs.attach();
        std::thread([p = std::move(me)]() mutable { p.detach(); }).join();
      },
      "another thread");
}

}  // namespace
}  // namespace pmindex::sync

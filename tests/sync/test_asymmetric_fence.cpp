// AsymmetricFence: the store-buffering litmus test its argument rests on.
//
// Thread L runs `x = 1; light(); r1 = y`, thread H runs `y = 1; heavy(); r2 = x`, both
// released at once, many times. A working pair never ends an iteration with r1 = r2 = 0.
// The known-bad case replaces heavy() by a plain seq_cst fence (what a heavy side that forgot
// membarrier would be): the light side's store may then still sit in its store buffer while
// its load runs, and the test expects to see r1 = r2 = 0 (it stops at the first).
// PMINDEX_SYMMETRIC_FENCES=1 (ctest runs this binary a second time with it) forces the
// fallback, where both sides are seq_cst fences; the litmus test must pass there too.
#include "pmindex/sync/asymmetric_fence.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace pmindex::sync {
namespace {

struct alignas(64) Line {
  std::atomic<std::uint64_t> v{0};
};

struct Litmus {
  Line x, y, ready, done;
  std::uint64_t r1 = 0, r2 = 0;
};

// Both threads arrive at a barrier (a locked RMW: their store buffers start empty), then
// wait a pseudo-random few dozen cycles each so that their windows overlap in varied ways.
inline void arrive_and_jitter(Litmus& t, std::uint64_t round, std::uint64_t& rng) {
  t.ready.v.fetch_add(1, std::memory_order_acq_rel);
  while (t.ready.v.load(std::memory_order_acquire) < 2 * round) {
  }
  rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
  for (std::uint64_t k = rng >> 58; k != 0; --k)
    std::atomic_signal_fence(std::memory_order_seq_cst);
}

// Runs up to `iterations` rounds (or until `budget` passes); returns how many ended with
// r1 = r2 = 0. Relaxed atomics: each access is one plain mov on x86, so only the fences under
// test order them (the compiler barrier inside light() keeps the compiler from moving them).
template <class Light, class Heavy>
std::uint64_t both_zero(std::uint64_t iterations, std::chrono::seconds budget, Light light,
                        Heavy heavy, std::uint64_t* ran, bool stop_at_first_bad = false) {
  Litmus t;
  // The final round, set by main before it arrives at the barrier of the round after it; h
  // reads it only after that barrier (whose acq_rel RMWs order the two), so it never misses
  // the barrier main waits at.
  std::atomic<std::uint64_t> last{UINT64_MAX};
  std::thread h([&] {
    std::uint64_t rng = 2;
    for (std::uint64_t i = 1;; ++i) {
      arrive_and_jitter(t, i, rng);
      if (i > last.load(std::memory_order_acquire)) return;
      t.y.v.store(1, std::memory_order_relaxed);
      heavy();
      t.r2 = t.x.v.load(std::memory_order_relaxed);
      t.done.v.fetch_add(1, std::memory_order_acq_rel);
    }
  });
  const auto until = std::chrono::steady_clock::now() + budget;
  std::uint64_t bad = 0, rng = 1, i = 1;
  for (;; ++i) {
    if (i > iterations || std::chrono::steady_clock::now() >= until ||
        (stop_at_first_bad && bad != 0)) {
      last.store(i - 1, std::memory_order_release);
      arrive_and_jitter(t, i, rng);  // releases h, which then sees the end
      break;
    }
    arrive_and_jitter(t, i, rng);
    t.x.v.store(1, std::memory_order_relaxed);
    light();
    t.r1 = t.y.v.load(std::memory_order_relaxed);
    while (t.done.v.load(std::memory_order_acquire) < i) {
    }
    if (t.r1 == 0 && t.r2 == 0) ++bad;
    t.x.v.store(0, std::memory_order_relaxed);
    t.y.v.store(0, std::memory_order_relaxed);
  }
  h.join();
  *ran = i - 1;
  return bad;
}

bool symmetric_requested() {
  const char* v = std::getenv("PMINDEX_SYMMETRIC_FENCES");
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

// light() reads a flag that must already hold the decision when main() starts: read it before
// anything here calls enabled() or heavy(). Only meaningful in a fresh process where no other
// test ran first, so ctest also runs this test alone (test_sync_fence_decided_at_start).
// Without the start-up decision light() would fall back to full fences for good.
TEST(AsymmetricFence, DecidedBeforeMain) {
  const bool flag = AsymmetricFence::light_skips_fence();
  EXPECT_EQ(flag, !symmetric_requested());
  EXPECT_EQ(flag, AsymmetricFence::enabled());
}

TEST(AsymmetricFence, ModeFollowsTheEnvironment) {
  if (symmetric_requested()) {
    EXPECT_FALSE(AsymmetricFence::enabled());
  } else {
    // membarrier(2) PRIVATE_EXPEDITED exists since Linux 4.14; CI machines have it.
    EXPECT_TRUE(AsymmetricFence::enabled());
  }
}

TEST(AsymmetricFence, StoreBufferingNeverEndsWithBothZero) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs two CPUs";
  std::uint64_t ran = 0;
  const std::uint64_t bad =
      both_zero(50'000, std::chrono::seconds(20), [] { AsymmetricFence::light(); },
                [] { AsymmetricFence::heavy(); }, &ran);
  std::printf("asymmetric fence (%s): %llu rounds, %llu with r1 = r2 = 0\n",
              AsymmetricFence::enabled() ? "membarrier" : "symmetric fallback",
              static_cast<unsigned long long>(ran), static_cast<unsigned long long>(bad));
  EXPECT_GE(ran, 1000u);
  EXPECT_EQ(bad, 0u);
}

TEST(AsymmetricFence, LitmusCatchesAHeavySideWithoutMembarrier) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs two CPUs";
  std::uint64_t ran = 0;
  // How often x86 shows the reordering varies by orders of magnitude with the machine's
  // state (1 in 400 to 1 in 500,000 rounds here), so run until the first one.
  const std::uint64_t bad = both_zero(
      100'000'000, std::chrono::seconds(120),
      [] { std::atomic_signal_fence(std::memory_order_seq_cst); },
      [] { AsymmetricFence::full_fence(); }, &ran, /*stop_at_first_bad=*/true);
  std::printf("compiler barrier vs fence: %llu rounds, %llu with r1 = r2 = 0\n",
              static_cast<unsigned long long>(ran), static_cast<unsigned long long>(bad));
  // Some machine states show no reordering at all (stop 25: 0 in 100M rounds, run alone):
  // then the litmus proves nothing either way, which is reported as a skip, not a pass.
  if (bad == 0) GTEST_SKIP() << "x86 store buffering was not observed in " << ran << " rounds";
  EXPECT_GT(bad, 0u);
}

}  // namespace
}  // namespace pmindex::sync

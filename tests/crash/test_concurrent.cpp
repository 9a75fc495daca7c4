// Multi-threaded crash simulation: the deterministic scheduler, per-thread flush/fence
// semantics, and a toy concurrent protocol whose dirty read (a reader returns a value that a
// crash then loses) is caught while the flush-on-read version passes.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <iostream>
#include <set>

#include "pmindex/crash/explorer.h"
#include "pmindex/crash/scheduler.h"
#include "pmindex/crash/tracer.h"
#include "pmindex/pm/pool.h"

namespace pmindex::crash {
namespace {

std::vector<int> interleaving(std::uint64_t seed) {
  Scheduler s(seed);
  std::vector<int> order;  // appended only by the thread holding the baton
  std::vector<std::function<void()>> bodies;
  for (int t = 0; t < 3; ++t) {
    bodies.push_back([&, t] {
      for (int k = 0; k < 20; ++k) {
        order.push_back(t);
        s.yield();
      }
    });
  }
  s.run(bodies);
  return order;
}

TEST(Scheduler, SameSeedSameInterleavingOtherSeedsDiffer) {
  const std::vector<int> a = interleaving(5);
  EXPECT_EQ(a.size(), 60u);
  EXPECT_EQ(a, interleaving(5));
  std::set<std::vector<int>> distinct;
  for (std::uint64_t seed = 1; seed <= 8; ++seed) distinct.insert(interleaving(seed));
  EXPECT_GT(distinct.size(), 4u);
}

struct ModeScope {
  explicit ModeScope(pm::Mode m) { EXPECT_TRUE(pm::Runtime::acquire_mode(m)); }
  ~ModeScope() { pm::Runtime::release_mode(); }
};

alignas(4096) char g_region[4096];

TEST(Scheduler, AFlushTakesEffectAtTheSameThreadsFence) {
  ModeScope mode(pm::Mode::adr);
  std::memset(g_region, 0, sizeof g_region);
  Tracer tracer(pm::Mode::adr);
  tracer.start();
  tracer.bind(g_region, sizeof g_region);
  Scheduler sched(3);
  tracer.set_scheduler(&sched);
  auto* w = reinterpret_cast<std::uint64_t*>(g_region);
  std::atomic<bool> a_flushed{false}, b_fenced{false};
  std::uint64_t after_other_fence = 99, after_own_fence = 99;
  auto persisted = [&] {
    std::uint64_t v = 0;
    std::memcpy(&v, tracer.persisted().data(), 8);
    return v;
  };
  sched.run({[&] {
               pm::store(w, std::uint64_t{1});
               pm::flush(w, 8);
               a_flushed.store(true, std::memory_order_relaxed);
               while (!b_fenced.load(std::memory_order_relaxed)) pm::yield_point("wait");
               after_other_fence = persisted();
               pm::fence();
               after_own_fence = persisted();
             },
             [&] {
               while (!a_flushed.load(std::memory_order_relaxed)) pm::yield_point("wait");
               pm::fence();  // another core's sfence does not order thread A's clwb
               b_fenced.store(true, std::memory_order_relaxed);
             }});
  tracer.set_scheduler(nullptr);
  tracer.stop();
  EXPECT_EQ(after_other_fence, 0u);
  EXPECT_EQ(after_own_fence, 1u);
}

// One PM word W. Thread 0 writes 1, 2, 3 (publish + persist each). Thread 1 reads W four
// times and returns what it saw; the buggy reader returns a value that may not be durable yet.
class DirtyReadToy final : public ConcurrentScenario {
 public:
  explicit DirtyReadToy(bool flush_on_read, pm::Mode mode)
      : flush_on_read_(flush_on_read), mode_(mode) {}
  Result<Region> setup() override {
    pool_.reset();
    started_ = completed_ = observed_ = 0;
    pm::PoolOptions po;
    po.size = pm::kMinPoolSize;
    po.mode = mode_;
    po.layout = pm::Layout{"toy", 0, pm::KeyMode::u64, 0};
    auto pool = pm::Pool::create(po);
    if (!pool.ok()) return pool.status();
    pool_ = std::move(pool).value();
    return Region{pool_->base(), pool_->size()};
  }
  std::size_t threads() const override { return 2; }
  void run_thread(std::size_t t, OpContext& ctx) override {
    auto* w = pool_->at<std::uint64_t>(pm::kHeaderSize);
    if (t == 0) {
      for (std::uint64_t k = 1; k <= 3; ++k) {
        started_.store(k, std::memory_order_relaxed);
        pm::publish(w, k);
        pm::persist(w, 8);
        completed_.store(k, std::memory_order_relaxed);
        ctx.op_returned();
      }
    } else {
      for (int r = 0; r < 4; ++r) {
        pm::yield_point("read");
        const std::uint64_t v = pm::load_acquire(w);
        if (flush_on_read_) pm::persist(w, 8);  // make what we return durable first
        observed_.store(std::max(observed_.load(std::memory_order_relaxed), v),
                        std::memory_order_relaxed);
        ctx.op_returned();
      }
    }
  }
  Status check_image(std::span<char> image, const CrashPoint&, std::uint64_t) override {
    std::uint64_t w = 0;
    std::memcpy(&w, image.data() + pm::kHeaderSize, 8);
    const std::uint64_t done = completed_.load(std::memory_order_relaxed);
    const std::uint64_t seen = observed_.load(std::memory_order_relaxed);
    if (w > started_.load(std::memory_order_relaxed))
      return Status(Code::corrupted, "W holds a value never written");
    if (w < done) return Status(Code::corrupted, "a completed write was lost");
    if (w < seen) {
      return Status(Code::corrupted, "dirty read: a reader returned " + std::to_string(seen) +
                                         " but the image holds " + std::to_string(w));
    }
    return Status::Ok();
  }
  void teardown() override { pool_.reset(); }

 private:
  bool flush_on_read_;
  pm::Mode mode_;
  std::unique_ptr<pm::Pool> pool_;
  std::atomic<std::uint64_t> started_{0}, completed_{0}, observed_{0};
};

ExploreReport run_dirty(bool flush_on_read, pm::Mode mode, std::uint64_t seed,
                        std::optional<ReplayToken> replay = {}) {
  DirtyReadToy toy(flush_on_read, mode);
  ExploreOptions o;
  o.label = std::string(flush_on_read ? "flush_on_read." : "dirty_read.") +
            std::string(pm::to_string(mode));
  o.mode = mode;
  o.seed = seed;
  o.images_budget = 0;
  o.max_failures = 1;
  o.replay = std::move(replay);
  return explore_concurrent(toy, o);
}

TEST(Concurrent, DirtyReadIsCaughtAndFlushOnReadPasses) {
  std::size_t caught = 0;
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    const ExploreReport bug = run_dirty(false, pm::Mode::adr, seed);
    if (!bug.ok()) {
      ++caught;
      EXPECT_NE(bug.failures[0].message.find("dirty read"), std::string::npos) << bug.to_string();
      if (caught == 1) {
        std::cout << "[caught] dirty_read seed " << seed << ": " << bug.to_string() << "\n";
        // The token replays the same schedule and image.
        const ExploreReport again = run_dirty(false, pm::Mode::adr, seed, bug.failures[0].token);
        ASSERT_FALSE(again.ok());
        EXPECT_EQ(again.images_checked, 1u);
        EXPECT_EQ(again.failures[0].message, bug.failures[0].message);
      }
    }
    const ExploreReport good = run_dirty(true, pm::Mode::adr, seed);
    EXPECT_TRUE(good.ok()) << "seed " << seed << ": " << good.to_string();
    EXPECT_GT(good.images_checked, 0u);
    // Under eADR a performed store is durable: the same reader is correct.
    const ExploreReport eadr = run_dirty(false, pm::Mode::eadr, seed);
    EXPECT_TRUE(eadr.ok()) << "seed " << seed << ": " << eadr.to_string();
  }
  EXPECT_GT(caught, 0u) << "no schedule exposed the dirty read";
}

TEST(Concurrent, RunsAreReproducible) {
  const ExploreReport a = run_dirty(true, pm::Mode::adr, 9);
  const ExploreReport b = run_dirty(true, pm::Mode::adr, 9);
  EXPECT_EQ(a.crash_points, b.crash_points);
  EXPECT_EQ(a.candidate_images, b.candidate_images);
  EXPECT_EQ(a.schedule_steps, b.schedule_steps);
}

}  // namespace
}  // namespace pmindex::crash
